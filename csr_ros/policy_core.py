"""What the policy node does, without ROS: fold events into a CsrState, schedule queries,
build the dynamic suffix, summarise health.

    SeqOrderer       chunk events in any order → gap-free; asks for missing ranges
    StateFold        csr/chunks + csr/swaps → CsrState (the policy's view of the state)
    QueryScheduler   ticks at rate_hz; never starts a query while one runs; counts skips
    build_suffix     latest 'instant' values + the current time → X_suffix
    diagnose         counters and the last result → (level, message, key/values)

The node feeds plain views of its messages (`ChunkEvent`, `SwapEvent`) into these and turns
their outputs back into ROS calls. Pure: no rclpy, no threads, no clocks (times come in).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Mapping, Sequence

from csr_ros.errors import ChunkError, ConfigError
from csr_ros.resources.base import QueryResult
from csr_ros.state import Chunk, CsrState, Seq, Version

# diagnostic_msgs/DiagnosticStatus levels
OK, WARN, ERROR = 0, 1, 2


# -- events (plain views of the messages) -------------------------------------------------------

@dataclass(frozen=True)
class ChunkEvent:
    """A StateChunk: `seq` is gap-free on csr/chunks."""

    seq: int
    source: str
    stamp_ns: int
    text: str


@dataclass(frozen=True)
class SwapEvent:
    """A SwapEvent: version `version` is active on `primary`; chunks before
    `evicted_before_seq` were evicted by policy."""

    version: int
    primary: str
    primary_url: str = ""
    evicted_before_seq: int = 0
    caught_up_to_seq: int = 0
    reason: str = "swap"


@dataclass(frozen=True)
class FetchRequest:
    """Ask the aggregator's GetChunks for chunks start_seq <= seq < end_seq."""

    start_seq: int
    end_seq: int


# -- the fold -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lost:
    """Seqs start_seq <= seq < end_seq will never arrive (the aggregator no longer has them)."""

    start_seq: int
    end_seq: int


@dataclass
class OrderCounters:
    delivered: int = 0
    duplicates: int = 0          # seq already delivered (or evicted): ignored
    buffered: int = 0            # arrived ahead of a gap, held until the gap is filled
    fetches: int = 0
    fetch_failures: int = 0
    lost: int = 0                # seqs given up on


@dataclass(frozen=True)
class Step:
    """What one input produced: in-order items to apply, and a range to fetch (if any)."""

    items: tuple[ChunkEvent | Lost, ...] = ()
    fetch: FetchRequest | None = None


