"""What the policy node does, without ROS: fold events into a CsrState, schedule queries,
build the dynamic suffix, summarise health.

    SeqOrderer       chunk events in any order → gap-free; asks for missing ranges
    StateFold        csr/chunks + csr/swaps → CsrState (the policy's view of the state);
                     a new aggregator stream (restart without a chunk log) starts a new version
    QueryScheduler   ticks at rate_hz and on-demand queries in one slot; never starts a query
                     while one runs; counts skips; neither kind starves the other
    build_suffix     latest 'instant' values + the current time → X_suffix
    diagnose         counters, achieved decision rate, last result → (level, message, values)

The node feeds plain views of its messages (`ChunkEvent`, `SwapEvent`) into these and turns
their outputs back into ROS calls. Pure: no rclpy, no threads, no clocks (times come in).
"""

from __future__ import annotations

import re
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
    """A StateChunk: `seq` is gap-free on csr/chunks within one `stream` (the aggregator's
    stream id; '' when the publisher does not say)."""

    seq: int
    source: str
    stamp_ns: int
    text: str
    stream: str = ""


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
    stream: str = ""          # the aggregator stream the version's chunks come from


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
    starts: int = 0              # 'start' events of a (re)started reconciler, adopted
    stream_restarts: int = 0     # new aggregator streams (restarted without its chunk log)
    retired_chunks: int = 0      # chunks of an earlier stream that arrived after it ended


class StreamTracker:
    """Which aggregator stream the chunks come from. `see(stream)` says what a chunk's stream
    means: 'same' (or unnamed), 'first' (the first one named), 'retired' (an earlier stream:
    drop it), or 'new' (the aggregator began a new stream; the old one is retired)."""

    def __init__(self, current: str = ""):
        self.current = current
        self.retired: set[str] = set()

    def see(self, stream: str) -> str:
        if not stream or stream == self.current:
            return "same"
        if stream in self.retired:
            return "retired"
        if not self.current:
            self.current = stream
            return "first"
        self.retired.add(self.current)
        self.current = stream
        return "new"


