"""The HTTP adapter: OpenAI's chat and completions endpoints over a `Gateway`.

    POST /v1/chat/completions   messages → session → reconciler → answer (JSON or SSE)
    POST /v1/completions        prompt (lines) → the same
    GET  /v1/models             the one served model name
    GET  /v1/csr/sessions       each session's version, new versions and reconciler counters
    GET  /health                200 once the gateway accepts requests

Starlette for routing and streaming responses, uvicorn to serve it: a small, well-kept ASGI
pair that llama-cpp-python's own server already runs on (through FastAPI), so the gateway adds
no new stack to the machines. The blocking reconciler call runs on starlette's thread pool.

The session is the `X-Session-Id` header, else the body's `user`. Every answer carries
`usage` (`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`), a `csr`
field (session, conversation version, whether this request started a new version and why,
chunks appended, state version, TTFT) and the headers `X-CSR-Session`, `X-CSR-Version`,
`X-CSR-New-Version`. A stream is sent once the answer is decoded (the resources return whole
answers): its pieces are the answer's tokens.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from csr_ros.errors import (ChunkError, ConfigError, ContextOverflowError, CsrError,
                            GatewayBusyError, GatewayRequestError, ResourceError,
                            StateMismatchError)
from csr_ros.gateway.service import Completion, Gateway
from csr_ros.gateway.session import (parse_chat, parse_completion_prompt, session_key,
                                     stream_pieces)

log = logging.getLogger(__name__)

#: request fields accepted and passed on; anything else not listed in IGNORED is refused
USED = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stop", "stream",
        "stream_options", "user", "n"}
#: sampling fields the resources' own settings replace (named in X-CSR-Ignored)
IGNORED = {"temperature", "top_p", "seed", "presence_penalty", "frequency_penalty",
           "logit_bias", "metadata", "store", "parallel_tool_calls", "service_tier"}


def build_app(gateway: Gateway) -> Starlette:
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
        body = await _body(request)
        prompt = parse_chat(body.get("messages"), default_profile=gateway.config.default_profile)
        return await _answer(gateway, request, body, prompt, chat=True)

    async def completions(request: Request):
        body = await _body(request)
        prompt = parse_completion_prompt(body.get("prompt"))
        return await _answer(gateway, request, body, prompt, chat=False)

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/csr/sessions", sessions),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={CsrError: _error_response})


async def _answer(gateway: Gateway, request: Request, body: dict, prompt, *, chat: bool):
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
    done = await run_in_threadpool(gateway.complete, key, prompt, max_tokens=max_tokens,
                                   stop=stop)
    headers = {"X-CSR-Session": key, "X-CSR-Version": str(done.version),
               "X-CSR-New-Version": "1" if done.new_version else "0"}
    ignored = sorted(set(body) & IGNORED)
    if ignored:
        headers["X-CSR-Ignored"] = ",".join(ignored)
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    name = gateway.config.model_name
    if not stream:
        choice = ({"index": 0, "message": {"role": "assistant", "content": done.text},
                   "finish_reason": done.finish_reason, "logprobs": None} if chat else
                  {"index": 0, "text": done.text, "finish_reason": done.finish_reason,
                   "logprobs": None})
        return JSONResponse({"id": ident, "object": "chat.completion" if chat
                             else "text_completion", "created": created, "model": name,
                             "choices": [choice], "usage": _usage(done),
                             "csr": done.csr_fields()}, headers=headers)
    decode = gateway.decoder(key)
    pieces = stream_pieces(decode, done.token_ids, done.text) if decode else [done.text]
    events = _stream_events(done, pieces, ident=ident, created=created, name=name, chat=chat,
                            include_usage=include_usage)
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


def _stream_events(done: Completion, pieces: list[str], *, ident: str, created: int, name: str,
                   chat: bool, include_usage: bool):
    obj = "chat.completion.chunk" if chat else "text_completion"

    def event(choices: list, **extra) -> str:
        payload = {"id": ident, "object": obj, "created": created, "model": name,
                   "choices": choices, **extra}
        if include_usage and "usage" not in extra:
            payload["usage"] = None
        return f"data: {json.dumps(payload)}\n\n"

    def delta(content: str | None = None, role: str | None = None,
              finish: str | None = None) -> dict:
        if chat:
            d = {} if content is None else {"content": content}
            if role:
                d["role"] = role
            return {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
        return {"index": 0, "text": content or "", "finish_reason": finish, "logprobs": None}

    if chat:
        yield event([delta("", role="assistant")], csr=done.csr_fields())
    for piece in pieces:
        yield event([delta(piece)])
    yield event([delta(finish=done.finish_reason)], **({} if chat else
                                                     {"csr": done.csr_fields()}))
    if include_usage:
        yield event([], usage=_usage(done))
    yield "data: [DONE]\n\n"


def _usage(done: Completion) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


async def _body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GatewayRequestError(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise GatewayRequestError("the request body must be a JSON object")
    unknown = sorted(set(body) - USED - IGNORED)
    if unknown:
        msg = (f"unsupported request fields {unknown}: the gateway answers text only (no "
               "tools, logprobs, response formats or batches)")
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


async def _error_response(request: Request, exc: Exception) -> JSONResponse:
    status, kind = 500, "server_error"
    for cls, code, name in _STATUS:
        if isinstance(exc, cls):
            status, kind = code, name
            break
    (log.info if status < 500 else log.warning)("%s %s: %d %s", request.method,
                                                request.url.path, status, exc)
    return JSONResponse({"error": {"message": str(exc), "type": kind, "param": None,
                                   "code": type(exc).__name__}}, status_code=status)


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
        deadline = time.monotonic() + 30.0
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"the gateway could not start serving on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(10.0)