class SeqOrderer:
    """Chunk events in any order → a gap-free sequence; gaps become fetch requests.

    An event with the expected seq is delivered at once, with any held ones that follow it.
    One that arrives early is held and the missing range is requested (one request at a time).
    When the answer comes, seqs the aggregator no longer has are given up as `Lost`, so a late
    joiner always converges and the loss is visible.
    """

    def __init__(self, next_seq: int = 0, *, max_held: int = 100_000, max_fetch_attempts: int = 3):
        self.next_seq = next_seq
        self.max_held = max_held
        self.max_fetch_attempts = max_fetch_attempts
        self.counters = OrderCounters()
        self._held: dict[int, ChunkEvent] = {}
        self._fetching: FetchRequest | None = None
        self._attempts = 0

    @property
    def n_held(self) -> int:
        return len(self._held)

    @property
    def fetching(self) -> FetchRequest | None:
        return self._fetching

    def offer(self, event: ChunkEvent) -> Step:
        if event.seq < self.next_seq or event.seq in self._held:
            self.counters.duplicates += 1
            return Step()
        items: list = []
        if len(self._held) >= self.max_held and event.seq > self.next_seq:
            # a gap that never fills must not grow memory without bound: give it up
            items += self._skip_to(min(self._held))
        self._held[event.seq] = event
        if event.seq > self.next_seq:
            self.counters.buffered += 1
        items += self._drain()
        return Step(tuple(items), self._request_gap())

    def fetched(self, events: Sequence[ChunkEvent], first_available_seq: int) -> Step:
        """The GetChunks answer: events (any order) and the oldest seq the aggregator has."""
        self._fetching, self._attempts = None, 0
        for event in events:
            if event.seq >= self.next_seq and event.seq not in self._held:
                self._held[event.seq] = event
        items = self._drain()
        if self._held and self.next_seq < first_available_seq:
            items += self._skip_to(min(first_available_seq, min(self._held)))
        return Step(tuple(items), self._request_gap())

    def fetch_failed(self) -> Step:
        """GetChunks did not answer (timeout, no service): retry, then give the gap up."""
        self.counters.fetch_failures += 1
        self._fetching = None
        self._attempts += 1
        items: list = []
        if self._attempts >= self.max_fetch_attempts and self._held:
            self._attempts = 0
            items = self._skip_to(min(self._held))
        return Step(tuple(items), self._request_gap())

    def advance_to(self, seq: int) -> Step:
        """Seqs before `seq` are no longer wanted (evicted): drop them, held or missing."""
        for held in [s for s in self._held if s < seq]:
            del self._held[held]
        self.next_seq = max(self.next_seq, seq)
        return Step(tuple(self._drain()), self._request_gap())

    def gap(self) -> FetchRequest | None:
        return self._request_gap()

    def probe(self) -> FetchRequest | None:
        """At start: ask for everything from next_seq to the newest (end_seq 0), so a node that
        joins while the stream is quiet still gets the history."""
        if self._fetching is not None:
            return None
        self._fetching = FetchRequest(start_seq=self.next_seq, end_seq=0)
        self.counters.fetches += 1
        return self._fetching

    def fetched_all(self, events: Sequence[ChunkEvent], first_available_seq: int) -> Step:
        """The answer to `probe`: like `fetched`, and what is older than the oldest available
        chunk is given up even when nothing newer is held yet."""
        step = self.fetched(events, first_available_seq)
        if self.next_seq < first_available_seq and not self._held:
            items = self._skip_to(first_available_seq)
            return Step(step.items + tuple(items), step.fetch)
        return step

    def _drain(self) -> list[ChunkEvent]:
        out = []
        while self.next_seq in self._held:
            out.append(self._held.pop(self.next_seq))
            self.next_seq += 1
            self.counters.delivered += 1
        return out

    def _skip_to(self, seq: int) -> list:
        items: list = []
        if seq > self.next_seq:
            items.append(Lost(self.next_seq, seq))
            self.counters.lost += seq - self.next_seq
            self.next_seq = seq
        return items + self._drain()

    def _request_gap(self) -> FetchRequest | None:
        if not self._held or self._fetching is not None:
            return None
        self._fetching = FetchRequest(start_seq=self.next_seq, end_seq=min(self._held))
        self.counters.fetches += 1
        return self._fetching


@dataclass
class FoldCounters:
    rejected: int = 0            # text the chunk policy refused (a placeholder took its seq)
    swaps: int = 0
    stale_swaps: int = 0