@dataclass(frozen=True)
class StreamRestart:
    """The aggregator started a new stream: its seqs begin again, so the chunks of the old
    stream cannot be continued. They leave the state; the new stream is a new version."""

    old_stream: str
    new_stream: str
    version: int                 # the version that begins with the new stream
    dropped_chunks: int
    dropped_tokens: int

    def describe(self) -> str:
        return (f"the aggregator restarted without its chunk log (stream {self.old_stream} → "
                f"{self.new_stream}); its seqs begin again, so v{self.version} starts from the "
                f"new stream and the {self.dropped_chunks} chunks ({self.dropped_tokens} "
                "tokens) of the old one leave the state. Give the aggregator a chunk_log to "
                "keep the history across restarts")


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
        self.streams = StreamTracker()         # '' until a chunk or a swap names one
        self.last_restart: StreamRestart | None = None
        self.needs_probe = False               # the state was reset: fetch the history again
        self._max_held, self._max_fetch_attempts = max_held, max_fetch_attempts
        self.order = SeqOrderer(int(state.next_seq), max_held=max_held,
                                max_fetch_attempts=max_fetch_attempts)

    @property
    def version(self) -> Version:
        return self.state.version

    @property
    def stream(self) -> str:
        return self.streams.current

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
        if not self._follow_stream(event.stream):
            return None
        return self._apply(self.order.offer(event))

    def on_fetched(self, chunks: Sequence[ChunkEvent], first_available_seq: int, *,
                   stream: str = "") -> FetchRequest | None:
        chunks = self._of_current_stream(chunks, stream)
        if chunks is None:
            return None
        return self._apply(self.order.fetched(chunks, first_available_seq))

    def on_fetch_failed(self) -> FetchRequest | None:
        return self._apply(self.order.fetch_failed())

    def on_swap(self, event: SwapEvent) -> bool:
        """Apply a version change; False (and counted) for a version that is not newer.

        A 'start' event is the reconciler's first after a (re)start and is always adopted, even
        with the version this fold already holds (a reconciler restarted without its chunk log
        counts anew from the history it fetched): its version and eviction point replace the
        fold's. Where the fold has already evicted chunks the reconciler still holds, the state
        restarts empty at `evicted_before_seq` and `needs_probe` asks for the history again.
        A swap of another stream than the fold's begins that stream (see `StreamRestart`).
        """
        if event.stream in self.streams.retired:
            self.counters.stale_swaps += 1     # the reconciler has not seen the new stream yet
            return False
        self._follow_stream(event.stream)
        if event.reason == "start":
            return self._adopt_start(event)
        if event.version <= self.state.version:
            self.counters.stale_swaps += 1
            if event.version == self.state.version and event.primary:
                self.primary, self.primary_url = event.primary, event.primary_url
            return False
        self._evict_to(event)
        self.counters.swaps += 1
        return True

    def _adopt_start(self, event: SwapEvent) -> bool:
        first_held = self.state.chunks[0].seq if self.state.chunks else self.state.next_seq
        self.counters.starts += 1
        if event.evicted_before_seq < first_held:
            # the fold dropped chunks the restarted reconciler keeps: fetch them again
            self._reset(version=event.version, next_seq=event.evicted_before_seq)
            self.needs_probe = True
            self.primary, self.primary_url = event.primary, event.primary_url
            return True
        self._evict_to(event)
        return True

    def _evict_to(self, event: SwapEvent) -> None:
        old = self.state
        kept = [c for c in old.chunks if c.seq >= event.evicted_before_seq]
        next_seq = max(int(old.next_seq), event.evicted_before_seq)
        self.state = CsrState(tokenizer=old.tokenizer, layout=old.layout, profile=old.profile,
                              mode=old.mode, policy=old.policy, version=Version(event.version),
                              next_seq=Seq(next_seq), chunks=kept)
        self.primary, self.primary_url = event.primary, event.primary_url
        self._apply(self.order.advance_to(next_seq))

    # -- aggregator streams ----------------------------------------------------------------------

    def _follow_stream(self, stream: str) -> bool:
        """False for a chunk of a retired stream (dropped, counted). A stream other than the
        current one begins a new version from its seq 0."""
        old_stream = self.streams.current
        seen = self.streams.see(stream)
        if seen == "retired":
            self.counters.retired_chunks += 1
            return False
        if seen != "new":
            return True
        old = self.state
        self.last_restart = StreamRestart(
            old_stream=old_stream, new_stream=stream, version=int(old.version) + 1,
            dropped_chunks=len(old.chunks), dropped_tokens=old.n_static - len(old.prefix_ids))
        self.counters.stream_restarts += 1
        self._reset(version=int(old.version) + 1, next_seq=0)
        return True

    def _of_current_stream(self, chunks: Sequence[ChunkEvent], stream: str):
        """A GetChunks answer: its chunks, or None if it belongs to a retired stream."""
        streams = {stream} | {c.stream for c in chunks}
        streams.discard("")
        for name in streams:
            if not self._follow_stream(name):
                return None
        return chunks

    def _reset(self, *, version: int, next_seq: int) -> None:
        old = self.state
        self.state = CsrState(tokenizer=old.tokenizer, layout=old.layout, profile=old.profile,
                              mode=old.mode, policy=old.policy, version=Version(version),
                              next_seq=Seq(next_seq), chunks=[])
        self.order = SeqOrderer(next_seq, max_held=self._max_held,
                                max_fetch_attempts=self._max_fetch_attempts)

    def gap(self) -> FetchRequest | None:
        return self.order.gap()

    def probe(self) -> FetchRequest | None:
        self.needs_probe = False
        return self.order.probe()

    def on_fetched_all(self, chunks: Sequence[ChunkEvent], first_available_seq: int, *,
                       stream: str = "") -> FetchRequest | None:
        chunks = self._of_current_stream(chunks, stream)
        if chunks is None:
            return None
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

PERIODIC = "periodic"        # what `QueryScheduler.grant` returns for an owed periodic query
MAX_WAITING_QUERIES = 32     # on-demand queries that may wait at once; more are refused


