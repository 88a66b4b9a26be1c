"""`csr-ros demo` decides typed actions: the summary keeps its keys and adds the decision
latency and the valid actions counted over parsed typed actions (two local engines)."""

from __future__ import annotations

import json

import pytest

from csr_ros.cli import main

pytestmark = pytest.mark.slow

SHORT = ["--cycles", "1", "--tau-mem", "600", "--chunk-rate-hz", "2", "--no-progress"]


def _check_typed(summary: dict, mode: str) -> None:
    assert summary["actions_mode"] == mode
    assert summary["chunks_lost"] == 0 and summary["state_consistent"]
    lat = summary["decision_latency"]
    assert set(lat) >= {"p50_s", "p99_s", "max_s"}
    assert 0 < lat["p50_s"] <= lat["p99_s"] <= lat["max_s"]
    assert lat["p50_s"] >= summary["ttft"]["p50_s"] - 1e-9      # TTFT is part of it
    assert summary["decisions"] == summary["queries"] - summary["failed_queries"] > 0
    assert summary["constrained_decisions"] == summary["decisions"]
    # Constrained decisions: every one parses (the budget of 24 tokens holds every action).
    assert summary["valid_actions"] == summary["decisions"]
    assert summary["invalid_actions"] == 0 and not summary["invalid_reasons"]
    assert sum(summary["actions_chosen"].values()) == summary["valid_actions"]


def test_the_demo_decodes_typed_actions_on_local_engines_by_default(tmp_path):
    out = tmp_path / "d.json"
    assert main(["demo", *SHORT, "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    _check_typed(summary, "auto")
    # More actions than `auto` scores in one pass once objects are seen: grammar decoding.
    assert summary["mask_s_per_token"] > 0
    # what dtype="auto" chose here: torch on a CPU with native bf16, llama.cpp without
    assert summary["precision"].startswith(("torch.", "llama.cpp "))
    # measured once on this machine (or the machine's only candidate), and said so
    assert summary["engine_choice"]["how"] in ("calibrated", "only candidate")
    assert summary["engine_choice"]["precision"] == summary["precision"]
