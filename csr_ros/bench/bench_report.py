"""Benchmark figures: spreads of repeated timings, result rows, ratios and the printed table.

Pure: no torch, no I/O. `csr_ros.bench.ttft_bench` measures; this module only summarizes.

Row schema (one dict per row, JSON-ready):
    method "csr" | "unordered":  resource, n, m, method, repeats, ttft_median_s, ttft_min_s,
                                 ttft_max_s, ttft_q1_s, ttft_q3_s, ttft_samples_s
    method "capsule":            resource, n, method, repeats, snapshot_*_s, restore_*_s
                                 (attached: pointer move), restore_copy_*_s (K/V copied in),
                                 capsule_kv_bytes
    method "prefill":            resource, n, method, seconds, tokens_per_s (the cold prefill of
                                 the static part), decode_tokens_per_s (median greedy decode
                                 speed on it), decode_samples_tokens_per_s

Summary "side_by_side" (two or more resources; the first is "local" where present): one entry per
figure and cell with each resource's value and first/other ratios:
    decode_tokens_per_s (n), csr_ttft_s (n, m), prefill_tokens_per_s (n), unordered_over_csr (n, m)

Summary "targets" (an in-process engine, named local*, beside a server): per engine, server and
cell, whether the engine decodes at least at the server's rate and answers a CSR query in at
most 0.8x the server's TTFT, and by how much it misses (docs/benchmarks.md, "auto").
"""

from __future__ import annotations

import statistics
from typing import Iterable, Sequence

METHODS = ("csr", "unordered", "capsule", "prefill")


def spread(samples: Sequence[float], prefix: str) -> dict[str, float | list[float]]:
    """median, min, max and quartiles of `samples`, keyed `<prefix>_median_s` etc."""
    assert samples, f"no samples for {prefix}"
    ordered = sorted(samples)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {f"{prefix}_median_s": statistics.median(ordered), f"{prefix}_min_s": ordered[0],
            f"{prefix}_max_s": ordered[-1], f"{prefix}_q1_s": q1, f"{prefix}_q3_s": q3,
            f"{prefix}_samples_s": list(samples)}


def ttft_row(resource: str, n: int, m: int, method: str, samples: Sequence[float]) -> dict:
    assert method in ("csr", "unordered"), method
    return {"resource": resource, "n": n, "m": m, "method": method, "repeats": len(samples),
            **spread(samples, "ttft")}


def capsule_row(resource: str, n: int, snapshot_s: Sequence[float], restore_s: Sequence[float],
                restore_copy_s: Sequence[float], kv_bytes: int) -> dict:
    return {"resource": resource, "n": n, "method": "capsule", "repeats": len(snapshot_s),
            **spread(snapshot_s, "snapshot"), **spread(restore_s, "restore"),
            **spread(restore_copy_s, "restore_copy"), "capsule_kv_bytes": int(kv_bytes)}


def prefill_row(resource: str, n: int, seconds: float,
                decode_tokens_per_s: float | Sequence[float] | None = None) -> dict:
    """`decode_tokens_per_s`: one rate or repeated samples (the median is reported)."""
    if decode_tokens_per_s is None or isinstance(decode_tokens_per_s, (int, float)):
        samples = [] if decode_tokens_per_s is None else [float(decode_tokens_per_s)]
    else:
        samples = [float(r) for r in decode_tokens_per_s]
    return {"resource": resource, "n": n, "method": "prefill", "seconds": seconds,
            "tokens_per_s": n / seconds if seconds > 0 else None,
            "decode_tokens_per_s": statistics.median(samples) if samples else None,
            "decode_samples_tokens_per_s": samples}


