"""The nodes on a real ROS 2 graph: rclpy with Fast DDS, in this process.

`bash scripts/test.sh` installs ROS 2 Jazzy from PyPI wheels and builds the interfaces
(`scripts/setup.sh --ros`), so these run on every CI run; `python -m pytest
test/ros/test_nodes_ros.py` runs them from the checkout. On a full ROS 2 install: `colcon build
--packages-select csr_ros && source install/setup.bash` first.

Chunks are published into the aggregator, a decision and a swap event come out of the policy
and the reconciler (two in-process SmolLM2 resources, as in all_in_one), and a node that joins
late catches up through GetChunks.
"""

from __future__ import annotations

import pytest

from rclpy.parameter import Parameter
from std_msgs.msg import String

from csr_ros.msg import PolicyDecision, StateChunk, SwapEvent
from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.common import CHUNKS_QOS, DECISIONS_QOS, SWAPS_QOS
from csr_ros.nodes.policy import PolicyNode
from csr_ros.nodes.reconciler import ReconcilerNode
from csr_ros.srv import GetChunks

from support.ros_graph import call
from support.ros_nodes import SPEECH, local_reconciler, recording_probe, say
from support.waiting import wait_for

pytestmark = pytest.mark.ros

@pytest.fixture
def probe(graph):
    """A plain node that publishes inputs and records what the csr_ros nodes publish: this
    file's own probe (it also publishes goals and records swap events), not the conftest's."""
    node = recording_probe(graph, "csr_ros_test_probe",
                           chunks=(StateChunk, "csr/chunks", CHUNKS_QOS),
                           decisions=(PolicyDecision, "csr/decisions", DECISIONS_QOS),
                           swaps=(SwapEvent, "csr/swaps", SWAPS_QOS))
    node.goal_pub = node.create_publisher(String, "/test/goal", 10)
    return node


def test_aggregator_publishes_gap_free_rendered_chunks(graph, probe):
    graph.add(AggregatorNode(context=graph.context, parameter_overrides=SPEECH))
    say(probe, graph, ["go to the kitchen", "stop", "turn left"])
    chunks = wait_for(lambda: len(probe.received["chunks"]) >= 3 and probe.received["chunks"],
                      what="three chunks")
    assert [c.seq for c in chunks] == [0, 1, 2]
    # each chunk starts with the episode time ("0s speech: ..."); the rest is the message
    assert [c.text.split(" ", 1)[1] for c in chunks] == ["speech: go to the kitchen",
                                                         "speech: stop", "speech: turn left"]
    assert all(c.source == "speech" for c in chunks)


def test_a_late_joiner_gets_missed_chunks_through_get_chunks(graph, probe):
    graph.add(AggregatorNode(context=graph.context, parameter_overrides=SPEECH))
    say(probe, graph, [f"utterance {i}" for i in range(5)])
    wait_for(lambda: len(probe.received["chunks"]) >= 5, what="five chunks")
    client = probe.create_client(GetChunks, "csr/get_chunks")
    assert client.wait_for_service(timeout_sec=10.0)
    response = call(client, GetChunks.Request(start_seq=2))
    assert [c.seq for c in response.chunks] == [2, 3, 4]
    assert (response.first_available_seq, response.next_seq) == (0, 5)
    # a policy node started now folds the whole history before its first live chunk
    policy = graph.add(PolicyNode(context=graph.context, parameter_overrides=[
        Parameter("rate_hz", Parameter.Type.DOUBLE, 0.2),
        Parameter("resource.r1_url", Parameter.Type.STRING, "http://127.0.0.1:9")]))
    wait_for(lambda: policy.fold.next_seq == 5, what="the late joiner to catch up")
    assert [c.text for c in policy.fold.state.chunks][0].endswith(" speech: utterance 0\n")


