"""The Decide action on a real ROS 2 graph (rclpy, Fast DDS, in this process): an rclpy action
client sends goals to the policy node, which answers on a real llama.cpp server (the HTTP path)
or, inside all_in_one, on in-process engines (the local path). Goal, feedback, result, cancel
of a running goal and of a waiting one, and goals queued between the periodic decisions."""

from __future__ import annotations

import threading

import pytest

from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.parameter import Parameter

from csr_ros.action import Decide
from csr_ros.msg import PolicyDecision
from csr_ros.nodes.common import DECISIONS_QOS
from csr_ros.nodes.policy import PolicyNode
from csr_ros.ros_params import DEFAULT_ACTIONS

from support.waiting import wait_for

pytestmark = pytest.mark.ros

COUNT = "Count from 1 to 500, one number after the other, separated by commas."
PERIODIC_TASK = "Decide the robot's next action in one short line."


class Goal:
    """One goal of an rclpy action client: its feedback as it comes, then its result."""

    def __init__(self, client: ActionClient, task: str, budget: int, suffix: str = ""):
        self.feedback: list = []
        self.first_token = threading.Event()
        self._sent = client.send_goal_async(
            Decide.Goal(task=task, suffix=suffix, max_new_tokens=budget),
            feedback_callback=self._on_feedback)
        self._result = None

    def _on_feedback(self, msg) -> None:
        self.feedback.append(msg.feedback)
        if msg.feedback.started and msg.feedback.tokens >= 1:
            self.first_token.set()

    @property
    def handle(self):
        handle = wait_for(lambda: self._sent.done() and self._sent.result(),
                          what="the goal to be accepted")
        assert handle.accepted
        return handle

    def cancel(self) -> None:
        future = self.handle.cancel_goal_async()
        wait_for(future.done, what="the cancel answer")

    def result(self, timeout_s: float = 120.0):
        if self._result is None:
            self._result = self.handle.get_result_async()
        return wait_for(lambda: self._result.done() and self._result.result(),
                        timeout_s=timeout_s, what="the goal's result")


def policy_node(graph, url: str, *, mode: str, rate_hz: float = 0.2) -> PolicyNode:
    return graph.add(PolicyNode(context=graph.context, parameter_overrides=[
        Parameter("rate_hz", Parameter.Type.DOUBLE, rate_hz),
        Parameter("resource.r1_url", Parameter.Type.STRING, url),
        Parameter("resource.r2_url", Parameter.Type.STRING, url),
        Parameter("actions.mode", Parameter.Type.STRING, mode)]))


def decide_client(graph) -> tuple[ActionClient, list]:
    """An action client of csr/decide, and the decisions seen on csr/decisions."""
    probe = graph.node("csr_ros_decide_probe")
    client = ActionClient(probe, Decide, "csr/decide")
    assert client.wait_for_server(timeout_sec=30.0), "no csr/decide action server"
    decisions: list = []
    probe.create_subscription(PolicyDecision, "csr/decisions", decisions.append, DECISIONS_QOS)
    return client, decisions


def test_a_goal_gets_feedback_while_it_decodes_and_its_decision_with_the_typed_action(
        graph, llama_server):
    policy_node(graph, llama_server.url, mode="auto")
    client, _ = decide_client(graph)
    goal = Goal(client, "The hallway is blocked. Say what you will do.", budget=32,
                suffix="now: an obstacle 0.4 m ahead")
    response = goal.result()
    assert response.status == GoalStatus.STATUS_SUCCEEDED, response.result.message
    result = response.result
    decision = result.decision
    assert result.success and result.message == ""
    assert decision.task == "The hallway is blocked. Say what you will do."
    assert decision.resource == "r1" and decision.ttft_s > 0 and decision.static_tokens > 0
    assert decision.constrained and decision.valid, decision.error
    assert decision.action_name in {spec.split("(")[0] for spec in DEFAULT_ACTIONS}
    assert decision.arguments_json.startswith("{")
    started = [f for f in goal.feedback if f.started]
    assert started, "no feedback while decoding"
    assert all(f.ttft_s > 0 for f in started)
    tokens = [f.tokens for f in started]
    assert tokens == sorted(tokens) and tokens[0] >= 1


