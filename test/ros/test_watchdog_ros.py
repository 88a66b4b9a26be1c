"""The policy's decision watchdog against a real llama.cpp server (rclpy, Fast DDS): the server
killed mid-run (SIGKILL of its process) or stalled (SIGSTOP) leads to the safe action at the
first tick past stale_after_s, said on /diagnostics with the cause; the server back leads back
to valid decisions, and the status clears. The pure machine: test/test_watchdog_pure.py."""

from __future__ import annotations

import os
import re
import signal

import pytest

from diagnostic_msgs.msg import DiagnosticStatus
from rcl_interfaces.msg import Log
from rclpy.parameter import Parameter

from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.policy import PolicyNode

from support.ros_nodes import SPEECH, logged, say, status_of
from support.waiting import wait_for

pytestmark = pytest.mark.ros

STALE_AFTER_S = 3.0
RATE_HZ = 2.0
CAUSE_ROUNDING_S = 0.005
CAUSE = re.compile(r"no valid decision for ([0-9.]+) s \(stale_after_s 3; ([0-9.]+) s at the "
                   r"check before\)")


def watched_policy(graph, url: str) -> PolicyNode:
    return graph.add(PolicyNode(parameter_overrides=[
        Parameter(k, value=v) for k, v in {
            "resource.r1_url": url, "resource.r2_url": url, "resource.timeout_s": 60.0,
            "rate_hz": RATE_HZ, "max_new_tokens": 16, "safe_action": "wait()",
            "stale_after_s": STALE_AFTER_S, "action_ttl_s": 600.0}.items()]))


def actions(probe, *, safe: bool) -> list:
    return [a for a in probe.received["actions"] if a.safe == safe]


def check_first_tick_past_stale_after_s(cause: str) -> None:
    """The watchdog checks at every tick: the safe action came at the first one whose age of
    the latest valid decision reached stale_after_s (the one before was still under it). The
    cause gives both ages in hundredths: an age of 2.996 s at the check before reads 3.00."""
    match = CAUSE.search(cause)
    assert match, cause
    age_s, before_s = float(match.group(1)), float(match.group(2))
    assert before_s - CAUSE_ROUNDING_S < STALE_AFTER_S <= age_s + CAUSE_ROUNDING_S, cause


def test_a_killed_server_leads_to_the_safe_action_and_a_restarted_one_back_to_decisions(
        graph, probe, console, fresh_llama_server):
    graph.add(AggregatorNode(parameter_overrides=SPEECH))
    policy = watched_policy(graph, fresh_llama_server.url)
    say(probe, graph, ["operator: patrol the hallway"])
    wait_for(lambda: len(actions(probe, safe=False)) >= 2, 180.0, "valid actions")
    # (a first decision slower than stale_after_s, the server's first prefill, may have
    # called for the safe action already: the one that counts is the next)
    before = len(actions(probe, safe=True))

    fresh_llama_server.kill()                       # SIGKILL of the server's process group
    safe = wait_for(lambda: actions(probe, safe=True)[before:], 120.0, "the safe action")[0]
    assert (safe.name, safe.query_id) == ("wait", 0)
    assert (safe.valid_until.sec, safe.valid_until.nanosec) == (0, 0)   # holds until the next
    check_first_tick_past_stale_after_s(safe.cause)
    assert re.search(r"\d+ failed quer(y|ies), the latest query failed: "
                     r"ResourceUnavailableError", safe.cause), safe.cause
    status = wait_for(lambda: status_of(probe, "policy", level=DiagnosticStatus.WARN,
                                        says=safe.cause), what="the cause on /diagnostics")
    assert status.message.startswith("safe action wait() holds since")
    n_safe = len(actions(probe, safe=True))

    fresh_llama_server.start()                      # the same port
    n_valid = len(actions(probe, safe=False))
    wait_for(lambda: len(actions(probe, safe=False)) > n_valid, 300.0,
             "a valid action from the restarted server")
    assert len(actions(probe, safe=True)) == n_safe                     # published once
    wait_for(lambda: status_of(probe, "policy") is not None and
             "holds since" not in status_of(probe, "policy").message, 30.0,
             "the watchdog's status to clear")
    assert policy.watchdog.status(0.0).message == ""
    wait_for(lambda: logged(console, "policy", "valid decisions again", level=Log.INFO),
             what="the policy to say valid decisions are back")


