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

Over a robot's day, faults included:

- Write-ahead: a chunk is applied only once the chunk log holds it. When the log's disk is full
  the chunks are held here, in order, with the seqs they will have (the caller's stream moves
  on), and appended as soon as the log takes records again (every later `add_chunk` and a
  retry timer try); the state stays what a restart would rebuild from the log.
- `query_timeout_s` bounds a query from routing to answer: past it the caller gets a failed
  outcome at once, the resource counts as failed (failover), and a worker process that does
  not answer is killed; a stalled server or worker never blocks the policy.
- `capsule_every_s`: a capsule of the primary is saved into the chunk log after a version
  change (at most that often), so a restart restores it and prefills only what follows.
- A reload of the primary (a fallback, a failover) makes the loads and extends still queued
  for that resource pointless (a load replaces everything): they are skipped, unless a query
  waits among them. A burst of chunks after an outage that forces several fallbacks in a row
  then costs one reload, not one per fallback.
- What the driver remembers for reports (timeline, swaps, windows) is bounded.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from csr_ros.chunklog import ChunkLog, read_from_checkpoint, rebuild_state
from csr_ros.errors import (ChunkLogError, ChunkLogFullError, ConfigError, CsrError,
                            QueryCancelledError)
from csr_ros.eviction import EvictionPolicy, drop_oldest_fraction
from csr_ros.reconcile.machine import (ChunkArrived, Extend, Load, Notice, OpFinished,
                                       QueryFinished, QueryStalled, QueryStarted, ReconcileConfig,
                                       Reconciliation, Route, StartTimer, TimerFired,
                                       VersionChanged)
from csr_ros.resources.base import QueryResult, Resource
from csr_ros.serial_worker import SerialWorker
from csr_ros.state import Chunk, CsrState, Request, Seq
from csr_ros.waiting import wait_until

log = logging.getLogger(__name__)

HISTORY_EVENTS = 4096      # timeline events and reconciliation windows kept for reports
HISTORY_SWAPS = 16         # swap records kept (each holds a whole committed run)
MAX_HELD_CHUNKS = 100_000  # chunks held while the chunk log is full (days of a robot's stream)
HELD_RETRY_S = 1.0         # how often held chunks are tried again when nothing else arrives
HEDGE_RETRY_S = 0.5        # a late query with nowhere to be asked again looks again this often


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
    """Where every chunk is, taken under one lock: in the active state or evicted by policy
    (`evicted_runs`: runs `[first, end)` of consecutive seqs, in eviction order)."""

    active_seqs: tuple[int, ...]
    evicted_runs: tuple[tuple[int, int], ...]
    static_ids: tuple[int, ...]
    version: int
    primary: str
    counters: dict

    @property
    def evicted_seqs(self) -> tuple[int, ...]:
        return tuple(s for first, end in self.evicted_runs for s in range(first, end))

    def check(self, sent_seqs: Sequence[int]) -> dict:
        """Compare with every seq that was sent: lost, duplicated, out of order."""
        evicted = self.evicted_seqs
        kept = set(self.active_seqs) | set(evicted)
        lost = [s for s in sent_seqs if s not in kept]
        duplicated = len(self.active_seqs) + len(evicted) - len(kept)
        return {"lost": len(lost), "duplicated": duplicated,
                "in_order": list(evicted) + list(self.active_seqs) == list(sent_seqs)}


@dataclass(frozen=True)
class LogCheck:
    """The active state against the one the chunk log rebuilds (`Reconciler.log_check`)."""

    equal: bool                    # token ids, version and seqs all the same
    version: int
    log_version: int
    n_static_tokens: int
    log_static_tokens: int
    seqs: tuple[int, int]          # [first, next) of the active state's chunks
    log_seqs: tuple[int, int]
    held_chunks: int               # accepted, not in the log yet (the log was full)
    pending_versions: int          # version records the log still holds back


@dataclass
class SwapRecord:
    version: int
    primary: str
    committed_ids: tuple[int, ...]
    t_s: float


