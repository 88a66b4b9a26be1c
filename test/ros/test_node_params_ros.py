"""Parameters a node refuses, as the node (rclpy) and as its process (exit 2, the reason on
stderr, no traceback): a misspelled name with the right one, a string for a float, a typo in a
params file, a missing params file, and a context_tokens longer than the llama.cpp server's
n_ctx, which stops the reconciler naming the parameter while the policy warns that no
reconciler publishes. The schemas without ROS: test/test_ros_params_validation.py."""

from __future__ import annotations

import json

import pytest
import yaml

from rclpy.parameter import Parameter

from csr_ros.errors import ConfigError
from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.policy import PolicyNode

from support.ros_graph import NodeProcess
from support.ros_nodes import DEAD_URL, policy_params, run_node, speech_sources, write_params

pytestmark = pytest.mark.ros


# -- refused by the node, and by its process ------------------------------------------------------

def test_a_misspelled_parameter_is_refused_by_the_node(graph):
    with pytest.raises(ConfigError, match=r"'rate_hzz' \(did you mean 'rate_hz'\?\)"):
        PolicyNode(parameter_overrides=policy_params() + [
            Parameter("rate_hzz", Parameter.Type.DOUBLE, 5.0)])
    with pytest.raises(ConfigError, match=r"'source.speech.period' \(did you mean "
                                          r"'source.speech.period_s'\?\)"):
        AggregatorNode(parameter_overrides=speech_sources(extra=[
            Parameter("source.speech.period", Parameter.Type.DOUBLE, 1.0)]))
    with pytest.raises(ConfigError, match=r"source.odom.\* is described but 'odom' is not"):
        AggregatorNode(parameter_overrides=speech_sources(extra=[
            Parameter("source.odom.topic", Parameter.Type.STRING, "/odom")]))


def test_a_typo_in_a_params_file_stops_the_node_with_exit_2(tmp_path):
    params = write_params(tmp_path, f"""
        /**/policy:
          ros__parameters:
            rate_hz: 2.0
            max_new_token: 8
            resource:
              r1_url: {DEAD_URL}
              r2_url: {DEAD_URL}
    """)
    node = run_node("csr_ros.nodes.policy", "--params-file", str(params))
    _, err = node.communicate(timeout=60)
    assert node.returncode == 2
    assert "'max_new_token' (did you mean 'max_new_tokens'?)" in err
    assert "Traceback" not in err


def test_a_string_for_a_float_parameter_is_called_a_string(graph):
    with pytest.raises(ConfigError, match=r"rate_hz must be a float, got a string 'fast': "
                                          r"'fast' is a string, not a number"):
        PolicyNode(parameter_overrides=[Parameter("rate_hz", Parameter.Type.STRING, "fast")])


def test_a_missing_params_file_is_a_clear_error_without_traceback(tmp_path):
    node = run_node("csr_ros.nodes.aggregator", "--params-file", str(tmp_path / "nope.yaml"))
    _, err = node.communicate(timeout=60)
    assert node.returncode == 2
    assert f"parameters file {tmp_path / 'nope.yaml'} does not exist" in err
    assert "Traceback" not in err and "RCLError" not in err


# -- a context longer than the server's -----------------------------------------------------------

@pytest.fixture
def short_context_server(tmp_path):
    """llama.cpp with --n-ctx 4096 (as docs/benchmarks.md's typed-action runs), shorter than
    the params file's context_tokens 8192."""
    from support.llama_server import make_llama_server

    from csr_ros.servers import serving

    with serving([make_llama_server(tmp_path / "server.log", n_ctx=4096)]) as (server,):
        yield server


def test_a_context_longer_than_the_servers_names_the_parameter_and_the_policy_warns(
        tmp_path, short_context_server):
    url = short_context_server.url
    remote = {"model": "smollm2", "context_tokens": 8192,
              "resource": {"kind": "openai", "r1_url": url, "r2_url": url}}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(json.loads(json.dumps({
        "/**/reconciler": {"ros__parameters": {**remote, "tau_mem_tokens": 2048}},
        "/**/policy": {"ros__parameters": {**remote, "rate_hz": 1.0, "max_new_tokens": 4}}}))))
    reconciler = NodeProcess("reconciler", "--params-file", str(params),
                             log=tmp_path / "reconciler.log")
    policy = NodeProcess("policy", "--params-file", str(params), log=tmp_path / "policy.log")
    try:
        assert reconciler.wait_exit(timeout_s=120.0) == 2, reconciler.output
        said = reconciler.output
        assert "context_tokens 8192 is more than" in said and "has 4096" in said, said
        assert "max_context_tokens" not in said and "Traceback" not in said, said
        policy.wait_output("no reconciler publishes csr/swaps", timeout_s=60.0)
    finally:
        reconciler.stop()
        policy.stop()
