"""Parameters that change while the policy runs, through the real rcl_interfaces services
(SetParameters, GetParameters, DescribeParameters, as `ros2 param` calls them), against a real
llama.cpp server: a run-time parameter takes effect on the next decision; one that would change
the cached prefix, or a value out of range, is refused with the reason and the node stays as it
was. The schema half: test/test_runtime_params_pure.py."""

from __future__ import annotations

import pytest

from rcl_interfaces.srv import DescribeParameters, GetParameters

from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.policy import PolicyNode

from support.ros_graph import Lifecycle, call, set_parameters
from support.ros_nodes import SPEECH, policy_on, say
from support.waiting import wait_for

pytestmark = pytest.mark.ros


def next_decision(probe, timeout_s: float = 180.0):
    n = len(probe.received["decisions"])
    return wait_for(lambda: probe.received["decisions"][n + 1:], timeout_s,
                    "a decision started after the change")[0]


def get(probe, *names):
    client = probe.create_client(GetParameters, "/policy/get_parameters")
    assert client.wait_for_service(timeout_sec=10.0)
    answer = wait_for(lambda: call(client, GetParameters.Request(names=list(names)), 3.0),
                      what="get_parameters")
    probe.destroy_client(client)
    return [v.double_value or v.integer_value or v.string_value for v in answer.values]


def test_descriptors_carry_the_schemas_ranges_and_say_what_changes_at_run_time(
        graph, probe, llama_server):
    graph.add(PolicyNode(parameter_overrides=policy_on(llama_server.url)))
    client = probe.create_client(DescribeParameters, "/policy/describe_parameters")
    assert client.wait_for_service(timeout_sec=10.0)
    names = ["rate_hz", "max_new_tokens", "temperature", "profile", "context_tokens"]
    answer = wait_for(lambda: call(client, DescribeParameters.Request(names=names), 3.0),
                      what="describe_parameters")
    d = dict(zip(names, answer.descriptors))
    rate = d["rate_hz"].floating_point_range[0]
    assert (rate.from_value, rate.to_value) == (0.0, 100.0)
    assert "> 0" in d["rate_hz"].additional_constraints
    tokens = d["max_new_tokens"].integer_range[0]
    assert (tokens.from_value, tokens.to_value) == (1, 4096)
    assert (d["temperature"].floating_point_range[0].to_value) == 2.0
    assert d["context_tokens"].integer_range[0].from_value == 256
    assert not any(x.read_only for x in answer.descriptors)   # refused with a reason instead
    assert "changes at run time" in d["rate_hz"].additional_constraints
    assert "a configured node refuses a change" in d["profile"].additional_constraints
    assert d["profile"].description.startswith("fixed robot profile")


def test_run_time_parameters_take_effect_on_the_next_decision_and_others_are_refused_with_a_reason(  # noqa: E501
        graph, probe, llama_server):
    graph.add(AggregatorNode(parameter_overrides=SPEECH))
    policy = graph.add(PolicyNode(parameter_overrides=policy_on(
        llama_server.url, autostart=True)))
    say(probe, graph, ["operator: check the kitchen"])
    before = wait_for(lambda: [d for d in probe.received["decisions"] if d.valid], 180.0,
                      "a valid decision")[-1]

    # the task, the token budget and the temperature: from the next decision on
    results = set_parameters(probe, "/policy", task="Name the room to check next.",
                             max_new_tokens=1, temperature=0.7, rate_hz=4.0)
    assert all(r.successful for r in results), [r.reason for r in results]
    decision = next_decision(probe)
    assert decision.task == "Name the room to check next."
    assert not decision.valid and decision.error.startswith("incomplete"), decision.error
    assert policy.scheduler.rate_hz == 4.0
    assert policy.tick_timer.timer_period_ns == 250_000_000
    (url, (version, resource)), = policy.http_resources.items()
    assert resource.temperature == 0.7
    # the same prefix, still cached: none of these changed it
    assert (decision.static_tokens, decision.extended_tokens) == (before.static_tokens, 0)
    assert set_parameters(probe, "/policy", max_new_tokens=16, temperature=0.0)[0].successful
    wait_for(lambda: [d for d in probe.received["decisions"][-3:] if d.valid], 180.0,
             "valid decisions again with the budget back")

    # what would change the cached prefix is refused, with the reason; nothing changes
    (profile,) = set_parameters(probe, "/policy", profile="You are a drone.")
    assert not profile.successful
    assert "profile cannot change while the node is configured" in profile.reason
    assert "cached prefix" in profile.reason
    assert get(probe, "profile")[0].startswith("You are the policy of a mobile robot")
    (mode,) = set_parameters(probe, "/policy", mode="text")
    assert not mode.successful and "mode cannot change" in mode.reason
    # values out of range: by the descriptor's range, or by the schema with its own words
    (too_fast,) = set_parameters(probe, "/policy", rate_hz=500.0)
    assert not too_fast.successful and "out of range" in too_fast.reason
    (zero,) = set_parameters(probe, "/policy", rate_hz=0.0)
    assert not zero.successful and "rate_hz must be > 0, got 0.0" in zero.reason
    (fly,) = set_parameters(probe, "/policy", safe_action="fly()")
    assert not fly.successful and "is not an action of the vocabulary" in fly.reason
    assert get(probe, "rate_hz", "safe_action") == [4.0, "wait()"]
    assert policy.scheduler.rate_hz == 4.0
    assert next_decision(probe).static_tokens == before.static_tokens

    # a new safe action is the one published from then on
    assert set_parameters(probe, "/policy", safe_action="stop()")[0].successful
    assert Lifecycle(probe, "/policy").change("deactivate")
    safe = wait_for(lambda: [a for a in probe.received["actions"] if a.safe], 30.0,
                    "the safe action")[-1]
    assert safe.name == "stop"