class Reconciler:
    """ASR over one (baselines) or two resources, for any `Resource`."""

    def __init__(self, state: CsrState, resources: Sequence[Resource], config: ReconcileConfig,
                 *, policy: EvictionPolicy = drop_oldest_fraction,
                 chunk_log: ChunkLog | None = None, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger | None = None, capsule_every_s: float | None = None):
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
        self.capsule_every_s = capsule_every_s
        # for reports, bounded: the newest events, windows and swaps
        self.timeline: collections.deque[TimelineEvent] = collections.deque(
            maxlen=HISTORY_EVENTS)
        self.swaps: collections.deque[SwapRecord] = collections.deque(maxlen=HISTORY_SWAPS)
        self.windows: collections.deque[tuple[float, float | None]] = collections.deque(
            maxlen=HISTORY_EVENTS)                 # reconciliation windows (start, end)
        self.held_since_s: float | None = None    # the chunk log is full since then
        self.held_episodes = 0                    # times chunks had to be held
        self.capsules_saved = 0
        self._held: list[Chunk] = []              # made, not logged yet (disk full), in order
        self._held_timer: threading.Timer | None = None
        self._capsule_s: float | None = None      # when the last capsule was asked for
        self._capsule_unsupported: set[str] = set()
        self.superseded_ops = 0                   # queued loads/extends a reload made moot
        self._queued: dict[str, list[tuple[str, int]]] = {n: [] for n in names}  # not started
        self._superseded: set[int] = set()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._workers = {name: SerialWorker(f"csr-{name}") for name in names}
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
        """Validate, tokenize, log (write-ahead) and append one input; never blocks on a model.

        Returns the chunks with their seqs. While the chunk log cannot take records (disk
        full) they are held, in order, and appended once it can (`held_chunks`); past
        MAX_HELD_CHUNKS held ones this raises ChunkLogFullError and takes nothing. A
        ChunkError (bad input) changes nothing either.
        """
        with self._lock:
            chunks = self.machine.active.make_chunks(raw, source=source, stamp_ns=stamp_ns)
            if self._held:
                if len(self._held) + len(chunks) > MAX_HELD_CHUNKS:
                    raise ChunkLogFullError(
                        f"{self.chunk_log.path}: {len(self._held)} chunks are held since the "
                        f"chunk log filled up {self.clock() - self.held_since_s:.0f} s ago; "
                        "no more are taken until it has space")
                first = self._held[-1].seq + 1
                chunks = [replace(c, seq=Seq(first + i)) for i, c in enumerate(chunks)]
            self._held.extend(chunks)
            self._append_held()
        return chunks

    @property
    def held_chunks(self) -> int:
        """Chunks accepted but not in the state yet: the chunk log could not take them."""
        with self._lock:
            return len(self._held)

    def _append_held(self) -> None:
        """Under the lock: log and apply held chunks in order, until the log refuses one."""
        while self._held:
            chunk = self._held[0]
            if self.chunk_log is not None:
                try:
                    self.chunk_log.append_chunk(chunk)
                except ChunkLogFullError as exc:
                    self._hold(exc)
                    return
            self._held.pop(0)
            self._handle(ChunkArrived(chunk, now_s=self.clock()))
        if self.held_since_s is not None:
            self.log.warning("the chunk log takes records again after %.1f s: the held chunks "
                             "are in the state, up to seq %d", self.clock() - self.held_since_s,
                             self.machine.active.next_seq - 1)
            self.held_since_s = None

    def _hold(self, exc: ChunkLogFullError) -> None:
        if self.held_since_s is None:
            self.held_since_s = self.clock()
            self.held_episodes += 1
            self.log.error("%s; chunk %d and the ones after it are held, in order, and join "
                           "the state once the log has room (decisions meanwhile see the state "
                           "without them)", exc, self._held[0].seq)
        if self._held_timer is None and not self._closed:
            self._held_timer = threading.Timer(HELD_RETRY_S, self._retry_held)
            self._held_timer.daemon = True
            self._held_timer.start()

    def _retry_held(self) -> None:
        with self._lock:
            self._held_timer = None
            if not self._closed:
                self._append_held()

    def new_stream(self) -> None:
        """The chunk stream began again at seq 0 (see `Reconciliation.new_stream`)."""
        with self._lock:
            if self._held:              # chunks of the old stream, which leaves the state anyway
                self.log.warning("the new stream drops %d chunks of the old one that were held "
                                 "(the chunk log was full)", len(self._held))
                self._held.clear()
            self._dispatch(self.machine.new_stream())
            self._changed.notify_all()

    def query(self, task: str, *, suffix: str = "", max_new_tokens: int = 8,
              stop: Sequence[str] = (), constraint=None, on_token=None,
              on_text=None) -> QueryOutcome:
        """Build a request against the active version and answer it on the resource holding it.
        `on_token` and `on_text` go to the resource's query (progress; what they raise ends
        the query). A QueryCancelledError they raise reaches the caller: the resource did not
        fail.

        With `hedge_after_s`, a query the primary has not answered by then, or that failed on
        it, is asked on the secondary too where it holds a consistent state (the machine's
        `hedge_state`): the first answer is the outcome, and the other one stops at its next
        token; its end is accounted when it comes."""
        config = self.config
        answered = threading.Event()
        ask = dict(max_new_tokens=max_new_tokens, stop=stop, constraint=constraint,
                   on_token=_unless(answered, on_token), on_text=_unless(answered, on_text))
        with self._lock:
            started_s = self.clock()
            inside = self.machine.reconciling
            route = self._route(QueryStarted(task=task, suffix=suffix,
                                             max_new_tokens=max_new_tokens, now_s=started_s))
            calls = {self._submit(route, started_s, ask): route}
        hedged = route.hedge or config.hedge_after_s is None
        hedge_tries = 0
        deadline_s = None if config.query_timeout_s is None else \
            started_s + config.query_timeout_s
        errors: list[tuple[Route, str]] = []
        outcome = None
        while outcome is None and calls:
            now_s = self.clock()
            waits = [t - now_s for t in (deadline_s, None if hedged else
                                         started_s + config.hedge_after_s +
                                         hedge_tries * HEDGE_RETRY_S) if t is not None]
            done, _ = futures_wait(list(calls), timeout=max(0.0, min(waits)) if waits else None,
                                   return_when=FIRST_COMPLETED)
            for future in done:
                answered_route = calls.pop(future)
                try:
                    wait_s, result = future.result()
                except QueryCancelledError:
                    self._finished(answered_route, True)
                    answered.set()
                    for other, other_route in calls.items():
                        other.add_done_callback(functools.partial(self._finished_later,
                                                                  other_route))
                    raise
                except Exception as exc:  # a failed resource is an outcome, not a crash
                    self.log.warning("query %d on %s failed: %s",
                                     answered_route.request.query_id, answered_route.resource,
                                     exc)
                    if not hedged:                # ask the secondary before the failover
                        hedged = True
                        calls.update(self._hedge(answered_route, task, suffix, started_s, ask))
                    self._finished(answered_route, False)
                    errors.append((answered_route, f"{type(exc).__name__}: {exc}"))
                    continue
                outcome = QueryOutcome(request=answered_route.request,
                                       resource=answered_route.resource, started_s=started_s,
                                       inside_window=inside, wait_s=wait_s,
                                       ttft_s=wait_s + result.ttft_s, result=result)
                self._finished(answered_route, True)
                break
            if outcome is not None or not calls:
                break
            now_s = self.clock()
            if deadline_s is not None and now_s >= deadline_s:
                for future, late in calls.items():
                    errors.append((late, self._timed_out(future, late)))
                calls = {}
                break
            if not hedged and now_s >= started_s + config.hedge_after_s + hedge_tries * \
                    HEDGE_RETRY_S:
                # nowhere to ask yet (a warm-up runs): again a little later, as a swap may come
                hedge_tries += 1
                more = self._hedge(route, task, suffix, started_s, ask)
                hedged = bool(more)
                calls.update(more)
        answered.set()                            # what still runs stops at its next token
        for future, late in calls.items():
            future.add_done_callback(functools.partial(self._finished_later, late))
        if outcome is None:
            failed, error = errors[-1]
            outcome = QueryOutcome(request=failed.request, resource=failed.resource,
                                   started_s=started_s, inside_window=inside, error=error)
        return outcome

    def _route(self, event) -> Route:
        """Under the lock: the machine's route for a query event; its other commands queued."""
        commands = self.machine.handle(event)
        (route,) = [c for c in commands if isinstance(c, Route)]
        self._dispatch([c for c in commands if not isinstance(c, Route)])
        return route

    def _submit(self, route: Route, started_s: float, ask: dict) -> Future:
        """Under the lock: queue `route` on its resource's worker."""
        marker = ("query", int(route.request.query_id))
        self._queued[route.resource].append(marker)
        return self._workers[route.resource].submit(
            lambda: self._answer(route, started_s=started_s, marker=marker, **ask))

    def _hedge(self, slow: Route, task: str, suffix: str, started_s: float,
               ask: dict) -> dict[Future, Route]:
        """`slow` is late or failed on the primary: ask the secondary, where it can."""
        with self._lock:
            commands = self.machine.handle(QueryStalled(
                slow.request.query_id, task=task, suffix=suffix,
                max_new_tokens=ask["max_new_tokens"], now_s=self.clock()))
            routes = [c for c in commands if isinstance(c, Route)]
            self._dispatch([c for c in commands if not isinstance(c, Route)])
            if not routes:
                return {}
            (route,) = routes
            self.timeline.append(TimelineEvent(self.clock(), "hedge",
                                               int(route.request.version),
                                               f"{slow.resource} late, asked {route.resource}"))
            self.log.warning("query %d on %s not answered after %.1f s: asked %s too (v%d, "
                             "the state it holds); %s is suspect until it answers",
                             slow.request.query_id, slow.resource, self.clock() - started_s,
                             route.resource, route.request.version, slow.resource)
            return {self._submit(route, started_s, ask): route}

    def _timed_out(self, future: Future, route: Route) -> str:
        """Past query_timeout_s: a query not started never runs, a running one is the
        resource's to end (a worker process is killed at the same deadline)."""
        timeout_s = self.config.query_timeout_s
        waited = "queued behind other work" if future.cancel() else "running"
        with self._lock:
            _discard(self._queued[route.resource], ("query", int(route.request.query_id)))
        self.log.warning("query %d on %s not answered within %.1f s (%s); %s counts as failed",
                         route.request.query_id, route.resource, timeout_s, waited,
                         route.resource)
        self._finished(route, False)
        return f"ResourceTimeoutError: not answered within {timeout_s:.1f} s ({waited})"

    def _finished(self, route: Route, ok: bool) -> None:
        with self._lock:
            if route.request.query_id in self.machine.queries:
                self._handle(QueryFinished(route.request.query_id, ok, now_s=self.clock()))

    def _finished_later(self, route: Route, future: Future) -> None:
        """The end of a query whose caller had its answer from the other resource."""
        if future.cancelled():
            return                                # accounted when it was cancelled
        exc = future.exception()
        self._finished(route, exc is None or isinstance(exc, QueryCancelledError))

    def _answer(self, route: Route, *, max_new_tokens: int, stop: Sequence[str],
                started_s: float, constraint=None, on_token=None, on_text=None,
                marker: tuple[str, int] | None = None) -> tuple[float, QueryResult]:
        if marker is not None:
            with self._lock:
                _discard(self._queued[route.resource], marker)
        resource = self.resources[route.resource]
        _set_background(resource, False, few_threads=self._urgent_reconciling())
        wait_s = self.clock() - started_s
        if route.cold:
            # Unordered baseline: nothing of the previous prompt is reused.
            load_started = self.clock()
            resource.load(())
            wait_s += self.clock() - load_started
        kwargs = {}
        if self.config.query_timeout_s is not None and resource.capabilities.timeout:
            # the deadline the caller waits for: a worker that does not answer by then dies
            kwargs["timeout_s"] = max(0.1, self.config.query_timeout_s - wait_s)
        return wait_s, resource.query(route.request, max_new_tokens=max_new_tokens, stop=stop,
                                      constraint=constraint, on_token=on_token,
                                      on_text=on_text, **kwargs)

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
                    "buffer_tokens": m.buffer_tokens, "held_chunks": len(self._held),
                    "superseded_ops": self.superseded_ops,
                    "primary_backlog": self._workers[m.primary].backlog,
                    "primary_reloading": m.primary_reloading, **vars(m.counters),
                    "headroom_s": v.headroom_s, "arrival_tokens_per_s": v.arrival_tokens_per_s,
                    "warm_tokens_per_s": v.warm_tokens_per_s,
                    "catchup_tokens_per_s": v.catchup_tokens_per_s,
                    "dt_warm_s": v.dt_warm_s, "dt_recon_s": v.dt_recon_s,
                    "time_to_full_s": v.time_to_full_s}

    def accounting(self) -> Accounting:
        with self._lock:
            m = self.machine
            return Accounting(active_seqs=tuple(int(c.seq) for c in m.active.chunks),
                              evicted_runs=tuple(m.evicted.runs),
                              static_ids=tuple(m.active.static_ids),
                              version=int(m.active.version), primary=m.primary,
                              counters=dict(vars(m.counters)))

    def log_check(self) -> LogCheck:
        """The state a restart would rebuild from the chunk log on disk (its checkpoint and
        what follows) against the active one, token for token, with nothing moving meanwhile.
        While the log is full, held chunks and version records make them differ: said in
        `held_chunks` and `pending_versions`."""
        assert self.chunk_log is not None, "log_check needs a chunk log"
        with self._lock:
            active = self.machine.active
            empty = CsrState(tokenizer=active.tokenizer, layout=active.layout,
                             profile=active.profile, mode=active.mode, policy=active.policy)
            rebuilt = rebuild_state(read_from_checkpoint(self.chunk_log.path), empty)
            seqs = [int(c.seq) for c in active.chunks]
            log_seqs = [int(c.seq) for c in rebuilt.chunks]
            return LogCheck(
                equal=(tuple(rebuilt.static_ids) == tuple(active.static_ids)
                       and rebuilt.version == active.version and log_seqs == seqs
                       and rebuilt.next_seq == active.next_seq),
                version=int(active.version), log_version=int(rebuilt.version),
                n_static_tokens=active.n_static, log_static_tokens=rebuilt.n_static,
                seqs=(seqs[0] if seqs else int(active.next_seq), int(active.next_seq)),
                log_seqs=(log_seqs[0] if log_seqs else int(rebuilt.next_seq),
                          int(rebuilt.next_seq)),
                held_chunks=len(self._held), pending_versions=self.chunk_log.pending_versions)

    def wait_idle(self, *, timeout_s: float | None = None) -> bool:
        """Wait until no reconciliation runs and every resource has finished its work."""
        with self._changed:
            return bool(wait_until(
                lambda: not self.machine.reconciling and not self.machine.primary_reloading
                and all(w.idle for w in self._workers.values()),
                timeout_s, interval_s=0.05, sleep=self._changed.wait, clock=self.clock))

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Stop the workers and timers; the resources and the chunk log belong to the caller.
        A worker still computing after `timeout_s` is left to finish on its daemon thread."""
        with self._lock:
            self._closed = True
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            if self._held_timer is not None:
                self._held_timer.cancel()
            if self._held:
                self.log.error("closing with %d chunks held (the chunk log was full): they are "
                               "not in the log; the stream's source has them from seq %d",
                               len(self._held), self._held[0].seq)
        deadline = time.monotonic() + timeout_s
        for worker in self._workers.values():
            worker.stop(timeout_s=max(0.0, deadline - time.monotonic()))

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
                queued = self._queued[cmd.resource]
                if isinstance(cmd, Load) and cmd.purpose != "warm" and \
                        all(kind == "op" for kind, _ in queued):
                    self._superseded.update(op_id for _, op_id in queued)
                queued.append(("op", cmd.op_id))
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
        self._ask_capsule(cmd, now_s)
        self.log.debug("v%d active (%s) on %s: chunks from %d, %d static tokens", cmd.version,
                 cmd.reason, cmd.primary, cmd.first_seq, self.machine.active.n_static)

    def _ask_capsule(self, cmd: VersionChanged, now_s: float) -> None:
        """Under the lock: queue a capsule of the new primary behind the work it has queued,
        so it is saved at a committed boundary of this version (at most every
        `capsule_every_s`)."""
        if self.chunk_log is None or self.capsule_every_s is None or \
                cmd.primary in self._capsule_unsupported:
            return
        if self._capsule_s is not None and now_s - self._capsule_s < self.capsule_every_s:
            return
        self._capsule_s = now_s
        version = int(cmd.version)
        self._workers[cmd.primary].submit(lambda: self._save_capsule(cmd.primary, version))

    def _save_capsule(self, name: str, version: int) -> None:
        """On the resource's worker thread: every op queued before this one has run, so the
        resource holds a prefix of `version` if it still is the primary of it."""
        with self._lock:
            if self._closed or self.machine.primary != name or \
                    int(self.machine.active.version) != version or \
                    self.machine.slots[name].failed:
                return
        resource = self.resources[name]
        caps = resource.capabilities
        try:
            if not caps.capsules and not (caps.worker and resource.call("capabilities").capsules):
                self._capsule_unsupported.add(name)
                self.log.info("%s cannot save capsules: a restart prefills the whole state", name)
                return
            started_s = self.clock()
            path = self.chunk_log.save_capsule(resource, version=version)
        except ChunkLogError as exc:      # disk full, or the version moved on: the next one
            self.log.info("no capsule of v%d: %s", version, exc)
            return
        except CsrError as exc:           # the resource failed: its queries will say so
            self.log.warning("capsule of v%d on %s failed: %s", version, name, exc)
            return
        self.capsules_saved += 1
        self.log.debug("capsule of v%d saved in %.2f s: %s", version, self.clock() - started_s,
                       path.name)

    def _run_op(self, cmd: Load | Extend) -> None:
        """On the resource's worker thread: run one Load/Extend, then report it."""
        with self._lock:
            _discard(self._queued[cmd.resource], ("op", cmd.op_id))
            if cmd.op_id in self._superseded:
                # a reload of this resource is queued behind it: nothing to compute
                self._superseded.discard(cmd.op_id)
                self.superseded_ops += 1
                self._handle(OpFinished(cmd.op_id, True, now_s=self.clock()))
                return
        resource = self.resources[cmd.resource]
        # The version is the routing key behind a router; a worker process enforces timeout_s.
        kwargs = {"version": int(cmd.version), "timeout_s": cmd.timeout_s}
        reconciling = cmd.purpose in ("warm", "catchup")
        urgent = self._urgent_reconciling()
        _set_background(resource, reconciling and not urgent, few_threads=reconciling or urgent)
        started_s = self.clock()
        ok, n_prefilled = True, len(cmd.ids)
        try:
            if isinstance(cmd, Load):
                n_prefilled = resource.load(cmd.ids, cmd.text, **kwargs).n_tokens
            else:
                n_prefilled = resource.extend(cmd.ids, cmd.text, **kwargs).n_tokens
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
            # what was prefilled, not what was sent: a load that reused what the resource
            # held must not make the measured prefill rate look faster than it is
            self._handle(OpFinished(cmd.op_id, ok, n_tokens=n_prefilled, seconds=seconds,
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


def _unless(answered: threading.Event, follow):
    """A query's progress callback that stops it once the caller has its answer elsewhere."""
    def call(value):
        if answered.is_set():
            raise QueryCancelledError("the other resource answered first")
        if follow is not None:
            follow(value)
    return call


def _discard(items: list, item) -> None:
    try:
        items.remove(item)
    except ValueError:
        pass


def _set_background(resource: Resource, background: bool, *,
                    few_threads: bool | None = None) -> None:
    """Background work (warm-up, catch-up) yields the CPU to queries where the resource can:
    a lower priority (`background`), and fewer compute threads (`few_threads`, default:
    `background`; an urgent reconciliation gets its priority back, not more threads)."""
    if resource.capabilities.background:
        resource.set_background(background, few_threads=few_threads)
