"""How on-demand decisions (Decide goals, Query calls) share the policy's one query slot with the
periodic decisions: in order, and neither kind starves the other (QueryScheduler, pure)."""

from __future__ import annotations

from csr_ros.node_logic.health import QueryStats, diagnose
from csr_ros.node_logic.schedule import MAX_WAITING_QUERIES, PERIODIC, QueryScheduler


def test_a_goal_that_arrives_while_the_slot_is_free_starts_at_once():
    s = QueryScheduler(rate_hz=2.0)
    key = s.enqueue()
    assert s.grant() == key
    assert s.running and s.running_key == key and not s.waiting


def test_goals_wait_behind_the_running_periodic_query_and_start_in_arrival_order():
    s = QueryScheduler(rate_hz=2.0)
    assert s.tick()
    first, second = s.enqueue(), s.enqueue()
    assert s.grant() is None                       # the periodic query still runs
    assert (s.ahead_of(first), s.ahead_of(second)) == (1, 2)
    s.finish(ok=True)
    assert s.grant() == first
    s.finish(ok=True)
    assert s.grant() == second


def test_a_tick_during_a_goal_is_owed_and_runs_before_the_next_goal():
    s = QueryScheduler(rate_hz=2.0)
    goal = s.enqueue()
    assert s.grant() == goal
    later = s.enqueue()
    assert not s.tick() and not s.tick()           # the goal takes two periods
    assert (s.deferred, s.skipped) == (1, 1)       # one periodic query is owed, not two
    assert s.ahead_of(later) == 2                  # the running goal and the owed tick
    s.finish(ok=True)
    assert s.grant() == PERIODIC
    assert s.running and s.running_key is None
    s.finish(ok=True)
    assert s.grant() == later


def test_back_to_back_goals_leave_the_periodic_decisions_every_other_turn():
    s = QueryScheduler(rate_hz=2.0)
    order = []
    for _ in range(MAX_WAITING_QUERIES):           # more goals than the queries that run
        s.enqueue()
    for _ in range(20):                            # every query takes longer than a period
        granted = s.grant()
        assert granted is not None
        order.append("p" if granted == PERIODIC else "g")
        s.tick()
        s.finish(ok=True)
    assert "".join(order) == "gp" * 10


def test_goals_are_not_starved_by_periodic_queries_that_are_always_due():
    s = QueryScheduler(rate_hz=2.0)
    assert s.tick()
    goal = s.enqueue()
    s.tick()                                       # due again while the periodic one runs
    s.finish(ok=True)
    assert s.grant() == goal                       # a skipped tick is not owed: the goal goes


def test_a_withdrawn_goal_leaves_the_queue_and_is_never_granted():
    s = QueryScheduler(rate_hz=2.0)
    assert s.tick()
    gone, kept = s.enqueue(), s.enqueue()
    assert s.withdraw(gone) and not s.withdraw(gone)
    s.finish(ok=True)
    assert s.grant() == kept
    assert not s.withdraw(kept)                    # running: it can only be stopped


def test_the_queue_is_bounded():
    s = QueryScheduler(rate_hz=2.0)
    assert s.tick()
    for _ in range(MAX_WAITING_QUERIES):
        assert not s.full
        s.enqueue()
    assert s.full


def test_diagnostics_count_the_deferred_ticks_and_the_waiting_queries():
    s = QueryScheduler(rate_hz=2.0)
    assert s.grant() is None
    s.enqueue()
    s.grant()
    s.enqueue()
    s.tick()
    values = dict(diagnose({"version": 0}, s, QueryStats(started_s=0.0)).values)
    assert (values["deferred_ticks"], values["waiting_queries"]) == ("1", "1")
