"""The run summary's figures: the report of a run and the policy's /diagnostics compute each one
alike, with csr_ros.stats.percentile (numpy's linear interpolation)."""

from __future__ import annotations

import numpy as np
import pytest

from csr_ros.episode_run import Answered, EpisodeSettings, Sample, decision_figures
from csr_ros.errors import ConfigError
from csr_ros.node_logic.health import QueryStats, diagnose
from csr_ros.node_logic.schedule import QueryScheduler
from csr_ros.resources.base import QueryResult


def test_diagnostics_and_the_run_report_give_the_same_p50_and_p99_on_the_same_samples():
    # 37 distinct TTFTs and decode times: the 99th percentile falls between two samples, where
    # a nearest-rank percentile and numpy's linear one differ
    ttfts_s = [0.05 + 0.0131 * ((7 * i) % 37) for i in range(37)]
    decodes_s = [0.2 + 0.0107 * ((5 * i) % 37) for i in range(37)]
    stats = QueryStats()
    answered = []
    for i, (ttft_s, decode_s) in enumerate(zip(ttfts_s, decodes_s)):
        result = QueryResult(text="wait()", token_ids=(1, 2, 3), ttft_s=ttft_s, decode_s=decode_s,
                             n_prompt=120, n_extended=0, cached_tokens=None,
                             finish_reason="stop", constrained=True)
        stats.record(result, 1, now_s=0.5 * i)
        answered.append(Answered(Sample(t_s=0.5 * i, ttft_s=ttft_s, inside=i % 3 == 0, version=1,
                                        n_static=100, resource="r1"),
                                 latency_s=ttft_s + decode_s, valid=True, constrained=True,
                                 action="wait", error=""))
    published = dict(diagnose({}, QueryScheduler(rate_hz=2.0), stats).values)
    report = decision_figures(answered, duration_s=18.5)
    for q, key in ((50, "p50_s"), (99, "p99_s")):
        assert getattr(report["ttft"], key) == stats.ttft_percentile_s(q) \
            == pytest.approx(np.percentile(ttfts_s, q))
        assert getattr(report["decision_latency"], key) == stats.decision_percentile_s(q) \
            == pytest.approx(np.percentile(np.add(ttfts_s, decodes_s), q))
        assert published[f"ttft_{key}"] == f"{getattr(report['ttft'], key):.3f}"
        assert published[f"decision_{key}"] == f"{getattr(report['decision_latency'], key):.3f}"
    assert report["ttft"].p99_s not in ttfts_s           # interpolated, not a sample
    assert report["ttft_inside"].n + report["ttft_outside"].n == report["decisions"] == 37


def test_an_episode_that_would_never_stop_is_refused():
    with pytest.raises(ConfigError, match="--cycles >= 1 or --duration-s"):
        EpisodeSettings(cycles=0)
    assert EpisodeSettings(cycles=0, duration_s=30.0).reconcile_config().tau_mem_tokens == 1536


@pytest.mark.slow
def test_run_episode_on_two_engines_returns_a_summary_that_loses_no_chunk(tmp_path):
    pytest.importorskip("torch")
    import json

    from csr_ros.episode_run import format_report
    from csr_ros.harness.episode_loop import run_episode
    from csr_ros.resources.local import LocalResource

    settings = EpisodeSettings(cycles=1, paced=True, tau_mem_tokens=600, chunk_rate_hz=2.0,
                               max_context_tokens=2048, reserve_tokens=96, live_line=False,
                               chunk_log=tmp_path / "chunks.log")
    resources = [LocalResource(name=name, threads=1, max_context_tokens=2048)
                 for name in ("r1", "r2")]
    try:
        summary = run_episode(settings, resources)
    finally:
        for resource in resources:
            resource.close()
    assert summary.settings is settings and summary.mode == "asr"
    assert summary.cycles >= 1 and summary.swaps >= 1 and summary.fallbacks == 0
    assert summary.ok and summary.chunk_log_rebuilds_state
    assert summary.local.chunks_in_order and summary.local.precision
    assert summary.chunks_active + summary.chunks_evicted == summary.chunks_in
    assert summary.decisions == len(summary.samples) == summary.ttft.n > 0
    assert summary.ttft_inside.n + summary.ttft_outside.n == summary.ttft.n
    assert any(e.kind == "swap" for e in summary.timeline)
    written = json.loads(json.dumps(summary.as_json()))
    assert written["ttft"]["p99_s"] == summary.ttft.p99_s and written["paced"] is True
    assert f"tau_mem {settings.tau_mem_tokens} tokens" in format_report(summary)
    # the engines' dtype was given (the float32 default), so nothing was calibrated
    assert written["engine_choice"] == {"how": "set", "backend": "torch",
                                        "precision": summary.local.precision}
    assert "engine torch.float32, set: torch" in format_report(summary)
