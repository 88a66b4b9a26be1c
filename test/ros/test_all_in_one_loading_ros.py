"""all_in_one while it loads its models, as a process: Ctrl-C during the load exits 0 without
"cannot schedule new futures after interpreter shutdown", and its policy waits for the load
(deciding ticks go on) without failed queries."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml

from support.ros_graph import NodeProcess

pytestmark = pytest.mark.ros


def all_in_one_params(tmp_path: Path, **policy) -> Path:
    local = {"model": "smollm2", "context_tokens": 4096,
             "resource": {"kind": "local", "threads": 1}}
    params = tmp_path / "all_in_one.yaml"
    params.write_text(yaml.safe_dump(json.loads(json.dumps({     # no YAML aliases (rcl)
        "/**/reconciler": {"ros__parameters": {**local, "tau_mem_tokens": 3000}},
        "/**/policy": {"ros__parameters": {**local, "rate_hz": 2.0, "max_new_tokens": 4,
                                           **policy}}}))))
    return params


def test_all_in_one_stopped_while_loading_its_models_exits_0_without_a_shutdown_error(tmp_path):
    """Ctrl-C while the models load (a timer callback on an executor thread): the process
    leaves with 0 and does not wait for the load inside interpreter shutdown, where it failed
    with "cannot schedule new futures after interpreter shutdown"."""
    node = NodeProcess("all_in_one", "--params-file", str(all_in_one_params(tmp_path)),
                       log=tmp_path / "all_in_one.log")
    try:
        node.wait_output("loading the model")
        node.proc.send_signal(signal.SIGINT)
        code = node.wait_exit(timeout_s=60.0)
    finally:
        node.stop()
    out = node.output
    assert "started: v" not in out, "the signal should have come during the model load"
    assert code == 0, out
    assert "cannot schedule new futures" not in out and "Traceback" not in out, out


def test_the_policy_of_all_in_one_waits_for_the_model_load_without_failed_queries(tmp_path):
    node = NodeProcess("all_in_one", "--params-file", str(all_in_one_params(tmp_path)),
                       log=tmp_path / "all_in_one.log")
    try:
        node.wait_output("started: v", timeout_s=240.0)
        code, _ = node.terminate(timeout_s=30.0)
    finally:
        node.stop()
    out = node.output
    loading = out.index("loading the model")
    assert out.index("deciding at") < loading < out.index("started: v")   # ticks while loading
    assert "has not started" not in out and "query failed" not in out, out
    assert code == 0, out