class StateFold:
    """Chunks and swaps in, a gap-free CsrState out (the policy node's view of the state).

    Ordering and fetching is `SeqOrderer`'s; lost seqs are skipped (the state's next seq jumps
    and `order.counters.lost` says how many). A swap replaces the state by the next version
    without the evicted chunks: the same fold the reconciler and the chunk log apply, so every
    node derives the same tokens.
    """

    def __init__(self, state: CsrState, *, max_held: int = 100_000, max_fetch_attempts: int = 3):
        if state.policy.oversize == "split":
            # one StateChunk must stay one Chunk with the same seq on every node
            msg = "the policy node's chunk policy must not split chunks (use oversize='truncate')"
            raise ConfigError(msg)
        self.state = state
        self.primary = ""
        self.primary_url = ""
        self.counters = FoldCounters()
        self.order = SeqOrderer(int(state.next_seq), max_held=max_held,
                                max_fetch_attempts=max_fetch_attempts)

    @property
    def version(self) -> Version:
        return self.state.version

    @property
    def next_seq(self) -> int:
        return int(self.state.next_seq)

    @property
    def n_held(self) -> int:
        return self.order.n_held

    @property
    def lost(self) -> int:
        return self.order.counters.lost

    def on_chunk(self, event: ChunkEvent) -> FetchRequest | None:
        return self._apply(self.order.offer(event))

    def on_fetched(self, chunks: Sequence[ChunkEvent], first_available_seq: int) -> FetchRequest | None:
        return self._apply(self.order.fetched(chunks, first_available_seq))

    def on_fetch_failed(self) -> FetchRequest | None:
        return self._apply(self.order.fetch_failed())

    def on_swap(self, event: SwapEvent) -> bool:
        """Apply a version change; False (and counted) for a version that is not newer.

        A 'start' event is the reconciler's first after a (re)start: it resets the version even
        to a lower one, since a reconciler that restarted without its chunk log counts anew."""
        restarted = event.reason == "start" and event.version != self.state.version
        if event.version <= self.state.version and not restarted:
            self.counters.stale_swaps += 1
            if event.version == self.state.version and event.primary:
                self.primary, self.primary_url = event.primary, event.primary_url
            return False
        old = self.state
        kept = [c for c in old.chunks if c.seq >= event.evicted_before_seq]
        next_seq = max(int(old.next_seq), event.evicted_before_seq)
        self.state = CsrState(tokenizer=old.tokenizer, layout=old.layout, profile=old.profile,
                              mode=old.mode, policy=old.policy, version=Version(event.version),
                              next_seq=Seq(next_seq), chunks=kept)
        self.primary, self.primary_url = event.primary, event.primary_url
        self.counters.swaps += 1
        self._apply(self.order.advance_to(next_seq))
        return True

    def gap(self) -> FetchRequest | None:
        return self.order.gap()

    def probe(self) -> FetchRequest | None:
        return self.order.probe()

    def on_fetched_all(self, chunks: Sequence[ChunkEvent], first_available_seq: int) -> FetchRequest | None:
        return self._apply(self.order.fetched_all(chunks, first_available_seq))

    def _apply(self, step: Step) -> FetchRequest | None:
        for item in step.items:
            if isinstance(item, Lost):
                self.state.next_seq = Seq(item.end_seq)
            else:
                chunk, refused = make_chunk(self.state, item)
                self.counters.rejected += refused
                self.state.append(chunk)
        assert self.order.next_seq == self.state.next_seq, "orderer and state disagree on seq"
        return step.fetch


def make_chunk(state: CsrState, event: ChunkEvent) -> tuple[Chunk, bool]:
    """The Chunk every node derives from one StateChunk (the next one of `state`).

    Returns (chunk, refused): text the chunk policy refuses becomes a placeholder that names
    the refusal, so the seq stays gap-free and every node still agrees token for token.
    """
    assert event.seq == state.next_seq, f"event seq {event.seq} != next seq {state.next_seq}"
    try:
        [chunk] = state.make_chunks(event.text, source=event.source, stamp_ns=event.stamp_ns)
        return chunk, False
    except ChunkError:
        [chunk] = state.make_chunks(refused_text(event), source=event.source,
                                    stamp_ns=event.stamp_ns)
        return chunk, True


def refused_text(event: ChunkEvent) -> str:
    return f"{event.source or 'chunk'}: [chunk {event.seq} refused]"


def lost_text(seq: int) -> str:
    return f"[chunk {seq} lost]"


def chunk_events(chunks: Sequence[Chunk]) -> list[ChunkEvent]:
    return [ChunkEvent(seq=int(c.seq), source=c.source, stamp_ns=c.stamp_ns, text=c.text)
            for c in chunks]


# -- scheduling ---------------------------------------------------------------------------------

@dataclass
class QueryScheduler:
    """Periodic queries at `rate_hz`; a tick while a query runs is skipped and counted.

    On-demand queries (the Query service) use the same slot: `try_start(periodic=False)`.
    """

    rate_hz: float
    running: bool = False
    ticks: int = 0
    started: int = 0
    skipped: int = 0
    finished: int = 0
    failed: int = 0

    def __post_init__(self):
        if not self.rate_hz > 0:
            raise ConfigError(f"rate_hz must be > 0, got {self.rate_hz}")

    @property
    def period_s(self) -> float:
        return 1.0 / self.rate_hz

    def tick(self) -> bool:
        """A timer tick: True if a query starts now."""
        self.ticks += 1
        if self.running:
            self.skipped += 1
            return False
        return self.try_start()

    def try_start(self) -> bool:
        if self.running:
            return False
        self.running = True
        self.started += 1
        return True

    def finish(self, *, ok: bool) -> None:
        assert self.running, "finish() without a running query"
        self.running = False
        self.finished += 1
        self.failed += not ok


