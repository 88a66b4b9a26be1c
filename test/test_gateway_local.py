"""`csr-ros gateway --bench` over the default model's local engines in worker processes: the
gateway's session holds the same tokens as a state built straight from the messages, reports
the engine's cached tokens, and answers as the engine does when asked directly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("torch")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def test_the_gateway_bench_compares_the_same_queries_through_it_and_straight_to_the_engine(
        tmp_path):
    out = tmp_path / "gateway.json"
    run = subprocess.run(
        [sys.executable, "-P", "-m", "csr_ros.cli", "gateway", "--bench", "--n", "256",
         "--m", "32", "--repeats", "2", "--threads", "1", "--max-context-tokens", "2048",
         "--tau-mem", "1024", "--json", str(out)],
        capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gateway / direct" in run.stdout
    s = json.loads(out.read_text())
    n, m = s["n_history_tokens"], s["m_dynamic_tokens"]
    assert n >= 256 and m == 32 and s["repeats"] == 2 == len(s["rows"])
    # the local engine holds the whole history: every query reuses all of it
    assert s["cached_tokens"] == [n] and s["prompt_tokens"] == [n + m]
    assert all(r["n_static"] == n and r["n_dynamic"] == m for r in s["rows"])
    assert s["same_answer"] is True and s["new_versions"] == 0
    assert all(r["gateway_ttft_s"] > 0 and r["direct_ttft_s"] > 0 for r in s["rows"])
    assert s["ratio_median"] == pytest.approx(s["gateway_ttft_s_median"]
                                              / s["direct_ttft_s_median"])
