"""The typed-action topic on a real ROS 2 graph: the policy node publishes, for each valid
decision, an Action a controller can execute, and every PolicyDecision carries the parse.

aggregator → reconciler (two in-process SmolLM2 resources) → policy (grammar-constrained
decoding over a vocabulary whose `$places` come from what the robot has heard).
"""

from __future__ import annotations

import json

import pytest

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from std_msgs.msg import String

from csr_ros.actions import Vocabulary
from csr_ros.msg import Action, PolicyDecision
from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.common import DECISIONS_QOS, DIAGNOSTICS_QOS
from csr_ros.nodes.policy import PolicyNode
from csr_ros.nodes.reconciler import ReconcilerNode

from support.ros_nodes import SPEECH, say
from support.waiting import wait_for

pytestmark = pytest.mark.ros

VOCABULARY = ["wait()", "go_to(place: $places)", "say(text: str)", "turn(degrees: int)"]
SEEN = [r"places=waypoint ([a-z_]+)"]
PLACES = ["dock", "kitchen_door", "charger"]


def test_the_actions_topic_carries_parsed_typed_actions(graph):
    from rclpy.node import Node

    shared = [Parameter("resource.kind", Parameter.Type.STRING, "local"),
              Parameter("context_tokens", Parameter.Type.INTEGER, 2048),
              Parameter("actions.vocabulary", Parameter.Type.STRING_ARRAY, VOCABULARY),
              Parameter("actions.max_str_chars", Parameter.Type.INTEGER, 12)]
    probe = graph.add(Node("csr_ros_actions_probe"))
    actions, decisions = [], []
    probe.create_subscription(Action, "csr/actions", actions.append, DECISIONS_QOS)
    probe.create_subscription(PolicyDecision, "csr/decisions", decisions.append, DECISIONS_QOS)
    diagnostics = []
    probe.create_subscription(DiagnosticArray, "/diagnostics", diagnostics.append,
                              DIAGNOSTICS_QOS)
    probe.speech_pub = probe.create_publisher(String, "/test/speech", 10)
    probe.goal_pub = probe.create_publisher(String, "/test/goal", 10)
    graph.add(AggregatorNode(parameter_overrides=SPEECH))
    reconciler = graph.add(ReconcilerNode(parameter_overrides=shared + [
        Parameter("resource.threads", Parameter.Type.INTEGER, 1),
        Parameter("tau_mem_tokens", Parameter.Type.INTEGER, 1500),
        Parameter("reserve_tokens", Parameter.Type.INTEGER, 256)]))
    policy = graph.add(PolicyNode(driver=reconciler, parameter_overrides=shared + [
        Parameter("rate_hz", Parameter.Type.DOUBLE, 2.0),
        Parameter("max_new_tokens", Parameter.Type.INTEGER, 24),
        Parameter("actions.mode", Parameter.Type.STRING, "grammar"),
        Parameter("actions.seen", Parameter.Type.STRING_ARRAY, SEEN)]))
    wait_for(lambda: probe.count_subscribers("/test/goal") > 0, timeout_s=120.0,
             what="goal subscription")
    probe.goal_pub.publish(String(data="go to the charger"))
    say(probe, graph, [f"passed waypoint {p}, all clear" for p in PLACES])
    wait_for(lambda: len(actions) >= 3, timeout_s=240.0, what="three typed actions")

    vocab = Vocabulary.parse(VOCABULARY, max_str_chars=12).bind({"places": PLACES})
    by_id = {d.query_id: d for d in decisions}
    for action in actions:
        parsed = vocab.parse_decision(by_id[action.query_id].text)    # the decision's own text
        assert (action.name, list(action.arg_names)) == \
            (parsed.name, [n for n, _ in parsed.args])
        assert json.loads(action.arguments_json) == parsed.arguments
        assert list(action.arg_values) == [v if isinstance(v, str) else json.dumps(v)
                                           for _, v in parsed.args]
        assert action.constrained and action.decision_s > 0
        decision = by_id[action.query_id]
        assert decision.valid and decision.action_name == action.name and not decision.error
    # Every decision was constrained and parsed; none is valid without an action.
    assert all(d.constrained for d in decisions)
    assert all(d.valid == bool(d.action_name) for d in decisions)
    assert policy.seen.values()["places"] == tuple(sorted(PLACES))

    def policy_counts() -> dict | None:
        for message in reversed(diagnostics):
            for status in message.status:
                values = {kv.key: kv.value for kv in status.values}
                if status.name.endswith(policy.get_name()) and "valid_actions" in values:
                    return values
        return None

    wait_for(lambda: policy_counts() is not None and
             int(policy_counts()["valid_actions"]) >= len(actions), timeout_s=30.0,
             what="/diagnostics counting the valid actions")
    assert policy_counts()["invalid_actions"] == "0"