# -- the dynamic suffix -------------------------------------------------------------------------

@dataclass(frozen=True)
class InstantValue:
    source: str
    text: str            # rendered, e.g. "goal: data=kitchen"
    stamp_ns: int        # when it was received


def build_suffix(instant: Mapping[str, InstantValue], now_ns: int, *, stale_s: float) -> str:
    """X_suffix: the current time, then each fresh instant value with its age, by source name."""
    now = datetime.fromtimestamp(now_ns / 1e9, tz=timezone.utc)
    lines = [f"now: stamp_ns={now_ns} utc={now.strftime('%Y-%m-%dT%H:%M:%S')}Z"]
    for source in sorted(instant):
        value = instant[source]
        age_s = (now_ns - value.stamp_ns) / 1e9
        if age_s <= stale_s:
            lines.append(f"{value.text.strip()} age_s={max(0.0, age_s):.1f}")
    return "\n".join(lines)


# -- diagnostics --------------------------------------------------------------------------------

@dataclass
class QueryStats:
    """Running figures of finished queries (TTFT, cache hits where the server reports them)."""

    ttfts_s: deque = field(default_factory=lambda: deque(maxlen=100))
    last: QueryResult | None = None
    last_version: int | None = None
    last_error: str = ""
    cached_tokens: int = 0           # over the queries whose server reported cached tokens
    reported_prompt_tokens: int = 0

    def record(self, result: QueryResult, version: int, *, ttft_s: float | None = None) -> None:
        """`ttft_s`: when the caller measured it (e.g. including a wait behind other work)."""
        self.ttfts_s.append(result.ttft_s if ttft_s is None else ttft_s)
        self.last, self.last_version, self.last_error = result, version, ""
        if result.cached_tokens is not None:
            self.cached_tokens += int(result.cached_tokens)
            self.reported_prompt_tokens += result.n_prompt

    def record_error(self, message: str) -> None:
        self.last_error = message

    @property
    def cache_hit_ratio(self) -> float | None:
        if not self.reported_prompt_tokens:
            return None
        return self.cached_tokens / self.reported_prompt_tokens


@dataclass(frozen=True)
class Diagnosis:
    level: int
    message: str
    values: tuple[tuple[str, str], ...]


def state_view(fold: StateFold) -> dict:
    """The figures `diagnose` reports about a state, from the policy's own fold."""
    return {"version": int(fold.version), "primary": fold.primary or "-",
            "chunks": len(fold.state.chunks), "next_seq": fold.next_seq,
            "static_tokens": fold.state.n_static, "lost_chunks": fold.lost,
            "held_chunks": fold.n_held, "rejected_chunks": fold.counters.rejected}


def diagnose(state: StateFold | Mapping, scheduler: QueryScheduler, stats: QueryStats) -> Diagnosis:
    """Level, message and key/values for /diagnostics. `state` is a fold or a mapping with the
    keys of `state_view` (e.g. made from a reconciliation driver's snapshot)."""
    view = state_view(state) if isinstance(state, StateFold) else dict(state)
    values: list[tuple[str, str]] = [(k, str(v)) for k, v in view.items()]
    values += [("queries", str(scheduler.finished)), ("failed_queries", str(scheduler.failed)),
               ("skipped_ticks", str(scheduler.skipped))]
    if stats.ttfts_s:
        values += [("ttft_s", f"{stats.ttfts_s[-1]:.3f}"),
                   ("ttft_mean_s", f"{statistics.fmean(stats.ttfts_s):.3f}")]
    if stats.cache_hit_ratio is not None:
        values.append(("cache_hit_ratio", f"{stats.cache_hit_ratio:.3f}"))
    if stats.last is not None:
        values += [("last_query_version", str(stats.last_version)),
                   ("last_static_extended_tokens", str(stats.last.n_extended)),
                   ("last_cached_tokens", str(stats.last.cached_tokens))]
    level, message = OK, "ok"
    if stats.ttfts_s and stats.ttfts_s[-1] > scheduler.period_s:
        level, message = WARN, (f"TTFT {stats.ttfts_s[-1]:.2f} s exceeds the query period "
                                f"{scheduler.period_s:.2f} s: ticks are being skipped")
    if view.get("lost_chunks"):
        level, message = WARN, f"{view['lost_chunks']} chunks were lost (not available to fetch)"
    if stats.last_error:
        level, message = ERROR, f"last query failed: {stats.last_error}"
    return Diagnosis(level=level, message=message, values=tuple(values))



