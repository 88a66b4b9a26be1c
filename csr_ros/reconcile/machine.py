"""Asynchronous state reconciliation (ASR) as a pure state machine: events in, commands out.

Algorithm 1 of the CSR paper, with concurrent queries routed by version:

    IDLE ──static ≥ tau_mem──▶ DRAIN ──secondary idle──▶ WARM ──done──▶ CATCHUP ─┐
      ▲                                  ▲                  │fail        ▲   │    │ buffer > n_catchup
      │                                  └── RETRY ◀────────┘            └───┘◀───┘
      └──────────── swap (buffer ≤ n_catchup tokens folded into the new state) ◀──┘

- Every state has a version; a query is built against the active version and routed to the
  resource that holds it. Resources run their commands first in, first out, so a query routed
  before a reload is answered before it.
- X_E = evict(active) is derived when the static part reaches `tau_mem_tokens`; the secondary is
  loaded with X_E while the primary keeps serving the full current state. Chunks arriving
  meanwhile go to the active state and to the catch-up buffer.
- Catch-up extends the secondary with the whole buffer while it holds more than
  `n_catchup_tokens` and the last step shrank it (a stream faster than the secondary's catch-up
  swaps with what arrived during one step left over); then the swap is atomic: the remaining
  buffer is folded into the new state (the first query after the swap prefills it), and the
  old primary keeps the old version for stragglers until the next cycle, which waits for them
  to finish before reloading it.
- A threshold crossing during a reconciliation is never lost: the check runs again after the
  swap, so it starts the next cycle at once.
- If a chunk would push the active context past `max_context_tokens - reserve_tokens`, the
  reconciliation is abandoned and the primary evicts synchronously (a counted fallback).
- A failed warm-up or catch-up is retried with exponential backoff; a failed primary is replaced
  by the secondary, loaded with the current state (failover); during a reconciliation, with
  the version it was evicting to and every chunk since.
- With `eager_extend`, chunks are prefilled on the primary as they arrive whenever it has no
  query in flight, so a query mostly prefills only its dynamic part (TTFT ~ M, not the chunks
  that arrived since the previous query).
- A state that is already past tau_mem when the machine starts (a node that joins after a long
  history) is evicted with the same policy, round after round, before the primary loads it.
- A new chunk stream (the aggregator restarted without its chunk log: seqs begin again) is a
  new version holding none of the old stream's chunks (`new_stream`).
- Hedged queries: after a swap the old primary keeps the old version, and the chunks that
  arrive later are appended to that state too (`previous`) while the secondary holds it, idle.
  A query on the primary that has not answered by `hedge_after_s` (`QueryStalled`), or that
  failed, is asked again there, built against that state; the slow primary is *suspect*, and
  every query goes straight to the secondary until the primary answers again.
- `capacity()` checks eq. 54 from the first measurements (arrival rate, prefill rate of any
  load or extend) and says what to change when reconciliation cannot keep up.
- What the machine keeps stays bounded over a robot's day: the evicted seqs are kept as runs
  of consecutive seqs (`SeqRuns`: one run per chunk stream), finished queries are forgotten.

Pure: no threads, no clocks (times arrive in events as `now_s`), no I/O, no torch.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field, replace
from typing import Sequence, Union

from csr_ros.errors import ConfigError, ContextOverflowError
from csr_ros.eviction import EvictionPolicy, drop_oldest_fraction
from csr_ros.state import Chunk, CsrState, QueryId, Request, Seq, Version

MODES = ("asr", "sync", "unordered")
OP_TIMEOUT_MARGIN = 3.0      # a load or extend may take this many times its estimate
OP_TIMEOUT_DOUBLINGS = 5     # ... and its timeout doubles per failed try, up to 32x


@dataclass(frozen=True)
class ReconcileConfig:
    tau_mem_tokens: int
    max_context_tokens: int
    reserve_tokens: int = 256          # dynamic part + generated tokens of one query
    n_catchup_tokens: int = 64
    eager_extend: bool = True          # prefill new chunks on an idle primary as they arrive
    mode: str = "asr"                  # asr | sync (evict on the primary) | unordered (no reuse)
    retry_base_s: float = 0.5
    retry_max_s: float = 8.0
    warm_timeout_s: float | None = None    # a Load or Extend (any purpose) that takes longer
                                           # than this, or 3x its estimate, fails
    query_timeout_s: float | None = None   # a query not answered in this time fails (the driver)
    hedge_after_s: float | None = None     # a query not answered by then is asked again on the
                                           # secondary too, where it holds a consistent state
    rate_halflife_s: float = 10.0      # smoothing of the token arrival rate

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"reconcile mode must be one of {MODES}, got {self.mode!r}")
        for name in ("warm_timeout_s", "query_timeout_s", "hedge_after_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be > 0 (or None: no limit), got {value}")
        if self.tau_mem_tokens <= 0 or self.n_catchup_tokens < 0 or self.reserve_tokens < 0:
            raise ConfigError("tau_mem_tokens must be > 0, n_catchup_tokens and reserve_tokens >= 0")
        if self.tau_mem_tokens + self.reserve_tokens > self.max_context_tokens:
            msg = (f"tau_mem_tokens ({self.tau_mem_tokens}) + reserve_tokens "
                   f"({self.reserve_tokens}) exceed max_context_tokens "
                   f"({self.max_context_tokens}): lower tau_mem or raise the context")
            raise ConfigError(msg)


class Phase(enum.Enum):
    IDLE = "idle"
    DRAIN = "drain"          # X_E derived; waiting for the secondary's stragglers to finish
    WARM = "warm"            # secondary loading X_E
    CATCHUP = "catchup"      # secondary extending with buffered chunks
    RETRY = "retry"          # a warm-up or catch-up failed; waiting for the backoff timer


# -- events -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChunkArrived:
    chunk: Chunk
    now_s: float = 0.0


@dataclass(frozen=True)
class QueryStarted:
    task: str
    suffix: str = ""
    max_new_tokens: int = 0
    now_s: float = 0.0


@dataclass(frozen=True)
class QueryStalled:
    """Query `query_id` has not answered by `hedge_after_s` (or failed): ask it elsewhere."""

    query_id: QueryId
    task: str
    suffix: str = ""
    max_new_tokens: int = 0
    now_s: float = 0.0


@dataclass(frozen=True)
class QueryFinished:
    query_id: QueryId
    ok: bool
    now_s: float = 0.0


@dataclass(frozen=True)
class OpFinished:
    """A Load or Extend command finished (`n_tokens` prefilled in `seconds`)."""

    op_id: int
    ok: bool
    n_tokens: int = 0
    seconds: float = 0.0
    now_s: float = 0.0


@dataclass(frozen=True)
class TimerFired:
    timer_id: int
    now_s: float = 0.0


Event = Union[ChunkArrived, QueryStarted, QueryStalled, QueryFinished, OpFinished, TimerFired]


# -- commands -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Load:
    """Replace what `resource` has committed by `ids` (a full prefill)."""

    op_id: int
    resource: str
    version: Version
    ids: tuple[int, ...]
    purpose: str                       # start | warm | evict | failover
    timeout_s: float | None = None
    text: str | None = None            # text mode: the same run as a string


@dataclass(frozen=True)
class Extend:
    """Append `ids` (chunks first_seq..last_seq) to what `resource` has committed."""

    op_id: int
    resource: str
    version: Version
    ids: tuple[int, ...]
    first_seq: Seq
    last_seq: Seq
    timeout_s: float | None = None
    purpose: str = "catchup"           # catchup (secondary) | eager (primary, new chunks)
    text: str | None = None            # text mode: the same tokens as a string


@dataclass(frozen=True)
class Route:
    """Answer `request` on `resource`; `cold`: discard the resource's cache first (baseline);
    `hedge`: asked on the secondary, against the state it holds, for a slow primary."""

    resource: str
    request: Request
    cold: bool = False
    hedge: bool = False


@dataclass(frozen=True)
class StartTimer:
    timer_id: int
    delay_s: float


@dataclass(frozen=True)
class VersionChanged:
    """A new version is active: chunks before `first_seq` were evicted by policy."""

    version: Version
    first_seq: Seq
    next_seq: Seq
    reason: str                        # swap | sync | fallback | failover
    primary: str
    committed_ids: tuple[int, ...] = ()  # swap: what the new primary holds, token for token


@dataclass(frozen=True)
class Notice:
    level: str                         # info | warning
    message: str


Command = Union[Load, Extend, Route, StartTimer, VersionChanged, Notice]


# -- bookkeeping --------------------------------------------------------------------------------

@dataclass
class ResourceSlot:
    name: str
    holds: Version | None = None       # version whose static run this resource holds (or will)
    inflight: set[QueryId] = field(default_factory=set)
    ops: set[int] = field(default_factory=set)
    failed: bool = False
    suspect: bool = False              # a query on it did not answer in time; until one does


@dataclass
class Counters:
    cycles_started: int = 0
    cycles: int = 0                    # completed evictions (swap, sync eviction or fallback)
    swaps: int = 0
    sync_evictions: int = 0
    fallbacks: int = 0
    retries: int = 0
    failovers: int = 0
    queries: int = 0
    failed_queries: int = 0
    hedged_queries: int = 0            # asked on the secondary for a slow or failed primary
    chunks_in: int = 0
    catchup_steps: int = 0
    catchup_cut_short: int = 0         # swaps with more than n_catchup left: it did not shrink


class SeqRuns:
    """Seqs in the order they were added, kept as runs of consecutive seqs `[first, end)`.

    Evictions drop the oldest chunks of a gap-free stream, so a robot's whole day of evicted
    seqs is one run (a new chunk stream starts another): memory stays flat however many chunks
    pass. Any order is kept exactly; it is only compact when seqs follow each other.
    """

    def __init__(self, seqs=()):
        self.runs: list[tuple[int, int]] = []
        self._n = 0
        self.extend(seqs)

    def add(self, seq: int) -> None:
        seq = int(seq)
        if self.runs and self.runs[-1][1] == seq:
            self.runs[-1] = (self.runs[-1][0], seq + 1)
        else:
            self.runs.append((seq, seq + 1))
        self._n += 1

    def extend(self, seqs) -> None:
        for seq in seqs:
            self.add(seq)

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        for first, end in self.runs:
            yield from range(first, end)

    def __eq__(self, other) -> bool:
        if isinstance(other, SeqRuns):
            return self.runs == other.runs
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"SeqRuns({self.runs!r})"


@dataclass(frozen=True)
class Viability:
    """Paper eq. 54: warm-up and catch-up must finish before the primary's context is full."""

    arrival_tokens_per_s: float | None
    warm_tokens_per_s: float | None
    catchup_tokens_per_s: float | None
    context_left_tokens: int
    time_to_full_s: float | None       # (N_max - |T|) / arrival rate
    dt_warm_s: float | None
    dt_recon_s: float | None
    headroom_s: float | None           # time_to_full_s - (dt_warm_s + dt_recon_s)


