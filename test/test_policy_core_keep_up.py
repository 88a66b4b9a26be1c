"""The policy says when it cannot keep up, with the numbers and what to change (pure parts)."""

from __future__ import annotations

import pytest

from csr_ros.node_logic.health import Announcer, QueryStats, diagnose, keep_up_warning
from csr_ros.node_logic.schedule import QueryScheduler
from csr_ros.resources.base import QueryResult


def _result(ttft_s: float, decode_s: float) -> QueryResult:
    return QueryResult(text="wait()", token_ids=(1, 2), ttft_s=ttft_s, decode_s=decode_s,
                       n_prompt=100, n_extended=0, cached_tokens=None, finish_reason="stop")


def _decide_every(stats: QueryStats, period_s: float, took_s: float, n: int) -> float:
    """n decisions back to back, each `took_s` long, starting a new one every max(period, took)."""
    now_s = stats.started_s
    for _ in range(n):
        now_s += max(period_s, took_s)
        stats.record(_result(took_s * 0.8, took_s * 0.2), 0, now_s=now_s)
    return now_s


def test_a_policy_that_decides_within_its_period_gets_no_warning():
    stats = QueryStats(started_s=0.0)
    now_s = _decide_every(stats, 0.5, 0.2, 40)
    assert keep_up_warning(stats, 2.0, now_s) is None


def test_a_policy_slower_than_its_period_is_told_so_with_the_numbers_and_a_lower_rate():
    stats = QueryStats(started_s=0.0)
    now_s = _decide_every(stats, 0.5, 2.0, 3)
    message = keep_up_warning(stats, 2.0, now_s)
    assert message is not None and message.startswith("the policy cannot keep up")
    assert "rate_hz 2" in message and "2.00 s" in message and "period 0.50 s" in message
    assert "lower rate_hz to 0.4" in message


def test_three_slow_decisions_are_enough_before_the_rate_window_has_filled():
    stats = QueryStats(started_s=0.0)
    now_s = _decide_every(stats, 0.5, 0.2, 60)       # 30 s of keeping up
    now_s = _decide_every_from(stats, now_s, 1.5, 3)  # then three slow ones
    assert stats.decisions_per_s(now_s) > 0.8 * 2.0  # the 30 s window still looks fine
    assert keep_up_warning(stats, 2.0, now_s).startswith("the policy cannot keep up")


def _decide_every_from(stats: QueryStats, now_s: float, took_s: float, n: int) -> float:
    for _ in range(n):
        now_s += took_s
        stats.record(_result(took_s * 0.8, took_s * 0.2), 0, now_s=now_s)
    return now_s


def test_a_reconciliation_that_cannot_keep_up_is_said_with_the_capacity_verdict():
    stats = QueryStats(started_s=0.0)
    now_s = _decide_every(stats, 0.5, 0.2, 10)
    capacity = {"viable": False, "message": "arrival exceeds what the resources can reconcile"}
    assert keep_up_warning(stats, 2.0, now_s, capacity=capacity) == capacity["message"]
    assert keep_up_warning(stats, 2.0, now_s, capacity={"viable": True, "message": "ok"}) is None


def test_nothing_is_said_before_the_first_decision():
    stats = QueryStats(started_s=0.0)
    assert keep_up_warning(stats, 2.0, 30.0) is None


def test_the_announcer_says_a_warning_at_once_then_only_every_repeat_interval_and_when_it_clears():
    announcer = Announcer(repeat_s=30.0)
    assert announcer.update(None, 0.0) is None
    assert announcer.update("decisions take 2.10 s", 1.0) == ("warning", "decisions take 2.10 s")
    assert announcer.update("decisions take 2.35 s", 2.0) is None       # same kind, new figures
    assert announcer.update("arrival exceeds 3.0 tokens/s", 3.0)[0] == "warning"  # new kind
    assert announcer.update("arrival exceeds 3.5 tokens/s", 20.0) is None
    assert announcer.update("arrival exceeds 3.5 tokens/s", 33.0)[0] == "warning"  # repeated
    assert announcer.update(None, 34.0) is None                  # clear, but not for long yet
    assert announcer.update(None, 43.9) is None
    assert announcer.update(None, 44.0) == ("info", "keeping up again")
    assert announcer.update(None, 45.0) is None


def test_the_announcer_says_nothing_new_while_a_figure_hovers_at_its_threshold():
    announcer = Announcer(repeat_s=30.0, clear_after_s=10.0)
    said = [announcer.update("0.39 decisions/s" if i % 2 else None, float(i)) for i in range(1, 20)]
    assert said[0] == ("warning", "0.39 decisions/s")
    assert said[1:] == [None] * 18


def test_no_rate_verdict_is_given_in_the_warm_up_after_the_first_query():
    # a model's first queries after it loaded are slow: 1 decision in the first 4 s is not
    # taken for a rate of 0.25 decisions/s
    stats = QueryStats(started_s=0.0)
    stats.record(_result(3.0, 0.5), 0, now_s=3.5)
    assert stats.decisions_per_s(4.0) is None
    assert keep_up_warning(stats, 2.0, 4.0) is None


def test_the_rate_window_opens_with_the_first_query_not_before():
    stats = QueryStats()
    assert stats.decisions_per_s(100.0) is None
    assert keep_up_warning(stats, 2.0, 100.0) is None