@dataclass
class QueryScheduler:
    """Periodic queries at `rate_hz` and on-demand ones (the Query service, the Decide action)
    through one slot: a query never starts while another runs.

    - A tick while a periodic query runs is skipped and counted (`skipped`).
    - On-demand queries wait in arrival order (`enqueue`) and take the free slot (`grant`)
      when no periodic query is owed.
    - A tick while an on-demand query runs is owed (`deferred`): when that query ends, the
      periodic one goes first. On-demand queries coming back to back so take at most every
      other turn and the periodic decisions go on, and a periodic query that is always due
      still lets the waiting ones in after it: neither starves the other.
    """

    rate_hz: float
    running: bool = False
    ticks: int = 0
    started: int = 0
    skipped: int = 0
    deferred: int = 0            # ticks owed to the end of an on-demand query
    finished: int = 0
    failed: int = 0
    owed: bool = False           # a periodic query goes next
    running_key: int | None = None   # the on-demand query that runs (None: a periodic one)
    waiting: deque = field(default_factory=deque)   # keys of on-demand queries, oldest first
    _next_key: int = 0

    def __post_init__(self):
        if not self.rate_hz > 0:
            raise ConfigError(f"rate_hz must be > 0, got {self.rate_hz}")

    @property
    def period_s(self) -> float:
        return 1.0 / self.rate_hz

    def tick(self) -> bool:
        """A timer tick: True if a periodic query starts now."""
        self.ticks += 1
        if self.running:
            if self.running_key is not None and not self.owed:
                self.owed = True
                self.deferred += 1
            else:
                self.skipped += 1
            return False
        return self.try_start()

    def try_start(self) -> bool:
        """Take the free slot for a periodic query."""
        if self.running:
            return False
        self.running, self.running_key = True, None
        self.started += 1
        return True

    @property
    def full(self) -> bool:
        """As many on-demand queries wait as may: refuse the next one."""
        return len(self.waiting) >= MAX_WAITING_QUERIES

    def enqueue(self) -> int:
        """An on-demand query arrives: its key, to wait for `grant` to return it."""
        assert not self.full, "enqueue() on a full queue"
        key = self._next_key
        self._next_key += 1
        self.waiting.append(key)
        return key

    def withdraw(self, key: int) -> bool:
        """A waiting on-demand query gives up (cancelled, timed out); False if not waiting."""
        if key not in self.waiting:
            return False
        self.waiting.remove(key)
        return True

    def ahead_of(self, key: int) -> int:
        """Queries that start before the waiting query `key` (the running one included)."""
        return int(self.running) + int(self.owed) + list(self.waiting).index(key)

    def grant(self) -> int | str | None:
        """Who takes the slot now that it may be free: PERIODIC (an owed tick), the key of the
        oldest waiting on-demand query, or None (the slot is busy, or nothing waits)."""
        if self.running:
            return None
        if self.owed:
            self.owed = False
            self.try_start()
            return PERIODIC
        if self.waiting:
            self.running, self.running_key = True, self.waiting.popleft()
            self.started += 1
            return self.running_key
        return None

    def finish(self, *, ok: bool) -> None:
        assert self.running, "finish() without a running query"
        self.running, self.running_key = False, None
        self.finished += 1
        self.failed += not ok


# -- the dynamic suffix -------------------------------------------------------------------------

@dataclass(frozen=True)
class InstantValue:
    source: str
    text: str            # rendered, e.g. "goal: data=kitchen"
    stamp_ns: int        # when it was received


def build_suffix(instant: Mapping[str, InstantValue], now_ns: int, *, stale_s: float,
                 origin_ns: int | None = None) -> str:
    """X_suffix: the current time, then each fresh instant value with its age, by source name.

    With the episode's origin known (the time the chunks count their seconds from), the time
    is said as the chunks say it (`now: 125s`), so "how long ago" is a subtraction the model
    can read off the prompt; otherwise as UTC. Never as a nanosecond integer."""
    if origin_ns is not None:
        lines = [f"now: {max(0, (now_ns - origin_ns) // 1_000_000_000)}s"]
    else:
        now = datetime.fromtimestamp(now_ns / 1e9, tz=timezone.utc)
        lines = [f"now: utc={now.strftime('%Y-%m-%dT%H:%M:%S')}Z"]
    for source in sorted(instant):
        value = instant[source]
        age_s = (now_ns - value.stamp_ns) / 1e9
        if age_s <= stale_s:
            lines.append(f"{value.text.strip()} age_s={max(0.0, age_s):.1f}")
    return "\n".join(lines)


