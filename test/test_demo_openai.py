"""`csr-ros demo --resource openai` over two real llama.cpp servers (R1 and R2)."""

from __future__ import annotations

import json

import pytest

from csr_ros.cli import main
from llama_server import llama_server_pair  # noqa: F401  (fixture)

pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_demo_runs_two_eviction_cycles_over_two_http_servers_losing_no_chunk(
        llama_server_pair, tmp_path):
    r1, r2 = llama_server_pair
    out = tmp_path / "o.json"
    code = main(["demo", "--resource", "openai", "--r1", r1.url, "--r2", r2.url,
                 "--cycles", "2", "--tau-mem", "500", "--chunk-rate-hz", "2",
                 "--duration-s", "600",    # a cap: servers too slow to cycle fail, never hang
                 "--max-context-tokens", "4096", "--reserve-tokens", "128",
                 "--json", str(out), "--chunk-log", str(tmp_path / "chunks.log"),
                 "--no-progress"])
    summary = json.loads(out.read_text())
    assert code == 0
    # Real time: two swaps show the asynchronous path; whether a slow machine also needed a
    # synchronous fallback is a speed figure, not asserted here.
    assert summary["swaps"] >= 2
    assert summary["chunks_lost"] == 0 and summary["chunks_in_order"]
    assert summary["failed_queries"] == 0 and summary["ttft"]["n"] > 0
    assert summary["chunk_log_rebuilds_state"]
