"""The gateway's sessions: each one a CsrState and a Reconciler over its own pair of resources.

    complete(key, prompt) ──▶ session (created, or the least recently used idle one closed)
        plan = transcript.plan(prompt)                    pure (session.py)
        extends  → reconciler.add_chunk(m) for each new message, then reconciler.query(dynamic)
        new version → a new state holding the whole history, a new Reconciler on the same
                      resources (the old one finished and closed first), then the query
        on_start(Started) once the messages are held; on_text(text so far) as it is decoded

A caller that stops following the answer (a streaming client that went away) raises from
`on_text`: the decode stops between two tokens, the messages appended stay (the next request
extends them), and complete() raises QueryCancelledError.

ASR runs inside each session's Reconciler as it does in the nodes: when the history reaches
`tau_mem_tokens`, old chunks are evicted on the secondary in the background and swapped in;
the session's transcript keeps every message, so the client's next resend still extends it.

One request at a time per session (a lock); sessions run side by side. No sockets here: the
HTTP adapter is app.py.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from csr_ros.actions import OutputConstraint
from csr_ros.errors import (ConfigError, GatewayBusyError, GatewayRequestError,
                            QueryCancelledError, ResourceUnavailableError)
from csr_ros.gateway.session import Plan, Prompt, Transcript, lru_victim
from csr_ros.layout import Layout
from csr_ros.reconcile.driver import Reconciler
from csr_ros.reconcile.machine import ReconcileConfig
from csr_ros.resources.base import Resource
from csr_ros.state import CsrState
from csr_ros.tokenizer import Tokenizer

log = logging.getLogger(__name__)

#: completions prompts are raw text: no chat template around the lines
RAW_LAYOUT = Layout(head_text="", mid_text="", tail_text="", head_ids=(), mid_ids=(),
                    tail_ids=())


@dataclass
class Backend:
    """What one session runs on: two resources (R1, R2) and the tokenizer of their model."""

    resources: list[Resource]
    tokenizer: Tokenizer
    state_mode: str = "token"          # "token" (ids) or "text" (servers that take text)

    def close(self) -> None:
        for resource in self.resources:
            try:
                resource.close()
            except Exception:          # closing must reach every resource
                log.exception("closing %s failed", getattr(resource, "name", resource))


#: session key -> its backend (called once per session, outside any gateway lock)
BackendFactory = Callable[[str], Backend]


def backend_factory(resource: str, *, model: str, max_context_tokens: int, tau_mem_tokens: int,
                    r1: str | None = None, r2: str | None = None, threads: int | None = None,
                    background_threads: int = 1, dtype: str = "auto") -> BackendFactory:
    """Two fresh resources named r1 and r2 per session, and their tokenizer: `local` engines
    in worker processes, or the `openai` servers at r1 and r2."""
    from csr_ros.model_store import resolve_model_dir

    model_dir = resolve_model_dir(model, weights=False)
    if resource == "openai":
        if not r1 or not r2:
            raise ConfigError("--resource openai needs --r1 URL and --r2 URL")
        from csr_ros.resources.factory import make_resource

        def openai_backend(key: str) -> Backend:
            resources = [make_resource("openai", url=url, name=name, model_dir=model_dir,
                                       max_context_tokens=max_context_tokens,
                                       tau_mem_tokens=tau_mem_tokens)
                         for url, name in ((r1, "r1"), (r2, "r2"))]
            return Backend(resources, resources[0].tokenizer, resources[0].state_mode)

        return openai_backend
    from csr_ros.resources.process import start_side_by_side
    from csr_ros.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(model_dir)
    threads = threads or min(2, os.cpu_count() or 1)

    def local_backend(key: str) -> Backend:
        resources = start_side_by_side(("r1", "r2"), "local", model=model, threads=threads,
                                       dtype=dtype, background_threads=background_threads,
                                       max_context_tokens=max_context_tokens)
        return Backend(resources, tokenizer, "token")

    return local_backend


@dataclass(frozen=True)
class GatewayConfig:
    reconcile: ReconcileConfig
    default_profile: str = "You are a helpful assistant."
    max_sessions: int = 4
    default_max_tokens: int = 64
    start_timeout_s: float = 600.0
    model_name: str = "csr-ros"

    def __post_init__(self):
        if self.max_sessions < 1:
            raise ConfigError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if not 1 <= self.default_max_tokens <= self.reconcile.reserve_tokens:
            msg = (f"default_max_tokens must be 1..reserve_tokens "
                   f"({self.reconcile.reserve_tokens}), got {self.default_max_tokens}")
            raise ConfigError(msg)


@dataclass(frozen=True)
class Started:
    """A request's messages are held (appended, or a new version loaded); its query begins."""

    session: str
    version: int
    new_version: bool
    reason: str
    n_appended: int
    n_held: int