# -- diagnostics --------------------------------------------------------------------------------

RATE_WINDOW_S = 30.0     # decisions/s is measured over this window (or since the start)
RECENT_ACTIONS = 20      # an invalid action among this many latest decisions: a warning


@dataclass
class QueryStats:
    """Running figures of finished queries (TTFT, cache hits where the server reports them,
    decisions per second over the last `RATE_WINDOW_S`)."""

    ttfts_s: deque = field(default_factory=lambda: deque(maxlen=100))
    last: QueryResult | None = None
    last_version: int | None = None
    last_error: str = ""
    cached_tokens: int = 0           # over the queries whose server reported cached tokens
    reported_prompt_tokens: int = 0
    started_s: float | None = None   # when the node began deciding (monotonic, from the caller)
    decided_s: deque = field(default_factory=lambda: deque(maxlen=10_000))
    decision_s: deque = field(default_factory=lambda: deque(maxlen=100))  # TTFT + decoding
    valid_actions: int = 0           # decisions that parsed into an action of the vocabulary
    invalid_actions: int = 0         # ... that did not (incomplete within the budget, unparsable)
    recent_valid: deque = field(default_factory=lambda: deque(maxlen=RECENT_ACTIONS))
    last_invalid: str = ""           # why the latest invalid decision was not an action

    def record(self, result: QueryResult, version: int, *, ttft_s: float | None = None,
               now_s: float | None = None) -> None:
        """`ttft_s`: when the caller measured it (e.g. including a wait behind other work);
        `now_s`: when the decision was made (monotonic), for the achieved decision rate."""
        self.ttfts_s.append(result.ttft_s if ttft_s is None else ttft_s)
        self.decision_s.append(self.ttfts_s[-1] + float(result.decode_s or 0.0))
        self.last, self.last_version, self.last_error = result, version, ""
        if now_s is not None:
            self.decided_s.append(now_s)
        if result.cached_tokens is not None:
            self.cached_tokens += int(result.cached_tokens)
            self.reported_prompt_tokens += result.n_prompt

    def decisions_per_s(self, now_s: float) -> float | None:
        """Decisions per second over the last RATE_WINDOW_S (or since `started_s`); None
        before a few seconds have passed."""
        if self.started_s is None:
            return None
        window_s = min(RATE_WINDOW_S, now_s - self.started_s)
        if window_s < 2.0:
            return None
        return sum(1 for t in self.decided_s if t > now_s - window_s) / window_s

    def ttft_percentile_s(self, q: float) -> float | None:
        return _percentile(self.ttfts_s, q)

    def decision_percentile_s(self, q: float) -> float | None:
        """Query start to last token (what bounds the decision rate)."""
        return _percentile(self.decision_s, q)

    def record_action(self, valid: bool, error: str = "") -> None:
        """A decision's typed action: valid, or why not (`Decision.error`)."""
        self.recent_valid.append(bool(valid))
        if valid:
            self.valid_actions += 1
        else:
            self.invalid_actions += 1
            self.last_invalid = error

    def record_error(self, message: str) -> None:
        self.last_error = message

    @property
    def cache_hit_ratio(self) -> float | None:
        if not self.reported_prompt_tokens:
            return None
        return self.cached_tokens / self.reported_prompt_tokens


