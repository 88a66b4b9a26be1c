"""QoS for a robot's links, on a real graph (rclpy, Fast DDS): what the nodes offer their
subscribers (csr/actions, csr/decisions and csr/swaps reliable and latched, so a controller or
monitor that joins late gets the latest at once), and a best-effort sensor publisher over a
lossy link whose messages still become chunks."""

from __future__ import annotations

import time

import pytest

from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, ReliabilityPolicy, qos_profile_sensor_data
from std_msgs.msg import String

from csr_ros.msg import Action, PolicyDecision, SwapEvent
from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.common import ACTIONS_QOS, DECISIONS_QOS, SWAPS_QOS
from csr_ros.nodes.policy import PolicyNode
from csr_ros.nodes.reconciler import ReconcilerNode

from support.ros_graph import Lifecycle
from support.ros_nodes import SPEECH, policy_on, say
from support.waiting import wait_for

pytestmark = pytest.mark.ros


def test_actions_decisions_and_swaps_are_reliable_and_a_late_joining_controller_gets_the_latest(
        graph, probe, llama_server):
    url = llama_server.url
    graph.add(AggregatorNode(parameter_overrides=SPEECH))
    graph.add(ReconcilerNode(parameter_overrides=[
        Parameter("resource.r1_url", value=url), Parameter("resource.r2_url", value=url),
        Parameter("context_tokens", value=4096), Parameter("tau_mem_tokens", value=3000)]))
    graph.add(PolicyNode(parameter_overrides=policy_on(url, autostart=True)))
    say(probe, graph, ["operator: the dock is free"])
    wait_for(lambda: len([a for a in probe.received["actions"] if not a.safe]) >= 2, 180.0,
             "actions")
    for topic in ("csr/actions", "csr/decisions", "csr/swaps"):
        (offer,) = [i.qos_profile for i in probe.get_publishers_info_by_topic(f"/{topic}")]
        assert offer.reliability == ReliabilityPolicy.RELIABLE, topic
        assert offer.durability == DurabilityPolicy.TRANSIENT_LOCAL, topic

    # the policy stops deciding: its last word is the safe action, which a controller that
    # joins now receives at once, and only that (depth 1: never an older action)
    assert Lifecycle(probe, "/policy").change("deactivate")
    wait_for(lambda: probe.received["actions"][-1].safe, 30.0, "the safe action")
    time.sleep(1.0)                                # anything still in flight has arrived
    latest_action = probe.received["actions"][-1]
    latest_decision = probe.received["decisions"][-1]
    controller = graph.node("late_controller")
    late = {"actions": [], "decisions": [], "swaps": []}
    controller.create_subscription(Action, "csr/actions", late["actions"].append, ACTIONS_QOS)
    controller.create_subscription(PolicyDecision, "csr/decisions", late["decisions"].append,
                                   DECISIONS_QOS)
    controller.create_subscription(SwapEvent, "csr/swaps", late["swaps"].append, SWAPS_QOS)
    wait_for(lambda: late["actions"] and late["decisions"] and late["swaps"],
             what="the latched messages")
    time.sleep(1.0)
    assert len(late["actions"]) == 1
    assert (late["actions"][0].safe, late["actions"][0].stamp) == \
        (True, latest_action.stamp)
    assert late["decisions"][-1].query_id == latest_decision.query_id
    assert 1 <= len(late["decisions"]) <= 10
    assert late["swaps"][-1].reason == "start"


def test_a_best_effort_sensor_over_a_lossy_link_still_has_its_messages_rendered(graph, probe):  # noqa: E501
    """A sensor driver publishing best effort (SensorDataQoS), over a link that loses a third
    of the messages: the aggregator subscribes best effort once it sees the publisher (a
    reliable subscription would match nothing), and renders what arrives, newest kept."""
    aggregator = graph.add(AggregatorNode(parameter_overrides=[
        Parameter("sources", value=["range"]),
        Parameter("source.range.topic", value="/test/range"),
        Parameter("source.range.type", value="std_msgs/msg/String"),
        Parameter("source.range.period_s", value=0.2),
        Parameter("qos_recheck_s", value=0.5)]))
    sensor = probe.create_publisher(String, "/test/range", qos_profile_sensor_data)
    wait_for(lambda: [i for i in probe.get_subscriptions_info_by_topic("/test/range")
                      if i.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT],
             30.0, "the aggregator to subscribe best effort")
    published = []
    for i in range(30):
        if i % 3 == 2:
            continue                     # lost on the link
        text = f"front range {i * 0.1:.1f} m"
        sensor.publish(String(data=text))
        published.append(text)
        time.sleep(0.05)
    final = "front range 9.9 m"
    published.append(final)

    def rendered():
        sensor.publish(String(data=final))   # a sensor keeps publishing its newest value
        return [c for c in probe.received["chunks"] if c.text.endswith(final)]
    wait_for(rendered, 30.0, "the newest value rendered", every_s=0.1)
    chunks = probe.received["chunks"]
    assert [c.seq for c in chunks] == list(range(len(chunks)))           # gap-free
    for chunk in chunks:
        assert chunk.source == "range"
        assert any(chunk.text.endswith(f"range: {text}") for text in published), chunk.text
    assert aggregator.source_qos["range"].reliable is False