def summarize(rows: Iterable[dict]) -> dict:
    """Speed-ups: unordered/CSR TTFT per (resource, n, m); CSR TTFT between resources; capsule
    restore growth from the smallest to the largest n."""
    rows = list(rows)
    ttft = {(r["resource"], r["n"], r["m"], r["method"]): r["ttft_median_s"]
            for r in rows if r["method"] in ("csr", "unordered")}
    speedups = []
    for (resource, n, m, method), csr_s in sorted(ttft.items()):
        unordered_s = ttft.get((resource, n, m, "unordered"))
        if method == "csr" and unordered_s is not None and csr_s > 0:
            speedups.append({"resource": resource, "n": n, "m": m, "csr_ttft_s": csr_s,
                             "unordered_ttft_s": unordered_s,
                             "unordered_over_csr": unordered_s / csr_s})
    resources = sorted({r["resource"] for r in rows})
    between = []
    if len(resources) >= 2:
        first = resources[0]
        for other in resources[1:]:
            for (resource, n, m, method), s in sorted(ttft.items()):
                theirs = ttft.get((other, n, m, method))
                if resource == first and theirs is not None and s > 0:
                    between.append({"n": n, "m": m, "method": method, "numerator": other,
                                    "denominator": first, "ratio": theirs / s})
    growth = []
    for resource in resources:
        capsules = sorted((r for r in rows
                           if r["method"] == "capsule" and r["resource"] == resource),
                          key=lambda r: r["n"])
        if len(capsules) >= 2 and capsules[0]["restore_median_s"] > 0:
            growth.append({"resource": resource, "n_from": capsules[0]["n"],
                           "n_to": capsules[-1]["n"],
                           "restore_growth": capsules[-1]["restore_median_s"]
                           / capsules[0]["restore_median_s"]})
    pairs = side_by_side(rows, speedups)
    return {"speedups": speedups, "between_resources": between, "capsule_restore_growth": growth,
            "side_by_side": pairs, "targets": against_servers(pairs)}


# (figure, whether higher is better, the engine's target as a fraction of the server's figure)
TARGETS = (("decode_tokens_per_s", True, 1.0), ("csr_ttft_s", False, 0.8))


def against_servers(pairs: Sequence[dict]) -> list[dict]:
    """Each in-process engine's figure over each server's, against TARGETS. `short_by` is how
    far the ratio is from its target where it misses (0 where it is met)."""
    out = []
    for p in pairs:
        for figure, higher_is_better, target in TARGETS:
            if p["figure"] != figure:
                continue
            engines = [name for name in p["values"] if name.startswith("local")]
            servers = [name for name in p["values"] if not name.startswith("local")]
            for engine in engines:
                for server in servers:
                    theirs = p["values"][server]
                    if not theirs:
                        continue
                    ratio = p["values"][engine] / theirs
                    met = ratio >= target if higher_is_better else ratio <= target
                    out.append({"figure": figure, "n": p["n"], "m": p["m"], "engine": engine,
                                "server": server, "ratio": ratio,
                                "target": f"{'>=' if higher_is_better else '<='} {target:g}",
                                "met": met, "short_by": 0.0 if met else abs(ratio - target)})
    return out


def side_by_side(rows: Sequence[dict], speedups: Sequence[dict]) -> list[dict]:
    """Every headline figure per cell, one value per resource, and first/other ratios."""
    resources = sorted({r["resource"] for r in rows}, key=lambda name: (name != "local", name))
    if len(resources) < 2:
        return []
    first, others = resources[0], resources[1:]
    figures: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["method"] == "prefill":
            for figure, key in (("decode_tokens_per_s", "decode_tokens_per_s"),
                                ("prefill_tokens_per_s", "tokens_per_s")):
                if r.get(key) is not None:
                    figures.setdefault((figure, r["n"], None), {})[r["resource"]] = r[key]
        elif r["method"] == "csr":
            figures.setdefault(("csr_ttft_s", r["n"], r["m"]), {})[r["resource"]] = (
                r["ttft_median_s"])
    for s in speedups:
        figures.setdefault(("unordered_over_csr", s["n"], s["m"]), {})[s["resource"]] = (
            s["unordered_over_csr"])
    out = []
    for (figure, n, m), values in sorted(figures.items(), key=lambda kv: (
            _FIGURE_ORDER.index(kv[0][0]), kv[0][1], kv[0][2] or 0)):
        entry = {"figure": figure, "n": n, "m": m, "values": values}
        for other in others:
            if values.get(first) is not None and values.get(other):
                entry[f"{first}_over_{other}"] = values[first] / values[other]
        out.append(entry)
    return out


_FIGURE_ORDER = ("decode_tokens_per_s", "csr_ttft_s", "prefill_tokens_per_s", "unordered_over_csr")


