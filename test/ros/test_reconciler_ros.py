"""The reconciler node on a real graph (rclpy, Fast DDS, in this process): started after a
history of about three contexts, it evicts with its own policy before it loads and reports its
capacity on /diagnostics; the library's warnings (its chunk log's) are logged by the node under
its name, as /rosout carries them. The pure machine: test/test_reconcile_capacity.py."""

from __future__ import annotations

import time

import pytest

from rcl_interfaces.msg import Log
from rclpy.parameter import Parameter
from std_msgs.msg import String

from csr_ros.msg import SwapEvent
from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.common import SWAPS_QOS
from csr_ros.nodes.reconciler import ReconcilerNode

from support.ros_nodes import local_reconciler, logged, policy_params, speech_sources
from support.waiting import wait_for

pytestmark = pytest.mark.ros


@pytest.fixture
def probe(flat_probe):
    """The conftest's flat_probe: these tests read chunks and /diagnostics as flat lists."""
    return flat_probe


# -- joining after a long history; capacity on /diagnostics ---------------------------------------

@pytest.mark.slow
def test_a_reconciler_joining_after_a_long_history_evicts_at_once_and_reports_capacity(
        graph, probe, console):
    """History of about three contexts before the reconciler starts: it derives the evicted
    state with its own policy and loads that, instead of failing over every few seconds."""
    pub = probe.create_publisher(String, "/defects/speech", 10)
    swaps = []
    probe.create_subscription(SwapEvent, "csr/swaps", swaps.append, SWAPS_QOS)
    graph.add(AggregatorNode(parameter_overrides=speech_sources(event=True)))
    wait_for(lambda: probe.count_subscribers("/defects/speech") > 0, what="subscription")
    for i in range(150):                  # a burst of events: none may be dropped
        pub.publish(String(data=f"the robot passed waypoint {i} in the hallway, battery "
                                f"{90 - i % 50} percent"))
        time.sleep(0.005)
    wait_for(lambda: len(probe.chunks) == 150, what="the history")
    reconciler = graph.add(ReconcilerNode(parameter_overrides=local_reconciler(
        context_tokens=1024, tau_mem_tokens=600)))
    start = wait_for(lambda: [s for s in swaps if s.reason == "start"], timeout_s=180.0,
                     what="the start event")[0]
    assert start.version == 1 and 0 < start.evicted_before_seq < 150
    assert start.caught_up_to_seq == 150 and start.static_tokens < 600
    wait_for(lambda: logged(console, "reconciler", "joined with", "evicted in", level=Log.INFO),
             what="its log line")
    outcome = reconciler.query("Where is the robot?", max_new_tokens=2)
    assert outcome.ok and outcome.request.n_static < 600
    for i in range(12):                   # arrivals after the start, over more than the
        pub.publish(String(data=f"speech: person {i} says hello"))   # rate's 10 s half-life
        time.sleep(1.0)
    status = wait_for(lambda: [s for s in probe.diagnostics if s.name == "csr_ros: reconciler"
                               and ("capacity.viable", "None") not in
                               [(v.key, v.value) for v in s.values]
                               and any(v.key == "capacity.viable" for v in s.values)],
                      timeout_s=60.0, what="a capacity verdict on /diagnostics")[-1]
    values = {v.key: v.value for v in status.values}
    assert float(values["capacity.prefill_tokens_per_s"]) > 0
    assert float(values["capacity.arrival_tokens_per_s"]) > 0
    assert values["capacity.viable"] in ("True", "False")


@pytest.mark.slow
def test_a_reconciler_that_started_before_get_chunks_was_seen_fetches_the_history_once_it_is(
        graph, probe, tmp_path):
    """Discovery on a loaded machine can outlast the start's wait for GetChunks. The chunks an
    aggregator published before the reconciler subscribed are not heard live again: once the
    service is seen, the reconciler fetches them (here an aggregator restarted from its chunk
    log holds five chunks that no live message will bring)."""
    chunk_log = [Parameter("chunk_log", Parameter.Type.STRING, str(tmp_path / "chunks.log"))]
    pub = probe.create_publisher(String, "/defects/speech", 10)
    first = graph.add(AggregatorNode(parameter_overrides=speech_sources(event=True,
                                                                         extra=chunk_log)))
    wait_for(lambda: probe.count_subscribers("/defects/speech") > 0, what="subscription")
    for i in range(5):
        pub.publish(String(data=f"the robot passed waypoint {i}"))
    wait_for(lambda: len(probe.chunks) == 5, what="the first aggregator's chunks")
    graph.remove(first)
    reconciler = graph.add(ReconcilerNode(parameter_overrides=local_reconciler(
        context_tokens=1024, tau_mem_tokens=600)))
    wait_for(lambda: reconciler.driver is not None, timeout_s=180.0,
             what="the start from live chunks")
    with reconciler.lock:
        assert reconciler.history_unasked and reconciler.order.next_seq == 0
    graph.add(AggregatorNode(parameter_overrides=speech_sources(event=True, extra=chunk_log)))
    wait_for(lambda: reconciler.driver.snapshot()["next_seq"] == 5, timeout_s=60.0,
             what="the five chunks fetched from the restarted aggregator")
    assert not reconciler.history_unasked
    outcome = reconciler.query("Where is the robot?", max_new_tokens=2)
    assert outcome.ok and outcome.request.last_seq == 4


# -- warnings through the node's logger -----------------------------------------------------------

def test_library_warnings_are_logged_by_the_node_with_its_name_and_level(graph, console,
                                                                            tmp_path):
    torn = tmp_path / "torn.log"
    torn.write_bytes(b"CSRLOG1\n\x10\x00\x00")          # a record header cut by a crash
    graph.add(ReconcilerNode(parameter_overrides=policy_params()[1:] + [
        Parameter("chunk_log", Parameter.Type.STRING, str(torn))]))
    found = wait_for(lambda: logged(console, "reconciler", "a crash while appending"),
                     what="the chunk log's warning")
    assert found[0].level == Log.WARN
