"""The HTTP adapter: OpenAI's chat and completions endpoints over a `Gateway`.

    POST /v1/chat/completions   messages (+ tools) → session → reconciler → answer or call
    POST /v1/completions        prompt (lines) → the same
    GET  /v1/models             the one served model name
    GET  /v1/csr/sessions       each session's version, new versions and reconciler counters
    GET  /health                200 once the gateway accepts requests

The blocking reconciler call runs on starlette's thread pool; a stream is fed from the worker
thread by the resource's `on_text` through an `AnswerStream` (answer.py), and a chat's tools
become the grammar its answer is decoded under (tool_calls.py). `check_exposure` refuses to
serve beyond loopback without a key unless told to. Sessions, `usage`, the `csr` field and
the `X-CSR-*` headers, errors, streaming, tools and the API key: docs/gateway.md.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import threading
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from csr_ros.errors import (ChunkError, ConfigError, ContextOverflowError, CsrError,
                            GatewayBusyError, GatewayRequestError, QueryCancelledError,
                            ResourceError, StateMismatchError)
from csr_ros.gateway.answer import Answer, AnswerStream, Decoding, settle
from csr_ros.gateway.service import Completion, Gateway, Started
from csr_ros.gateway.session import parse_chat, parse_completion_prompt, session_key
from csr_ros.gateway.tool_calls import parse_tools, plan_decoding
from csr_ros.waiting import wait_until

log = logging.getLogger(__name__)

#: request fields accepted and passed on; anything else not listed in IGNORED is refused
USED = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stop", "stream",
        "stream_options", "user", "n"}
#: and for chat: tools as typed actions (tool_calls.py). An answer holds at most one call,
#: which both values of parallel_tool_calls allow.
CHAT_USED = USED | {"tools", "tool_choice", "response_format", "parallel_tool_calls"}
#: sampling fields the resources' own settings replace (named in X-CSR-Ignored)
IGNORED = {"temperature", "top_p", "seed", "presence_penalty", "frequency_penalty",
           "logit_bias", "metadata", "store", "service_tier"}
#: streams being decoded on worker threads (the event loop holds tasks only weakly)
_WORKERS: set[asyncio.Future] = set()


def build_app(gateway: Gateway, *, api_key: str | None = None) -> Starlette:
    """The routes over `gateway`; with `api_key`, each one asks for it (docs/gateway.md, "The
    API key")."""
    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": gateway.config.model_name, "object": "model", "created": 0,
             "owned_by": "csr-ros"}]})

    async def sessions(request: Request) -> JSONResponse:
        stats = await run_in_threadpool(gateway.session_stats)
        return JSONResponse({"sessions": stats, "max_sessions": gateway.config.max_sessions,
                             "sessions_closed": gateway.sessions_closed})

    async def chat(request: Request):
        body = await _body(request, CHAT_USED)
        tools = parse_tools(body.get("tools"))
        decoding = plan_decoding(tools, body.get("tool_choice"), body.get("response_format"))
        prompt = parse_chat(body.get("messages"), default_profile=gateway.config.default_profile,
                            tools=tools)
        return await _answer(gateway, request, body, prompt, chat=True, decoding=decoding)

    async def completions(request: Request):
        body = await _body(request, USED)
        prompt = parse_completion_prompt(body.get("prompt"))
        return await _answer(gateway, request, body, prompt, chat=False)

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/csr/sessions", sessions),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"])]
    middleware = [Middleware(_RequireKey, api_key=api_key)] if api_key else []
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={CsrError: _error_response})


def check_exposure(host: str, api_key: str | None, *, insecure_no_auth: bool = False) -> None:
    """ConfigError when `host` reaches beyond this machine and no key guards it: a robot's
    gateway on its network would otherwise serve anyone who finds the port."""
    if api_key or insecure_no_auth or _is_loopback(host):
        return
    raise ConfigError(f"--host {host} serves beyond this machine: give an API key (--api-key "
                      "KEY or $CSR_ROS_API_KEY; clients send it as `Authorization: Bearer KEY`, "
                      "the openai client's api_key), or pass --insecure-no-auth to serve "
                      "without one")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False                    # a name: it may resolve anywhere


