"""The policy's decision watchdog as a pure state machine (csr_ros.node_logic.watchdog): when
the controller is told to hold the safe action, once, with the cause, and when it is not.
The node half (a real server killed mid-run) is in test/ros/test_watchdog_ros.py."""

from __future__ import annotations

import pytest

from csr_ros.errors import ConfigError
from csr_ros.node_logic.watchdog import (Activated, Deactivated, Decided, DecisionWatchdog,
                                         Failed, GoSafe, Resumed, Tick, WatchdogConfig)


def watching(stale_after_s: float = 3.0, safe_action: str = "wait()") -> DecisionWatchdog:
    machine = DecisionWatchdog(WatchdogConfig(stale_after_s=stale_after_s,
                                              safe_action=safe_action))
    assert machine.handle(Activated(now_s=0.0)) == []
    return machine


def test_valid_decisions_keep_the_watchdog_quiet():
    machine = watching()
    for t in range(1, 20):
        assert machine.handle(Decided(now_s=t * 0.5, valid=True)) == []
        assert machine.handle(Tick(now_s=t * 0.5 + 0.1)) == []
    assert not machine.status(10.0).stale and machine.status(10.0).message == ""


def test_no_valid_decision_for_stale_after_s_calls_for_the_safe_action_once():
    machine = watching()
    machine.handle(Decided(now_s=1.0, valid=True))
    assert machine.handle(Tick(now_s=3.5)) == []              # 2.5 s since the last one
    (go,) = machine.handle(Tick(now_s=4.0))
    assert isinstance(go, GoSafe)
    assert "no valid decision for 3.00 s (stale_after_s 3; 2.50 s at the check before)" in \
        go.cause                      # the first tick past stale_after_s
    assert "no decision finished" in go.cause
    for t in (4.5, 10.0, 60.0):                                # once per episode
        assert machine.handle(Tick(now_s=t)) == []
    status = machine.status(12.0)
    assert status.stale and status.message.startswith("safe action wait() holds since 8.0 s")
    assert ("safe_actions_published", "1") in status.values


def test_failed_queries_are_the_cause_and_do_not_reset_the_stale_clock():
    machine = watching()
    for t in (0.5, 1.5, 2.5):
        assert machine.handle(Failed(now_s=t, error="ResourceUnavailableError: refused")) == []
    (go,) = machine.handle(Tick(now_s=3.0))
    assert "3 failed queries" in go.cause
    assert "query failed: ResourceUnavailableError: refused" in go.cause


def test_answers_that_are_not_valid_actions_are_the_cause():
    machine = watching(stale_after_s=2.0)
    machine.handle(Decided(now_s=0.5, valid=False, error="incomplete: the budget of 1 tokens "
                                                         "ended"))
    machine.handle(Decided(now_s=1.5, valid=False, error="expired: the decision took 6.00 s"))
    (go,) = machine.handle(Tick(now_s=2.0))
    assert "2 answers that were not valid actions" in go.cause and "expired" in go.cause


def test_a_running_query_that_does_not_answer_is_named():
    machine = watching()
    (go,) = machine.handle(Tick(now_s=3.2, waiting="the running query started 3.1 s ago"))
    assert go.cause.endswith("no decision finished (the running query started 3.1 s ago)")


def test_a_context_overflow_calls_for_the_safe_action_at_once():
    machine = watching()
    machine.handle(Decided(now_s=0.5, valid=True))
    (go,) = machine.handle(Failed(now_s=0.9, error="ContextOverflowError: 8300 tokens exceed",
                                  overflow=True))
    assert go.cause.startswith("the context would overflow: ContextOverflowError")
    assert machine.handle(Failed(now_s=1.4, error="ContextOverflowError: again",
                                 overflow=True)) == []


def test_deactivation_publishes_the_safe_action_unless_it_holds_already():
    machine = watching()
    machine.handle(Decided(now_s=1.0, valid=True))
    (go,) = machine.handle(Deactivated(now_s=2.0))
    assert "deactivated" in go.cause
    assert machine.handle(Deactivated(now_s=3.0)) == []          # not active: nothing more
    stale = watching()
    stale.handle(Tick(now_s=5.0))                                 # holds already
    assert stale.handle(Deactivated(now_s=6.0)) == []
    assert "deactivated" in stale.status(7.0).message             # the cause is updated


def test_an_answer_after_deactivation_changes_nothing():
    machine = watching()
    machine.handle(Deactivated(now_s=1.0))
    assert machine.handle(Decided(now_s=1.5, valid=True)) == []
    assert machine.status(2.0).stale


def test_valid_decisions_again_clear_the_status_and_are_said_once():
    machine = watching()
    machine.handle(Tick(now_s=3.5))
    (back,) = machine.handle(Decided(now_s=8.0, valid=True))
    assert isinstance(back, Resumed) and back.after_s == pytest.approx(4.5)
    assert machine.handle(Decided(now_s=8.5, valid=True)) == []
    assert machine.status(9.0).message == "" and not machine.status(9.0).stale
    (again,) = machine.handle(Tick(now_s=11.5))                  # a second episode
    assert isinstance(again, GoSafe)
    assert ("stale_episodes", "2") in machine.status(12.0).values


def test_a_reactivated_policy_holds_the_safe_action_until_a_valid_decision():
    machine = watching()
    machine.handle(Deactivated(now_s=1.0))
    assert machine.handle(Activated(now_s=5.0)) == []
    assert machine.status(5.5).stale                    # wait() still holds at the controller
    assert machine.handle(Tick(now_s=8.5)) == []        # stale again: no second publication
    (back,) = machine.handle(Decided(now_s=9.0, valid=True))
    assert isinstance(back, Resumed)


def test_without_a_safe_action_the_watchdog_only_reports():
    machine = watching(safe_action="")
    (go,) = machine.handle(Tick(now_s=3.0))
    assert isinstance(go, GoSafe)
    assert machine.status(4.0).message.startswith("no safe_action is set: nothing was published")
    assert ("safe_actions_published", "0") in machine.status(4.0).values


def test_a_new_stale_after_s_applies_from_the_next_tick():
    machine = watching(stale_after_s=10.0)
    assert machine.handle(Tick(now_s=4.0)) == []
    machine.reconfigure(WatchdogConfig(stale_after_s=2.0, safe_action="wait()"))
    (go,) = machine.handle(Tick(now_s=4.1))
    assert "no valid decision for 4.10 s (stale_after_s 2; 4.00 s at the check before)" in \
        go.cause


def test_stale_after_s_must_be_positive():
    with pytest.raises(ConfigError, match=r"stale_after_s must be > 0, got 0"):
        WatchdogConfig(stale_after_s=0.0)
