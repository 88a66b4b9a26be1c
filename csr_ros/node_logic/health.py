"""How a policy is doing, for /diagnostics and the live warnings: running figures of its
queries, the achieved decision rate against rate_hz, and a verdict with what to change.

    QueryStats        TTFT, decision time, cache hits, typed-action validity, the rate window
    Missed            ticks skipped, waited and queries failed over the rate window
    keep_up_warning   why the policy is not keeping up, with the numbers; None while it is
    Announcer         when to say a lasting warning (at once, every repeat_s, once when cleared)
    diagnose          counters, rate, last result → (level, message, key/values)

Pure: no rclpy, no clocks (times come in).
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

from csr_ros.node_logic.schedule import QueryScheduler
from csr_ros.node_logic.stream import StateFold
from csr_ros.resources.base import QueryResult
from csr_ros.stats import percentile

# diagnostic_msgs/DiagnosticStatus levels
OK, WARN, ERROR = 0, 1, 2

RATE_WINDOW_S = 30.0     # decisions/s is measured over this window (or since the start)
RATE_WARMUP_S = 5.0      # no rate verdict before this long after the first query ...
RATE_PERIODS = 10        # ... nor before, or over less than, this many periods: one decision
                         # more or less in a window of n periods moves the rate by 1/n
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
    counted: deque = field(default_factory=lambda: deque(maxlen=10_000))  # scheduler samples

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

    def decisions_per_s(self, now_s: float, rate_hz: float | None = None) -> float | None:
        """Decisions per second over the last RATE_WINDOW_S, or RATE_PERIODS periods of
        `rate_hz` where that is longer (or since `started_s`, the first query's start).

        None until RATE_WARMUP_S and RATE_PERIODS periods have passed: a model's first queries
        after it loaded are not taken for the rate, and a window of a few periods, where one
        decision more or less moves the figure by a third, gives no verdict."""
        if self.started_s is None:
            return None
        periods_s = RATE_PERIODS / rate_hz if rate_hz else 0.0
        window_s = min(max(RATE_WINDOW_S, periods_s), now_s - self.started_s)
        if window_s < max(RATE_WARMUP_S, periods_s):
            return None
        return sum(1 for t in self.decided_s if t > now_s - window_s) / window_s

    def missed(self, now_s: float, scheduler: QueryScheduler) -> Missed:
        """What `scheduler` counted since the latest of its samples (one per call) at or before
        the rate window's start (without one: since the start)."""
        window_s = max(RATE_WINDOW_S, RATE_PERIODS * scheduler.period_s)
        now = (now_s, scheduler.ticks, scheduler.skipped, scheduler.failed, scheduler.deferred)
        while len(self.counted) > 1 and self.counted[1][0] <= now_s - window_s:
            self.counted.popleft()
        since_s = max(now_s - window_s, now_s if self.started_s is None else self.started_s)
        first = self.counted[0] if self.counted else (since_s, 0, 0, 0, 0)
        self.counted.append(now)
        return Missed(now_s - first[0],
                      *(max(0, b - a) for a, b in zip(first[1:], now[1:])))

    def ttft_percentile_s(self, q: float) -> float | None:
        return percentile(self.ttfts_s, q)

    def decision_percentile_s(self, q: float) -> float | None:
        """Query start to last token (what bounds the decision rate)."""
        return percentile(self.decision_s, q)

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




@dataclass(frozen=True)
class Missed:
    """What the scheduler counted over the last `window_s` (QueryStats.missed)."""

    window_s: float
    ticks: int
    skipped_ticks: int       # a tick while a periodic query ran
    failed_queries: int
    deferred_ticks: int      # a tick that waited for a Query call or a Decide goal


@dataclass(frozen=True)
class Diagnosis:
    level: int
    message: str
    values: tuple[tuple[str, str], ...]


RATE_SHORTFALL = 0.8     # achieved below this share of rate_hz: a warning


def rate_shortfall(rate: float, rate_hz: float, ttft_p50_s: float | None,
                   decision_p50_s: float | None = None, *, missed: Missed | None = None,
                   decisions_s=(), last_error: str = "") -> str:
    """Why the policy decides slower than asked, and what to change. A decision takes its TTFT
    plus the decoding of its answer; a query never starts before the previous one ended.
    `missed` and `decisions_s` (recent decision times) say what happened when the typical
    decision fits the period."""
    msg = f"{rate:.3g} decisions/s against rate_hz {rate_hz:g}"
    if ttft_p50_s is None:
        return msg + ": no query has finished yet"
    took_s = decision_p50_s if decision_p50_s is not None else ttft_p50_s
    period_s = 1 / rate_hz
    msg += (f": a decision takes {took_s:.2f} s (p50: TTFT {ttft_p50_s:.2f} s + decoding "
            f"{max(0.0, took_s - ttft_p50_s):.2f} s)")
    if took_s > period_s:
        return msg + (f", longer than the period {period_s:.2f} s, so ticks are skipped; lower "
                      f"rate_hz to {max(0.01, 0.8 / took_s):.2g}, or make decisions cheaper "
                      "(fewer max_new_tokens"
                      f"{', the decoding dominates' if took_s > 2 * ttft_p50_s else ''}; a "
                      "smaller tau_mem_tokens; a faster resource)")
    msg += f", within the period {period_s:.2f} s"
    if missed is None:
        return msg + ", so queries failed, waited or were skipped"
    said = []
    if missed.skipped_ticks:
        slow = [s for s in decisions_s if s > period_s]
        said.append(f"{missed.skipped_ticks} ticks were skipped while a query ran"
                    + (f" ({len(slow)} of the last {len(decisions_s)} decisions took longer "
                       f"than the period, the longest {max(slow):.2f} s)" if slow else ""))
    if missed.failed_queries:
        said.append(f"{missed.failed_queries} queries failed"
                    + (f" (the last: {last_error})" if last_error else ""))
    if missed.deferred_ticks:
        said.append(f"{missed.deferred_ticks} ticks waited for Query calls or Decide goals")
    if not said:
        said.append(f"no tick was skipped and no query failed; {missed.ticks} ticks came, "
                    f"{missed.window_s * rate_hz:.0f} were due (the node's timer ran late)")
    return msg + f"; in the last {missed.window_s:.0f} s " + ", ".join(said)


def keep_up_warning(stats: QueryStats, rate_hz: float, now_s: float, *,
                    capacity: Mapping | None = None,
                    scheduler: QueryScheduler | None = None) -> str | None:
    """Why the policy is not keeping up, with the numbers and what to change; None while it is.

    Said as soon as it shows: the achieved rate below RATE_SHORTFALL of `rate_hz`, or the last
    three decisions each longer than the period (before the rate window has caught up), or the
    reconciler's capacity verdict that reconciliation cannot keep up with the arrivals.
    `scheduler`: its counters say what happened (ticks skipped, queries failed)."""
    if not stats.decision_s:       # nothing decided yet (a model still loading): no verdict
        return capacity["message"] if capacity and capacity.get("viable") is False else None
    period_s = 1 / rate_hz
    rate = stats.decisions_per_s(now_s, rate_hz)
    recent = list(stats.decision_s)[-3:]
    slow = len(recent) == 3 and min(recent) > period_s
    if slow:        # each of them longer than the period: at most this rate, whatever came before
        rate = min(rate if rate is not None else rate_hz, 1 / statistics.fmean(recent))
    if rate is not None and rate < RATE_SHORTFALL * rate_hz:
        return "the policy cannot keep up: " + _shortfall(stats, rate, rate_hz, now_s, scheduler)
    if capacity and capacity.get("viable") is False:
        return capacity["message"]
    return None


def _shortfall(stats: QueryStats, rate: float, rate_hz: float, now_s: float | None,
               scheduler: QueryScheduler | None) -> str:
    missed = (stats.missed(now_s, scheduler)
              if scheduler is not None and now_s is not None else None)
    return rate_shortfall(rate, rate_hz, stats.ttft_percentile_s(50),
                          stats.decision_percentile_s(50), missed=missed,
                          decisions_s=list(stats.decision_s), last_error=stats.last_error)


class Announcer:
    """When to log a warning that lasts: at once when it appears or changes kind, then every
    `repeat_s` while it lasts, and once (an info) when it has stayed clear for `clear_after_s`,
    so that a figure hovering at the threshold does not say warning, info, warning, ... The
    kind of a message is its text without the numbers, so changing figures do not count as a
    new warning."""

    def __init__(self, repeat_s: float = 30.0, clear_after_s: float = 10.0):
        self.repeat_s = repeat_s
        self.clear_after_s = clear_after_s
        self._kind: str | None = None
        self._said_s = float("-inf")
        self._clear_since_s: float | None = None

    def update(self, message: str | None, now_s: float) -> tuple[str, str] | None:
        """(level 'warning' | 'info', text) to log now, or None."""
        if message is None:
            if self._kind is None:
                return None
            if self._clear_since_s is None:
                self._clear_since_s = now_s
            if now_s - self._clear_since_s < self.clear_after_s:
                return None
            self._kind, self._clear_since_s = None, None
            return "info", "keeping up again"
        self._clear_since_s = None
        kind = re.sub(r"[0-9.]+", "#", message)
        if kind != self._kind or now_s - self._said_s >= self.repeat_s:
            self._kind, self._said_s = kind, now_s
            return "warning", message
        return None


def state_view(fold: StateFold) -> dict:
    """The figures `diagnose` reports about a state, from the policy's own fold."""
    order = fold.order.counters
    view = {"version": int(fold.version), "primary": fold.primary or "-",
            "chunks": len(fold.state.chunks), "next_seq": fold.next_seq,
            "static_tokens": fold.state.n_static, "lost_chunks": fold.lost,
            "held_chunks": fold.n_held, "rejected_chunks": fold.counters.rejected,
            "stream": fold.stream or "-", "stream_restarts": fold.counters.stream_restarts,
            "reconciler_starts": fold.counters.starts,
            "chunks_delivered": order.delivered, "duplicate_chunks": order.duplicates,
            "out_of_order_chunks": order.buffered, "fetches": order.fetches,
            "fetch_failures": order.fetch_failures}
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
    rate = stats.decisions_per_s(now_s, scheduler.rate_hz) if now_s is not None else None
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
        level, message = WARN, _shortfall(stats, rate, scheduler.rate_hz, now_s, scheduler)
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
