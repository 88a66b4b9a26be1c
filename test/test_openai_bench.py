"""`csr-ros bench --resource openai` runs through the generic bench against a real server."""

from __future__ import annotations

import json

import pytest

from csr_ros.cli import main

pytestmark = pytest.mark.server


def test_bench_over_http_writes_csr_and_unordered_rows(llama_server, tmp_path):
    out = tmp_path / "o.json"
    code = main(["bench", "--resource", "openai", "--url", llama_server.url, "--n", "256",
                 "--m", "16", "--repeats", "1", "--json", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    methods = {(r["resource"], r["method"]) for r in rows}
    assert {("openai", "prefill"), ("openai", "csr"), ("openai", "unordered")} <= methods
    csr = next(r for r in rows if r["method"] == "csr")
    assert (csr["n"], csr["m"]) == (256, 16) and csr["ttft_median_s"] > 0
