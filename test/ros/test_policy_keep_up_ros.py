"""A policy node that falls behind and catches up again stays up (real rclpy, Fast DDS, and a
real llama.cpp server stopped and resumed with SIGSTOP/SIGCONT).

rclpy ties one severity to each line that logs: the node's "cannot keep up" warning and its
"keeping up again" info once came from one line, and the second of them raised ValueError in
the diagnostics timer, which ended the process about 23 s into every launch."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import yaml

from rcl_interfaces.msg import Log
from rclpy.parameter import Parameter

from csr_ros.node_logic.health import QueryStats
from csr_ros.nodes.policy import PolicyNode
from csr_ros.resources.base import QueryResult

from support.ros_graph import NodeProcess
from support.ros_nodes import logged

pytestmark = pytest.mark.ros

DEAD_URL = "http://127.0.0.1:9"          # discard port: nothing answers


def _stats(decisions_per_s: float, took_s: float) -> QueryStats:
    """Figures of a policy that has decided for 40 s at `decisions_per_s`, up to now."""
    now_s = time.monotonic()
    stats = QueryStats(started_s=now_s - 40.0)
    result = QueryResult(text="wait()", token_ids=(1,), ttft_s=took_s, decode_s=0.0,
                         n_prompt=10, n_extended=0, cached_tokens=None, finish_reason="stop")
    n = int(40 * decisions_per_s)
    for i in range(n):
        stats.record(result, 0, now_s=now_s - 40.0 + (i + 1) * 40.0 / n)
    return stats


def test_the_policy_node_says_it_fell_behind_and_caught_up_without_dying(graph, console):
    policy = graph.add(PolicyNode(parameter_overrides=[
        Parameter("rate_hz", Parameter.Type.DOUBLE, 2.0),
        Parameter("resource.r1_url", Parameter.Type.STRING, DEAD_URL),
        Parameter("resource.r2_url", Parameter.Type.STRING, DEAD_URL)]))
    policy.tick_timer.cancel()      # no query of its own: the figures below are the policy's
    policy.diagnostics_timer.cancel()
    policy.keep_up.clear_after_s = 0.0      # "keeping up again" as soon as it is
    for decisions_per_s, took_s in [(0.25, 3.0), (2.0, 0.1), (0.25, 3.0), (2.0, 0.1)]:
        with policy.lock:
            policy.stats = _stats(decisions_per_s, took_s)
        policy.diagnostics_callback()     # raised ValueError on the second call before the fix

    # logged in the calls above: the node's own stderr has them now, in order
    said = [(m.level, m.msg.split(":")[0]) for m in logged(console, "policy", level=Log.INFO)
            if "keep" in m.msg]
    assert said == [(Log.WARN, "the policy cannot keep up"), (Log.INFO, "keeping up again")] * 2, \
        console.text


def test_a_policy_whose_server_stalls_falls_behind_then_keeps_up_again_and_stays_up(
        tmp_path, fresh_llama_server):
    """A real stall: the llama.cpp server is stopped (SIGSTOP) for 20 s, then resumed."""
    url = fresh_llama_server.url
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(json.loads(json.dumps({"/**/policy": {"ros__parameters": {
        "resource": {"kind": "openai", "r1_url": url, "r2_url": url, "timeout_s": 60.0},
        "rate_hz": 0.5, "max_new_tokens": 4}}}))))
    policy = NodeProcess("policy", "--params-file", str(params), log=tmp_path / "policy.log")
    pid = fresh_llama_server.pid
    try:
        policy.wait_output("deciding at", timeout_s=120.0)
        time.sleep(15.0)        # past the rate's warm-up: decisions at 0.5 Hz
        os.kill(pid, signal.SIGSTOP)
        try:
            policy.wait_output("the policy cannot keep up", timeout_s=120.0)
        finally:
            os.kill(pid, signal.SIGCONT)
        # the 30 s rate window fills again with decisions at 0.5 Hz (slowly on a busy machine)
        policy.wait_output("keeping up again", timeout_s=300.0)
        time.sleep(3.0)         # a diagnostics tick after the info
        assert policy.proc.poll() is None, policy.output
        assert "ValueError" not in policy.output and "Traceback" not in policy.output, \
            policy.output
    finally:
        policy.stop()