@dataclass(frozen=True)
class Capacity:
    """Eq. 54 at the moment a reconciliation starts (the static part at tau_mem): can warming
    X_E and catching up finish before the arrivals fill the rest of the context?

    Estimated from the first measurements: the arrival rate of chunk tokens, and the prefill
    rate of the resources (a finished warm-up when there is one, else any load or extend,
    such as the primary's start). `viable` is None until both are known.
    """

    viable: bool | None
    arrival_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    evicted_tokens: int                # |X_E| when reconciling from tau_mem
    dt_warm_s: float | None
    dt_recon_s: float | None
    time_to_full_s: float | None       # (limit - tau_mem) / arrival
    headroom_s: float | None
    max_arrival_tokens_per_s: float | None   # what these resources can reconcile
    max_tau_mem_tokens: int | None           # the largest tau_mem that fits this arrival
    message: str

    def as_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(self).items()}


class Reconciliation:
    """The ASR machine over one or two named resources. Feed it events with `handle`."""

    def __init__(self, state: CsrState, resources: Sequence[str], config: ReconcileConfig,
                 *, policy: EvictionPolicy = drop_oldest_fraction):
        if config.mode == "asr" and len(resources) != 2:
            raise ConfigError(f"ASR needs two resources, got {len(resources)}")
        if config.mode != "asr" and len(resources) < 1:
            raise ConfigError("the baselines need one resource")
        if len(set(resources)) != len(resources):
            raise ConfigError(f"resource names must differ, got {list(resources)}")
        self.config = config
        self.policy = policy
        self.active = state
        self.slots = {name: ResourceSlot(name) for name in resources}
        self.primary = resources[0]
        self.secondary = resources[1] if len(resources) > 1 else None
        self.phase = Phase.IDLE
        self.pending: CsrState | None = None   # X_E plus caught-up chunks (next version)
        self.buffer: list[Chunk] = []          # arrived since X_E, not yet sent to the secondary
        self.previous: CsrState | None = None  # the old version and later chunks (hedges)
        self.counters = Counters()
        self.evicted = SeqRuns()               # seqs dropped by policy, in order
        self.queries: dict[QueryId, tuple[Version, str]] = {}
        self._op_ids = itertools.count(1)
        self._timer_ids = itertools.count(1)
        self._warm_op: int | None = None       # the secondary's current reconciliation op
        self._retry_timer: int | None = None
        self._primary_op: int | None = None    # a reload of the primary (start/evict/failover)
        self._primary_retry_timer: int | None = None
        self._primary_failures = 0
        self._primary_issued_tokens = 0        # static run the primary holds once its queue ran
        self._eager_ops: dict[int, tuple[str, Version]] = {}
        self._warm_failures = 0
        self._next_version = Version(state.version + 1)
        self._arrival: _Rate = _Rate(config.rate_halflife_s)
        self._warm_rate: float | None = None
        self._catchup_rate: float | None = None
        self._catchup_step_tokens: int | None = None   # the last catch-up step's, this cycle
        self._prefill_tokens = 0               # every successful load/extend, for capacity()
        self._prefill_s = 0.0

    # -- public view ---------------------------------------------------------------------------

    @property
    def reconciling(self) -> bool:
        """True inside a reconciliation window (X_E derived, swap not done yet)."""
        return self.phase is not Phase.IDLE

    @property
    def context_room_tokens(self) -> int:
        """Static tokens that can still arrive before a chunk forces a synchronous fallback."""
        limit = self.config.max_context_tokens - self.config.reserve_tokens
        return limit - self.active.n_static

    @property
    def hedge_state(self) -> CsrState | None:
        """The state the idle secondary holds, consistent with the stream (the old version and
        every chunk since), that a hedged query is built against; None where there is none."""
        slot = self.slots.get(self.secondary) if self.secondary is not None else None
        if self.previous is None or slot is None or slot.holds != self.previous.version \
                or slot.failed or slot.suspect or slot.ops or self.phase is not Phase.IDLE:
            return None
        return self.previous

    @property
    def primary_reloading(self) -> bool:
        """A reload of the primary (start, eviction, failover) is queued or waiting to retry."""
        return self._primary_op is not None or self._primary_retry_timer is not None

    @property
    def evicted_seqs(self) -> list[Seq]:
        """Every seq dropped by policy, in order (expanded from `evicted`: for tests and
        small runs; a long run reads `evicted.runs`)."""
        return [Seq(s) for s in self.evicted]

    @property
    def buffer_tokens(self) -> int:
        return sum(c.n_tokens for c in self.buffer)

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """Prefill rate of the resources: a finished warm-up's, else every load and extend's."""
        if self._warm_rate:
            return self._warm_rate
        return self._prefill_tokens / self._prefill_s if self._prefill_s > 0 else None

    def viability(self) -> Viability:
        cfg = self.config
        left = cfg.max_context_tokens - cfg.reserve_tokens - self.active.n_static
        arrival = self._arrival.value
        to_full = left / arrival if arrival else None
        n_evicted = self.pending.n_static if self.pending is not None else self._evicted_estimate()
        warm_rate = self.prefill_tokens_per_s
        catchup_rate = self._catchup_rate or warm_rate
        dt_warm = n_evicted / warm_rate if warm_rate else None
        dt_recon = None
        if dt_warm is not None and catchup_rate and arrival is not None:
            if catchup_rate > arrival:
                dt_recon = arrival * dt_warm / (catchup_rate - arrival)
            else:
                dt_recon = float("inf")
        headroom = None
        if to_full is not None and dt_warm is not None and dt_recon is not None:
            headroom = to_full - (dt_warm + dt_recon)
        return Viability(arrival_tokens_per_s=arrival, warm_tokens_per_s=warm_rate,
                         catchup_tokens_per_s=catchup_rate, context_left_tokens=left,
                         time_to_full_s=to_full, dt_warm_s=dt_warm, dt_recon_s=dt_recon,
                         headroom_s=headroom)

    def capacity(self) -> Capacity:
        """Eq. 54 evaluated for a reconciliation that starts at tau_mem (see `Capacity`)."""
        cfg = self.config
        limit = cfg.max_context_tokens - cfg.reserve_tokens
        tau = cfg.tau_mem_tokens
        arrival = self._arrival.value
        rate = self.prefill_tokens_per_s
        catchup = self._catchup_rate or rate
        n_evicted = self._evicted_at(tau)
        if cfg.mode != "asr":
            return Capacity(None, arrival, rate, n_evicted, None, None, None, None, None, None,
                            f"{cfg.mode} mode evicts on the primary; eq. 54 does not apply")
        span_s = self._arrival.span_s
        if not arrival or not rate or span_s < cfg.rate_halflife_s:
            missing = " and ".join(w for w, v in (
                (f"arrivals over {cfg.rate_halflife_s:g} s (seen {span_s:.1f} s)",
                 arrival and span_s >= cfg.rate_halflife_s),
                ("a prefill measurement", rate)) if not v)
            return Capacity(None, arrival, rate, n_evicted, None, None, None, None, None, None,
                            f"capacity not known yet: waiting for {missing}")
        dt_warm = n_evicted / rate
        dt_recon = arrival * dt_warm / (catchup - arrival) if catchup > arrival else float("inf")
        to_full = (limit - tau) / arrival
        headroom = to_full - dt_warm - dt_recon
        # with catch-up as fast as warm-up, eq. 54 reads (limit - tau)/a >= |X_E| / (p - a)
        max_arrival = rate * (limit - tau) / (limit - tau + n_evicted)
        max_tau = self._max_tau_for(arrival, rate, limit)
        viable = headroom >= 0
        figures = (f"arrival {arrival:.1f} tokens/s; warming |X_E| = {n_evicted} tokens at "
                   f"{rate:.0f} tokens/s takes {dt_warm:.1f} s, catching up "
                   f"{'forever' if dt_recon == float('inf') else f'{dt_recon:.1f} s'}; the "
                   f"context fills {to_full:.1f} s after tau_mem ({tau} of {limit} tokens)")
        if viable:
            message = f"reconciliation keeps up (headroom {headroom:.1f} s): {figures}"
        else:
            change = [f"lower the arrival to <= {max_arrival:.1f} tokens/s (the aggregator's "
                      "source.<name>.period_s, deadbands, keepalive_s)"]
            if max_tau is not None:
                change.append(f"lower tau_mem_tokens to <= {max_tau}")
            change.append("evict more per cycle (eviction.fraction, eviction.keep_tokens), a "
                          "larger context_tokens, or faster resources")
            message = (f"arrival exceeds what the resources can reconcile: {figures}; every "
                       "cycle will end in a synchronous fallback (the primary stalls while it "
                       "prefills the evicted state). Change: " + "; or ".join(change))
        return Capacity(viable, arrival, rate, n_evicted, dt_warm, dt_recon, to_full, headroom,
                        max_arrival, max_tau, message)

    def _evicted_at(self, tau_tokens: int) -> int:
        """|X_E| for a static part of `tau_tokens`, with chunks the size of today's (the eviction
        policy is applied to that synthetic history)."""
        prefix = len(self.active.prefix_ids)
        tokens = self.active.chunk_tokens
        mean = max(1, round(sum(tokens) / len(tokens))) if tokens else 32
        n = max(1, (tau_tokens - prefix) // mean)
        n_drop = self.policy([mean] * n)
        return prefix + (n - n_drop) * mean

    def _max_tau_for(self, arrival: float, rate: float, limit: int) -> int | None:
        """The largest tau_mem (in steps of 1/64 of the limit) for which eq. 54 holds."""
        prefix = len(self.active.prefix_ids)
        best = None
        for i in range(1, 64):
            tau = prefix + (limit - prefix) * i // 64
            n_e = self._evicted_at(tau)
            if rate > arrival and (limit - tau) / arrival >= n_e / (rate - arrival):
                best = tau
        return best

    # -- events --------------------------------------------------------------------------------

    def start(self, *, preloaded: bool = False) -> list[Command]:
        """Load the primary with the current state (before the first query).

        `preloaded`: the primary already holds exactly the active static run (resumed from a
        capsule and the chunk log), so nothing is loaded. A state already at or past tau_mem
        (a node joining after a long history) is first evicted to what the primary can hold,
        with the same policy, as a new version ('join').
        """
        if preloaded:
            self.slots[self.primary].holds = self.active.version
            self.active.mark_prefilled()
            self._primary_issued_tokens = self.active.n_static
            return []
        cmds = self._fit_on_join()
        return cmds + self._reload_primary("start")

    def _fit_on_join(self) -> list[Command]:
        cfg = self.config
        limit = cfg.max_context_tokens - cfg.reserve_tokens
        state, rounds = self.active, 0
        while state.n_static >= cfg.tau_mem_tokens and state.chunks:
            n_drop = self.policy(state.chunk_tokens)
            tokens = state.chunk_tokens
            while n_drop < len(tokens) and state.n_static - sum(tokens[:n_drop]) > limit:
                n_drop += 1                  # a policy that keeps too much must still fit
            if n_drop == 0:
                break
            state = state.evicted(n_drop)
            rounds += 1
        if rounds == 0:
            return []
        before = self.active
        new = state
        new.version = self._next_version
        self._next_version = Version(self._next_version + 1)
        self.counters.cycles_started += 1
        notice = Notice("info", (
            f"joined with {before.n_static} static tokens ({len(before.chunks)} chunks), past "
            f"tau_mem {cfg.tau_mem_tokens}: evicted in {rounds} rounds of the same policy to "
            f"{new.n_static} tokens ({len(new.chunks)} chunks) before loading"))
        return [notice] + self._activate(new, "join", reload=False)

    def new_stream(self) -> list[Command]:
        """The chunk stream began again (its seqs restart at 0): a new version without any
        chunk of the old stream; the primary reloads the prefix."""
        self._abandon()
        self.previous = None
        old = self.active
        new = old.evicted(len(old.chunks))
        new.next_seq = Seq(0)
        new.version = self._next_version
        self._next_version = Version(self._next_version + 1)
        notice = Notice("warning", (
            f"the chunk stream began again at seq 0 (the aggregator restarted without its chunk"
            f" log): v{new.version} holds none of the {len(old.chunks)} chunks "
            f"({old.n_static - len(old.prefix_ids)} tokens) of the old stream"))
        self.evicted.extend(c.seq for c in old.chunks)
        assert new.version > old.version, "versions only increase"
        self.active = new
        self.slots[self.primary].holds = new.version
        cmds: list[Command] = [notice, VersionChanged(version=new.version, first_seq=Seq(0),
                                                      next_seq=Seq(0), reason="stream",
                                                      primary=self.primary)]
        return cmds + self._reload_primary("stream")

    def handle(self, event: Event) -> list[Command]:
        if isinstance(event, ChunkArrived):
            return self._on_chunk(event)
        if isinstance(event, QueryStarted):
            return self._on_query_started(event)
        if isinstance(event, QueryFinished):
            return self._on_query_finished(event)
        if isinstance(event, QueryStalled):
            return self._on_query_stalled(event)
        if isinstance(event, OpFinished):
            return self._on_op_finished(event)
        if isinstance(event, TimerFired):
            return self._on_timer(event)
        raise TypeError(f"not a reconciliation event: {event!r}")

    def _on_chunk(self, ev: ChunkArrived) -> list[Command]:
        chunk = ev.chunk
        if chunk.seq != self.active.next_seq:
            self.active.append(chunk)      # raises ChunkOrderError on a gap, nothing changed
        cmds: list[Command] = []
        if chunk.n_tokens > self.context_room_tokens:
            limit = self.config.max_context_tokens - self.config.reserve_tokens
            cmds += self._fallback(chunk.n_tokens, limit)
        self.active.append(chunk)
        if cmds:
            # The fallback's version holds this chunk too: its change says so, as the chunk
            # log has the chunk before the version record and a restart folds it into it.
            cmds = [replace(c, next_seq=self.active.next_seq) if isinstance(c, VersionChanged)
                    else c for c in cmds]
        if self.previous is not None:
            if self.previous.n_static + chunk.n_tokens > \
                    self.config.max_context_tokens - self.config.reserve_tokens:
                self.previous = None           # too long for a query on the secondary
            else:
                self.previous.append(chunk)
        self.counters.chunks_in += 1
        self._arrival.add(chunk.n_tokens, ev.now_s)
        if self.pending is not None:
            self.buffer.append(chunk)
        cmds += self._maybe_start_cycle(ev.now_s)
        cmds += self._eager_extend()
        return cmds

    def _on_query_started(self, ev: QueryStarted) -> list[Command]:
        if self.slots[self.primary].suspect and self.hedge_state is not None:
            return self._hedge(ev.task, ev.suffix, ev.max_new_tokens)
        request = self.active.build_request(task=ev.task, suffix=ev.suffix)
        need = request.n_static + request.n_dynamic + ev.max_new_tokens
        if need > self.config.max_context_tokens:
            msg = (f"query needs {need} tokens (static {request.n_static}, dynamic "
                   f"{request.n_dynamic}, new {ev.max_new_tokens}) over max_context_tokens "
                   f"{self.config.max_context_tokens}: raise reserve_tokens to cover the "
                   "dynamic part and the answer")
            raise ContextOverflowError(msg)
        slot = self.slots[self.primary]
        assert slot.holds == request.version, (
            f"primary {slot.name} holds version {slot.holds}, request is v{request.version}")
        slot.inflight.add(request.query_id)
        self._primary_issued_tokens = request.n_static
        self.queries[request.query_id] = (request.version, slot.name)
        self.counters.queries += 1
        return [Route(resource=slot.name, request=request, cold=self.config.mode == "unordered")]

    def _on_query_stalled(self, ev: QueryStalled) -> list[Command]:
        """Query `ev.query_id` is late or failed: its resource is suspect, and the query is
        asked again where a consistent state is served: on the secondary's hedge state, or,
        once a swap made another resource primary, on that primary (else nothing yet: the
        caller may ask again)."""
        known = self.queries.get(ev.query_id)
        if known is None or self.config.mode != "asr":
            return []
        slow = self.slots[known[1]]
        slow.suspect = True
        primary = self.slots[self.primary]
        if slow.name != self.primary and not primary.suspect and not primary.failed \
                and primary.holds == self.active.version and not self.primary_reloading:
            self.counters.hedged_queries += 1
            return self._on_query_started(QueryStarted(ev.task, ev.suffix, ev.max_new_tokens,
                                                       now_s=ev.now_s))
        if slow.name != self.primary or self.hedge_state is None:
            return []
        return self._hedge(ev.task, ev.suffix, ev.max_new_tokens)

    def _hedge(self, task: str, suffix: str, max_new_tokens: int) -> list[Command]:
        state, slot = self.previous, self.slots[self.secondary]
        request = state.build_request(task=task, suffix=suffix)
        if request.n_static + request.n_dynamic + max_new_tokens > self.config.max_context_tokens:
            return []
        slot.inflight.add(request.query_id)
        self.queries[request.query_id] = (request.version, slot.name)
        self.counters.queries += 1
        self.counters.hedged_queries += 1
        return [Route(resource=slot.name, request=request, hedge=True)]

    def _on_query_finished(self, ev: QueryFinished) -> list[Command]:
        _, name = self.queries.pop(ev.query_id)
        slot = self.slots[name]
        slot.inflight.discard(ev.query_id)
        cmds: list[Command] = []
        if not ev.ok:
            self.counters.failed_queries += 1
            if name == self.primary:
                cmds += self._primary_failed(f"query {ev.query_id} failed on {name}", ev.now_s)
            else:
                slot.holds = None          # a straggler failed: its cache is unknown now
                slot.failed = True
        else:
            slot.suspect = False               # it answers again
            if name == self.primary:
                self._primary_failures = 0
        cmds += self._try_warm(ev.now_s)
        cmds += self._eager_extend()
        return cmds

    def _on_op_finished(self, ev: OpFinished) -> list[Command]:
        owner = None
        for slot in self.slots.values():
            if ev.op_id in slot.ops:
                owner = slot
                slot.suspect = slot.suspect and not ev.ok     # it computes again
            slot.ops.discard(ev.op_id)
        # A retried warm-up's time says nothing of the prefill rate: a server may have computed
        # the abandoned attempt's prefill and answer the retry from its cache at once.
        retried = ev.op_id == self._warm_op and self._warm_failures > 0
        rate = ev.n_tokens / ev.seconds \
            if ev.ok and ev.n_tokens > 0 and ev.seconds > 0 and not retried else None
        if rate is not None:
            self._prefill_tokens += ev.n_tokens
            self._prefill_s += ev.seconds
        if ev.op_id in self._eager_ops:
            name, version = self._eager_ops.pop(ev.op_id)
            if ev.ok:
                return self._eager_extend()      # what arrived meanwhile, in one extend
            if name == self.primary:     # a reload queued behind it, if any, recovers it
                return self._primary_failed(f"extending {name} (v{version}) failed", ev.now_s)
            self.slots[name].holds = None
            return []
        if ev.op_id == self._primary_op:
            self._primary_op = None
            if ev.ok:
                self._primary_failures = 0
                self.slots[self.primary].failed = False
                return self._maybe_start_cycle(ev.now_s) + self._try_warm(ev.now_s)
            return self._primary_failed(f"reloading {self.primary} failed", ev.now_s)
        if ev.op_id != self._warm_op:
            if not ev.ok and owner is not None and owner.name != self.primary:
                owner.holds, owner.failed = None, True   # what it holds is unknown now
            return self._try_warm(ev.now_s)    # stale: its reconciliation was abandoned
        self._warm_op = None
        slot = self.slots[self.secondary]
        if not ev.ok:
            what = "warm-up" if self.phase is Phase.WARM else "catch-up"
            slot.holds, slot.failed = None, True
            self.counters.retries += 1
            self._warm_failures += 1
            delay_s = min(self.config.retry_max_s,
                          self.config.retry_base_s * 2 ** (self._warm_failures - 1))
            self.phase = Phase.RETRY
            self._retry_timer = next(self._timer_ids)
            return [Notice("warning", f"{what} of v{self.pending.version} on {slot.name} failed; "
                                      f"retry {self._warm_failures} in {delay_s:.1f} s"),
                    StartTimer(self._retry_timer, delay_s)]
        slot.failed = False
        self._warm_failures = 0
        if self.phase is Phase.WARM:
            self._warm_rate = _smooth(self._warm_rate, rate)
        else:
            self._catchup_rate = _smooth(self._catchup_rate, rate)
            self.counters.catchup_steps += 1
        self.phase = Phase.CATCHUP
        return self._catch_up_or_swap(ev.now_s)

    def _on_timer(self, ev: TimerFired) -> list[Command]:
        if ev.timer_id == self._retry_timer and self.phase is Phase.RETRY:
            self._retry_timer = None
            self.phase = Phase.DRAIN
            return self._try_warm(ev.now_s)
        if ev.timer_id == self._primary_retry_timer:
            self._primary_retry_timer = None
            return self._reload_primary("failover")
        return []

    # -- the cycle -----------------------------------------------------------------------------

    def _maybe_start_cycle(self, now_s: float) -> list[Command]:
        if self.phase is not Phase.IDLE or self.active.n_static < self.config.tau_mem_tokens:
            return []
        n_drop = self.policy(self.active.chunk_tokens)
        if n_drop == 0:
            return [Notice("warning", "static part over tau_mem but the eviction policy drops "
                                      "nothing; the context bound will force a fallback")]
        self.counters.cycles_started += 1
        if self.config.mode != "asr":
            self.counters.sync_evictions += 1
            return self._activate(self._derive(n_drop), "sync",
                                  reload=self.config.mode == "sync")
        self.pending = self._derive(n_drop)
        self.buffer = []
        self._catchup_step_tokens = None
        self.phase = Phase.DRAIN
        return self._try_warm(now_s)

    def _try_warm(self, now_s: float) -> list[Command]:
        if self.phase is not Phase.DRAIN:
            return []
        slot = self.slots[self.secondary]
        if slot.inflight:
            return []                      # stragglers of the old version are still running
        self.previous = None               # the secondary is loaded with the next version
        slot.holds = self.pending.version
        self._warm_op = op_id = next(self._op_ids)
        slot.ops.add(op_id)
        self.phase = Phase.WARM
        ids = tuple(self.pending.static_ids)
        return [Load(op_id=op_id, resource=slot.name, version=self.pending.version,
                     ids=ids, purpose="warm", text=_text_of(self.pending),
                     timeout_s=self._op_timeout_s(len(ids), self._warm_failures))]

    def _catch_up_or_swap(self, now_s: float) -> list[Command]:
        """Another catch-up step while the buffer holds more than `n_catchup_tokens` and shrank
        in the last step; else the swap. Where the stream brings more tokens during a step than
        the step took (a fast stream on a busy secondary), more steps cannot catch up: the rest
        (what arrived during one step) goes to the new primary, as the first query's prefill,
        instead of the context filling up into a fallback."""
        shrinking = self._catchup_step_tokens is None or \
            self.buffer_tokens < self._catchup_step_tokens
        if self.buffer_tokens > self.config.n_catchup_tokens and not shrinking:
            self.counters.catchup_cut_short += 1
            return self._swap(now_s)
        if self.buffer_tokens > self.config.n_catchup_tokens:
            chunks, self.buffer = self.buffer, []
            ids: list[int] = []
            for chunk in chunks:
                self.pending.append(chunk)
                ids.extend(chunk.token_ids)
            slot = self.slots[self.secondary]
            self._warm_op = op_id = next(self._op_ids)
            slot.ops.add(op_id)
            self._catchup_step_tokens = len(ids)
            return [Extend(op_id=op_id, resource=slot.name, version=self.pending.version,
                           ids=tuple(ids), first_seq=chunks[0].seq, last_seq=chunks[-1].seq,
                           timeout_s=self._op_timeout_s(len(ids), self._warm_failures),
                           text=_text_of(self.pending, chunks))]
        return self._swap(now_s)

    def _swap(self, now_s: float) -> list[Command]:
        new = self.pending
        self.previous = self.active        # what the old primary holds, for hedged queries
        committed_ids = tuple(new.static_ids)
        new.mark_prefilled()               # i* of the next query is measured against this
        for chunk in self.buffer:          # what catch-up left: the new primary prefills it
            new.append(chunk)
        self.pending, self.buffer = None, []
        self.phase = Phase.IDLE
        self._warm_op = None
        self.counters.swaps += 1
        if self._primary_op is not None or self._primary_retry_timer is not None:
            # The old primary was still reloading (a fallback) or waiting to: the swap
            # overtakes it. What it loads is only ever a straggler's version now, and a failure
            # of the new primary must be recovered, not taken for that reload's.
            if self._primary_retry_timer is not None:
                self.slots[self.primary].holds = None
            self._primary_op = self._primary_retry_timer = None
        self._primary_failures = 0
        self.primary, self.secondary = self.secondary, self.primary
        self._primary_issued_tokens = len(committed_ids)
        cmds = self._activate(new, "swap", reload=False, committed_ids=committed_ids)
        return cmds + self._maybe_start_cycle(now_s) + self._eager_extend()

    # -- degraded paths ------------------------------------------------------------------------

    def _fallback(self, n_tokens: int, limit: int) -> list[Command]:
        """The context is full before reconciliation finished: evict on the primary now."""
        chunk_tokens = self.active.chunk_tokens
        n_drop = self.policy(chunk_tokens)
        while n_drop < len(chunk_tokens) and \
                self.active.n_static - sum(chunk_tokens[:n_drop]) + n_tokens > limit:
            n_drop += 1
        if self.active.n_static - sum(chunk_tokens[:n_drop]) + n_tokens > limit:
            msg = (f"a {n_tokens}-token chunk does not fit in max_context_tokens "
                   f"{self.config.max_context_tokens} even with every chunk evicted; "
                   "lower max_chunk_tokens or reserve_tokens")
            raise ContextOverflowError(msg)
        abandoned = self.phase is not Phase.IDLE
        self._abandon()
        self.counters.fallbacks += 1
        cmds: list[Command] = [Notice("warning", (
            f"context full at {self.active.n_static} static tokens "
            f"({'reconciliation still running' if abandoned else 'no reconciliation running'});"
            f" evicting {n_drop} chunks synchronously on {self.primary} (fallback "
            f"{self.counters.fallbacks})"))]
        return cmds + self._activate(self._derive(n_drop), "fallback", reload=True)

    def _primary_failed(self, why: str, now_s: float) -> list[Command]:
        self._primary_failures += 1
        slot = self.slots[self.primary]
        slot.failed = True
        if self._primary_op is not None or self._primary_retry_timer is not None:
            return [Notice("warning", f"{why}; {self.primary} is being recovered")]
        if self.secondary is not None and self._primary_failures == 1:
            n_drop = self._reconciled_drop()
            self._abandon()
            self.counters.failovers += 1
            self.primary, self.secondary = self.secondary, self.primary
            self.slots[self.secondary].holds = None
            self.slots[self.primary].suspect = False
            self.previous = None
            evicting = f", evicting the {n_drop} chunks its reconciliation was evicting" \
                if n_drop else ""
            return [Notice("warning", f"{why}; failing over to {self.primary}{evicting}")] + \
                self._activate(self._derive(n_drop), "failover", reload=True)
        self.counters.retries += 1
        delay_s = min(self.config.retry_max_s,
                      self.config.retry_base_s * 2 ** (self._primary_failures - 1))
        self._primary_retry_timer = next(self._timer_ids)
        return [Notice("warning", f"{why}; reloading {self.primary} in {delay_s:.1f} s"),
                StartTimer(self._primary_retry_timer, delay_s)]

    def _reconciled_drop(self) -> int:
        """The chunks a running reconciliation evicts (0 where none runs). A failover loads the
        new primary in full anyway: it loads that version and every chunk since, which is
        fewer tokens than the current state and begins with the prefix the new primary was
        warming (a server's prompt cache may still hold it)."""
        if self.pending is None:
            return 0
        return sum(1 for chunk in self.active.chunks if chunk.seq < self.pending.first_seq)

    def _abandon(self) -> None:
        if self.pending is not None and self.secondary is not None:
            self.slots[self.secondary].holds = None
        self.pending, self.buffer = None, []
        self.phase = Phase.IDLE
        self._warm_op = self._retry_timer = None

    # -- versions ------------------------------------------------------------------------------

    def _derive(self, n_drop: int) -> CsrState:
        new = self.active.evicted(n_drop)
        new.version = self._next_version
        self._next_version = Version(self._next_version + 1)
        return new

    def _activate(self, new: CsrState, reason: str, *, reload: bool,
                  committed_ids: tuple[int, ...] = ()) -> list[Command]:
        first_seq = new.first_seq
        self.evicted.extend(c.seq for c in self.active.chunks if c.seq < first_seq)
        assert new.version > self.active.version, "versions only increase"
        self.active = new
        if reason != "failover":
            self.counters.cycles += 1
        self.slots[self.primary].holds = new.version
        cmds: list[Command] = [VersionChanged(version=new.version, first_seq=first_seq,
                                              next_seq=new.next_seq, reason=reason,
                                              primary=self.primary, committed_ids=committed_ids)]
        if reload:
            cmds += self._reload_primary(reason)
        return cmds

    def _reload_primary(self, purpose: str) -> list[Command]:
        slot = self.slots[self.primary]
        slot.holds = self.active.version
        self.active.mark_prefilled()
        self._primary_issued_tokens = self.active.n_static
        self._primary_op = op_id = next(self._op_ids)
        slot.ops.add(op_id)
        ids = tuple(self.active.static_ids)
        return [Load(op_id=op_id, resource=slot.name, version=self.active.version, ids=ids,
                     purpose=purpose, text=_text_of(self.active),
                     timeout_s=self._op_timeout_s(len(ids), self._primary_failures))]

    def _eager_extend(self) -> list[Command]:
        """Prefill chunks the primary does not hold yet, while it has no query to answer.

        One such extend at a time: chunks that arrive while it runs go in the next one, so a
        fast stream costs one call per extend, not one per chunk, and never queues up behind
        the primary's queries."""
        slot = self.slots[self.primary]
        if not self.config.eager_extend or self.config.mode == "unordered" or slot.inflight \
                or slot.failed or slot.holds != self.active.version \
                or self._primary_retry_timer is not None \
                or (slot.name, self.active.version) in self._eager_ops.values():
            return []
        n_issued = self._primary_issued_tokens
        if n_issued >= self.active.n_static:
            return []
        ids = tuple(self.active.static_ids[n_issued:])
        self._primary_issued_tokens = self.active.n_static
        chunks = [c for c in self.active.chunks if c.seq >= self._first_unissued_seq(n_issued)]
        assert sum(c.n_tokens for c in chunks) == len(ids), "the primary stops at chunk bounds"
        op_id = next(self._op_ids)
        slot.ops.add(op_id)
        self._eager_ops[op_id] = (slot.name, self.active.version)
        return [Extend(op_id=op_id, resource=slot.name, version=self.active.version, ids=ids,
                       first_seq=chunks[0].seq, last_seq=chunks[-1].seq, purpose="eager",
                       timeout_s=self._op_timeout_s(len(ids), 0),
                       text=_text_of(self.active, chunks))]

    def _op_timeout_s(self, n_tokens: int, failures: int) -> float | None:
        """A load or extend's deadline: `warm_timeout_s`, or `OP_TIMEOUT_MARGIN` times what the
        measured prefill rate says it takes where that is longer; doubled per failed try
        before it. A server that drops the work of a client that gave up would otherwise never
        finish a warm-up longer than the timeout: every retry starts it again."""
        base_s = self.config.warm_timeout_s
        if base_s is None:
            return None
        rate = self.prefill_tokens_per_s
        estimate_s = OP_TIMEOUT_MARGIN * n_tokens / rate if rate else 0.0
        return max(base_s, estimate_s) * 2 ** min(failures, OP_TIMEOUT_DOUBLINGS)

    def _first_unissued_seq(self, n_issued: int) -> Seq:
        n = len(self.active.prefix_ids)
        for chunk in self.active.chunks:
            if n >= n_issued:
                return chunk.seq
            n += chunk.n_tokens
        return self.active.next_seq

    def _evicted_estimate(self) -> int:
        n_drop = self.policy(self.active.chunk_tokens)
        return self.active.n_static - sum(self.active.chunk_tokens[:n_drop])


def _text_of(state: CsrState, chunks: Sequence[Chunk] | None = None) -> str | None:
    """Text mode: the static run (or just `chunks`) as the string a server tokenizes."""
    if state.mode != "text":
        return None
    return state.static_text if chunks is None else "".join(c.text for c in chunks)


class _Rate:
    """Tokens per second over a sliding exponential window."""

    def __init__(self, halflife_s: float):
        self.halflife_s = halflife_s
        self._first_s: float | None = None
        self._last_s: float | None = None
        self._tokens = 0.0

    def add(self, n_tokens: int, now_s: float) -> None:
        if self._first_s is None:
            self._first_s = self._last_s = now_s
            self._tokens = float(n_tokens)
            return
        dt = max(0.0, now_s - self._last_s)
        self._tokens = self._tokens * 0.5 ** (dt / self.halflife_s) + n_tokens
        self._last_s = now_s

    @property
    def span_s(self) -> float:
        """Time between the first and the newest arrival (0 before two)."""
        return 0.0 if self._first_s is None else self._last_s - self._first_s

    @property
    def value(self) -> float | None:
        if self._first_s is None or self._last_s <= self._first_s:
            return None
        span_s = self._last_s - self._first_s
        # the decayed sum over an exponential window of effective length halflife/ln2
        window_s = self.halflife_s / 0.6931471805599453 * (1 - 0.5 ** (span_s / self.halflife_s))
        return self._tokens / window_s if window_s > 0 else None


def _smooth(old: float | None, new: float | None, weight: float = 0.5) -> float | None:
    if new is None:
        return old
    return new if old is None else (1 - weight) * old + weight * new