@dataclass(frozen=True)
class Completion:
    """One answer, with the accounting a client sees in `usage` and in the `csr` field."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    cached_source: str                 # "resource" (the server said) | "gateway" (committed run)
    ttft_s: float                      # query routed → first token (the reconciler's figure)
    session: str
    version: int                       # the session's conversation version (1, 2, …)
    new_version: bool
    reason: str
    n_appended: int                    # messages appended as chunks by this request
    n_held: int                        # history messages reused from the session
    state_version: int                 # the ASR state version the query was built against
    n_static: int
    n_dynamic: int
    i_star: int
    resource: str

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    def csr_fields(self) -> dict:
        return {"session": self.session, "version": self.version,
                "new_version": self.new_version, "reason": self.reason,
                "appended": self.n_appended, "held": self.n_held,
                "state_version": self.state_version, "n_static": self.n_static,
                "n_dynamic": self.n_dynamic, "i_star": self.i_star, "resource": self.resource,
                "ttft_s": self.ttft_s, "cached_source": self.cached_source}


@dataclass
class _Session:
    key: str
    transcript: Transcript = field(default_factory=Transcript)
    backend: Backend | None = None
    reconciler: Reconciler | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0                 # under the gateway's lock
    decoding: bool = False             # a query of this session is being decoded
    decoded_chars: int = 0             # its answer's text so far
    cancelled: int = 0                 # queries stopped because the caller went away

    def close(self) -> None:
        if self.reconciler is not None:
            self.reconciler.close()
        if self.backend is not None:
            self.backend.close()


class Gateway:
    """Sessions keyed by the client's session id, at most `config.max_sessions` of them."""

    def __init__(self, factory: BackendFactory, config: GatewayConfig):
        self.factory = factory
        self.config = config
        self._sessions: OrderedDict[str, _Session] = OrderedDict()   # least recent first
        self._lock = threading.Lock()
        self.sessions_closed = 0
        self._closed = False

    # -- the one entry point ---------------------------------------------------------------

    def complete(self, key: str, prompt: Prompt, *, max_tokens: int | None = None,
                 stop: Sequence[str] = (), constraint: OutputConstraint | None = None,
                 on_start: Callable[[Started], None] | None = None,
                 on_text: Callable[[str], None] | None = None) -> Completion:
        """Answer `prompt` in session `key`. `constraint`: the grammar the answer is decoded
        under (tools, response_format); such an answer is complete when its grammar ends, so
        its default budget is the largest (reserve_tokens) rather than default_max_tokens."""
        max_tokens = self._check_max_tokens(max_tokens, constrained=constraint is not None)
        session = self._acquire(key)
        try:
            with session.lock:
                if session.backend is None:
                    session.backend = self.factory(key)
                plan = session.transcript.plan(prompt)
                if plan.new_version:
                    self._new_version(session, prompt, plan)
                else:
                    for text in plan.append:
                        session.reconciler.add_chunk(text, source=prompt.kind,
                                                     stamp_ns=time.time_ns())
                        session.transcript.appended(text)
                version = session.transcript.version
                if on_start is not None:
                    on_start(Started(key, version, plan.new_version, plan.reason,
                                     len(plan.append), plan.n_held))
                outcome = self._query(session, plan.dynamic, max_tokens=max_tokens, stop=stop,
                                      constraint=constraint, on_text=on_text)
        finally:
            self._release(session)
        if not outcome.ok:
            msg = (f"session {key!r}: the query failed on {outcome.resource}: {outcome.error}; "
                   "the messages are kept, retry when the resource is back")
            raise ResourceUnavailableError(msg)
        result, request = outcome.result, outcome.request
        reported = result.cached_tokens
        cached = reported if reported is not None else request.n_static - result.n_extended
        return Completion(
            text=result.text, token_ids=tuple(result.token_ids),
            finish_reason=result.finish_reason, prompt_tokens=result.n_prompt,
            cached_tokens=int(cached), cached_source="resource" if reported is not None
            else "gateway", ttft_s=outcome.ttft_s, session=key, version=version,
            new_version=plan.new_version, reason=plan.reason,
            n_appended=len(plan.append), n_held=plan.n_held,
            state_version=int(request.version), n_static=request.n_static,
            n_dynamic=request.n_dynamic, i_star=request.i_star, resource=outcome.resource)

    def _query(self, session: _Session, dynamic: str, *, max_tokens: int,
               stop: Sequence[str], constraint: OutputConstraint | None,
               on_text: Callable[[str], None] | None):
        """Under the session's lock: the reconciler's query, followed in `session`'s stats."""
        def follow(text: str) -> None:
            session.decoded_chars = len(text)
            if on_text is not None:
                on_text(text)

        session.decoding, session.decoded_chars = True, 0
        try:
            return session.reconciler.query(dynamic, max_new_tokens=max_tokens,
                                            stop=tuple(stop), constraint=constraint,
                                            on_text=follow)
        except QueryCancelledError as exc:
            session.cancelled += 1
            log.info("session %r: the decode stopped after %d characters (%s); the messages "
                     "are kept", session.key, session.decoded_chars, exc)
            raise
        finally:
            session.decoding = False

    # -- sessions --------------------------------------------------------------------------

    def session_stats(self) -> list[dict]:
        with self._lock:
            sessions = list(self._sessions.values())
        rows = []
        for s in sessions:
            row = {"session": s.key, "version": s.transcript.version,
                   "new_versions": s.transcript.new_versions,
                   "messages": len(s.transcript.items), "in_flight": s.in_flight,
                   "decoding": s.decoding, "decoded_chars": s.decoded_chars,
                   "cancelled": s.cancelled}
            if s.reconciler is not None:
                row["reconciler"] = {k: _finite(v) for k, v in s.reconciler.snapshot().items()}
            rows.append(row)
        return rows

    def reconciler_of(self, key: str) -> Reconciler | None:
        with self._lock:
            session = self._sessions.get(key)
        return None if session is None else session.reconciler

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            with session.lock:
                session.close()

    def _acquire(self, key: str) -> _Session:
        victim = None
        with self._lock:
            if self._closed:
                raise ResourceUnavailableError("the gateway is shutting down")
            session = self._sessions.get(key)
            if session is None:
                if len(self._sessions) >= self.config.max_sessions:
                    busy = {k for k, s in self._sessions.items() if s.in_flight}
                    victim_key = lru_victim(list(self._sessions), busy)
                    if victim_key is None:
                        msg = (f"all {self.config.max_sessions} sessions have a request in "
                               "flight; retry later or start the gateway with more "
                               "--max-sessions")
                        raise GatewayBusyError(msg)
                    victim = self._sessions.pop(victim_key)
                    self.sessions_closed += 1
                session = self._sessions[key] = _Session(key)
            self._sessions.move_to_end(key)
            session.in_flight += 1
        if victim is not None:
            log.info("session %r closed to make room for %r (at most %d sessions)",
                     victim.key, key, self.config.max_sessions)
            with victim.lock:
                victim.close()
        return session

    def _release(self, session: _Session) -> None:
        with self._lock:
            session.in_flight -= 1

    def _new_version(self, session: _Session, prompt: Prompt, plan: Plan) -> None:
        """A fresh state holding the prompt's whole history, on the session's resources."""
        backend = session.backend
        layout = Layout.from_tokenizer(backend.tokenizer) if prompt.kind == "chat" \
            else RAW_LAYOUT
        state = CsrState(tokenizer=backend.tokenizer, layout=layout, profile=prompt.profile,
                         mode=backend.state_mode)
        stamp_ns = time.time_ns()
        for text in plan.append:          # validates every message before anything changes
            state.add(text, source=prompt.kind, stamp_ns=stamp_ns)
        old, broke = session.reconciler, session.transcript.profile is not None
        if old is not None:
            # The old version's work (a warm-up, a catch-up) finishes first: one caller per
            # resource at a time.
            old.wait_idle(timeout_s=self.config.start_timeout_s)
            old.close()
            session.reconciler = None
        try:
            reconciler = Reconciler(state, backend.resources, self.config.reconcile, logger=log)
        except BaseException:
            session.transcript.forget()    # the next prompt starts a version again
            raise
        session.transcript.start_version(prompt, broke_prefix=broke)
        for text in plan.append:
            session.transcript.appended(text)
        (log.warning if broke else log.info)(
            "session %r: version %d (%s): %d messages as chunks, %d tokens", session.key,
            session.transcript.version, plan.reason, len(plan.append), state.n_static)
        session.reconciler = reconciler
        reconciler.start(timeout_s=self.config.start_timeout_s)

    def _check_max_tokens(self, max_tokens: int | None, *, constrained: bool) -> int:
        limit = self.config.reconcile.reserve_tokens
        if max_tokens is None:
            return limit if constrained else self.config.default_max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) \
                or not 1 <= max_tokens <= limit:
            msg = (f"max_tokens must be an integer 1..{limit} (the gateway's reserve_tokens), "
                   f"got {max_tokens!r}")
            raise GatewayRequestError(msg)
        return max_tokens


def _finite(value):
    """JSON has no infinity: a rate or a time that is not finite yet reads as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