def test_a_stalled_server_leads_to_the_safe_action_naming_the_query_that_does_not_answer(
        graph, probe, fresh_llama_server):
    graph.add(AggregatorNode(parameter_overrides=SPEECH))
    watched_policy(graph, fresh_llama_server.url)
    say(probe, graph, ["operator: patrol the hallway"])
    wait_for(lambda: len(actions(probe, safe=False)) >= 2, 180.0, "valid actions")
    before = len(actions(probe, safe=True))
    os.kill(fresh_llama_server.pid, signal.SIGSTOP)
    try:
        safe = wait_for(lambda: actions(probe, safe=True)[before:], 120.0, "the safe action")[0]
    finally:
        os.kill(fresh_llama_server.pid, signal.SIGCONT)
    check_first_tick_past_stale_after_s(safe.cause)
    assert "no decision finished (the running query started" in safe.cause, safe.cause
    n_valid = len(actions(probe, safe=False))
    wait_for(lambda: len(actions(probe, safe=False)) > n_valid, 300.0,
             "a valid action once the server goes on")


def test_a_stalled_primary_server_is_hedged_on_the_old_primary_and_decisions_go_on(
        graph, probe, llama_server_pair):
    from csr_ros.msg import SwapEvent
    from csr_ros.nodes.common import SWAPS_QOS

    old, new = llama_server_pair
    swaps = probe.create_publisher(SwapEvent, "csr/swaps", SWAPS_QOS)
    graph.add(AggregatorNode(parameter_overrides=SPEECH))
    policy = graph.add(PolicyNode(parameter_overrides=[
        Parameter(k, value=v) for k, v in {
            "resource.r1_url": old.url, "resource.r2_url": new.url, "resource.timeout_s": 120.0,
            "rate_hz": RATE_HZ, "max_new_tokens": 16, "safe_action": "wait()",
            "stale_after_s": 600.0, "action_ttl_s": 600.0, "hedge_after_s": 1.0}.items()]))
    say(probe, graph, ["operator: patrol the hallway", "operator: then the kitchen"])
    wait_for(lambda: [d for d in probe.received["decisions"] if d.resource == "r1"], 180.0,
             "decisions from r1")
    wait_for(lambda: probe.count_subscribers("csr/swaps") > 0, what="the policy on csr/swaps")
    n_chunks = policy.fold.next_seq
    swaps.publish(SwapEvent(version=1, reason="swap", primary="r2", primary_url=new.url,
                            evicted_before_seq=1, caught_up_to_seq=n_chunks))
    wait_for(lambda: [d for d in probe.received["decisions"] if d.resource == "r2"], 180.0,
             "decisions from the new primary r2")
    say(probe, graph, ["operator: the door is open"])   # a chunk after the swap
    wait_for(lambda: policy.fold.next_seq > n_chunks, what="the chunk after the swap")
    os.kill(new.pid, signal.SIGSTOP)                     # r2 stops answering
    try:
        n = len(probe.received["decisions"])
        hedged = wait_for(lambda: [d for d in probe.received["decisions"][n:]
                                   if d.resource == "r1"], 180.0,
                          "a decision from r1 while r2 is stopped")[0]
        assert hedged.version == 0, "against the old version r1 holds"
        assert hedged.last_seq >= n_chunks, "with the chunks that came after the swap"
        assert policy.hedged_queries >= 1 and new.url in policy.suspect_urls
    finally:
        os.kill(new.pid, signal.SIGCONT)
    wait_for(lambda: new.url not in policy.suspect_urls, 180.0,
             "r2's late answer, which clears the suspicion")
    n = len(probe.received["decisions"])
    wait_for(lambda: [d for d in probe.received["decisions"][n:] if d.resource == "r2"], 180.0,
             "decisions from r2 again")
    assert not actions(probe, safe=True), "no decision was ever late enough for the safe action"
