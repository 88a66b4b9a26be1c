"""A resource behind an OpenAI-compatible completions server (vLLM first; SGLang, llama.cpp).

    OpenAIResource(OpenAIOptions("http://127.0.0.1:8001", name="r1", robot_id="robot_0"))
    make_resource("openai", url="http://127.0.0.1:8001", name="r1")      # the same

    load(ids)    POST /v1/completions, prompt = ids, max_tokens=1, low priority  (warm-up)
    extend(ids)  the same with prompt = committed ⊕ ids; the server's prefix cache makes it
                 cost only the new tokens                                      (catch-up)
    query(req)   streaming POST /v1/completions with the whole prompt (static ⊕ dynamic);
                 TTFT is taken on the client at the first streamed token

The committed run is tracked here, an estimate of the server's cache and never a correctness
condition: every request carries its whole prompt. Prompts travel as token ids where the
server accepts them and as text otherwise; behind a router, `robot_id` gives every completion
the routing key `X-Session-ID: <robot_id>/v<version>`. Options, behaviour and faults:
docs/openai_and_vllm.md, "The HTTP resource"; the routing key: docs/fleet.md.

Its parts: `OpenAIOptions` (what it is made with, checked once), http_transport.py (requests,
retries, streamed events), http_errors.py (a server's refusals as csr_ros errors) and
dialects.py (what vLLM, SGLang and llama.cpp's servers each understand).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import httpx

from csr_ros.actions import OutputConstraint
from csr_ros.errors import (ConfigError, ContextOverflowError, ResourceError,
                            ResourceUnavailableError, StateMismatchError)
from csr_ros.resources import dialects
from csr_ros.resources.base import Capabilities, PrefillResult, QueryResult
from csr_ros.resources.dialects import DIALECTS, STRUCTURED_APIS, Dialect, ServerInfo
from csr_ros.resources.http_transport import HttpTransport
from csr_ros.state import Request
from csr_ros.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8001"
PROMPT_MODES = ("auto", "tokens", "text")
TOKENIZER_CHOICES = ("local", "server")
ROUTING_KEY_HEADER = "X-Session-ID"            # vllm-router consistent_hash: first key it reads
DEFAULT_CONTEXT_TOKENS = 8192                  # assumed when the server does not say
FINISH_REASONS = ("stop", "length")            # any other end of a stream is a server error
# A string with template tokens, digits, units and non-ASCII text: two tokenizers that agree
# on it are the same tokenizer for every practical purpose here.
_TOKENIZER_PROBE = "<|im_start|>system\nCSR probe: v=0.25 m/s, 12 Hz, ünïcode ✓ 中文\n<|im_end|>\n"


@dataclass(frozen=True)
class OpenAIOptions:
    """How an OpenAIResource talks to its server; checked when made (ConfigError)."""

    url: str = DEFAULT_URL
    name: str = "openai"
    model: str | None = None               # the served model id (None: the one it serves)
    api_key: str | None = None             # None: $CSR_ROS_API_KEY
    prompt_mode: str = "auto"              # PROMPT_MODES; auto: ids where the server takes them
    tokenizer: str | Tokenizer = "local"   # "local" files, the "server"'s own, or a Tokenizer
    model_dir: str | Path | None = None    # the local tokenizer's files (None: by model name)
    max_context_tokens: int | None = None  # None: what the server reports
    tau_mem_tokens: int | None = None      # with headroom_tokens: the context the server needs
    headroom_tokens: int = 1024
    priority_scheduling: bool = False      # send warm-ups with `priority` (vLLM)
    prefill_priority: int = 10             # larger = later
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0
    retries: int = 2                       # only while no connection could be made
    backoff_s: float = 0.5
    temperature: float = 0.0
    seed: int | None = 0
    extra_body: dict = field(default_factory=dict)   # merged into every completion request
    structured_api: str = "auto"           # dialects.STRUCTURED_APIS
    robot_id: str = ""                     # "": no routing key
    check_health: bool = True              # ask the server when made (else at the first call)

    def __post_init__(self):
        if self.prompt_mode not in PROMPT_MODES:
            raise ConfigError(f"prompt_mode must be one of {PROMPT_MODES}, "
                              f"got {self.prompt_mode!r}")
        if isinstance(self.tokenizer, str) and self.tokenizer not in TOKENIZER_CHOICES:
            raise ConfigError(f"tokenizer must be one of {TOKENIZER_CHOICES} or a Tokenizer, "
                              f"got {self.tokenizer!r}")
        if self.structured_api not in STRUCTURED_APIS:
            raise ConfigError(f"structured_api must be one of {STRUCTURED_APIS}, "
                              f"got {self.structured_api!r}")
        if self.retries < 0 or self.backoff_s < 0 or self.headroom_tokens < 0:
            raise ConfigError("retries, backoff_s and headroom_tokens must be >= 0")
        robot_id = self.robot_id
        if not isinstance(robot_id, str) or robot_id != robot_id.strip() or \
                any(not (ch.isascii() and ch.isprintable()) for ch in robot_id):
            raise ConfigError(f"robot_id must be printable ASCII without surrounding spaces "
                              f"(it travels in an HTTP header), got {robot_id!r}")


class OpenAIResource:
    """One server's resource; see the module docstring. `transport`: httpx's, for tests."""

    def __init__(self, options: OpenAIOptions, *, transport: httpx.BaseTransport | None = None):
        self.options = options
        self.name, self.robot_id = options.name, options.robot_id
        self.model = options.model                  # the server's, once asked
        self.max_context_tokens = options.max_context_tokens or DEFAULT_CONTEXT_TOKENS
        self.extra_body = dict(options.extra_body)  # a caller may change it between requests
        self.http = HttpTransport(options.url, name=options.name, api_key=options.api_key,
                                  connect_timeout_s=options.connect_timeout_s,
                                  read_timeout_s=options.read_timeout_s,
                                  retries=options.retries, backoff_s=options.backoff_s,
                                  transport=transport)
        self.url = self.http.url
        self._routing_version = 0                   # the version the committed run belongs to
        self.last_routing_key: str | None = None    # what the last request was sent with
        tokenizer = options.tokenizer
        self._tokenizer: Tokenizer | None = tokenizer if not isinstance(tokenizer, str) else None
        self._remote_tokenizer = None               # the server's, made here: closed here
        self._lock = threading.RLock()
        self._committed_ids: tuple[int, ...] = ()
        self._committed_text: str | None = ""
        self._structured_warned = False
        self.last_choice_cached_tokens: int | None = None
        # What the server said it served from its cache, summed (routing and eviction show
        # here): {"queries"|"prefills": {"requests", "prompt_tokens", "cached_tokens",
        # "without_usage"}}, read with usage_totals().
        self._usage = {kind: {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0,
                              "without_usage": 0} for kind in ("queries", "prefills")}
        self.info: ServerInfo | None = None
        self.dialect: Dialect | None = None
        self.prompt_mode: str | None = (None if options.prompt_mode == "auto"
                                        else options.prompt_mode)
        if options.check_health:
            self.check_health()

    # -- what callers read -----------------------------------------------------------------

    @property
    def n_committed(self) -> int:
        return len(self._committed_ids)

    @property
    def committed_ids(self) -> tuple[int, ...]:
        """What this client last prefilled (the server's cache is not visible to clients)."""
        return self._committed_ids

    def usage_totals(self) -> dict:
        """Prompt tokens sent and cached tokens the server reported, for queries and for
        prefills (load/extend) apart; a request whose answer carried no usage (llama.cpp's
        streams) counts under `without_usage` only."""
        with self._lock:
            return {kind: dict(t) for kind, t in self._usage.items()}

    def _count_usage(self, kind: str, usage: dict | None) -> None:
        tally = self._usage[kind]
        tally["requests"] += 1
        details = (usage or {}).get("prompt_tokens_details") or {}
        if not usage or usage.get("prompt_tokens") is None or \
                details.get("cached_tokens") is None:
            tally["without_usage"] += 1
            return
        tally["prompt_tokens"] += int(usage["prompt_tokens"])
        tally["cached_tokens"] += int(details["cached_tokens"])

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(echo_logprobs=True, routing_key=bool(self.robot_id))

    @property
    def routing_key(self) -> str | None:
        """The `X-Session-ID` of the committed run's version (None without a robot_id)."""
        return self.routing_key_for(self._routing_version)

    def routing_key_for(self, version: int) -> str | None:
        """The `X-Session-ID` of requests about state `version` (None without a robot_id)."""
        if not self.robot_id:
            return None
        return f"{self.robot_id}/v{int(version)}"

    @property
    def state_mode(self) -> str:
        """The CsrState mode that fits this resource: 'text' when prompts travel as text."""
        return "text" if self._resolved_prompt_mode() == "text" else "token"

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer to build the CsrState with (local files, or the server's own)."""
        if self._tokenizer is None:
            if self.options.tokenizer == "server":
                from csr_ros.resources.remote_tokenizer import RemoteTokenizer

                self._tokenizer = self._remote_tokenizer = RemoteTokenizer(
                    self.url, model=self.model, model_dir=self._metadata_dir(),
                    api_key=self.http.api_key)
            else:
                from csr_ros.tokenizer import HFTokenizer

                self._tokenizer = HFTokenizer(self._metadata_dir())
        return self._tokenizer

    # -- health ----------------------------------------------------------------------------

    def check_health(self) -> ServerInfo:
        """Reachable, serving the expected model, with enough context; tokenizers agree.

        Raises ResourceUnavailableError with what is wrong and what to do about it.
        """
        models = self.http.get_json("/v1/models", what="list the served models")
        entries = [m for m in models.get("data", []) if isinstance(m, dict)]
        ids = tuple(str(m.get("id")) for m in entries)
        props = self.http.get_json("/props", what="read /props", missing_ok=True)
        kind = dialects.server_kind({str(m.get("owned_by", "")) for m in entries}, props)
        if self.model is not None and self.model not in ids:
            msg = (f"{self.url} serves {list(ids)}, not {self.model!r}: wrong server or port, "
                   "or pass model= with one of those ids")
            raise ResourceUnavailableError(msg)
        if self.model is None:
            if len(ids) != 1:
                msg = f"{self.url} serves {list(ids) or 'no model'}; pass model= to choose one"
                raise ResourceUnavailableError(msg)
            self.model = ids[0]
        context = dialects.server_context_tokens(entries, self.model, props)
        configured = self.options.max_context_tokens
        if context is not None:
            self.max_context_tokens = min(context, configured or context)
        elif configured is None:
            log.warning("%s does not report its context size; assuming %d tokens "
                        "(pass max_context_tokens= to say)", self.url, self.max_context_tokens)
        tau_mem, headroom = self.options.tau_mem_tokens, self.options.headroom_tokens
        if tau_mem is not None:
            needed = tau_mem + headroom
            if needed > self.max_context_tokens:
                msg = (f"{self.url} has a context of {self.max_context_tokens} tokens, shorter "
                       f"than tau_mem + headroom = {tau_mem} + {headroom} = {needed}: "
                       "start the server with a longer "
                       "context (vLLM --max-model-len, llama.cpp n_ctx) or lower tau_mem")
                raise ResourceUnavailableError(msg)
        version = None
        if kind == "vllm":
            answer = self.http.get_json("/version", what="read /version", missing_ok=True)
            version = str(answer.get("version")) if isinstance(answer, dict) and \
                answer.get("version") else None
        self.info = ServerInfo(kind=kind, model=self.model, models=ids, context_tokens=context,
                               version=version)
        self.dialect = DIALECTS[kind]
        self._check_tokenizer_agrees()
        log.info("%s: %s at %s serves %s, context %s, prompts as %s", self.name, kind, self.url,
                 self.model, context, self._resolved_prompt_mode())
        return self.info

    def _check_tokenizer_agrees(self) -> None:
        """A local tokenizer must split text as the server does, or prefixes never match."""
        if self.options.tokenizer == "server":
            return
        from csr_ros.resources.remote_tokenizer import RemoteTokenizer

        try:
            remote = RemoteTokenizer(self.url, model=self.model, special_tokens=(),
                                     client=self.http.client)
            server_ids = remote.encode_template(_TOKENIZER_PROBE)
        except (ConfigError, ResourceError) as exc:
            log.debug("%s: cannot compare tokenizers (%s)", self.url, exc)
            return
        local_ids = self.tokenizer.encode_template(_TOKENIZER_PROBE)
        if local_ids != server_ids:
            msg = (f"the local tokenizer ({self._metadata_dir()}) splits text differently from "
                   f"the server at {self.url} ({self.model!r}): it serves another model. "
                   "Pass model_dir= of the served model, or tokenizer='server'")
            raise ResourceUnavailableError(msg)

    # -- warm-up and catch-up (prefill only) -------------------------------------------------

    def load(self, ids: Sequence[int], text: str | None = None, *, version: int | None = None,
             timeout_s: float | None = None) -> PrefillResult:
        """Replace the committed run: prefill `ids` (or `text`, in text mode), decode nothing.
        `version`: the state version of the run (its routing key behind a router).
        `timeout_s` (the reconciler's deadline, which follows its estimate of the prefill)
        raises the read timeout for this call where it is longer: a server that drops the work
        of a client that gave up would otherwise never finish a long warm-up."""
        ids = tuple(ids)
        with self._lock:
            if version is not None:
                self._routing_version = int(version)
            if not ids:
                self._committed_ids, self._committed_text = (), ""
                return PrefillResult(n_tokens=0, seconds=0.0, n_committed=0)
            text = self._text_of(ids, text)
            seconds = self._prefill(ids, text, timeout_s)
            self._committed_ids, self._committed_text = ids, text
            return PrefillResult(n_tokens=len(ids), seconds=seconds, n_committed=len(ids))

    def extend(self, ids: Sequence[int], text: str | None = None, *, version: int | None = None,
               timeout_s: float | None = None) -> PrefillResult:
        """Append to the committed run. The whole run is sent; the server reuses its prefix.
        `timeout_s` as in `load`."""
        ids = tuple(ids)
        with self._lock:
            if version is not None:
                self._routing_version = int(version)
            if not ids:
                return PrefillResult(n_tokens=0, seconds=0.0, n_committed=self.n_committed)
            new_text = self._text_of(ids, text)
            full_ids = self._committed_ids + ids
            full_text = None if new_text is None else self._committed_text + new_text
            seconds = self._prefill(full_ids, full_text, timeout_s)
            self._committed_ids, self._committed_text = full_ids, full_text
            return PrefillResult(n_tokens=len(ids), seconds=seconds, n_committed=len(full_ids))

    def _prefill(self, ids: tuple[int, ...], text: str | None,
                 timeout_s: float | None) -> float:
        self._ensure_checked()
        self._check_fits(len(ids) + 1)
        body = self._body(list(ids) if text is None else text, max_tokens=1, stop=())
        if self.options.priority_scheduling:
            body["priority"] = self.options.prefill_priority      # larger = later (vLLM)
        read_timeout_s = None
        if timeout_s is not None and timeout_s > self.options.read_timeout_s:
            read_timeout_s = timeout_s
        started = time.monotonic()
        payload = self._complete(body, read_timeout_s=read_timeout_s)
        seconds = time.monotonic() - started
        self._count_usage("prefills", payload.get("usage"))
        return seconds

    # -- the hot path ------------------------------------------------------------------------

    def query(self, request: Request, *, max_new_tokens: int, stop: Sequence[str] = (),
              constraint: OutputConstraint | None = None,
              on_token: Callable[[int], None] | None = None,
              on_text: Callable[[str], None] | None = None,
              timeout_s: float | None = None) -> QueryResult:
        """`on_token(n)` and `on_text(text)`: called with the answer's tokens and text so far
        as each streamed piece arrives from the server; what they raise (e.g.
        QueryCancelledError) closes the stream at once (vLLM aborts a request whose client
        went away). `timeout_s` is not enforced (as in `load`)."""
        with self._lock:
            self._ensure_checked()
            n_extended = self._n_extended(request)
            self._check_fits(len(request.ids) + max_new_tokens)
            static_text = self._static_text_of(request)
            prompt = self._prompt(request, static_text)
            body = self._body(prompt, max_tokens=max_new_tokens, stop=stop)
            constrained = False
            if constraint is not None:
                fields = self.structured_fields(constraint)
                body.update(fields)
                constrained = bool(fields)
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            pieces: list[str] = []
            token_ids: list[int] = []
            usage: dict = {}
            finish_reason: str | None = None
            first_token_at: float | None = None
            started = time.monotonic()
            response = self._send(body, stream=True,
                                  key=self.routing_key_for(request.version))
            try:
                for event in self.http.events(response, n_received=lambda: len(pieces)):
                    usage = event.get("usage") or usage
                    for choice in event.get("choices") or ():
                        if first_token_at is None:
                            first_token_at = time.monotonic()   # TTFT: the one place it is taken
                        pieces.append(choice.get("text") or "")
                        token_ids.extend(choice.get("token_ids") or ())
                        finish_reason = choice.get("finish_reason") or finish_reason
                    if event.get("choices"):
                        if on_token is not None:
                            on_token(max(len(token_ids), len(pieces)))
                        if on_text is not None:
                            on_text("".join(pieces))
            finally:
                response.close()
            ended = time.monotonic()
            if first_token_at is None:
                msg = f"{self.url} ended the stream without a token (usage {usage or 'none'})"
                raise ResourceUnavailableError(msg)
            if finish_reason not in FINISH_REASONS:
                # Not a budget that ran out: the server gave up on the request (vLLM "abort",
                # llama-cpp-python dropping a running stream for a newer request unless its
                # interrupt_requests is off). The answer may be cut anywhere.
                msg = (f"{self.name}: {self.url} ended the stream after {len(pieces)} pieces "
                       f"with finish_reason {finish_reason!r}, neither 'stop' nor 'length': "
                       "a server error (llama-cpp-python: start it with interrupt_requests "
                       "off, as `csr-ros serve llamacpp` does)")
                raise ResourceUnavailableError(msg)
            self._committed_ids, self._committed_text = request.static_ids, static_text
            text = "".join(pieces)
            if not token_ids and text:
                token_ids = self.tokenizer.encode_template(text)   # the server sent text only
            details = usage.get("prompt_tokens_details") or {}
            self._count_usage("queries", usage)
            return QueryResult(text=text, token_ids=tuple(token_ids),
                               ttft_s=first_token_at - started, decode_s=ended - first_token_at,
                               n_prompt=int(usage.get("prompt_tokens") or len(request.ids)),
                               n_extended=n_extended, cached_tokens=details.get("cached_tokens"),
                               finish_reason=finish_reason,
                               resource=self.name, constrained=constrained)

    def prompt_of(self, request: Request) -> list[int] | str:
        """The prompt `query` sends for `request`: token ids, or text in text mode."""
        with self._lock:
            self._ensure_checked()
            self._n_extended(request)
            return self._prompt(request, self._static_text_of(request))

    def choice_logprobs(self, prompt: list[int] | str,
                        choices: Sequence[str]) -> list[list[float]]:
        """Per-token log-probabilities of each of `choices` after `prompt`, from the cache.

        vLLM (token prompts): one batched completion whose prompts are `prompt` followed by
        each distinct proper prefix of the choices' tokens (the root included), with
        `max_tokens=1` and `logprob_token_ids` naming the tokens that can come next. Such
        requests read the prefix cache like any query: what is computed is the few tokens past
        the cached blocks, once per prefix, in one engine step, so scoring costs about a CSR
        query. (`echo` with `logprobs` asks for prompt log-probabilities, and vLLM computes
        those without its prefix cache: a full prefill per choice.) Other servers, or text
        prompts: `echo_logprobs` per choice. `last_choice_cached_tokens` is the server's count
        of prompt tokens it read from its cache, for the last prompt of the last call (vLLM
        reports one prompt's count for a batch).
        """
        if not choices or any(not c for c in choices):
            raise ConfigError("choices must be non-empty strings")
        with self._lock:
            self._ensure_checked()
            if not self.dialect.choice_token_ids or isinstance(prompt, str):
                return [self.echo_logprobs(prompt, c) for c in choices]
            tails = [list(self.tokenizer.encode_data(c)) for c in choices]
            if any(not t for t in tails):
                raise ConfigError("a choice tokenizes to nothing; choices must be non-empty text")
            prefixes = dialects.choice_prefixes(tails)
            wanted = sorted({t[len(p)] for t in tails for p in prefixes
                             if tuple(t[:len(p)]) == p and len(t) > len(p)})
            if len(wanted) > dialects.MAX_LOGPROB_TOKEN_IDS:
                raise ConfigError(f"the choices need {len(wanted)} distinct next tokens; vLLM "
                                  f"scores at most {dialects.MAX_LOGPROB_TOKEN_IDS} per request")
            prompts = [list(prompt) + list(p) for p in prefixes]
            self._check_fits(max(len(q) for q in prompts) + 1)
            body = self._body(prompts, max_tokens=1, stop=())
            body.update(logprobs=1, logprob_token_ids=wanted, return_tokens_as_token_ids=True)
            payload = self._complete(body)
            details = (payload.get("usage") or {}).get("prompt_tokens_details") or {}
            self.last_choice_cached_tokens = details.get("cached_tokens")
        rows: dict[tuple[int, ...], dict[int, float]] = {}
        try:
            for choice in payload["choices"]:
                top = choice["logprobs"]["top_logprobs"][0]
                rows[prefixes[int(choice["index"])]] = {
                    int(str(tok).split(":", 1)[1]): float(lp) for tok, lp in top.items()}
        except (KeyError, IndexError, TypeError, ValueError):
            raise ResourceError(f"{self.url} did not return the requested token "
                                "log-probabilities (completions with logprob_token_ids)") from None
        out = []
        for tail in tails:
            try:
                out.append([rows[tuple(tail[:i])][tok] for i, tok in enumerate(tail)])
            except KeyError:
                raise ResourceError(f"{self.url} left out a requested token's "
                                    "log-probability") from None
        return out

    def echo_logprobs(self, prompt: list[int] | str, continuation: str) -> list[float]:
        """Log-probabilities of the tokens of `continuation` after `prompt` (a completion with
        `echo` and `logprobs`; the prompt prefix is served from the server's cache).

        For servers that compute prompt log-probabilities correctly (vLLM, SGLang).
        llama-cpp-python pairs each echoed token with the logits computed *at* it (one position
        late) and sorts the whole vocabulary per prompt token, so it is not asked this.
        """
        with self._lock:
            self._ensure_checked()
            if isinstance(prompt, str):
                full: list[int] | str = prompt + continuation
                n_prompt = None
            else:
                tail = self.tokenizer.encode_data(continuation)
                full, n_prompt = list(prompt) + list(tail), len(prompt)
            self._check_fits((len(full) if n_prompt is not None else 0) + 1)
            body = self._body(full, max_tokens=1, stop=())
            body.update(echo=True, logprobs=1)
            payload = self._complete(body)
        try:
            logprobs = payload["choices"][0]["logprobs"]
            values = logprobs["token_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise ResourceError(f"{self.url} did not return echoed log-probabilities "
                                "(completions with echo=true, logprobs=1)") from None
        if n_prompt is not None:
            picked = values[n_prompt:len(full)]
        else:
            offsets, tokens = logprobs.get("text_offset"), logprobs.get("tokens")
            if not offsets or not tokens:
                raise ResourceError(f"{self.url} returned log-probabilities without text offsets")
            start, end = len(prompt), len(full)
            picked = [v for v, off, tok in zip(values, offsets, tokens)
                      if off < end and off + len(tok) > start]
        if any(v is None for v in picked):
            raise ResourceError(f"{self.url} returned a null log-probability inside the "
                                "continuation")
        return [float(v) for v in picked]

    def close(self) -> None:
        if self._remote_tokenizer is not None:
            self._remote_tokenizer.close()
        self.http.close()

    def __enter__(self) -> "OpenAIResource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- request building --------------------------------------------------------------------

    def structured_fields(self, constraint: OutputConstraint) -> dict:
        """The request fields that make this server decode only what `constraint` allows.

        Empty when the server is not known to honour any (an unknown OpenAI-compatible server):
        the answer is then parsed like free text and counted invalid if it does not parse.
        """
        fields = dialects.structured_fields(self._structured_api(), constraint)
        if fields:
            return fields
        if not self._structured_warned:
            log.warning("%s: %s is not known to constrain its output; decisions are parsed "
                        "as free text", self.name, self.url)
            self._structured_warned = True
        return {}

    def _structured_api(self) -> str:
        if self.options.structured_api != "auto":
            return self.options.structured_api
        self._ensure_checked()
        return self.dialect.structured_api(self.info.version)

    def _resolved_prompt_mode(self) -> str:
        if self.prompt_mode is None:
            self._ensure_checked()
            self.prompt_mode = "tokens" if self.dialect.token_prompts else "text"
        return self.prompt_mode

    def _text_of(self, ids: Sequence[int], text: str | None) -> str | None:
        """The prompt text of `ids` in text mode (None in token mode).

        The caller's text (the CsrState's text mode) when given. Otherwise the ids are decoded
        and the text is checked to tokenize back to the same ids: it is not so when data spells
        a control token in a token-mode state, and then the server would read a control token.
        """
        if self._resolved_prompt_mode() == "tokens":
            return None
        if text is not None:
            return text
        decoded = self.tokenizer.decode(ids)
        if self.tokenizer.encode_template(decoded) != list(ids):
            msg = (f"{self.name}: {self.url} takes prompts as text, and these token ids do not "
                   "survive the round trip through text (data spelling a control token?): "
                   "build the CsrState with mode='text' (resource.state_mode)")
            raise ConfigError(msg)
        return decoded

    def _static_text_of(self, request: Request) -> str | None:
        """Text mode: the request's static text; O(new tokens) when it carries none."""
        if self._resolved_prompt_mode() == "tokens":
            return None
        if request.static_text is not None:
            return request.static_text
        n = len(self._committed_ids)          # _n_extended has checked that static extends it
        return self._committed_text + self._text_of(request.static_ids[n:], None)

    def _prompt(self, request: Request, static_text: str | None) -> list[int] | str:
        if static_text is None:
            return list(request.ids)
        return static_text + self._text_of(request.dynamic_ids, request.dynamic_text)

    def _body(self, prompt: list[int] | str, *, max_tokens: int, stop: Sequence[str]) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": int(max_tokens),
                "temperature": self.options.temperature, "stop": list(stop)}
        if self.options.seed is not None:
            body["seed"] = self.options.seed
        if self.dialect is not None and self.dialect.returns_token_ids:
            body["return_token_ids"] = True                 # generated ids per streamed piece
        body.update(self.extra_body)
        return body

    def _n_extended(self, request: Request) -> int:
        n = len(self._committed_ids)
        if request.static_ids[:n] != self._committed_ids:
            msg = (f"{self.name}: the request (version {request.version}) does not extend the "
                   f"{n} committed tokens; load() the state it was built against first")
            raise StateMismatchError(msg)
        return len(request.static_ids) - n

    def _check_fits(self, n_tokens: int) -> None:
        if n_tokens > self.max_context_tokens:
            msg = (f"{self.name}: {n_tokens} tokens exceed the context of "
                   f"{self.max_context_tokens} at {self.url}; evict (ASR) before this point")
            raise ContextOverflowError(msg)

    def _ensure_checked(self) -> None:
        if self.info is None:
            self.check_health()

    def _metadata_dir(self) -> Path:
        if self.options.model_dir is not None:
            return Path(self.options.model_dir)
        from csr_ros.model_catalog import catalog_model
        from csr_ros.model_store import resolve_model_dir

        if self.model is not None and catalog_model(self.model) is not None:
            return resolve_model_dir(self.model, weights=False)   # served under its own name
        return resolve_model_dir(weights=False)

    # -- HTTP --------------------------------------------------------------------------------

    def _complete(self, body: dict, *, read_timeout_s: float | None = None) -> dict:
        """A non-streamed completion's JSON body, sent with the committed run's routing key."""
        return self.http.complete("/v1/completions", body, headers=self._routed(None),
                                  read_timeout_s=read_timeout_s)

    def _send(self, body: dict, *, stream: bool, key: str | None = None) -> httpx.Response:
        """POST /v1/completions with the routing key `key` (default: the committed run's)."""
        return self.http.post("/v1/completions", body, stream=stream, headers=self._routed(key))

    def _routed(self, key: str | None) -> dict | None:
        key = self.routing_key if key is None else key
        self.last_routing_key = key
        return {ROUTING_KEY_HEADER: key} if key is not None else None


def connect(**options) -> OpenAIResource:
    """`make_resource("openai", **options)`: the options from keywords, then the resource."""
    return OpenAIResource(OpenAIOptions(**options))
