"""The pure benchmark summaries and a short real run of `csr-ros bench`."""

from __future__ import annotations

import json

import pytest

from csr_ros.bench.bench_report import capsule_row, format_table, prefill_row, spread, summarize, ttft_row


def test_a_spread_reports_median_extremes_and_quartiles():
    s = spread([0.4, 0.1, 0.3, 0.2, 0.5], "ttft")
    assert s["ttft_median_s"] == 0.3 and s["ttft_min_s"] == 0.1 and s["ttft_max_s"] == 0.5
    assert s["ttft_q1_s"] == pytest.approx(0.2) and s["ttft_q3_s"] == pytest.approx(0.4)
    assert s["ttft_samples_s"] == [0.4, 0.1, 0.3, 0.2, 0.5]
    single = spread([0.7], "restore")
    assert single["restore_q1_s"] == single["restore_q3_s"] == single["restore_median_s"] == 0.7


def test_the_summary_relates_unordered_to_csr_and_resources_to_each_other():
    rows = [ttft_row("local", 1024, 32, "csr", [0.1, 0.2, 0.3]),
            ttft_row("local", 1024, 32, "unordered", [4.0, 4.0, 4.0]),
            ttft_row("openai", 1024, 32, "csr", [0.05]),
            capsule_row("local", 512, [1e-5], [2e-5], [1e-3], 100),
            capsule_row("local", 1024, [1e-5], [3e-5], [2e-3], 200),
            prefill_row("local", 1024, 3.5)]
    summary = summarize(rows)
    (speedup,) = summary["speedups"]
    assert speedup["unordered_over_csr"] == pytest.approx(20.0)
    (between,) = summary["between_resources"]
    assert (between["numerator"], between["denominator"]) == ("openai", "local")
    assert between["ratio"] == pytest.approx(0.25)
    (growth,) = summary["capsule_restore_growth"]
    assert growth["restore_growth"] == pytest.approx(1.5)
    table = format_table(rows, summary)
    assert "20.0x" in table and "3.500" in table and "1.50x the time at N=512" in table
    assert rows[-1]["tokens_per_s"] == pytest.approx(1024 / 3.5)


def test_the_side_by_side_summary_puts_local_first_and_relates_every_headline_figure():
    rows = [prefill_row("openai", 1024, 4.0, [40.0, 50.0, 45.0]),
            prefill_row("local", 1024, 2.0, [60.0]),
            ttft_row("local", 1024, 32, "csr", [0.1]),
            ttft_row("local", 1024, 32, "unordered", [12.0]),
            ttft_row("openai", 1024, 32, "csr", [0.2]),
            ttft_row("openai", 1024, 32, "unordered", [8.0])]
    assert rows[0]["decode_tokens_per_s"] == 45.0
    assert rows[0]["decode_samples_tokens_per_s"] == [40.0, 50.0, 45.0]
    summary = summarize(rows)
    by_figure = {p["figure"]: p for p in summary["side_by_side"]}
    assert list(by_figure) == ["decode_tokens_per_s", "csr_ttft_s", "prefill_tokens_per_s",
                               "unordered_over_csr"]
    assert by_figure["decode_tokens_per_s"]["local_over_openai"] == pytest.approx(60 / 45)
    assert by_figure["csr_ttft_s"]["local_over_openai"] == pytest.approx(0.5)
    assert by_figure["prefill_tokens_per_s"]["values"] == {"local": 512.0, "openai": 256.0}
    assert by_figure["unordered_over_csr"]["values"] == {"local": 120.0, "openai": 40.0}
    table = format_table(rows, summary)
    assert "local/openai" in table and "decode_tokens_per_s" in table and "1.33" in table


def test_each_engine_is_held_to_the_decode_and_ttft_targets_against_the_server():
    rows = [prefill_row("openai", 1024, 4.0, [50.0]), prefill_row("local", 1024, 2.0, [40.0]),
            prefill_row("local-llamacpp", 1024, 3.0, [55.0]),
            ttft_row("openai", 1024, 32, "csr", [0.2]), ttft_row("local", 1024, 32, "csr", [0.1]),
            ttft_row("local-llamacpp", 1024, 32, "csr", [0.19])]
    summary = summarize(rows)
    targets = {(t["figure"], t["engine"]): t for t in summary["targets"]}
    assert set(targets) == {(f, e) for f in ("decode_tokens_per_s", "csr_ttft_s")
                            for e in ("local", "local-llamacpp")}
    assert all(t["server"] == "openai" for t in targets.values())
    slow_decode = targets[("decode_tokens_per_s", "local")]
    assert not slow_decode["met"] and slow_decode["short_by"] == pytest.approx(0.2)
    assert targets[("csr_ttft_s", "local")]["met"]
    assert targets[("decode_tokens_per_s", "local-llamacpp")]["met"]
    slow_ttft = targets[("csr_ttft_s", "local-llamacpp")]
    assert not slow_ttft["met"] and slow_ttft["ratio"] == pytest.approx(0.95)
    assert slow_ttft["short_by"] == pytest.approx(0.15)
    table = format_table(rows, summary)
    assert "MISSED by 0.20" in table and "MISSED by 0.15" in table
    assert "local: 1 of 2 targets missed" in table


def test_a_run_without_a_server_has_no_targets():
    rows = [ttft_row("local", 1024, 32, "csr", [0.1]), prefill_row("local", 1024, 2.0, [40.0])]
    assert summarize(rows)["targets"] == []