def _percentile(values, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


@dataclass(frozen=True)
class Diagnosis:
    level: int
    message: str
    values: tuple[tuple[str, str], ...]


RATE_SHORTFALL = 0.8     # achieved below this share of rate_hz: a warning


def rate_shortfall(rate: float, rate_hz: float, ttft_p50_s: float | None,
                   decision_p50_s: float | None = None) -> str:
    """Why the policy decides slower than asked, and what to change. A decision takes its TTFT
    plus the decoding of its answer; a query never starts before the previous one ended."""
    msg = f"{rate:.3g} decisions/s against rate_hz {rate_hz:g}"
    if ttft_p50_s is None:
        return msg + ": no query has finished yet"
    took_s = decision_p50_s if decision_p50_s is not None else ttft_p50_s
    period_s = 1 / rate_hz
    msg += (f": a decision takes {took_s:.2f} s (p50: TTFT {ttft_p50_s:.2f} s + decoding "
            f"{max(0.0, took_s - ttft_p50_s):.2f} s)")
    if took_s > period_s:
        msg += (f", longer than the period {period_s:.2f} s, so ticks are skipped; lower "
                f"rate_hz to {max(0.01, 0.8 / took_s):.2g}, or make decisions cheaper (fewer "
                f"max_new_tokens{', the decoding dominates' if took_s > 2 * ttft_p50_s else ''}"
                "; a smaller tau_mem_tokens; a faster resource)")
    else:
        msg += (", shorter than the period: queries failed or waited (see failed_queries and "
                "the last error)")
    return msg


def keep_up_warning(stats: QueryStats, rate_hz: float, now_s: float, *,
                    capacity: Mapping | None = None) -> str | None:
    """Why the policy is not keeping up, with the numbers and what to change; None while it is.

    Said as soon as it shows: the achieved rate below RATE_SHORTFALL of `rate_hz`, or the last
    three decisions each longer than the period (before the rate window has caught up), or the
    reconciler's capacity verdict that reconciliation cannot keep up with the arrivals."""
    if not stats.decision_s:       # nothing decided yet (a model still loading): no verdict
        return capacity["message"] if capacity and capacity.get("viable") is False else None
    period_s = 1 / rate_hz
    rate = stats.decisions_per_s(now_s)
    recent = list(stats.decision_s)[-3:]
    slow = len(recent) == 3 and min(recent) > period_s
    if slow:        # each of them longer than the period: at most this rate, whatever came before
        rate = min(rate if rate is not None else rate_hz, 1 / statistics.fmean(recent))
    if rate is not None and rate < RATE_SHORTFALL * rate_hz:
        return "the policy cannot keep up: " + rate_shortfall(
            rate, rate_hz, stats.ttft_percentile_s(50), stats.decision_percentile_s(50))
    if capacity and capacity.get("viable") is False:
        return capacity["message"]
    return None


class Announcer:
    """When to log a warning that lasts: at once when it appears or changes kind, then every
    `repeat_s` while it lasts, and once (an info) when it clears. The kind of a message is its
    text without the numbers, so changing figures do not count as a new warning."""

    def __init__(self, repeat_s: float = 30.0):
        self.repeat_s = repeat_s
        self._kind: str | None = None
        self._said_s = float("-inf")

    def update(self, message: str | None, now_s: float) -> tuple[str, str] | None:
        """(level 'warning' | 'info', text) to log now, or None."""
        if message is None:
            if self._kind is None:
                return None
            self._kind = None
            return "info", "keeping up again"
        kind = re.sub(r"[0-9.]+", "#", message)
        if kind != self._kind or now_s - self._said_s >= self.repeat_s:
            self._kind, self._said_s = kind, now_s
            return "warning", message
        return None


def state_view(fold: StateFold) -> dict:
    """The figures `diagnose` reports about a state, from the policy's own fold."""
    view = {"version": int(fold.version), "primary": fold.primary or "-",
            "chunks": len(fold.state.chunks), "next_seq": fold.next_seq,
            "static_tokens": fold.state.n_static, "lost_chunks": fold.lost,
            "held_chunks": fold.n_held, "rejected_chunks": fold.counters.rejected,
            "stream": fold.stream or "-", "stream_restarts": fold.counters.stream_restarts,
            "reconciler_starts": fold.counters.starts}
    if fold.last_restart is not None:
        view["stream_message"] = fold.last_restart.describe()
    return view


def diagnose(state: StateFold | Mapping, scheduler: QueryScheduler, stats: QueryStats, *,
             now_s: float | None = None, capacity: Mapping | None = None) -> Diagnosis:
    """Level, message and key/values for /diagnostics. `state` is a fold or a mapping with the
    keys of `state_view` (e.g. made from a reconciliation driver's snapshot).

    `now_s` (monotonic) enables the achieved decision rate against `rate_hz`; `capacity` is a
    reconciler's capacity verdict (`Capacity.as_dict()`), shown when it says it cannot keep up.
    """
    view = state_view(state) if isinstance(state, StateFold) else dict(state)
    values: list[tuple[str, str]] = [(k, str(v)) for k, v in view.items()]
    values += [("queries", str(scheduler.finished)), ("failed_queries", str(scheduler.failed)),
               ("skipped_ticks", str(scheduler.skipped)), ("rate_hz", f"{scheduler.rate_hz:g}"),
               ("deferred_ticks", str(scheduler.deferred)),
               ("waiting_queries", str(len(scheduler.waiting)))]
    rate = stats.decisions_per_s(now_s) if now_s is not None else None
    if rate is not None:
        values.append(("decisions_per_s", f"{rate:.3f}"))
    if stats.ttfts_s:
        values += [("ttft_s", f"{stats.ttfts_s[-1]:.3f}"),
                   ("ttft_mean_s", f"{statistics.fmean(stats.ttfts_s):.3f}"),
                   ("ttft_p50_s", f"{stats.ttft_percentile_s(50):.3f}"),
                   ("ttft_p99_s", f"{stats.ttft_percentile_s(99):.3f}"),
                   ("decision_p50_s", f"{stats.decision_percentile_s(50):.3f}"),
                   ("decision_p99_s", f"{stats.decision_percentile_s(99):.3f}")]
    if stats.valid_actions or stats.invalid_actions:
        values += [("valid_actions", str(stats.valid_actions)),
                   ("invalid_actions", str(stats.invalid_actions))]
    if stats.cache_hit_ratio is not None:
        values.append(("cache_hit_ratio", f"{stats.cache_hit_ratio:.3f}"))
    if stats.last is not None:
        values += [("last_query_version", str(stats.last_version)),
                   ("last_static_extended_tokens", str(stats.last.n_extended)),
                   ("last_cached_tokens", str(stats.last.cached_tokens))]
    for key, value in (capacity or {}).items():
        if key != "message":
            values.append((f"capacity.{key}", str(value)))
    level, message = OK, "ok"
    if stats.ttfts_s and stats.ttfts_s[-1] > scheduler.period_s:
        level, message = WARN, (f"TTFT {stats.ttfts_s[-1]:.2f} s exceeds the query period "
                                f"{scheduler.period_s:.2f} s: ticks are being skipped")
    if rate is not None and rate < RATE_SHORTFALL * scheduler.rate_hz:
        level, message = WARN, rate_shortfall(rate, scheduler.rate_hz,
                                              stats.ttft_percentile_s(50),
                                              stats.decision_percentile_s(50))
    n_invalid = stats.recent_valid.count(False)
    if n_invalid:
        level, message = WARN, (f"{n_invalid} of the last {len(stats.recent_valid)} decisions "
                                f"were not valid actions (latest: {stats.last_invalid})")
    if capacity and capacity.get("viable") is False:
        level, message = WARN, capacity["message"]
    if view.get("stream_restarts"):
        level, message = WARN, view.get("stream_message") or "the aggregator restarted"
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

def vocabulary_from_params(params: Mapping):
    """The action vocabulary of the `actions.*` parameters, or None (free text only)."""
    from csr_ros.actions import Vocabulary

    specs, schema = params.get("actions.vocabulary", []), params.get("actions.schema", "")
    if not specs and not schema:
        return None
    return Vocabulary.from_params(specs, schema, max_str_chars=params.get("actions.max_str_chars",
                                                                           32))


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
    vocab = vocabulary_from_params(params)
    if vocab is not None and params.get("actions.in_profile", True):
        profile = profile.rstrip() + "\n" + vocab.describe()
    layout = Layout.from_tokenizer(tokenizer, use_chat_template=params["use_chat_template"])
    # truncate, never split: one StateChunk is one Chunk with the same seq on every node
    policy = ChunkPolicy(max_chunk_tokens=params["max_chunk_tokens"], oversize="truncate")
    return CsrState(tokenizer=tokenizer, layout=layout, profile=profile, mode=params["mode"],
                    policy=policy)

