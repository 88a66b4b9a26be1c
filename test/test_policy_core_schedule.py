"""Query scheduling at rate_hz with skipped ticks, the dynamic suffix, and diagnostics."""

from __future__ import annotations

import pytest

from csr_ros.chunks import ChunkPolicy
from csr_ros.errors import ConfigError
from csr_ros.layout import Layout
from csr_ros.model_store import resolve_model_dir
from csr_ros.node_logic.health import ERROR, OK, WARN, QueryStats, diagnose
from csr_ros.node_logic.schedule import QueryScheduler
from csr_ros.node_logic.stream import ChunkEvent, StateFold
from csr_ros.node_logic.suffix import InstantValue, build_suffix
from csr_ros.node_logic.swaps import OpTiming, TimedResource, swap_report
from csr_ros.resources.base import QueryResult
from csr_ros.state import CsrState
from csr_ros.tokenizer import HFTokenizer

S = 1_000_000_000


def result(ttft_s: float, cached: int | None = 90) -> QueryResult:
    return QueryResult(text="stop", token_ids=(1,), ttft_s=ttft_s, decode_s=0.1, n_prompt=100,
                       n_extended=4, cached_tokens=cached, finish_reason="stop", resource="r1")


def test_a_tick_starts_a_query_only_when_none_is_running():
    s = QueryScheduler(rate_hz=2.0)
    assert s.period_s == 0.5
    assert s.tick()
    assert not s.tick() and not s.tick()         # the query takes longer than two periods
    s.finish(ok=True)
    assert s.tick()
    assert (s.ticks, s.started, s.skipped, s.finished) == (4, 2, 2, 1)


def test_on_demand_queries_share_the_slot_and_do_not_count_as_skipped_ticks():
    s = QueryScheduler(rate_hz=2.0)
    assert s.try_start()
    assert not s.try_start()
    s.finish(ok=False)
    assert (s.skipped, s.failed) == (0, 1)


def test_rate_must_be_positive():
    with pytest.raises(ConfigError, match="rate_hz must be > 0"):
        QueryScheduler(rate_hz=0.0)


def test_suffix_has_the_time_and_fresh_instant_values_sorted_with_their_age():
    instant = {"task": InstantValue("task", "task: data=kitchen", stamp_ns=9 * S),
               "battery": InstantValue("battery", "battery: percent=81", stamp_ns=int(9.5 * S)),
               "old": InstantValue("old", "old: data=x", stamp_ns=0)}
    assert build_suffix(instant, now_ns=10 * S, stale_s=5.0) == (
        "now: utc=1970-01-01T00:00:10Z\n"
        "battery: percent=81 age_s=0.5\n"
        "task: data=kitchen age_s=1.0")


def test_suffix_says_the_time_in_the_chunks_episode_seconds_when_the_origin_is_known():
    suffix = build_suffix({}, now_ns=130 * S + S // 2, stale_s=5.0, origin_ns=5 * S)
    assert suffix == "now: 125s"
    assert str(130 * S) not in suffix


@pytest.fixture(scope="module")
def fold():
    tokenizer = HFTokenizer(resolve_model_dir(weights=False))
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer), profile="p",
                     policy=ChunkPolicy(oversize="truncate"))
    f = StateFold(state)
    f.on_chunk(ChunkEvent(seq=0, source="odom", stamp_ns=0, text="odom: x_m=1"))
    return f


def test_diagnostics_report_ttft_cache_hits_and_version(fold):
    s, stats = QueryScheduler(rate_hz=2.0), QueryStats()
    stats.record(result(0.2), version=0)
    stats.record(result(0.3, cached=None), version=0)   # not reported: left out of the ratio
    d = diagnose(fold, s, stats)
    values = dict(d.values)
    assert d.level == OK
    assert values["ttft_s"] == "0.300" and values["ttft_mean_s"] == "0.250"
    assert values["cache_hit_ratio"] == "0.900"
    assert values["version"] == "0" and values["chunks"] == "1"


def test_diagnostics_warn_when_ttft_exceeds_the_period_and_error_on_failure(fold):
    s, stats = QueryScheduler(rate_hz=2.0), QueryStats()
    stats.record(result(0.8), version=0)
    assert diagnose(fold, s, stats).level == WARN
    stats.record_error("connection refused")
    d = diagnose(fold, s, stats)
    assert d.level == ERROR and "connection refused" in d.message


def test_a_swap_report_takes_warm_up_and_catch_up_from_the_new_primarys_operations():
    ops = [OpTiming("r1", "load", 0.0, 0.5, 100, True),        # the start, on the old primary
           OpTiming("r2", "load", 1.0, 2.0, 300, False),       # a failed warm-up, retried
           OpTiming("r2", "load", 4.0, 1.5, 300, True),
           OpTiming("r2", "extend", 5.6, 0.25, 40, True),
           OpTiming("r2", "extend", 5.9, 0.125, 30, True)]
    snapshot = {"version": 1, "primary": "r2", "next_seq": 90, "n_chunks": 50,
                "n_static_tokens": 420}
    report = swap_report(snapshot, reason="swap", committed_tokens=400, window=(3.5, 6.5),
                         ops=ops)
    assert (report.evicted_before_seq, report.caught_up_to_seq, report.static_tokens) == \
        (40, 90, 400)
    assert (report.window_s, report.warmup_s, report.catchup_s, report.catchup_rounds) == \
        (3.0, 1.5, 0.375, 2)
    assert isinstance(report.catchup_s, float)


def test_timed_resource_records_each_load_and_extend_even_when_it_fails():
    class Flaky:
        name, max_context_tokens, n_committed = "r1", 100, 0

        def load(self, ids, text=None):
            return "loaded"

        def extend(self, ids, text=None):
            raise RuntimeError("server went away")

    ops: list = []
    clock = iter([0.0, 0.5, 1.0, 1.25]).__next__
    resource = TimedResource(Flaky(), ops, clock)
    assert resource.load([1, 2, 3]) == "loaded"
    with pytest.raises(RuntimeError):
        resource.extend([4])
    assert ops == [OpTiming("r1", "load", 0.0, 0.5, 3, True),
                   OpTiming("r1", "extend", 1.0, 0.25, 1, False)]


# -- invalid actions on the diagnostics ---------------------------------------------------------

def test_invalid_actions_are_counted_and_a_recent_one_is_a_warning_with_its_reason():
    scheduler = QueryScheduler(rate_hz=2.0)
    stats = QueryStats(started_s=0.0)
    result = QueryResult(text="pick(", token_ids=(1,) * 4, ttft_s=0.1, decode_s=0.2,
                         n_prompt=900, n_extended=0, cached_tokens=None,
                         finish_reason="length", resource="r1")
    for _ in range(3):
        stats.record(result, 0, now_s=1.0)
        stats.record_action(True)
    assert diagnose({"version": 0}, scheduler, stats).level == 0
    stats.record_action(False, "incomplete: the budget of 4 tokens ended inside the action")
    d = diagnose({"version": 0}, scheduler, stats)
    values = dict(d.values)
    assert values["valid_actions"] == "3" and values["invalid_actions"] == "1"
    assert d.level == 1
    assert d.message == ("1 of the last 4 decisions were not valid actions (latest: incomplete: "
                         "the budget of 4 tokens ended inside the action)")
    for _ in range(20):                       # it leaves the window: ok again, still counted
        stats.record_action(True)
    d = diagnose({"version": 0}, scheduler, stats)
    assert d.level == 0 and dict(d.values)["invalid_actions"] == "1"
