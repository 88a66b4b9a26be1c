"""What the reconciler publishes on csr/swaps: the timings of each resource's warm-up and
catch-up, and the report of a committed version. Pure apart from the clock passed in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from csr_ros.resources.base import Capabilities


@dataclass(frozen=True)
class OpTiming:
    resource: str
    kind: str            # load | extend
    started_s: float     # monotonic
    seconds: float
    n_tokens: int
    ok: bool


class TimedResource:
    """A Resource that records how long each load/extend took (for SwapEvent's figures).

    It passes on the inner resource's routing key and background work; the inner resource's
    other capabilities are not reachable through it."""

    def __init__(self, inner, ops: list, clock):
        self._inner = inner
        self._ops = ops
        self._clock = clock
        self.name = inner.name
        self.max_context_tokens = inner.max_context_tokens

    @property
    def capabilities(self) -> Capabilities:
        inner = self._inner.capabilities
        return Capabilities(routing_key=inner.routing_key, background=inner.background)

    n_committed = property(lambda self: self._inner.n_committed)
    committed_ids = property(lambda self: self._inner.committed_ids)
    state_mode = property(lambda self: self._inner.state_mode)
    routing_key = property(lambda self: self._inner.routing_key)

    def set_background(self, background: bool, *, few_threads: bool | None = None) -> None:
        self._inner.set_background(background, few_threads=few_threads)

    def load(self, ids, text=None, **kw):
        return self._timed("load", ids, lambda: self._inner.load(ids, text, **kw))

    def extend(self, ids, text=None, **kw):
        return self._timed("extend", ids, lambda: self._inner.extend(ids, text, **kw))

    def query(self, request, **kw):
        return self._inner.query(request, **kw)

    def close(self) -> None:
        self._inner.close()

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