@pytest.mark.slow
def test_chunks_in_decision_and_swap_event_out_and_a_standalone_policy_folds_the_swap(
        graph, probe):
    """aggregator → reconciler (ASR over two in-process SmolLM2 resources) → policy decisions;
    a small tau_mem forces a reconciliation, so a swap event follows the start event. A second,
    standalone policy node (as on a robot, talking to servers) folds that event: it ends on the
    reconciler's version with exactly the reconciler's tokens."""
    graph.add(AggregatorNode(context=graph.context, parameter_overrides=SPEECH))
    reconciler = graph.add(ReconcilerNode(context=graph.context, parameter_overrides=local_reconciler(
        context_tokens=2048, tau_mem_tokens=300)))
    graph.add(PolicyNode(driver=reconciler, context=graph.context, parameter_overrides=[
        Parameter("resource.kind", Parameter.Type.STRING, "local"),
        Parameter("rate_hz", Parameter.Type.DOUBLE, 1.0),
        Parameter("max_new_tokens", Parameter.Type.INTEGER, 4)]))
    observer = graph.add(PolicyNode(context=graph.context, cli_args=[
        "--ros-args", "-r", "__node:=policy_observer"], parameter_overrides=[
        Parameter("rate_hz", Parameter.Type.DOUBLE, 0.1),
        Parameter("resource.r1_url", Parameter.Type.STRING, "http://127.0.0.1:9")]))
    start = wait_for(lambda: probe.received["swaps"], timeout_s=120.0, what="the start event")
    assert start[0].reason == "start" and start[0].primary == "r1"
    wait_for(lambda: probe.count_subscribers("/test/goal") > 0, what="goal subscription")
    probe.goal_pub.publish(String(data="find the red cup"))
    say(probe, graph, [f"the robot is at waypoint {i}, battery {90 - i} percent"
                       for i in range(40)])
    decision = wait_for(lambda: probe.received["decisions"], timeout_s=120.0,
                        what="a decision")[0]
    assert decision.text and decision.ttft_s > 0 and decision.static_tokens > 0
    swaps = wait_for(lambda: [s for s in probe.received["swaps"] if s.reason == "swap"],
                     timeout_s=240.0, what="a swap event")
    assert swaps[-1].version >= 1 and swaps[-1].evicted_before_seq > 0

    def folded():
        truth = reconciler.driver.accounting()
        with observer.lock:
            state = observer.fold.state
            return (int(state.version) == truth.version and
                    tuple(state.static_ids) == tuple(truth.static_ids) and truth)
    truth = wait_for(folded, timeout_s=60.0, what="the standalone policy to fold the swap")
    assert truth.version == max(s.version for s in probe.received["swaps"])
    assert observer.fold.state.chunks[0].seq == truth.active_seqs[0] > 0


VISION_AND_SPEECH = SPEECH + [
    Parameter("sources", Parameter.Type.STRING_ARRAY, ["speech", "goal", "detections"]),
    Parameter("source.detections.topic", Parameter.Type.STRING, "/test/detections"),
    Parameter("source.detections.type", Parameter.Type.STRING,
              "vision_msgs/msg/Detection2DArray")]


def test_a_source_whose_type_is_not_installed_is_skipped_and_named_on_diagnostics(graph, probe):
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

    try:
        import vision_msgs  # noqa: F401
        pytest.fail("vision_msgs is installed here; this test needs a type that is not")
    except ImportError:
        pass
    arrays = []
    probe.create_subscription(DiagnosticArray, "/diagnostics", arrays.append, 10)
    aggregator = graph.add(AggregatorNode(context=graph.context, parameter_overrides=VISION_AND_SPEECH))
    assert set(aggregator.sources) == {"speech", "goal"}
    assert "vision_msgs/msg/Detection2DArray" in aggregator.skipped["detections"]
    say(probe, graph, ["still here"])
    wait_for(lambda: probe.received["chunks"], what="a chunk of the other sources")
    status = wait_for(lambda: [s for a in arrays for s in a.status
                               if s.name == "csr_ros: aggregator"], what="diagnostics")[-1]
    assert status.level == DiagnosticStatus.WARN and "detections skipped" in status.message
    values = {kv.key: kv.value for kv in status.values}
    assert "not installed" in values["skipped.detections"]


def test_a_strict_aggregator_stops_on_a_type_that_is_not_installed(graph):
    from csr_ros.errors import ConfigError

    with pytest.raises(ConfigError, match=r"source\.detections\.type.*vision_msgs"):
        AggregatorNode(context=graph.context, parameter_overrides=VISION_AND_SPEECH + [
            Parameter("strict", Parameter.Type.BOOL, True)])