class _RequireKey:
    """ASGI middleware: a request without `Authorization: Bearer <api_key>` gets 401."""

    def __init__(self, app, *, api_key: str):
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or \
                    not hmac.compare_digest(token.strip().encode(), self._key):
                message = ("this gateway needs its API key: send `Authorization: Bearer <key>` "
                           "(the openai client's api_key)" if not token else
                           "the API key sent is not this gateway's")
                log.info("%s %s: 401 %s", scope.get("method"), scope.get("path"), message)
                response = JSONResponse(
                    {"error": {"message": message, "type": "invalid_request_error",
                               "param": None, "code": "invalid_api_key"}},
                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _answer(gateway: Gateway, request: Request, body: dict, prompt, *, chat: bool,
                  decoding: Decoding = Decoding.plain()):
    key = session_key(request.headers, body)
    stream, include_usage = _stream_options(body)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) if chat \
        else body.get("max_tokens")
    if body.get("n", 1) != 1:
        raise GatewayRequestError("only n=1 is supported")
    model = body.get("model")
    if model is not None and model != gateway.config.model_name:
        msg = f"this gateway serves the model {gateway.config.model_name!r}, not {model!r}"
        raise GatewayRequestError(msg)
    stop = _stop(body.get("stop"))
    reply = _Reply(gateway.config.model_name, chat=chat, include_usage=include_usage,
                   ignored=sorted(set(body) & IGNORED))
    ask = dict(max_tokens=max_tokens, stop=stop, constraint=decoding.constraint)
    if not stream:
        done = await run_in_threadpool(gateway.complete, key, prompt, **ask)
        return JSONResponse(reply.body(done, settle(decoding, done.text, done.finish_reason)),
                            headers=reply.headers(done))
    return await _stream(gateway, key, prompt, ask, decoding, reply)


async def _stream(gateway: Gateway, key: str, prompt, ask: dict, decoding: Decoding,
                  reply: "_Reply") -> StreamingResponse:
    """Decode on a worker thread and send each piece as it is released (docs/gateway.md,
    "Streaming")."""
    loop = asyncio.get_running_loop()
    items: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()
    pieces = AnswerStream(decoding, stop=ask["stop"])

    def put(kind: str, value) -> None:
        loop.call_soon_threadsafe(items.put_nowait, (kind, value))

    def on_text(text: str) -> None:
        if gone.is_set():
            raise QueryCancelledError("the client closed the stream")
        piece = pieces.feed(text)
        if piece:
            put("piece", piece)

    def work() -> None:
        try:
            put("done", gateway.complete(key, prompt, on_start=lambda s: put("start", s),
                                         on_text=on_text, **ask))
        except BaseException as exc:       # delivered to the response, or its status
            put("error", exc)

    worker = asyncio.ensure_future(run_in_threadpool(work))
    _WORKERS.add(worker)                   # the loop holds tasks weakly
    worker.add_done_callback(_WORKERS.discard)
    started: Started | None = None
    kind, value = await items.get()
    while kind == "start":
        started = value
        kind, value = await items.get()
    if kind == "error":
        raise value                        # nothing sent yet: the error's own status
    assert started is not None, "complete() calls on_start before its query's first text"

    async def events():
        nonlocal kind, value
        try:
            if reply.chat:
                yield reply.first_event()
            while True:
                if kind == "piece":
                    yield reply.piece_event(value)
                elif kind == "done":
                    answer = settle(decoding, value.text, value.finish_reason)
                    for event in reply.last_events(value, answer, pieces):
                        yield event
                    return
                else:
                    yield reply.error_event(value)
                    return
                kind, value = await items.get()
        finally:
            gone.set()                     # a client that went away stops the decode

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers=reply.headers(started))