def test_a_short_bench_run_writes_the_documented_json_and_a_png_plot(tmp_path, capsys):
    pytest.importorskip("torch")
    from csr_ros.cli import main

    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    assert main(["bench", "--n", "48,96", "--m", "8", "--repeats", "1", "--json", str(out),
                 "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    report = json.loads(out.read_text())
    assert set(report) == {"rows", "meta", "summary"}
    by_method = {}
    for row in report["rows"]:
        by_method.setdefault(row["method"], []).append(row)
    assert sorted((r["n"], r["m"]) for r in by_method["csr"]) == [(48, 8), (96, 8)]
    assert sorted((r["n"], r["m"]) for r in by_method["unordered"]) == [(48, 8), (96, 8)]
    for row in by_method["csr"] + by_method["unordered"]:
        assert row["resource"] == "local" and row["repeats"] == 1
        assert 0 < row["ttft_min_s"] <= row["ttft_median_s"] <= row["ttft_max_s"]
    assert sorted(r["n"] for r in by_method["capsule"]) == [48, 96]
    for row in by_method["capsule"]:
        assert row["snapshot_median_s"] > 0 and row["restore_median_s"] > 0
        assert row["capsule_kv_bytes"] > 0
    assert len(report["summary"]["speedups"]) == 2
    assert [r["n"] for r in by_method["prefill"]] == [48, 96]
    assert all(r["tokens_per_s"] > 0 and "decode_tokens_per_s" in r for r in by_method["prefill"])
    assert report["meta"]["n"] == [48, 96] and report["meta"]["torch"]
    printed = capsys.readouterr().out
    assert "CSR TTFT" in printed and "restore ms" in printed


def test_the_bench_refuses_an_openai_run_without_a_url():
    from csr_ros.cli import main

    assert main(["bench", "--resource", "openai"]) == 2


@pytest.mark.server
def test_the_bench_runs_local_and_openai_side_by_side(llama_server, tmp_path):
    pytest.importorskip("torch")
    from csr_ros.cli import main

    out = tmp_path / "both.json"
    assert main(["bench", "--resource", "local,openai", "--url", llama_server.url, "--n", "64",
                 "--m", "8", "--repeats", "1", "--no-unordered", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {r["resource"] for r in report["rows"] if r["method"] == "csr"} == {"local", "openai"}
    (between,) = report["summary"]["between_resources"]
    assert (between["numerator"], between["denominator"]) == ("openai", "local")
    assert between["ratio"] > 0
    decode = {r["resource"]: r["decode_tokens_per_s"] for r in report["rows"]
              if r["method"] == "prefill"}
    assert decode["local"] > 0 and decode["openai"] > 0
    figures = {p["figure"]: p for p in report["summary"]["side_by_side"]}
    assert figures["decode_tokens_per_s"]["local_over_openai"] > 0
    assert figures["csr_ttft_s"]["local_over_openai"] > 0
    # The local engine is the one dtype="auto" measured fastest on this CPU (llama.cpp's
    # kernels, or torch with its lean forward, never the transformers fallback), and says so.
    local = report["meta"]["engines"]["local"]
    assert local["choice"]["how"] in ("calibrated", "only candidate")
    assert local["precision"] == local["choice"]["precision"]
    expected = "llama.cpp" if local["precision"].startswith("llama.cpp") else "lean"
    assert local["forward"] == expected


def test_two_resources_take_each_timed_repeat_in_turn(monkeypatch):
    """Side by side, decode and CSR repeats alternate between the resources one by one, so each
    pair of samples is taken seconds apart under the same load."""
    pytest.importorskip("torch")
    from csr_ros.bench.ttft_bench import WARMUP_QUERIES, bench_phases, interleaved
    from csr_ros.layout import Layout
    from csr_ros.model_store import resolve_model_dir
    from csr_ros.resources.local import LocalResource
    from csr_ros.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(resolve_model_dir(weights=False))
    layout = Layout.from_tokenizer(tokenizer)
    calls: list[tuple[str, str]] = []
    resources = [LocalResource(name=name, threads=1, max_context_tokens=512)
                 for name in ("a", "b")]
    try:
        for resource in resources:
            def recorded(*args, _name=resource.name, _call=resource.engine.query, **kwargs):
                # The bench's decode runs ask the engine with EOS suppressed (no EOS ids).
                calls.append((_name, "decode" if kwargs.get("eos_ids") == () else "query"))
                return _call(*args, **kwargs)

            monkeypatch.setattr(resource.engine, "query", recorded)
        rows = interleaved([bench_phases(r, tokenizer, layout, ns=[64], ms=[4], repeats=3,
                                         unordered=False) for r in resources])
    finally:
        for resource in resources:
            resource.close()
    decodes = [name for name, what in calls if what == "decode"]
    queries = [name for name, what in calls if what == "query"]
    assert decodes == ["a", "b"] * 3
    # Each resource's warm-up answers come in its first step, then the CSR repeats alternate.
    assert queries == ["a"] * WARMUP_QUERIES + ["b"] * WARMUP_QUERIES + ["a", "b"] * 3
    csr = {r["resource"]: r for r in rows if r["method"] == "csr"}
    assert set(csr) == {"a", "b"} and all(len(r["cached_tokens"]) == 3 for r in csr.values())
    decode_rows = [r for r in rows if r["method"] == "prefill"]
    assert {r["resource"] for r in decode_rows} == {"a", "b"}
    assert all(r["decode_tokens_per_s"] > 0 for r in decode_rows)
