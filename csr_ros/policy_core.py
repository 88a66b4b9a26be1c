"""What the policy node does, without ROS: fold events into a CsrState, schedule queries,
build the dynamic suffix, summarise health.

    StateFold        csr/chunks + csr/swaps → CsrState, gap-free; asks for missing chunks
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

@dataclass
class FoldCounters:
    appended: int = 0
    duplicates: int = 0          # seq already folded (or evicted): ignored
    buffered: int = 0            # arrived ahead of a gap, held until the gap is filled
    fetches: int = 0
    fetch_failures: int = 0
    lost: int = 0                # seqs given up on (the aggregator no longer had them)
    rejected: int = 0            # text the chunk policy refused (counted, logged by the node)
    swaps: int = 0
    stale_swaps: int = 0


class StateFold:
    """Chunks and swaps in, a gap-free CsrState out.

    A chunk with the expected seq is appended. One that arrives early is held and the missing
    range is requested (`FetchRequest`); when the answer comes (`on_fetched`) the held chunks
    follow. Seqs the aggregator no longer has are skipped and counted in `counters.lost`, so a
    late joiner always converges and the loss is visible.

    A swap replaces the state by the next version without the evicted chunks (the same fold the
    reconciler and the chunk log apply), so every node derives the same tokens.
    """

    def __init__(self, state: CsrState, *, max_buffered: int = 100_000, max_fetch_attempts: int = 3):
        if state.policy.oversize == "split":
            # one StateChunk must stay one Chunk with the same seq on every node
            msg = "the policy node's chunk policy must not split chunks (use oversize='truncate')"
            raise ConfigError(msg)
        self.state = state
        self.primary = ""
        self.primary_url = ""
        self.counters = FoldCounters()
        self.max_buffered = max_buffered
        self.max_fetch_attempts = max_fetch_attempts
        self._held: dict[int, ChunkEvent] = {}
        self._fetching: FetchRequest | None = None
        self._fetch_attempts = 0

    @property
    def version(self) -> Version:
        return self.state.version

    @property
    def next_seq(self) -> int:
        return int(self.state.next_seq)

    @property
    def fetching(self) -> FetchRequest | None:
        return self._fetching

    @property
    def n_held(self) -> int:
        return len(self._held)

    # chunks

    def on_chunk(self, event: ChunkEvent) -> FetchRequest | None:
        if event.seq < self.next_seq or event.seq in self._held:
            self.counters.duplicates += 1
            return None
        if event.seq > self.next_seq:
            self._hold(event)
            return self._request_gap()
        self._append(event)
        self._drain()
        return self._request_gap()

    def on_fetched(self, chunks: Sequence[ChunkEvent], first_available_seq: int) -> FetchRequest | None:
        """The GetChunks answer: chunks (in any order) and the oldest seq the aggregator has."""
        self._fetching = None
        self._fetch_attempts = 0
        for event in sorted(chunks, key=lambda c: c.seq):
            if event.seq == self.next_seq:
                self._append(event)
                self._drain()
            elif event.seq > self.next_seq and event.seq not in self._held:
                self._hold(event)
        if self._held and self.next_seq < first_available_seq:
            self._skip_to(min(first_available_seq, min(self._held)))
        return self._request_gap()

    def on_fetch_failed(self) -> FetchRequest | None:
        """GetChunks did not answer (timeout, no service): retry, then give the gap up."""
        self.counters.fetch_failures += 1
        self._fetching = None
        self._fetch_attempts += 1
        if self._fetch_attempts >= self.max_fetch_attempts and self._held:
            self._fetch_attempts = 0
            self._skip_to(min(self._held))
        return self._request_gap()

    # swaps

    def on_swap(self, event: SwapEvent) -> bool:
        """Apply a version change; False (and counted) for a version that is not newer."""
        if event.version <= self.state.version:
            self.counters.stale_swaps += 1
            if event.version == self.state.version and event.primary:
                self.primary, self.primary_url = event.primary, event.primary_url
            return False
        old = self.state
        kept = [c for c in old.chunks if c.seq >= event.evicted_before_seq]
        next_seq = old.next_seq if (kept or old.next_seq >= event.evicted_before_seq) \
            else Seq(event.evicted_before_seq)
        self.state = CsrState(tokenizer=old.tokenizer, layout=old.layout, profile=old.profile,
                              mode=old.mode, policy=old.policy, version=Version(event.version),
                              next_seq=Seq(next_seq), chunks=kept)
        for seq in [s for s in self._held if s < self.next_seq]:
            del self._held[seq]
        self.primary, self.primary_url = event.primary, event.primary_url
        self.counters.swaps += 1
        self._drain()
        return True

    def gap(self) -> FetchRequest | None:
        """The missing range to fetch now, if any and none is being fetched."""
        return self._request_gap()

    # internals

    def _append(self, event: ChunkEvent) -> None:
        chunk, refused = make_chunk(self.state, event)
        self.counters.rejected += refused
        self.state.append(chunk)
        self.counters.appended += 1

    def _hold(self, event: ChunkEvent) -> None:
        if len(self._held) >= self.max_buffered:
            # a gap that never fills must not grow memory without bound: give it up
            self._skip_to(min(self._held))
        self._held[event.seq] = event
        self.counters.buffered += 1

    def _drain(self) -> None:
        while self.next_seq in self._held:
            self._append(self._held.pop(self.next_seq))

    def _skip_to(self, seq: int) -> None:
        if seq > self.next_seq:
            self.counters.lost += seq - self.next_seq
            self.state.next_seq = Seq(seq)
        self._drain()

    def _request_gap(self) -> FetchRequest | None:
        if not self._held or self._fetching is not None:
            return None
        request = FetchRequest(start_seq=self.next_seq, end_seq=min(self._held))
        self._fetching = request
        self.counters.fetches += 1
        return request


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
        [chunk] = state.make_chunks(f"{event.source or 'chunk'}: [chunk {event.seq} refused]",
                                    source=event.source, stamp_ns=event.stamp_ns)
        return chunk, True


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

    def record(self, result: QueryResult, version: int) -> None:
        self.ttfts_s.append(result.ttft_s)
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


def diagnose(fold: StateFold, scheduler: QueryScheduler, stats: QueryStats) -> Diagnosis:
    values: list[tuple[str, str]] = [
        ("version", str(int(fold.version))),
        ("primary", fold.primary or "-"),
        ("chunks", str(len(fold.state.chunks))),
        ("next_seq", str(fold.next_seq)),
        ("static_tokens", str(fold.state.n_static)),
        ("queries", str(scheduler.finished)),
        ("failed_queries", str(scheduler.failed)),
        ("skipped_ticks", str(scheduler.skipped)),
        ("lost_chunks", str(fold.counters.lost)),
        ("held_chunks", str(fold.n_held)),
        ("rejected_chunks", str(fold.counters.rejected)),
    ]
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
    if fold.counters.lost:
        level, message = WARN, f"{fold.counters.lost} chunks were lost (not available to fetch)"
    if stats.last_error:
        level, message = ERROR, f"last query failed: {stats.last_error}"
    return Diagnosis(level=level, message=message, values=tuple(values))

