"""A short run of the main job through the real ROS 2 graph (`csr-ros demo --ros`): the
episode publisher's robot messages, the aggregator's chunks, ASR and decisions in all_in_one,
each node in its own process; the report from what was observed on the topics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.ros_graph import ROOT

pytestmark = [pytest.mark.ros, pytest.mark.slow]


def test_a_short_ros_graph_demo_ends_with_the_demo_report_and_loses_no_chunk(tmp_path):
    out = tmp_path / "demo_ros.json"
    plot = tmp_path / "demo_ros.png"
    # a small tau_mem so that one eviction cycle fits in a short run; capped in time
    done = subprocess.run(
        [sys.executable, "-m", "csr_ros.cli", "demo", "--ros", "--cycles", "1", "--tau-mem",
         "450", "--duration-s", "150", "--max-new-tokens", "16", "--no-progress",
         "--json", str(out), "--plot", str(plot)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    s = json.loads(out.read_text())
    assert "csr-ros demo (asr, ROS 2 graph" in done.stdout and "TTFT all" in done.stdout
    assert plot.stat().st_size > 10_000
    assert s["exit_codes"] == {"aggregator": 0, "all_in_one": 0, "episode_publisher": 0}
    assert s["chunks_in"] > 0 and s["chunks_lost"] == 0 and s["chunk_streams"] == 1
    assert s["decisions"] > 0 and s["ttft"]["n"] == s["decisions"]
    assert s["state_consistent"], "the last decision did not cover the newest chunk"
    assert s["cycles"] >= 1 and s["final_version"] >= 1