class _Reply:
    """One request's OpenAI response: the JSON body, or the SSE events of a stream."""

    def __init__(self, model: str, *, chat: bool, include_usage: bool, ignored: list[str]):
        self.model, self.chat = model, chat
        self.include_usage, self.ignored = include_usage, ignored
        self.ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def headers(self, done: Completion | Started) -> dict:
        headers = {"X-CSR-Session": done.session, "X-CSR-Version": str(done.version),
                   "X-CSR-New-Version": "1" if done.new_version else "0"}
        if self.ignored:
            headers["X-CSR-Ignored"] = ",".join(self.ignored)
        return headers

    def body(self, done: Completion, answer: Answer) -> dict:
        if self.chat:
            message = {"role": "assistant", "content": answer.content}
            if answer.tool_call is not None:
                message["tool_calls"] = [answer.tool_call.as_dict()]
            choice = {"index": 0, "message": message, "finish_reason": answer.finish_reason,
                      "logprobs": None}
        else:
            choice = {"index": 0, "text": done.text, "finish_reason": done.finish_reason,
                      "logprobs": None}
        return {"id": self.ident, "object": "chat.completion" if self.chat
                else "text_completion", "created": self.created, "model": self.model,
                "choices": [choice], "usage": _usage(done), "csr": _csr(done, answer)}

    def first_event(self) -> str:
        """Chat streams open with the assistant's role."""
        return self._event([self._delta({"role": "assistant", "content": ""})])

    def piece_event(self, piece: str) -> str:
        return self._event([self._delta({"content": piece})] if self.chat
                           else [self._text(piece)])

    def last_events(self, done: Completion, answer: Answer, pieces: AnswerStream):
        """The rest of the content (or the call), the finish, usage if asked, [DONE]."""
        if answer.tool_call is not None:
            call = {"index": 0, **answer.tool_call.as_dict()}
            yield self._event([self._delta({"tool_calls": [call]})])
        else:
            rest = pieces.finish(answer.content)
            if rest:
                yield self.piece_event(rest)
        finish = (self._delta({}, answer.finish_reason) if self.chat
                  else self._text("", answer.finish_reason))
        yield self._event([finish], csr=_csr(done, answer))
        if self.include_usage:
            yield self._event([], usage=_usage(done))
        yield "data: [DONE]\n\n"

    def error_event(self, exc: BaseException) -> str:
        status, kind = _status_of(exc)
        log.warning("stream of %s ended by an error (%d): %s", self.ident, status, exc)
        return (f"data: {json.dumps(_error_body(exc, kind))}\n\n"
                "data: [DONE]\n\n")

    def _event(self, choices: list, **extra) -> str:
        payload = {"id": self.ident, "object": "chat.completion.chunk" if self.chat
                   else "text_completion", "created": self.created, "model": self.model,
                   "choices": choices, **extra}
        if self.include_usage and "usage" not in extra:
            payload["usage"] = None
        return f"data: {json.dumps(payload)}\n\n"

    @staticmethod
    def _delta(delta: dict, finish: str | None = None) -> dict:
        return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}

    @staticmethod
    def _text(text: str, finish: str | None = None) -> dict:
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}


def _csr(done: Completion, answer: Answer) -> dict:
    fields = done.csr_fields()
    if answer.error:
        fields["not_a_call"] = answer.error
    return fields


def _usage(done: Completion) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


async def _body(request: Request, used: set[str]) -> dict:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GatewayRequestError(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise GatewayRequestError("the request body must be a JSON object")
    unknown = sorted(set(body) - used - IGNORED)
    if unknown:
        also = "" if used is CHAT_USED else " (tools and response formats are chat's)"
        msg = (f"unsupported request fields {unknown}: the gateway does not answer with "
               f"logprobs, audio, several choices or legacy functions{also}")
        raise GatewayRequestError(msg)
    return body


def _stream_options(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GatewayRequestError(f"'stream' must be true or false, got {stream!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise GatewayRequestError("'stream_options' must be an object")
    return stream, bool(options.get("include_usage", False)) and stream


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or \
            not all(isinstance(s, str) and s for s in stop):
        raise GatewayRequestError("'stop' must be a string or a list of up to 4 strings")
    return tuple(stop)


_STATUS = ((GatewayBusyError, 429, "rate_limit_error"),
           (GatewayRequestError, 400, "invalid_request_error"),
           (ChunkError, 400, "invalid_request_error"),
           (ContextOverflowError, 400, "invalid_request_error"),
           (ConfigError, 400, "invalid_request_error"),
           (StateMismatchError, 500, "server_error"),
           (ResourceError, 503, "server_error"))


def _status_of(exc: BaseException) -> tuple[int, str]:
    for cls, code, name in _STATUS:
        if isinstance(exc, cls):
            return code, name
    return 500, "server_error"


def _error_body(exc: BaseException, kind: str) -> dict:
    return {"error": {"message": str(exc), "type": kind, "param": None,
                      "code": type(exc).__name__}}


async def _error_response(request: Request, exc: Exception) -> JSONResponse:
    status, kind = _status_of(exc)
    (log.info if status < 500 else log.warning)("%s %s: %d %s", request.method,
                                                request.url.path, status, exc)
    return JSONResponse(_error_body(exc, kind), status_code=status)


class ServerThread:
    """uvicorn serving an app on a thread, on loopback: `with ServerThread(app, port): ...`."""

    def __init__(self, app, port: int, host: str = "127.0.0.1", *, log_level: str = "warning"):
        import uvicorn

        self.url = f"http://{host}:{port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                                     log_level=log_level))
        self._thread = threading.Thread(target=self._server.run, name="gateway-http",
                                        daemon=True)

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        failed = ConfigError(f"the gateway could not start serving on {self.url}")

        def started() -> bool:
            if not self._server.started and not self._thread.is_alive():
                raise failed
            return self._server.started
        wait_until(started, 30.0, interval_s=0.02, timeout_error=failed)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(10.0)
