"""Parameters that change while a node runs, without ROS: which may (none of them changes the
cached prefix), the ranges the descriptors carry, and why a refused change is refused
(csr_ros.ros_params). Through the real SetParameters service:
test/ros/test_runtime_params_ros.py."""

from __future__ import annotations

import pytest

from csr_ros.chunklog import Retention
from csr_ros.errors import ActionSpecError, ConfigError
from csr_ros.ros_params import (AGGREGATOR, POLICY, RECONCILER, bounds, check_change,
                                chunk_log_options, constraints_text, spec_of, validate)

RUN_TIME = {"task", "rate_hz", "max_new_tokens", "temperature", "safe_action", "stale_after_s",
            "action_ttl_s", "hedge_after_s", "stale_instant_s", "fetch_timeout_s"}


def policy_values(**given):
    return validate("policy", {"resource.r1_url": "http://gpu:8001",
                               "resource.r2_url": "http://gpu:8002", **given})


def test_only_the_policys_parameters_that_leave_the_prefix_alone_change_at_run_time():
    assert {s.name for s in POLICY if s.dynamic} == RUN_TIME
    assert not [s.name for s in AGGREGATOR + RECONCILER if s.dynamic]
    prefix = {"profile", "actions.vocabulary", "model", "mode", "use_chat_template",
              "actions.schema", "actions.in_profile", "tokenizer", "context_tokens"}
    assert not prefix & RUN_TIME


def test_a_configured_node_refuses_a_prefix_parameter_and_says_why_and_what_changes():
    with pytest.raises(ConfigError) as info:
        check_change("policy", "profile", "You are a drone.", configured=True)
    said = str(info.value)
    assert "profile cannot change while the node is configured" in said
    assert "cached prefix" in said and "Deactivate and clean up the node" in said
    assert "rate_hz" in said and "safe_action" in said


def test_an_unconfigured_node_takes_any_parameter_for_its_next_configure():
    assert check_change("policy", "profile", "You are a drone.", configured=False) == \
        "You are a drone."
    assert check_change("aggregator", "source.speech.period_s", 1.0, configured=False) == 1.0


def test_a_run_time_value_is_checked_as_the_params_file_is():
    assert check_change("policy", "rate_hz", 0.5, configured=True) == 0.5
    with pytest.raises(ConfigError, match=r"policy: rate_hz must be > 0, got 0.0"):
        check_change("policy", "rate_hz", 0.0, configured=True)
    with pytest.raises(ConfigError, match=r"policy: temperature must be <= 2.0, got 3.5"):
        check_change("policy", "temperature", 3.5, configured=True)
    with pytest.raises(ConfigError, match=r"policy: max_new_tokens must be an integer"):
        check_change("policy", "max_new_tokens", "many", configured=True)
    with pytest.raises(ConfigError, match=r"unknown parameter 'rate_hzz'"):
        check_change("policy", "rate_hzz", 1.0, configured=True)


def test_a_safe_action_must_be_an_action_of_the_vocabulary_at_configure_and_at_run_time():
    values = policy_values(safe_action="wait()")
    assert values["safe_action"] == "wait()"
    with pytest.raises(ActionSpecError, match=r"safe_action 'hover\(\)' is not an action of "
                                              r"the vocabulary"):
        policy_values(safe_action="hover()")
    with pytest.raises(ActionSpecError, match=r"safe_action 'wait\(\)' needs an action "
                                              r"vocabulary"):
        policy_values(safe_action="wait()", **{"actions.vocabulary": [], "actions.mode": "free"})
    assert check_change("policy", "safe_action", "stop()", configured=True,
                        current=values) == "stop()"
    with pytest.raises(ActionSpecError, match=r"safe_action 'fly\(\)' is not an action"):
        check_change("policy", "safe_action", "fly()", configured=True, current=values)


def test_descriptor_ranges_come_from_the_schema():
    assert bounds(spec_of("policy", "rate_hz")) == (0, 100.0)       # > 0 said in the text
    assert "> 0" in constraints_text(spec_of("policy", "rate_hz"))
    assert bounds(spec_of("policy", "temperature")) == (0.0, 2.0)
    assert bounds(spec_of("policy", "max_new_tokens")) == (1, 4096)
    assert bounds(spec_of("policy", "task")) == (None, None)
    assert bounds(spec_of("aggregator", "source.scan.period_s")) == (-1.0, None)
    assert "changes at run time" in constraints_text(spec_of("policy", "task"))
    assert "a configured node refuses a change" in constraints_text(spec_of("policy", "model"))
    assert "one of ['token', 'text']" in constraints_text(spec_of("policy", "mode"))


def test_the_chunk_log_retention_parameters_make_the_logs_retention():
    values = validate("aggregator", {"sources": ["speech"], "source.speech.topic": "/s",
                                     "source.speech.type": "std_msgs/msg/String",
                                     "chunk_log_retention.retain_bytes": 10_000_000,
                                     "chunk_log_retention.action": "delete",
                                     "chunk_log_segment_bytes": 1 << 20})
    assert chunk_log_options(values, keep_state=False) == {
        "max_segment_bytes": 1 << 20,
        "retention": Retention(retain_bytes=10_000_000, retain_s=None, action="delete",
                               compress=False, keep_state=False)}
    none = validate("reconciler", {"resource.r1_url": "http://a", "resource.r2_url": "http://b"})
    assert chunk_log_options(none, keep_state=True)["retention"] is None   # keeps everything
    with pytest.raises(ConfigError, match=r"chunk_log_retention: compress applies to archived"):
        chunk_log_options({**none, "chunk_log_retention.retain_s": 3600.0,
                           "chunk_log_retention.action": "delete",
                           "chunk_log_retention.compress": True}, keep_state=True)
    with pytest.raises(ConfigError, match=r"chunk_log_segment_bytes must be >= 4096"):
        validate("reconciler", {"chunk_log_segment_bytes": 100})


def test_no_parameter_description_calls_the_chunk_log_a_file():
    for spec in AGGREGATOR + RECONCILER:
        if spec.name.startswith("chunk_log"):
            assert "file" not in spec.description, spec
