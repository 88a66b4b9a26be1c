"""The chunk stream as every node sees it, folded into a CsrState.

    SeqOrderer   chunk events in any order → gap-free; asks for missing ranges
    StateFold    csr/chunks + csr/swaps → CsrState (the policy's view of the state); a new
                 aggregator stream (restart without a chunk log) starts a new version
    make_chunk   one StateChunk → the Chunk every node derives from it, token for token

Pure: no rclpy, no threads, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from csr_ros.errors import ChunkError, ConfigError
from csr_ros.state import Chunk, CsrState, Seq, Version


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

    With `keep_previous_tokens`, the state before the last swap goes on as `previous` (with
    every later chunk, up to that many static tokens): what the old primary server caches, which
    a query can be asked against there when the new primary does not answer (a hedge).
    """

    def __init__(self, state: CsrState, *, max_held: int = 100_000, max_fetch_attempts: int = 3,
                 keep_previous_tokens: int = 0):
        if state.policy.oversize == "split":
            # one StateChunk must stay one Chunk with the same seq on every node
            msg = "the policy node's chunk policy must not split chunks (use oversize='truncate')"
            raise ConfigError(msg)
        self.state = state
        self.primary = ""
        self.primary_url = ""
        self.previous: CsrState | None = None  # the version before the last swap, and later chunks
        self.previous_primary = self.previous_url = ""
        self._keep_previous_tokens = keep_previous_tokens
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
                   stream: str = "", probe: bool = False) -> FetchRequest | None:
        """A GetChunks answer; `probe`: the answer to `probe()` (see `SeqOrderer.fetched_all`)."""
        chunks = self._of_current_stream(chunks, stream)
        if chunks is None:
            return None
        fetched = self.order.fetched_all if probe else self.order.fetched
        return self._apply(fetched(chunks, first_available_seq))

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
        first_held = self.state.first_seq
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
        self.previous = None
        if self._keep_previous_tokens and event.reason == "swap" and self.primary_url and \
                event.primary_url != self.primary_url and \
                event.evicted_before_seq <= int(old.next_seq) and \
                old.n_static <= self._keep_previous_tokens:
            self.previous, self.previous_primary, self.previous_url = \
                old, self.primary, self.primary_url
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
        self.previous = None
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

    def _apply(self, step: Step) -> FetchRequest | None:
        for item in step.items:
            if isinstance(item, Lost):
                self.state.next_seq = Seq(item.end_seq)
                self.previous = None           # a gap: no longer a state any server holds
            else:
                chunk, refused = make_chunk(self.state, item)
                self.counters.rejected += refused
                self.state.append(chunk)
                if self.previous is not None:
                    if self.previous.n_static + chunk.n_tokens > self._keep_previous_tokens:
                        self.previous = None
                    else:
                        self.previous.append(chunk)
        assert self.order.next_seq == self.state.next_seq, "orderer and state disagree on seq"
        return step.fetch


def make_chunk(state: CsrState, event: ChunkEvent) -> tuple[Chunk, bool]:
    """The Chunk every node derives from one StateChunk (the next one of `state`).

    Returns (chunk, refused): text the chunk policy refuses becomes a placeholder that names
    the refusal, so the seq stays gap-free and every node still agrees token for token.
    """
    assert event.seq == state.next_seq, f"event seq {event.seq} != next seq {state.next_seq}"
    [chunk], refused = add_or_placeholder(state.make_chunks, event)
    return chunk, refused is not None


def add_or_placeholder(add_chunk: Callable[..., list[Chunk]],
                       event: ChunkEvent) -> tuple[list[Chunk], ChunkError | None]:
    """`add_chunk(text, source=, stamp_ns=)` of the event, or of the placeholder that names its
    refusal where the chunk policy refuses it: what it returned, and the refusal (None: taken)."""
    try:
        return add_chunk(event.text, source=event.source, stamp_ns=event.stamp_ns), None
    except ChunkError as exc:
        placeholder = f"{event.source or 'chunk'}: [chunk {event.seq} refused]"
        return add_chunk(placeholder, source=event.source, stamp_ns=event.stamp_ns), exc


def add_lost_placeholders(add_chunk: Callable[..., object], lost: Lost) -> None:
    """A placeholder for each lost seq, so the seq stays gap-free for a state that cannot
    skip one."""
    for seq in range(lost.start_seq, lost.end_seq):
        add_chunk(f"[chunk {seq} lost]", source="lost", stamp_ns=0)