def format_table(rows: Sequence[dict], summary: dict) -> str:
    """The human-readable result: TTFT table, capsule table, ratios."""
    lines = []
    ttft = {(r["resource"], r["n"], r["m"], r["method"]): r for r in rows
            if r["method"] in ("csr", "unordered")}
    prefill = {(r["resource"], r["n"]): r for r in rows if r["method"] == "prefill"}
    keys = sorted({(res, n, m) for res, n, m, _ in ttft})
    w = max([10] + [len(r["resource"]) for r in rows])      # the resource column
    if keys:
        lines.append(f"{'resource':<{w}} {'N':>6} {'M':>5}  {'CSR TTFT s (min-max)':<26}"
                     f"{'unordered TTFT s (min-max)':<28}{'speed-up':>9}  {'cold prefill N s':>16}"
                     f"{'decode tok/s':>14}")
        for res, n, m in keys:
            csr, unordered = ttft.get((res, n, m, "csr")), ttft.get((res, n, m, "unordered"))
            ratio = (f"{unordered['ttft_median_s'] / csr['ttft_median_s']:.1f}x"
                     if csr and unordered and csr["ttft_median_s"] > 0 else "-")
            cold = prefill.get((res, n)) or {}
            seconds, decode = cold.get("seconds"), cold.get("decode_tokens_per_s")
            lines.append(f"{res:<{w}} {n:>6} {m:>5}  {_cell(csr, 'ttft'):<26}"
                         f"{_cell(unordered, 'ttft'):<28}{ratio:>9}  "
                         f"{'-' if seconds is None else f'{seconds:.3f}':>16}"
                         f"{'-' if decode is None else f'{decode:.1f}':>14}")
    capsules = sorted((r for r in rows if r["method"] == "capsule"),
                      key=lambda r: (r["resource"], r["n"]))
    if capsules:
        lines.append("")
        lines.append(f"{'resource':<{w}} {'N':>6}  {'snapshot ms':<22}{'restore ms':<22}"
                     f"{'restore+copy ms':<22}{'K/V MiB':>8}")
        for r in capsules:
            lines.append(f"{r['resource']:<{w}} {r['n']:>6}  {_cell(r, 'snapshot', 1e3):<22}"
                         f"{_cell(r, 'restore', 1e3):<22}{_cell(r, 'restore_copy', 1e3):<22}"
                         f"{r['capsule_kv_bytes'] / 2**20:>8.1f}")
    pairs = summary.get("side_by_side") or ()
    if pairs:
        names = sorted({name for p in pairs for name in p["values"]},
                       key=lambda name: (name != "local", name))
        ratio_keys = [f"{names[0]}_over_{other}" for other in names[1:]]
        lines.append("")
        lines.append(f"{'side by side':<22}{'N':>6}{'M':>5}"
                     + "".join(f"{name:>{max(12, len(name) + 2)}}" for name in names)
                     + "".join(f"{key.replace('_over_', '/'):>{max(16, len(key))}}"
                               for key in ratio_keys))
        for p in pairs:
            cells = "".join(f"{_num(p['values'].get(name)):>{max(12, len(name) + 2)}}"
                            for name in names)
            ratios = "".join(f"{_num(p.get(key), 2):>{max(16, len(key))}}"
                             for key in ratio_keys)
            lines.append(f"{p['figure']:<22}{p['n']:>6}{'-' if p['m'] is None else p['m']:>5}"
                         f"{cells}{ratios}")
    targets = summary.get("targets") or ()
    if targets:
        lines.append("")
        lines.append("targets (engine/server): decode >= 1x, CSR TTFT <= 0.8x")
        for t in targets:
            cell = f"N={t['n']}" + ("" if t["m"] is None else f", M={t['m']}")
            verdict = "met" if t["met"] else f"MISSED by {t['short_by']:.2f}"
            lines.append(f"  {t['figure']:<20} {cell:<14} {t['engine']}/{t['server']} "
                         f"{t['ratio']:.2f} ({t['target']}): {verdict}")
        for engine in sorted({t["engine"] for t in targets}):
            missed = [t for t in targets if t["engine"] == engine and not t["met"]]
            lines.append(f"  {engine}: " + ("every target met" if not missed else
                         f"{len(missed)} of {sum(t['engine'] == engine for t in targets)} "
                         "targets missed"))
    for g in summary.get("capsule_restore_growth", ()):
        lines.append(f"capsule restore {g['resource']}: N={g['n_to']} takes "
                     f"{g['restore_growth']:.2f}x the time at N={g['n_from']}")
    for b in summary.get("between_resources", ()):
        lines.append(f"{b['method']} TTFT at N={b['n']}, M={b['m']}: "
                     f"{b['numerator']} / {b['denominator']} = {b['ratio']:.2f}")
    return "\n".join(lines)


def _num(value: float | None, digits: int | None = None) -> str:
    if value is None:
        return "-"
    if digits is None:
        digits = 3 if abs(value) < 10 else 1
    return f"{value:.{digits}f}"


def _cell(row: dict | None, prefix: str, scale: float = 1.0) -> str:
    if row is None:
        return "-"
    return (f"{row[f'{prefix}_median_s'] * scale:.3f} "
            f"({row[f'{prefix}_min_s'] * scale:.3f}-{row[f'{prefix}_max_s'] * scale:.3f})")
