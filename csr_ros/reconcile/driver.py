"""Runs the ASR machine over real resources: one worker thread per resource, plain locks.

    caller threads ──add_chunk / query──▶ [lock: machine.handle] ──commands──▶ worker queues
    worker threads ──load / extend / query on a resource (no lock held)──▶ completion events

A resource doing background work (warm-up, catch-up) is asked to yield the CPU to the
primary's queries (`set_background`, where `capabilities.background` says it can: worker
processes, at a lower priority and on fewer threads), unless it may not finish before the
context is full (negative headroom, or the state past halfway to the limit), when finishing in
time matters more: then its priority comes back, its few threads stay, and the primary computes
on few threads too until the swap (at equal priority, more threads than cores would slow the
primary's queries many times over).

The machine lock is held only while the pure machine handles an event and the commands are
queued, never while a model computes. Each resource executes its commands first in, first
out, which is what the machine's routing assumes. A query never waits for a warm-up or a
catch-up: those run on the secondary's worker while the primary's worker answers queries.

TTFT is measured at one point: from the moment the query is built and routed to the first
sampled token, so it includes any wait behind a synchronous eviction on the same resource.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Sequence

from csr_ros.chunklog import ChunkLog
from csr_ros.errors import ConfigError, CsrError, QueryCancelledError
from csr_ros.eviction import EvictionPolicy, drop_oldest_fraction
from csr_ros.reconcile.machine import (ChunkArrived, Extend, Load, Notice, OpFinished,
                                       QueryFinished, QueryStarted, ReconcileConfig,
                                       Reconciliation, Route, StartTimer, TimerFired,
                                       VersionChanged)
from csr_ros.resources.base import QueryResult, Resource
from csr_ros.state import Chunk, CsrState, Request

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueryOutcome:
    request: Request
    resource: str
    started_s: float               # monotonic time the query was built
    inside_window: bool            # a reconciliation was running when it was built
    wait_s: float = 0.0            # queued behind other work on its resource
    ttft_s: float | None = None    # started → first sampled token (None if it failed)
    result: QueryResult | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None


@dataclass
class TimelineEvent:
    t_s: float                     # monotonic
    kind: str                      # evict (X_E derived) | swap | sync | fallback | failover | retry
    version: int
    detail: str = ""


@dataclass(frozen=True)
class Accounting:
    """Where every chunk is, taken under one lock: in the active state or evicted by policy."""

    active_seqs: tuple[int, ...]
    evicted_seqs: tuple[int, ...]
    static_ids: tuple[int, ...]
    version: int
    primary: str
    counters: dict

    def check(self, sent_seqs: Sequence[int]) -> dict:
        """Compare with every seq that was sent: lost, duplicated, out of order."""
        kept = set(self.active_seqs) | set(self.evicted_seqs)
        lost = [s for s in sent_seqs if s not in kept]
        duplicated = len(self.active_seqs) + len(self.evicted_seqs) - len(kept)
        return {"lost": len(lost), "duplicated": duplicated,
                "in_order": list(self.evicted_seqs) + list(self.active_seqs) == list(sent_seqs)}


@dataclass
class SwapRecord:
    version: int
    primary: str
    committed_ids: tuple[int, ...]
    t_s: float


class _Worker:
    """Runs submitted calls one at a time, in order, on its own thread."""

    def __init__(self, name: str):
        self.name = name
        self._queue: queue.Queue = queue.Queue()
        self._busy = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"csr-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], object]) -> Future:
        future: Future = Future()
        with self._lock:
            self._busy += 1
        self._queue.put((fn, future))
        return future

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._busy == 0

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            try:
                future.set_result(fn())
            except BaseException as exc:   # delivered to whoever waits on the future
                future.set_exception(exc)
            finally:
                with self._lock:
                    self._busy -= 1

    def stop(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)


class Reconciler:
    """ASR over one (baselines) or two resources, for any `Resource`."""

    def __init__(self, state: CsrState, resources: Sequence[Resource], config: ReconcileConfig,
                 *, policy: EvictionPolicy = drop_oldest_fraction,
                 chunk_log: ChunkLog | None = None, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger | None = None):
        names = [r.name for r in resources]
        if len(set(names)) != len(names):
            raise ConfigError(f"resources need distinct names, got {names}")
        limit = min(r.max_context_tokens for r in resources)
        if config.max_context_tokens > limit:
            msg = (f"max_context_tokens {config.max_context_tokens} is more than resource "
                   f"context {limit}")
            raise ConfigError(msg)
        self.config = config
        self.log = logger or log                # a node passes one that reaches /rosout
        self.resources = {r.name: r for r in resources}
        self.machine = Reconciliation(state, names, config, policy=policy)
        self.chunk_log = chunk_log
        self.clock = clock
        self.timeline: list[TimelineEvent] = []
        self.swaps: list[SwapRecord] = []
        self.windows: list[tuple[float, float | None]] = []   # reconciliation windows
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._workers = {name: _Worker(name) for name in names}
        self._timers: dict[int, threading.Timer] = {}
        self._closed = False

    # -- feeding and asking ----------------------------------------------------------------

    def start(self, *, wait: bool = True, timeout_s: float | None = None,
              preloaded: bool = False) -> None:
        """Load the primary with the current state (prefix and any rebuilt chunks).

        `preloaded`: the primary already holds exactly that state (see `chunklog.resume`).
        """
        with self._lock:
            self._dispatch(self.machine.start(preloaded=preloaded))
        if wait:
            self.wait_idle(timeout_s=timeout_s)

    def add_chunk(self, raw: str | bytes, *, source: str = "", stamp_ns: int = 0) -> list[Chunk]:
        """Validate, tokenize, log (write-ahead) and append one input; never blocks on a model."""
        with self._lock:
            chunks = self.machine.active.make_chunks(raw, source=source, stamp_ns=stamp_ns)
            for chunk in chunks:
                if self.chunk_log is not None:
                    self.chunk_log.append_chunk(chunk)
                self._handle(ChunkArrived(chunk, now_s=self.clock()))
        return chunks

    def new_stream(self) -> None:
        """The chunk stream began again at seq 0 (see `Reconciliation.new_stream`)."""
        with self._lock:
            self._dispatch(self.machine.new_stream())
            self._changed.notify_all()

    def query(self, task: str, *, suffix: str = "", max_new_tokens: int = 8,
              stop: Sequence[str] = (), constraint=None, on_token=None) -> QueryOutcome:
        """Build a request against the active version and answer it on the resource holding it.
        `on_token` goes to the resource's query (progress; what it raises ends the query). A
        QueryCancelledError it raises reaches the caller: the resource did not fail."""
        with self._lock:
            started_s = self.clock()
            inside = self.machine.reconciling
            commands = self.machine.handle(QueryStarted(task=task, suffix=suffix,
                                                        max_new_tokens=max_new_tokens,
                                                        now_s=started_s))
            (route,) = [c for c in commands if isinstance(c, Route)]
            self._dispatch([c for c in commands if not isinstance(c, Route)])
            future = self._workers[route.resource].submit(
                lambda: self._answer(route, max_new_tokens, stop, started_s, constraint,
                                     on_token))
        outcome: QueryOutcome
        try:
            wait_s, result = future.result()
            outcome = QueryOutcome(request=route.request, resource=route.resource,
                                   started_s=started_s, inside_window=inside, wait_s=wait_s,
                                   ttft_s=wait_s + result.ttft_s, result=result)
        except QueryCancelledError:
            with self._lock:
                self._handle(QueryFinished(route.request.query_id, True, now_s=self.clock()))
            raise
        except Exception as exc:  # a failed resource is an outcome, not a crash of the policy
            self.log.warning("query %d on %s failed: %s", route.request.query_id,
                             route.resource, exc)
            outcome = QueryOutcome(request=route.request, resource=route.resource,
                                   started_s=started_s, inside_window=inside,
                                   error=f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._handle(QueryFinished(route.request.query_id, outcome.ok, now_s=self.clock()))
        return outcome

    def _answer(self, route: Route, max_new_tokens: int, stop: Sequence[str],
                started_s: float, constraint=None, on_token=None) -> tuple[float, QueryResult]:
        resource = self.resources[route.resource]
        _set_background(resource, False, few_threads=self._urgent_reconciling())
        wait_s = self.clock() - started_s
        if route.cold:
            # Unordered baseline: nothing of the previous prompt is reused.
            load_started = self.clock()
            resource.load(())
            wait_s += self.clock() - load_started
        return wait_s, resource.query(route.request, max_new_tokens=max_new_tokens, stop=stop,
                                      constraint=constraint, on_token=on_token)

    # -- state for callers -----------------------------------------------------------------

    @property
    def primary(self) -> Resource:
        return self.resources[self.machine.primary]

    def at_risk(self, n_tokens: int) -> bool:
        """True while a reconciliation runs and `n_tokens` more static tokens would fill the
        context before it ends (the next chunk of that size would force a fallback)."""
        with self._lock:
            return self.machine.reconciling and n_tokens > self.machine.context_room_tokens

    def capacity(self):
        """Eq. 54 from the measurements so far (`Reconciliation.capacity`)."""
        with self._lock:
            return self.machine.capacity()

    def snapshot(self) -> dict:
        """Counters, phase, version and viability, consistent with each other."""
        with self._lock:
            m = self.machine
            v = m.viability()
            return {"phase": m.phase.value, "version": int(m.active.version),
                    "primary": m.primary, "n_static_tokens": m.active.n_static,
                    "n_chunks": len(m.active.chunks), "next_seq": int(m.active.next_seq),
                    "buffer_tokens": m.buffer_tokens, **vars(m.counters),
                    "headroom_s": v.headroom_s, "arrival_tokens_per_s": v.arrival_tokens_per_s,
                    "warm_tokens_per_s": v.warm_tokens_per_s,
                    "catchup_tokens_per_s": v.catchup_tokens_per_s,
                    "dt_warm_s": v.dt_warm_s, "dt_recon_s": v.dt_recon_s,
                    "time_to_full_s": v.time_to_full_s}

    def accounting(self) -> Accounting:
        with self._lock:
            m = self.machine
            return Accounting(active_seqs=tuple(int(c.seq) for c in m.active.chunks),
                              evicted_seqs=tuple(int(s) for s in m.evicted_seqs),
                              static_ids=tuple(m.active.static_ids),
                              version=int(m.active.version), primary=m.primary,
                              counters=dict(vars(m.counters)))

    def wait_idle(self, *, timeout_s: float | None = None) -> bool:
        """Wait until no reconciliation runs and every resource has finished its work."""
        deadline = None if timeout_s is None else self.clock() + timeout_s
        with self._changed:
            while True:
                if not self.machine.reconciling and not self.machine.primary_reloading and \
                        all(w.idle for w in self._workers.values()):
                    return True
                left = None if deadline is None else deadline - self.clock()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(0.05 if left is None else min(left, 0.05))

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Stop the workers and timers; the resources and the chunk log belong to the caller.
        A worker still computing after `timeout_s` is left to finish on its daemon thread."""
        with self._lock:
            self._closed = True
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
        deadline = time.monotonic() + timeout_s
        for worker in self._workers.values():
            worker.stop(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "Reconciler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the machine's commands ------------------------------------------------------------

    def _handle(self, event) -> None:
        """Under the lock: one machine step, then queue its commands."""
        was_reconciling = self.machine.reconciling
        commands = self.machine.handle(event)
        now_s = self.clock()
        if not was_reconciling and self.machine.reconciling:
            self.windows.append((now_s, None))
            self.timeline.append(TimelineEvent(now_s, "evict", int(self.machine.pending.version),
                                               f"X_E {self.machine.pending.n_static} tokens"))
        self._dispatch(commands)
        if was_reconciling and not self.machine.reconciling and self.windows:
            self.windows[-1] = (self.windows[-1][0], now_s)
        if self._urgent_reconciling_locked():
            # running background work must not miss the deadline: give it the CPU back now
            _set_background(self.resources[self.machine.secondary], False, few_threads=True)
        self._changed.notify_all()

    def _dispatch(self, commands) -> None:
        for cmd in commands:
            if isinstance(cmd, (Load, Extend)):
                self._workers[cmd.resource].submit(lambda cmd=cmd: self._run_op(cmd))
            elif isinstance(cmd, StartTimer):
                if not self._closed:
                    timer = threading.Timer(cmd.delay_s, self._fire, args=(cmd.timer_id,))
                    timer.daemon = True
                    self._timers[cmd.timer_id] = timer
                    timer.start()
                    self.timeline.append(TimelineEvent(self.clock(), "retry",
                                                       int(self.machine.active.version)))
            elif isinstance(cmd, VersionChanged):
                self._version_changed(cmd)
            elif isinstance(cmd, Notice):
                self.log.log(logging.WARNING if cmd.level == "warning" else logging.INFO, "%s",
                        cmd.message)
            else:
                raise AssertionError(f"unexpected command {cmd!r}")

    def _version_changed(self, cmd: VersionChanged) -> None:
        now_s = self.clock()
        if self.chunk_log is not None:
            active = self.machine.active
            self.chunk_log.append_version(cmd.version, cmd.first_seq, cmd.next_seq, cmd.reason,
                                          n_static_tokens=active.n_static
                                          if active.version == cmd.version else None)
        self.timeline.append(TimelineEvent(now_s, cmd.reason, int(cmd.version),
                                           f"primary {cmd.primary}"))
        if cmd.reason == "swap":
            self.swaps.append(SwapRecord(int(cmd.version), cmd.primary, cmd.committed_ids, now_s))
        self.log.debug("v%d active (%s) on %s: chunks from %d, %d static tokens", cmd.version,
                 cmd.reason, cmd.primary, cmd.first_seq, self.machine.active.n_static)

    def _run_op(self, cmd: Load | Extend) -> None:
        """On the resource's worker thread: run one Load/Extend, then report it."""
        resource = self.resources[cmd.resource]
        # The version is the routing key behind a router; a worker process enforces timeout_s.
        kwargs = {"version": int(cmd.version), "timeout_s": cmd.timeout_s}
        reconciling = cmd.purpose in ("warm", "catchup")
        urgent = self._urgent_reconciling()
        _set_background(resource, reconciling and not urgent, few_threads=reconciling or urgent)
        started_s = self.clock()
        ok = True
        try:
            if isinstance(cmd, Load):
                resource.load(cmd.ids, cmd.text, **kwargs)
            else:
                resource.extend(cmd.ids, cmd.text, **kwargs)
        except CsrError as exc:
            ok = False
            self.log.warning("%s of v%d on %s failed: %s", type(cmd).__name__.lower(), cmd.version,
                        cmd.resource, exc)
        except Exception:  # a bug in a backend must not stop the reconciler
            ok = False
            self.log.exception("%s of v%d on %s raised", type(cmd).__name__.lower(), cmd.version,
                          cmd.resource)
        seconds = self.clock() - started_s
        with self._lock:
            self._handle(OpFinished(cmd.op_id, ok, n_tokens=len(cmd.ids), seconds=seconds,
                                    now_s=self.clock()))

    def _urgent_reconciling(self) -> bool:
        """A reconciliation is running and must finish in time. Its secondary then computes at
        full priority, so the primary's work runs on few threads too: two resources of equal
        priority on more threads than cores slow each other down many times over (every op
        of one waits for a thread the other holds), the primary's queries most of all."""
        with self._lock:
            return self._urgent_reconciling_locked()

    def _urgent_reconciling_locked(self) -> bool:
        return (self.machine.reconciling and self.machine.secondary is not None
                and self._urgent_locked())

    def _urgent_locked(self) -> bool:
        """The reconciliation may not finish before the context is full: the headroom is
        negative, or the active state is past halfway from tau_mem to the context limit."""
        m, cfg = self.machine, self.config
        headroom_s = m.viability().headroom_s
        limit = cfg.max_context_tokens - cfg.reserve_tokens
        halfway = cfg.tau_mem_tokens + (limit - cfg.tau_mem_tokens) // 2
        return (headroom_s is not None and headroom_s < 0) or m.active.n_static >= halfway

    def _fire(self, timer_id: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._timers.pop(timer_id, None)
            self._handle(TimerFired(timer_id, now_s=self.clock()))


def _set_background(resource: Resource, background: bool, *,
                    few_threads: bool | None = None) -> None:
    """Background work (warm-up, catch-up) yields the CPU to queries where the resource can:
    a lower priority (`background`), and fewer compute threads (`few_threads`, default:
    `background`; an urgent reconciliation gets its priority back, not more threads)."""
    if resource.capabilities.background:
        resource.set_background(background, few_threads=few_threads)