def test_cancelling_a_running_goal_stops_its_decode_and_the_next_goal_is_answered(
        graph, llama_server):
    policy = policy_node(graph, llama_server.url, mode="free")
    client, decisions = decide_client(graph)
    long = Goal(client, COUNT, budget=400)
    assert long.first_token.wait(timeout=120.0), "the goal never started decoding"
    long.cancel()
    response = long.result()
    assert response.status == GoalStatus.STATUS_CANCELED
    assert not response.result.success and response.result.message == "canceled"
    assert max(f.tokens for f in long.feedback) < 400          # stopped, not run to its end
    # no decision is published for it, and the node has not counted it as a failure
    assert all(d.task != COUNT for d in decisions)
    with policy.lock:
        assert policy.stats.last_error == ""
    after = Goal(client, "Say hello.", budget=4).result()
    assert after.status == GoalStatus.STATUS_SUCCEEDED, after.result.message
    assert after.result.decision.text


def test_a_goal_cancelled_while_it_waits_leaves_the_queue_before_the_running_one_ends(
        graph, llama_server):
    policy_node(graph, llama_server.url, mode="free")
    client, _ = decide_client(graph)
    running = Goal(client, COUNT, budget=400)
    assert running.first_token.wait(timeout=120.0), "the first goal never started decoding"
    waiting = Goal(client, COUNT, budget=400)
    wait_for(lambda: waiting.feedback, what="the waiting goal's feedback")
    assert not waiting.feedback[0].started and waiting.feedback[0].queued_ahead >= 1
    waiting.cancel()
    response = waiting.result()
    assert response.status == GoalStatus.STATUS_CANCELED
    assert not any(f.started for f in waiting.feedback)          # it never ran
    decoded = len(running.feedback)
    wait_for(lambda: len(running.feedback) > decoded, what="the first goal to go on decoding")
    # the first goal was still decoding after the second left the queue; it may end on its
    # own (the model's end of text) before its cancel arrives, and then it succeeds
    running.cancel()
    assert running.result().status in (GoalStatus.STATUS_CANCELED, GoalStatus.STATUS_SUCCEEDED)


def test_goals_sent_at_once_take_turns_with_the_periodic_decisions(graph, llama_server):
    """At 50 Hz a periodic decision is due during every goal's decision, so one goes between
    each two goals: the goals queue behind the periodic decisions without starving them."""
    policy_node(graph, llama_server.url, mode="free", rate_hz=50.0)
    client, decisions = decide_client(graph)
    goals = [Goal(client, f"Say the word number {i}.", budget=4) for i in range(3)]
    for goal in goals:
        response = goal.result()
        assert response.status == GoalStatus.STATUS_SUCCEEDED, response.result.message
    ids = [g.result().result.decision.query_id for g in goals]
    wait_for(lambda: {d.query_id for d in decisions} >= set(ids), what="the goals' decisions")
    seen = sorted(d.query_id for d in decisions)
    for first, second in zip(sorted(ids), sorted(ids)[1:]):
        between = [q for q in seen if first < q < second]
        assert between, f"no periodic decision between goal queries {first} and {second}"
        assert all(d.task == PERIODIC_TASK for d in decisions if d.query_id in between)


@pytest.mark.slow
def test_all_in_one_serves_goals_on_its_in_process_engines_and_a_cancel_stops_the_decode(graph):
    """The local path: all_in_one's policy asks the reconciler's in-process engines; a canceled
    goal stops between two tokens and the engine answers the next goal."""
    from csr_ros.nodes.reconciler import ReconcilerNode

    local = [Parameter("resource.kind", Parameter.Type.STRING, "local"),
             Parameter("resource.threads", Parameter.Type.INTEGER, 1),
             Parameter("context_tokens", Parameter.Type.INTEGER, 2048)]
    reconciler = graph.add(ReconcilerNode(context=graph.context, parameter_overrides=local + [
        Parameter("tau_mem_tokens", Parameter.Type.INTEGER, 1024),
        Parameter("reserve_tokens", Parameter.Type.INTEGER, 512)]))
    graph.add(PolicyNode(driver=reconciler, context=graph.context, parameter_overrides=local + [
        Parameter("rate_hz", Parameter.Type.DOUBLE, 0.2),
        Parameter("actions.mode", Parameter.Type.STRING, "free")]))
    client, _ = decide_client(graph)
    wait_for(lambda: reconciler.driver is not None, timeout_s=300.0, what="the engines to load")
    long = Goal(client, COUNT, budget=400)
    assert long.first_token.wait(timeout=120.0), "the goal never started decoding"
    long.cancel()
    response = long.result()
    assert response.status == GoalStatus.STATUS_CANCELED
    assert max(f.tokens for f in long.feedback) < 400
    after = Goal(client, "Say hello.", budget=4).result()
    assert after.status == GoalStatus.STATUS_SUCCEEDED, after.result.message
    assert after.result.decision.resource == "r1" and after.result.decision.text
