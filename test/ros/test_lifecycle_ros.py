"""Managed (lifecycle) nodes on a real ROS 2 graph (rclpy, Fast DDS), driven as a lifecycle
manager drives them: through their lifecycle_msgs services (change_state, get_state).

A deactivated policy publishes nothing but its safe action, and activated again it decides over
the same history without prefilling it again; an inactive aggregator keeps its chunks; a
transition that fails (a bad parameter, servers that cannot be reached) leaves the node in the
right state with the reason on /diagnostics, and the process up; a callback that raises is
said and counted, and the node goes on."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import yaml

from diagnostic_msgs.msg import DiagnosticStatus
from rcl_interfaces.msg import Log
from rclpy.parameter import Parameter
from std_msgs.msg import String

from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.policy import PolicyNode
from csr_ros.nodes.reconciler import ReconcilerNode
from csr_ros.srv import GetChunks, Query

from support.ros_graph import Lifecycle, NodeProcess, call, set_parameters
from support.ros_nodes import DEAD_URL, SPEECH, logged, policy_on, say, status_of
from support.waiting import wait_for

pytestmark = pytest.mark.ros


def decisions_after(probe, n: int, count: int = 1, timeout_s: float = 180.0) -> list:
    return wait_for(lambda: len(probe.received["decisions"]) >= n + count and
                    probe.received["decisions"][n:], timeout_s, f"{count} decision(s)")


def test_a_policy_driven_through_its_lifecycle_services_commands_nothing_while_inactive_and_resumes_without_prefill(  # noqa: E501
        graph, probe, llama_server):
    graph.add(AggregatorNode(parameter_overrides=SPEECH))
    policy = graph.add(PolicyNode(parameter_overrides=policy_on(llama_server.url)))
    lifecycle = Lifecycle(probe, "/policy")
    assert lifecycle.state() == "unconfigured" and policy.fold is None

    assert lifecycle.change("configure") and lifecycle.state() == "inactive"
    say(probe, graph, [f"operator: check room {i}" for i in range(3)])
    # an inactive policy folds the history (its reactivation needs no catch-up) ...
    wait_for(lambda: policy.fold.next_seq == 3, what="the inactive policy to fold 3 chunks")
    # ... and decides nothing, also on demand
    query = probe.create_client(Query, "csr/query")
    assert query.wait_for_service(timeout_sec=10.0)
    answer = wait_for(lambda: call(query, Query.Request(task="Where now?"), timeout_s=5.0),
                      what="the Query service")
    assert not answer.success and "the policy node is inactive" in answer.message
    assert not probe.received["decisions"] and not probe.received["actions"]

    assert lifecycle.change("activate") and lifecycle.state() == "active"
    first = decisions_after(probe, 0, 2)
    assert first[0].static_tokens > 0 and first[0].extended_tokens == first[0].static_tokens
    assert first[1].extended_tokens == 0                  # the server holds the prefix now
    wait_for(lambda: [a for a in probe.received["actions"] if not a.safe],
             what="an action")

    assert lifecycle.change("deactivate") and lifecycle.state() == "inactive"
    safe = wait_for(lambda: [a for a in probe.received["actions"] if a.safe],
                    what="the safe action on deactivation")
    assert len(safe) == 1 and safe[0].name == "wait" and "deactivated" in safe[0].cause
    assert (safe[0].valid_until.sec, safe[0].valid_until.nanosec) == (0, 0)   # until the next
    n_decisions, n_actions = len(probe.received["decisions"]), len(probe.received["actions"])
    time.sleep(3.0)                                       # six periods at rate_hz 2
    assert len(probe.received["decisions"]) == n_decisions
    assert len(probe.received["actions"]) == n_actions
    assert status_of(probe, "policy", level=DiagnosticStatus.WARN, says="inactive")

    assert lifecycle.change("activate")
    again = decisions_after(probe, n_decisions)[0]
    # the same history, nothing prefilled again: no static token was not cached already
    assert (again.version, again.static_tokens, again.last_seq) == \
        (first[-1].version, first[-1].static_tokens, first[-1].last_seq)
    assert again.extended_tokens == 0

    # cleaned up and configured again: the client is new, so the state is prefilled again
    # (what extended_tokens shows when a prefill does happen)
    assert lifecycle.change("deactivate") and lifecycle.change("cleanup")
    assert lifecycle.state() == "unconfigured" and policy.fold is None
    assert lifecycle.change("configure") and lifecycle.change("activate")
    n_decisions = len(probe.received["decisions"])
    fresh = decisions_after(probe, n_decisions)[0]
    assert fresh.extended_tokens == fresh.static_tokens > 0

    n_safe = len([a for a in probe.received["actions"] if a.safe])
    assert lifecycle.change("shutdown") and lifecycle.state() == "finalized"
    wait_for(lambda: len([a for a in probe.received["actions"] if a.safe]) == n_safe + 1,
             what="the safe action on shutdown from active")


def test_an_inactive_aggregator_takes_no_messages_keeps_its_chunks_and_goes_on_with_its_seq(
        graph, probe):
    aggregator = graph.add(AggregatorNode(parameter_overrides=SPEECH))
    lifecycle = Lifecycle(probe, "/aggregator")
    say(probe, graph, ["one", "two", "three"])
    chunks = wait_for(lambda: len(probe.received["chunks"]) >= 3 and probe.received["chunks"],
                      what="three chunks")
    assert lifecycle.change("deactivate") and lifecycle.state() == "inactive"
    wait_for(lambda: probe.speech_pub.get_subscription_count() == 0,
             what="the aggregator to leave its sources")
    for text in ("while inactive 1", "while inactive 2"):
        probe.speech_pub.publish(String(data=text))
    client = probe.create_client(GetChunks, "csr/get_chunks")
    assert client.wait_for_service(timeout_sec=10.0)
    answer = wait_for(lambda: call(client, GetChunks.Request(start_seq=0), timeout_s=3.0),
                      what="GetChunks")           # still served while inactive: nothing dropped
    assert [c.seq for c in answer.chunks] == [0, 1, 2] and answer.next_seq == 3
    assert lifecycle.change("activate")
    say(probe, graph, ["four"])
    chunk = wait_for(lambda: len(probe.received["chunks"]) >= 4 and probe.received["chunks"][3],
                     what="the fourth chunk")
    assert chunk.seq == 3 and chunk.stream == chunks[0].stream       # not a new stream
    assert chunk.text.endswith("speech: four")
    assert not [c for c in probe.received["chunks"] if "while inactive" in c.text]
    assert aggregator.next_seq == 4


def write_params(path, sections: dict) -> str:
    path.write_text(yaml.safe_dump(json.loads(json.dumps(sections))))
    return str(path)


def test_a_bad_parameter_fails_configure_with_the_reason_and_the_process_stays_up_to_be_fixed(
        tmp_path, graph, probe):
    params = write_params(tmp_path / "params.yaml", {"/**/policy": {"ros__parameters": {
        "autostart": False, "rate_hz": 0.0,
        "resource": {"r1_url": DEAD_URL, "r2_url": DEAD_URL}}}})
    node = NodeProcess("policy", "--params-file", params, log=tmp_path / "policy.log")
    try:
        lifecycle = Lifecycle(probe, "/policy")
        assert lifecycle.state() == "unconfigured"
        assert not lifecycle.change("configure")
        assert lifecycle.state() == "unconfigured"
        status = wait_for(lambda: status_of(probe, "policy", level=DiagnosticStatus.ERROR,
                                            says="configure failed"), what="the reason")
        assert "rate_hz must be > 0, got 0.0" in status.message
        assert ("failed_transition", "configure") in [(v.key, v.value) for v in status.values]
        assert "configure failed, the node is unconfigured: policy: rate_hz must be > 0" in \
            node.output
        assert node.proc.poll() is None                 # the process did not exit
        # an unconfigured node takes the fix; the next configure uses it
        (result,) = set_parameters(probe, "/policy", rate_hz=1.0)
        assert result.successful, result.reason
        assert lifecycle.change("configure") and lifecycle.state() == "inactive"
        code, _ = node.terminate()
        assert code == 0, node.output
    finally:
        node.stop()


def test_servers_that_cannot_be_reached_bring_the_reconciler_back_to_unconfigured_and_say_why(
        tmp_path, graph, probe):
    params = write_params(tmp_path / "params.yaml", {"/**/reconciler": {"ros__parameters": {
        "autostart": False, "startup_timeout_s": 2.0,
        "resource": {"kind": "openai", "r1_url": DEAD_URL, "r2_url": DEAD_URL}}}})
    node = NodeProcess("reconciler", "--params-file", params, log=tmp_path / "reconciler.log")
    try:
        lifecycle = Lifecycle(probe, "/reconciler")
        assert lifecycle.change("configure") and lifecycle.change("activate")
        wait_for(lambda: lifecycle.state() == "unconfigured", 60.0,
                 "the reconciler to give up on its resources")
        status = wait_for(lambda: status_of(probe, "reconciler", level=DiagnosticStatus.ERROR,
                                            says="activate failed"), what="the reason")
        assert "the resources were unreachable for" in status.message
        assert "127.0.0.1:9" in status.message
        time.sleep(1.0)
        assert node.proc.poll() is None, node.output    # without autostart the process stays
        code, _ = node.terminate()
        assert code == 0, node.output
    finally:
        node.stop()


def test_with_autostart_servers_that_cannot_be_reached_end_the_reconciler_process_with_exit_2(
        tmp_path):
    """autostart is the node managing itself: nothing would retry, so it says why and exits."""
    params = write_params(tmp_path / "params.yaml", {"/**/reconciler": {"ros__parameters": {
        "startup_timeout_s": 2.0,
        "resource": {"kind": "openai", "r1_url": DEAD_URL, "r2_url": DEAD_URL}}}})
    node = NodeProcess("reconciler", "--params-file", params, log=tmp_path / "reconciler.log")
    try:
        assert node.wait_exit(timeout_s=120.0) == 2, node.output
        assert "[reconciler] error: reconciler: the resources were unreachable for" in \
            node.output
        assert "Traceback" not in node.output
    finally:
        node.stop()


def test_a_callback_that_raises_is_said_once_counted_on_diagnostics_and_the_node_goes_on(
        graph, probe, console):
    aggregator = graph.add(AggregatorNode(parameter_overrides=SPEECH))
    offer = aggregator.emitter.offer
    failing = {"messages": 1}

    def offer_that_fails_once(*args):
        if failing["messages"]:
            failing["messages"] -= 1
            raise ValueError("a renderer bug")
        return offer(*args)
    aggregator.emitter.offer = offer_that_fails_once
    say(probe, graph, ["lost to the bug", "rendered"])
    chunk = wait_for(lambda: probe.received["chunks"], what="a chunk after the fault")[0]
    assert chunk.text.endswith("speech: rendered")          # the subscription goes on

    aggregator.emitter.poll = lambda now_ns: (_ for _ in ()).throw(RuntimeError("poll bug"))
    wait_for(lambda: aggregator.faults.total >= 10, what="the timer to fail ten times")
    status = wait_for(lambda: status_of(probe, "aggregator", level=DiagnosticStatus.ERROR,
                                        says="poll_callback raised RuntimeError: poll bug"),
                      what="the fault on /diagnostics")
    assert "the node goes on" in status.message
    logs = logged(console, "aggregator", level=Log.ERROR)      # said at the first of the ten
    assert [m for m in logs if "poll_callback raised" in m.msg], console.text
    said = [m.msg for m in logs if "poll_callback" in m.msg]
    assert len(said) == 1 and "Traceback" in said[0] and "RuntimeError: poll bug" in said[0]
    assert len([m for m in logs if "message_callback" in m.msg]) == 1
    assert aggregator.faults.total > len(said) + 1       # the repeats were counted, not said

    aggregator.ring = None                # the GetChunks service now raises: it still answers
    client = probe.create_client(GetChunks, "csr/get_chunks")
    assert client.wait_for_service(timeout_sec=10.0)
    wait_for(lambda: call(client, GetChunks.Request(start_seq=0), timeout_s=3.0),
             what="an answer from the failing service")
    wait_for(lambda: logged(console, "aggregator", "get_chunks_callback raised", level=Log.ERROR),
             what="the service fault in the node's log")


@pytest.mark.slow
def test_all_in_one_nodes_driven_through_their_lifecycle_services_lose_no_chunk_and_prefill_nothing_again(  # noqa: E501
        graph, probe):
    """The reconciler and the policy of all_in_one (two in-process engines, which report what
    they hold): an inactive reconciler takes no chunks and the policy in its process waits;
    active again it fetches what it missed. A reactivated policy queries the engine that holds
    its whole prefix: extended 0, cached = static."""
    local = [Parameter("resource.kind", value="local"), Parameter("context_tokens", value=2048),
             Parameter("autostart", value=False)]
    graph.add(AggregatorNode(parameter_overrides=SPEECH))
    reconciler = graph.add(ReconcilerNode(parameter_overrides=local + [
        Parameter("resource.threads", value=1), Parameter("tau_mem_tokens", value=1500),
        Parameter("reserve_tokens", value=256)]))
    graph.add(PolicyNode(driver=reconciler, parameter_overrides=local + [
        Parameter("rate_hz", value=2.0), Parameter("max_new_tokens", value=8),
        Parameter("safe_action", value="wait()"), Parameter("stale_after_s", value=600.0),
        Parameter("action_ttl_s", value=600.0)]))
    reconciling, deciding = Lifecycle(probe, "/reconciler"), Lifecycle(probe, "/policy")
    for lifecycle in (reconciling, deciding):
        assert lifecycle.state() == "unconfigured"
        assert lifecycle.change("configure") and lifecycle.change("activate")
    say(probe, graph, [f"operator: room {i} is clear" for i in range(3)])
    wait_for(lambda: [d for d in probe.received["decisions"] if d.last_seq == 2], 300.0,
             "a decision over the three chunks")

    assert reconciling.change("deactivate") and reconciling.state() == "inactive"
    n_decisions = len(probe.received["decisions"])
    say(probe, graph, [f"operator: room {i} is clear" for i in range(3, 6)])
    time.sleep(3.0)
    # its policy had nothing current to decide on: none decided, none published
    assert len(probe.received["decisions"]) <= n_decisions + 1   # one may have been running
    assert reconciler.snapshot()["next_seq"] == 3
    assert reconciling.change("activate")
    wait_for(lambda: reconciler.snapshot()["next_seq"] == 6, 60.0,
             "the reconciler to fetch the chunks it missed")
    assert reconciler.lost_while_running == 0
    latest = wait_for(lambda: [d for d in probe.received["decisions"] if d.last_seq == 5], 300.0,
                      "a decision over all six chunks")[-1]

    assert deciding.change("deactivate")
    n_decisions = len(probe.received["decisions"])
    assert deciding.change("activate")
    again = decisions_after(probe, n_decisions, timeout_s=300.0)[0]
    assert (again.version, again.static_tokens) == (latest.version, latest.static_tokens)
    assert again.extended_tokens == 0 and again.cached_tokens == again.static_tokens
    assert [a for a in probe.received["actions"] if a.safe and "deactivated" in a.cause]


def test_a_node_process_stopped_while_its_executor_is_busy_prints_no_unretrieved_exception(
        tmp_path):
    """Handlers the executor still had queued ran after it was destroyed and failed with
    InvalidHandle, printed at exit as "The following exception was never retrieved: cannot use
    Destroyable because destruction was requested" (all_in_one, whose threads are busy with
    models); cancelling them printed "coroutine ... was never awaited" instead."""
    import subprocess
    import sys

    from support.ros_graph import ROOT

    script = tmp_path / "busy_node.py"
    script.write_text(
        "import time\n"
        "from rclpy.callback_groups import ReentrantCallbackGroup\n"
        "from csr_ros.nodes.common import run\n"
        "from csr_ros.nodes.managed import GuardedCallbacks\n"
        "from rclpy.node import Node\n"
        "class Busy(GuardedCallbacks, Node):\n"
        "    def __init__(self, **kw):\n"
        "        super().__init__('busy', **kw)\n"
        "        self.start_guard()\n"
        "        group = ReentrantCallbackGroup()\n"
        "        self.made = [self.create_timer(0.3, lambda: time.sleep(0.25),\n"
        "                                       callback_group=group) for _ in range(2)]\n"
        "        self.made.append(self.create_timer(0.005, lambda: None, callback_group=group))\n"
        "        print('busy up', flush=True)\n"
        "raise SystemExit(run(Busy, threads=2, label='busy'))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout.readline().strip() == "busy up"
        time.sleep(2.0)                                  # handlers queue behind busy threads
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "never retrieved" not in out and "never awaited" not in out, out
        assert "Traceback" not in out, out