def test_a_slow_rate_that_is_kept_gets_no_verdict_from_a_window_of_a_few_periods():
    # 0.5 Hz, each decision 0.3 s, the first at 0.3 s: three decisions in 7.7 s read 0.39/s
    stats = QueryStats(started_s=0.0)
    for t_s in (0.3, 2.3, 4.3):
        stats.record(_result(0.25, 0.05), 0, now_s=t_s)
    assert stats.decisions_per_s(7.7, 0.5) is None
    assert keep_up_warning(stats, 0.5, 7.7) is None
    now_s = _decide_every_from(stats, 4.3, 2.0, 20)     # 20 more, one every period
    assert keep_up_warning(stats, 0.5, now_s) is None


# -- the policy's diagnostics: decisions per second against rate_hz, and the capacity verdict --

def test_decisions_per_second_below_rate_hz_is_a_warning_with_ttft_and_what_to_change():
    scheduler = QueryScheduler(rate_hz=2.0)
    stats = QueryStats(started_s=0.0)
    result = QueryResult(text="go", token_ids=(1,), ttft_s=21.0, decode_s=0.5, n_prompt=100,
                         n_extended=0, cached_tokens=None, finish_reason="stop", resource="r1")
    for t in (21.0, 42.0, 63.0):
        stats.record(result, 0, now_s=t)
    d = diagnose({"version": 0}, scheduler, stats, now_s=66.0)
    values = dict(d.values)
    assert float(values["decisions_per_s"]) == pytest.approx(2 / 30, rel=0.01)
    assert values["rate_hz"] == "2" and values["ttft_p50_s"] == "21.000"
    assert d.level == 1 and "decisions/s against rate_hz 2" in d.message
    assert "TTFT 21.00 s + decoding 0.50 s" in d.message and "lower rate_hz to 0.037" in d.message


def test_a_rate_shortfall_from_decoding_blames_the_decoding_not_the_ttft():
    scheduler = QueryScheduler(rate_hz=2.0)
    stats = QueryStats(started_s=0.0)
    result = QueryResult(text="go", token_ids=(1,) * 48, ttft_s=0.7, decode_s=6.3, n_prompt=900,
                         n_extended=0, cached_tokens=800, finish_reason="length",
                         resource="r1")
    for t in range(7, 35, 7):
        stats.record(result, 0, now_s=float(t))
    d = diagnose({"version": 0}, scheduler, stats, now_s=35.0)
    assert "a decision takes 7.00 s (p50: TTFT 0.70 s + decoding 6.30 s)" in d.message
    assert "lower rate_hz to 0.11" in d.message and "the decoding dominates" in d.message


def test_a_capacity_verdict_that_cannot_keep_up_is_the_policy_diagnostics_message():
    scheduler = QueryScheduler(rate_hz=2.0)
    d = diagnose({"version": 0}, scheduler, QueryStats(started_s=0.0), now_s=1.0,
                 capacity={"viable": False, "message": "arrival exceeds ...", "headroom_s": -3})
    assert d.level == 1 and d.message == "arrival exceeds ..."
    assert ("capacity.headroom_s", "-3") in d.values


# -- the keep-up warning names what happened when a typical decision fits the period --

def _shortfall_within_the_period(skipped: int, failed: int, error: str = "") -> str:
    """2 Hz, decisions of 0.3 s, 20 of them over 30 s (0.67/s): the scheduler's counters say
    why; a few of the decisions took 4.2 s."""
    scheduler = QueryScheduler(rate_hz=2.0)
    stats = QueryStats(started_s=0.0)
    assert stats.missed(0.0, scheduler).ticks == 0           # the first sample, at the start
    for i in range(20):
        took_s = 4.2 if skipped and i % 10 == 0 else 0.3
        stats.record(_result(took_s * 0.8, took_s * 0.2), 0, now_s=1.5 * (i + 1))
    scheduler.ticks, scheduler.skipped, scheduler.failed = 20 + skipped, skipped, failed
    if error:
        stats.record_error(error)
    message = keep_up_warning(stats, 2.0, 30.0, scheduler=scheduler)
    assert message is not None and message.startswith("the policy cannot keep up: 0.667 ")
    assert "within the period 0.50 s" in message
    return message


def test_a_shortfall_from_skipped_ticks_names_them_and_the_slow_decisions_not_failures():
    message = _shortfall_within_the_period(skipped=21, failed=0)
    assert message.endswith("in the last 30 s 21 ticks were skipped while a query ran (2 of "
                            "the last 20 decisions took longer than the period, the longest "
                            "4.20 s)")
    assert "fail" not in message


def test_a_shortfall_from_failed_queries_names_them_with_the_last_error_not_skipped_ticks():
    message = _shortfall_within_the_period(skipped=0, failed=5, error="connection refused")
    assert message.endswith("in the last 30 s 5 queries failed (the last: connection refused)")
    assert "skipped" not in message


def test_a_shortfall_with_neither_says_no_tick_was_skipped_and_how_many_ticks_came():
    message = _shortfall_within_the_period(skipped=0, failed=0)
    assert message.endswith("in the last 30 s no tick was skipped and no query failed; 20 "
                            "ticks came, 60 were due (the node's timer ran late)")


def test_the_counts_cover_the_rate_window_from_the_latest_sample_before_it():
    scheduler = QueryScheduler(rate_hz=2.0)
    stats = QueryStats(started_s=0.0)
    scheduler.skipped = 40                                    # before the first sample
    assert stats.missed(10.0, scheduler).skipped_ticks == 40  # since the start
    scheduler.skipped, scheduler.failed = 43, 1
    missed = stats.missed(50.0, scheduler)                    # no sample at 20 s: from 10 s
    assert (missed.window_s, missed.skipped_ticks, missed.failed_queries) == (40.0, 3, 1)
    missed = stats.missed(80.0, scheduler)                    # from the 50 s sample on
    assert (missed.window_s, missed.skipped_ticks, missed.failed_queries) == (30.0, 0, 0)
