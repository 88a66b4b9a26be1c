"""`csr-ros demo --resource openai` over two real llama.cpp servers (R1 and R2)."""

from __future__ import annotations

import json

import pytest

from csr_ros.cli import main

pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_demo_runs_two_eviction_cycles_over_two_http_servers_losing_no_chunk(
        llama_server_pair, tmp_path):
    r1, r2 = llama_server_pair
    out = tmp_path / "o.json"
    code = main(["demo", "--resource", "openai", "--r1", r1.url, "--r2", r2.url,
                 "--cycles", "2", "--tau-mem", "500", "--chunk-rate-hz", "2",
                 # chunks that could fill the context wait for the swap: the same outcome on
                 # any machine, however slow or loaded; the duration is only a cap on a hang
                 "--paced", "--duration-s", "3600",
                 "--max-context-tokens", "4096", "--reserve-tokens", "128",
                 "--json", str(out), "--chunk-log", str(tmp_path / "chunks.log"),
                 "--no-progress"])
    summary = json.loads(out.read_text())
    assert code == 0
    # Paced, every cycle ends in a swap (no chunk ever found the context full), at any speed.
    assert summary["cycles"] >= 2 and summary["swaps"] == summary["cycles"]
    assert summary["fallbacks"] == 0
    assert summary["chunks_lost"] == 0 and summary["chunks_in_order"]
    assert summary["failed_queries"] == 0 and summary["ttft"]["n"] > 0
    assert summary["chunk_log_rebuilds_state"]
