"""The report: one row per method, budget and choice-scoring rule, a markdown table, a bias
check, a plot of accuracy against TTFT.

Every field of a row, the bias check and when a row is flagged (`SAME_AS_NONE_WARNING`,
`bias_warnings`): docs/eval.md, "Report".

Pure apart from writing the plot.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

from csr_ros.bench.eval.scoring import exact_match, normalize_answer
from csr_ros.stats import percentile, wilson_interval

SAME_AS_NONE_WARNING = 0.9       # answers as no memory does on this share of questions or more

COLOURS = {"csr": "tab:green", "window": "tab:blue", "bm25": "tab:orange", "none": "tab:grey"}
MARKERS = {"csr": "o", "window": "s", "bm25": "^", "none": "x"}


def summarize(records: Sequence, runs: Sequence[dict]) -> list[dict]:
    rows = []
    for run in runs:
        scoring = run.get("scoring", "")
        mine = [r for r in records
                if r.label == run["label"] and r.scoring == scoring]
        n = len(mine)
        n_ok = sum(r.correct for r in mine)
        lo, hi = wilson_interval(n_ok, n)
        ttft = [r.ttft_s for r in mine]
        decision = [r.decision_s for r in mine]
        kinds: dict[str, list] = {}
        for r in mine:
            kinds.setdefault(r.kind or "-", []).append(r)
        row = {
            "method": run["method"], "budget": run["budget"], "scoring": scoring,
            "n_questions": n,
            "accuracy": n_ok / n if n else None, "ci95": [lo, hi],
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "prompt_tokens_mean": _mean([r.prompt_tokens for r in mine]),
            "recomputed_tokens_mean": _mean([r.recomputed_tokens for r in mine]),
            **scores(mine),
            "label": run["label"], "n_correct": n_ok,
            "accuracy_contains": sum(r.contains for r in mine) / n if n else None,
            "decision_p50_s": percentile(decision, 50),
            "decision_p99_s": percentile(decision, 99),
            "history_tokens_mean": _mean([r.history_tokens for r in mine]),
            "accuracy_by_kind": {k: {"n": len(v), "accuracy": sum(r.correct for r in v) / len(v),
                                     **{key: value for key, value in scores(v).items()
                                        if key in KIND_SCORES}}
                                 for k, v in sorted(kinds.items())},
            **answer_bias(mine),
        }
        row.update({k: v for k, v in run.items()
                    if k not in ("method", "budget", "label", "scoring")})
        rows.append(row)
    _same_as_none(rows, records, runs)
    return rows


def answer_bias(records: Sequence) -> dict:
    """The row's most frequent answer over its questions with choices: its share, and the
    accuracy of always giving it; the most frequent letter's share."""
    chosen = [r for r in records if r.choices]
    if not chosen:
        return {"n_choice": 0, "top_answer": None, "top_answer_share": None,
                "top_answer_accuracy": None, "top_label": None, "top_label_share": None}
    answers = Counter(normalize_answer(r.prediction) for r in chosen)
    top, n_top = min(answers.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = next(r.prediction for r in chosen if normalize_answer(r.prediction) == top)
    letters = Counter(r.predicted_label for r in chosen if r.predicted_label)
    label, n_label = (min(letters.items(), key=lambda kv: (-kv[1], kv[0])) if letters
                      else (None, 0))
    return {"n_choice": len(chosen), "top_answer": shown,
            "top_answer_share": n_top / len(chosen),
            "top_answer_accuracy": sum(exact_match(shown, r.answer) for r in chosen)
            / len(chosen),
            "top_label": label, "top_label_share": n_label / len(chosen) if letters else None}


def _same_as_none(rows: list[dict], records: Sequence, runs: Sequence[dict]) -> None:
    """Each row's `same_as_none`: the share of its questions answered exactly as the no-memory
    row of the same scoring rule answered them (None where there is no such row)."""
    none_label = next((run["label"] for run in runs if run["method"] == "none"), None)
    said: dict[tuple, str] = {}
    if none_label is not None:
        said = {(r.scoring, r.episode, r.qid, r.t_s): normalize_answer(r.prediction)
                for r in records if r.label == none_label}
    for row in rows:
        mine = [r for r in records if r.label == row["label"] and r.scoring == row["scoring"]]
        paired = [(r, said.get((r.scoring, r.episode, r.qid, r.t_s))) for r in mine]
        paired = [(r, theirs) for r, theirs in paired if theirs is not None]
        row["same_as_none"] = (sum(normalize_answer(r.prediction) == theirs
                                   for r, theirs in paired) / len(paired)
                               if paired and row["method"] != "none" else None)


def bias_warnings(rows: Sequence[dict]) -> list[str]:
    """A warning for each row that answers as no memory does on almost every question."""
    out = []
    for r in rows:
        share = r.get("same_as_none")
        if share is not None and share >= SAME_AS_NONE_WARNING:
            out.append(f"{_row_name(r)} answers as no memory does on {share:.0%} of the "
                       f"questions (n={r['n_questions']}): its accuracy says nothing about "
                       "memory")
    return out


def _row_name(r: dict) -> str:
    """'csr (tau_mem_tokens=2048, eviction=..., label)'."""
    parts = [f"{k}={v}" for k, v in r["budget"].items()] + [r.get("scoring") or ""]
    inner = ", ".join(p for p in parts if p)
    return f"{r['method']} ({inner})" if inner else r["method"]


def bias_table(rows: Sequence[dict]) -> str:
    """Per row: the most frequent answer and its share, the accuracy of always giving it, the
    most frequent letter's share, and the share answered as no memory answered."""
    lines = ["| method | budget | scoring | accuracy | most frequent answer | its share | "
             "accuracy of always giving it | most frequent letter | same as none |",
             "|---|---|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        budget = ", ".join(f"{k}={v}" for k, v in r["budget"].items()) or "-"
        letter = (f"{r['top_label']} {r['top_label_share']:.2f}" if r.get("top_label")
                  else "-")
        lines.append(
            f"| {r['method']} | {budget} | {r['scoring'] or '-'} | {_f(r['accuracy'], 3)} | "
            f"{r['top_answer'] if r['top_answer'] is not None else '-'} | "
            f"{_f(r['top_answer_share'], 2)} | {_f(r['top_answer_accuracy'], 2)} | {letter} | "
            f"{_f(r.get('same_as_none'), 2)} |")
    return "\n".join(lines)


KIND_SCORES = ("f1", "judge", "evidence_coverage")


def scores(records: Sequence) -> dict:
    """Evidence coverage over the questions that name evidence; F1 and the judge over the open
    questions (None where there are none, or no judge ran)."""
    evident = [r.evidence_covered for r in records if r.evidence_covered is not None]
    open_ = [r for r in records if not r.choices]
    judged = [r.judge for r in open_ if r.judge is not None]
    return {
        "evidence_coverage": sum(evident) / len(evident) if evident else None,
        "f1": _mean([r.f1 for r in open_]),
        "judge": sum(j == 1.0 for j in judged) / len(judged) if judged else None,
        "judge_ci95": list(wilson_interval(sum(j == 1.0 for j in judged), len(judged)))
        if judged else None,
        "n_open": len(open_), "n_with_evidence": len(evident),
        "judge_score_mean": _mean(judged),
        "judge_unparsed": sum(r.judge_parsed is False for r in open_) if judged else None,
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def markdown_table(rows: Sequence[dict]) -> str:
    lines = ["| method | budget | scoring | n | accuracy | 95% CI | F1 | judge | "
             "evidence coverage | TTFT p50 [s] | TTFT p99 [s] | prompt tokens | "
             "recomputed tokens | history tokens |",
             "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        budget = ", ".join(f"{k}={v}" for k, v in r["budget"].items()) or "-"
        lines.append(
            f"| {r['method']} | {budget} | {r.get('scoring') or '-'} | {r['n_questions']} | "
            f"{_f(r['accuracy'], 3)} | "
            f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {_f(r.get('f1'), 3)} | "
            f"{_f(r.get('judge'), 3)} | {_f(r.get('evidence_coverage'), 3)} | "
            f"{_f(r['ttft_p50_s'], 3)} | "
            f"{_f(r['ttft_p99_s'], 3)} | {_f(r['prompt_tokens_mean'], 0)} | "
            f"{_f(r['recomputed_tokens_mean'], 0)} | {_f(r['history_tokens_mean'], 0)} |")
    kinds = sorted({k for r in rows for k in r["accuracy_by_kind"]})
    if len(kinds) > 1:
        lines += ["", "| method | budget | scoring | " + " | ".join(kinds) + " |",
                  "|---|---|---|" + "---:|" * len(kinds)]
        for r in rows:
            budget = ", ".join(f"{k}={v}" for k, v in r["budget"].items()) or "-"
            cells = []
            for k in kinds:
                cell = r["accuracy_by_kind"].get(k)
                cells.append(_kind_cell(cell) if cell else "-")
            lines.append(f"| {r['method']} | {budget} | {r.get('scoring') or '-'} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def _kind_cell(cell: dict) -> str:
    """'0.25 (12)': EM accuracy (questions); open ones add F1 and the judge when there are."""
    parts = [f"{cell['accuracy']:.2f}"]
    if cell.get("f1") is not None:
        parts.append(f"F1 {cell['f1']:.2f}")
    if cell.get("judge") is not None:
        parts.append(f"judge {cell['judge']:.2f}")
    if cell.get("evidence_coverage") is not None:
        parts.append(f"ev {cell['evidence_coverage']:.2f}")
    return " / ".join(parts) + f" ({cell['n']})"


def _f(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def plot_accuracy_vs_ttft(rows: Sequence[dict], path: str | Path, *, title: str = "") -> Path:
    """Accuracy (Wilson 95% CI as the vertical bar) against TTFT p50 (p50 to p99 as the
    horizontal bar), one point per method and budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from csr_ros.plots import save_figure

    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    rules = {r.get("scoring") for r in rows}
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
        short = {"tau_mem_tokens": "tau", "window_tokens": "K", "window_chunks": "chunks",
                 "k": "k"}
        budget = " ".join(f"{short[k]}={v}" for k, v in r["budget"].items() if k in short)
        if len(rules) > 1:
            budget += f" {r['scoring']}"
        offset = (6, 6 + 11 * (len(labelled_points) % 3))
        labelled_points.append(x)
        ax.annotate(f"{method} {budget}".strip(), (x, y), textcoords="offset points",
                    xytext=offset, fontsize=8, color=COLOURS.get(method, "black"))
    ax.set_xscale("log")
    # ticks at 1, 2 and 5 of every decade, all labelled: the points often lie within one
    # decade (1-3 s), where decade ticks alone would leave the axis without a number
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("TTFT [ms] (marker p50, bar to p99)")
    ax.set_ylabel("accuracy (bar: Wilson 95% CI)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    n = max((r["n_questions"] for r in rows), default=0)
    ax.set_title(title or f"Memory recall against decision latency ({n} questions per point)")
    ax.legend(loc="best")
    return save_figure(fig, path)
