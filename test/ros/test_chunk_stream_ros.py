"""The chunk stream across node restarts, on a real graph (rclpy, Fast DDS, in this process): an
aggregator restarted without its chunk log begins a new stream, which the policy and a
reconciler that has not started fold as a new version and say so; restarted with its chunk log
it continues its stream; a restarted reconciler's start event naming the version the policy
holds is adopted, the evicted chunks it keeps fetched again. The pure fold:
test/test_policy_core_fold.py."""

from __future__ import annotations

import pytest

from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.parameter import Parameter
from std_msgs.msg import String

from csr_ros.msg import SwapEvent
from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.common import SWAPS_QOS
from csr_ros.nodes.policy import PolicyNode
from csr_ros.nodes.reconciler import ReconcilerNode

from support.ros_nodes import body, logged, policy_params, speech_sources
from support.waiting import wait_for

pytestmark = pytest.mark.ros


@pytest.fixture
def probe(flat_probe):
    """The conftest's flat_probe: these tests read chunks and /diagnostics as flat lists."""
    return flat_probe


# -- an aggregator restarted without its chunk log, and with it -----------------------------------

def test_an_aggregator_restarted_without_chunk_log_starts_a_new_version_in_the_policy(
        graph, probe, console):
    pub = probe.create_publisher(String, "/defects/speech", 10)
    first = graph.add(AggregatorNode(parameter_overrides=speech_sources()))
    policy = graph.add(PolicyNode(parameter_overrides=policy_params()))
    wait_for(lambda: probe.count_subscribers("/defects/speech") > 0, what="subscription")
    for i in range(4):
        pub.publish(String(data=f"old {i}"))
    wait_for(lambda: policy.fold.next_seq == 4, what="the policy to fold the first stream")
    old_stream = policy.fold.stream
    graph.remove(first)
    graph.add(AggregatorNode(parameter_overrides=speech_sources()))
    wait_for(lambda: probe.count_subscribers("/defects/speech") > 0, what="resubscription")
    pub.publish(String(data="new 0"))
    pub.publish(String(data="new 1"))
    wait_for(lambda: [body(c.text) for c in policy.fold.state.chunks] ==
             ["speech: new 0", "speech: new 1"], what="the new stream")
    assert policy.fold.stream != old_stream and policy.fold.version == 1
    wait_for(lambda: logged(console, "policy", "restarted without its chunk log", "4 chunks"),
             what="its log line")
    status = wait_for(lambda: [s for s in probe.diagnostics if s.name == "csr_ros: policy"
                               and "restarted without its chunk log" in s.message],
                      what="a diagnostics entry")
    assert status[-1].level == DiagnosticStatus.WARN


def test_a_reconciler_that_has_not_started_folds_the_new_stream_too(graph, probe, console):
    pub = probe.create_publisher(String, "/defects/speech", 10)
    first = graph.add(AggregatorNode(parameter_overrides=speech_sources()))
    reconciler = graph.add(ReconcilerNode(parameter_overrides=policy_params()[1:]))
    wait_for(lambda: probe.count_subscribers("/defects/speech") > 0, what="subscription")
    for i in range(3):
        pub.publish(String(data=f"old {i}"))
    wait_for(lambda: reconciler.order.next_seq == 3, what="the reconciler to fold")
    graph.remove(first)
    graph.add(AggregatorNode(parameter_overrides=speech_sources()))
    wait_for(lambda: probe.count_subscribers("/defects/speech") > 0, what="resubscription")
    pub.publish(String(data="new 0"))
    wait_for(lambda: [body(c.text) for c in reconciler.state.chunks] == ["speech: new 0"],
             what="the new stream in the reconciler")
    assert reconciler.stream_restarts == 1
    wait_for(lambda: logged(console, "reconciler", "began a new chunk stream",
                            "without the 3 chunks"),
             what="its log line")


def test_an_aggregator_restarted_with_its_chunk_log_continues_its_stream(graph, probe, tmp_path):
    log = Parameter("chunk_log", Parameter.Type.STRING, str(tmp_path / "chunks.log"))
    pub = probe.create_publisher(String, "/defects/speech", 10)
    first = graph.add(AggregatorNode(parameter_overrides=speech_sources(extra=[log])))
    wait_for(lambda: probe.count_subscribers("/defects/speech") > 0, what="subscription")
    pub.publish(String(data="before"))
    wait_for(lambda: probe.chunks, what="a chunk")
    graph.remove(first)
    graph.add(AggregatorNode(parameter_overrides=speech_sources(extra=[log])))
    wait_for(lambda: probe.count_subscribers("/defects/speech") > 0, what="resubscription")
    pub.publish(String(data="after"))
    wait_for(lambda: len(probe.chunks) == 2, what="a second chunk")
    assert [(c.seq, c.stream) for c in probe.chunks] == [(0, probe.chunks[0].stream),
                                                          (1, probe.chunks[0].stream)]


# -- a restarted reconciler -----------------------------------------------------------------------

def test_the_policy_adopts_a_restarted_reconcilers_start_with_the_same_version(graph, probe):
    pub = probe.create_publisher(String, "/defects/speech", 10)
    swaps = probe.create_publisher(SwapEvent, "csr/swaps", SWAPS_QOS)
    graph.add(AggregatorNode(parameter_overrides=speech_sources()))
    policy = graph.add(PolicyNode(parameter_overrides=policy_params()))
    wait_for(lambda: probe.count_subscribers("/defects/speech") > 0 and
             probe.count_subscribers("csr/swaps") > 0, what="subscriptions")
    for i in range(6):
        pub.publish(String(data=f"utterance {i}"))
    wait_for(lambda: policy.fold.next_seq == 6, what="six chunks")
    swaps.publish(SwapEvent(version=1, reason="swap", primary="r2", evicted_before_seq=4,
                            caught_up_to_seq=6))
    wait_for(lambda: policy.fold.version == 1, what="the swap")
    assert [c.seq for c in policy.fold.state.chunks] == [4, 5]
    # the reconciler restarts (no chunk log), joins with the history and names the same version
    swaps.publish(SwapEvent(version=1, reason="start", primary="r1", evicted_before_seq=2,
                            caught_up_to_seq=6))
    wait_for(lambda: [c.seq for c in policy.fold.state.chunks] == [2, 3, 4, 5],
             what="the policy to refetch the chunks the restarted reconciler holds")
    assert policy.fold.primary == "r1" and policy.fold.version == 1
