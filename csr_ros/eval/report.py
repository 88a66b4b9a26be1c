"""The report: one row per method and budget, a markdown table, a plot of accuracy against TTFT.

Row (JSON-ready), the fields the issue names first:
    method, budget, n_questions, accuracy, ci95 [lo, hi] (Wilson), ttft_p50_s, ttft_p99_s,
    prompt_tokens_mean, recomputed_tokens_mean,
then label, n_correct, accuracy_contains (the answer appears in the prediction),
decision_p50_s / decision_p99_s (until the answer is chosen),
history_tokens_mean (chunk tokens in the prompt), accuracy_by_kind, and the run's counters
(wall_s; CSR: swaps, fallbacks, evicted_chunks).

Pure apart from writing the plot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from csr_ros.eval.scoring import percentile, wilson_interval

COLOURS = {"csr": "tab:green", "window": "tab:blue", "bm25": "tab:orange", "none": "tab:grey"}
MARKERS = {"csr": "o", "window": "s", "bm25": "^", "none": "x"}


def summarize(records: Sequence, runs: Sequence[dict]) -> list[dict]:
    rows = []
    for run in runs:
        mine = [r for r in records if r.label == run["label"]]
        n = len(mine)
        n_ok = sum(r.correct for r in mine)
        lo, hi = wilson_interval(n_ok, n)
        ttft = [r.ttft_s for r in mine]
        decision = [r.decision_s for r in mine]
        kinds: dict[str, list[bool]] = {}
        for r in mine:
            kinds.setdefault(r.kind or "-", []).append(r.correct)
        row = {
            "method": run["method"], "budget": run["budget"], "n_questions": n,
            "accuracy": n_ok / n if n else None, "ci95": [lo, hi],
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "prompt_tokens_mean": _mean([r.prompt_tokens for r in mine]),
            "recomputed_tokens_mean": _mean([r.recomputed_tokens for r in mine]),
            "label": run["label"], "n_correct": n_ok,
            "accuracy_contains": sum(r.contains for r in mine) / n if n else None,
            "decision_p50_s": percentile(decision, 50),
            "decision_p99_s": percentile(decision, 99),
            "history_tokens_mean": _mean([r.history_tokens for r in mine]),
            "accuracy_by_kind": {k: {"n": len(v), "accuracy": sum(v) / len(v)}
                                 for k, v in sorted(kinds.items())},
        }
        row.update({k: v for k, v in run.items() if k not in ("method", "budget", "label")})
        rows.append(row)
    return rows


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def markdown_table(rows: Sequence[dict]) -> str:
    lines = ["| method | budget | n | accuracy | 95% CI | TTFT p50 [s] | TTFT p99 [s] | "
             "prompt tokens | recomputed tokens | history tokens |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        budget = ", ".join(f"{k}={v}" for k, v in r["budget"].items()) or "-"
        lines.append(
            f"| {r['method']} | {budget} | {r['n_questions']} | {_f(r['accuracy'], 3)} | "
            f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {_f(r['ttft_p50_s'], 3)} | "
            f"{_f(r['ttft_p99_s'], 3)} | {_f(r['prompt_tokens_mean'], 0)} | "
            f"{_f(r['recomputed_tokens_mean'], 0)} | {_f(r['history_tokens_mean'], 0)} |")
    kinds = sorted({k for r in rows for k in r["accuracy_by_kind"]})
    if len(kinds) > 1:
        lines += ["", "| method | budget | " + " | ".join(kinds) + " |",
                  "|---|---|" + "---:|" * len(kinds)]
        for r in rows:
            budget = ", ".join(f"{k}={v}" for k, v in r["budget"].items()) or "-"
            cells = []
            for k in kinds:
                cell = r["accuracy_by_kind"].get(k)
                cells.append(f"{cell['accuracy']:.2f} ({cell['n']})" if cell else "-")
            lines.append(f"| {r['method']} | {budget} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _f(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def plot_accuracy_vs_ttft(rows: Sequence[dict], path: str | Path, *, title: str = "") -> Path:
    """Accuracy (Wilson 95% CI as the vertical bar) against TTFT p50 (p50 to p99 as the
    horizontal bar), one point per method and budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    labelled: set[str] = set()
    labelled_points: list[float] = []
    for r in rows:
        if r["accuracy"] is None or r["ttft_p50_s"] is None:
            continue
        x, y = r["ttft_p50_s"] * 1000, r["accuracy"]
        method = r["method"]
        ax.errorbar([x], [y], yerr=[[max(0.0, y - r["ci95"][0])], [max(0.0, r["ci95"][1] - y)]],
                    xerr=[[0], [max(0.0, r["ttft_p99_s"] * 1000 - x)]],
                    fmt=MARKERS.get(method, "o"), color=COLOURS.get(method, "black"),
                    capsize=3, ms=8, label=None if method in labelled else method)
        labelled.add(method)
        short = {"tau_mem_tokens": "tau", "window_tokens": "K", "k": "k"}
        budget = " ".join(f"{short[k]}={v}" for k, v in r["budget"].items() if k in short)
        offset = (6, 6 + 11 * (len(labelled_points) % 3))
        labelled_points.append(x)
        ax.annotate(f"{method} {budget}".strip(), (x, y), textcoords="offset points",
                    xytext=offset, fontsize=8, color=COLOURS.get(method, "black"))
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("TTFT [ms] (marker p50, bar to p99)")
    ax.set_ylabel("accuracy (bar: Wilson 95% CI)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    n = max((r["n_questions"] for r in rows), default=0)
    ax.set_title(title or f"Memory recall against decision latency ({n} questions per point)")
    ax.legend(loc="best")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