# -- swap reports (what the reconciler publishes on csr/swaps) ----------------------------------

@dataclass(frozen=True)
class OpTiming:
    resource: str
    kind: str            # load | extend
    started_s: float     # monotonic
    seconds: float
    n_tokens: int
    ok: bool


class TimedResource:
    """A Resource that records how long each load/extend took (for SwapEvent's figures)."""

    def __init__(self, inner, ops: list, clock):
        self._inner = inner
        self._ops = ops
        self._clock = clock
        self.name = inner.name
        self.max_context_tokens = inner.max_context_tokens

    @property
    def n_committed(self) -> int:
        return self._inner.n_committed

    def load(self, ids, text=None, **kw):
        return self._timed("load", ids, lambda: self._inner.load(ids, text, **kw))

    def extend(self, ids, text=None, **kw):
        return self._timed("extend", ids, lambda: self._inner.extend(ids, text, **kw))

    def query(self, request, **kw):
        return self._inner.query(request, **kw)

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _timed(self, kind, ids, call):
        started = self._clock()
        ok = False
        try:
            result = call()
            ok = True
            return result
        finally:
            self._ops.append(OpTiming(self.name, kind, started, self._clock() - started,
                                      len(ids), ok))


@dataclass(frozen=True)
class SwapReport:
    version: int
    reason: str
    primary: str
    evicted_before_seq: int
    caught_up_to_seq: int
    static_tokens: int
    window_s: float
    warmup_s: float
    catchup_s: float
    catchup_rounds: int


def swap_report(snapshot: Mapping, *, reason: str, committed_tokens: int | None,
                window: tuple[float, float | None] | None, ops: Sequence[OpTiming]) -> SwapReport:
    """The SwapEvent of the version in a driver `snapshot` (its active chunks are contiguous,
    so the first kept seq is next_seq - n_chunks). Warm-up is the newest successful load on the
    new primary, catch-up the successful extends on it after that load."""
    primary = snapshot["primary"]
    mine = [op for op in ops if op.resource == primary and op.ok]
    loads = [i for i, op in enumerate(mine) if op.kind == "load"]
    warm = mine[loads[-1]] if loads and reason == "swap" else None
    extends = [op for op in mine[loads[-1] + 1:] if op.kind == "extend"] if warm else []
    window_s = 0.0
    if window is not None and window[1] is not None:
        window_s = window[1] - window[0]
    return SwapReport(
        version=int(snapshot["version"]), reason=reason, primary=primary,
        evicted_before_seq=int(snapshot["next_seq"]) - int(snapshot["n_chunks"]),
        caught_up_to_seq=int(snapshot["next_seq"]),
        static_tokens=int(committed_tokens if committed_tokens is not None
                          else snapshot["n_static_tokens"]),
        window_s=float(window_s), warmup_s=float(warm.seconds) if warm else 0.0,
        catchup_s=float(sum(op.seconds for op in extends)), catchup_rounds=len(extends))


# -- the state every node builds from the same parameters ---------------------------------------

def state_from_params(params: Mapping, tokenizer) -> CsrState:
    """The empty CsrState of the `model`/`mode`/`profile` parameters (policy and reconciler
    must build the same one, or their tokens differ)."""
    from pathlib import Path

    from csr_ros.chunks import ChunkPolicy
    from csr_ros.layout import Layout

    profile = params["profile"]
    if params.get("profile_file"):
        path = Path(params["profile_file"]).expanduser()
        try:
            profile = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"profile_file {path}: {exc.strerror}") from None
    layout = Layout.from_tokenizer(tokenizer, use_chat_template=params["use_chat_template"])
    # truncate, never split: one StateChunk is one Chunk with the same seq on every node
    policy = ChunkPolicy(max_chunk_tokens=params["max_chunk_tokens"], oversize="truncate")
    return CsrState(tokenizer=tokenizer, layout=layout, profile=profile, mode=params["mode"],
                    policy=policy)
