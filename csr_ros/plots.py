"""Plots (matplotlib, Agg).

- `plot_run`: a demo run: TTFT over time with eviction and swap markers, and the TTFT
  distribution inside and outside reconciliation windows (CSR paper, Fig. 6 and 7).
- `plot_bench`: `csr-ros bench` rows: TTFT against N for CSR and the unordered baseline per
  resource and M (min-max as error bars), and capsule snapshot/restore times against N.
- `plot_fleet`: `csr-ros fleet` runs: TTFT p99 and the prefix-cache hit ratio against the
  robot count, per routing policy and server count.
- `plot_tokens`: `csr-ros replay --plot`: a bag's history tokens per source against robot time.
- `plot_soak`: `csr-ros soak --plot`: RSS and open fds per process over robot time, TTFT of the
  decisions with the faults marked, and how long each fault took to recover.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from csr_ros.episode_run import RunSummary

MARKERS = {  # timeline kind -> (colour, line style, label)
    "evict": ("tab:orange", "--", "X_E derived (warm-up starts)"),
    "swap": ("tab:green", "-", "swap"),
    "sync": ("tab:red", "-", "synchronous eviction"),
    "fallback": ("tab:red", ":", "fallback (evicted on the primary)"),
    "failover": ("tab:purple", "-.", "failover"),
    "retry": ("tab:brown", ":", "retry"),
}


def plot_run(summary: RunSummary, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    samples = summary.samples
    fig, (ax_time, ax_hist) = plt.subplots(1, 2, figsize=(14, 5),
                                           gridspec_kw={"width_ratios": [2.2, 1]})
    for start, end in summary.windows:
        end = summary.duration_s if end is None else end
        ax_time.axvspan(start, end, color="tab:orange", alpha=0.12, lw=0)
    labelled: set[str] = set()
    for event in summary.timeline:
        colour, style, label = MARKERS.get(event.kind, ("grey", ":", event.kind))
        ax_time.axvline(event.t_s, color=colour, ls=style, lw=1,
                        label=None if label in labelled else label)
        labelled.add(label)
    for inside, colour, name in ((False, "tab:blue", "outside reconciliation"),
                                 (True, "tab:orange", "inside reconciliation")):
        xs = [s.t_s for s in samples if s.inside == inside]
        ys = [s.ttft_s * 1000 for s in samples if s.inside == inside]
        ax_time.scatter(xs, ys, s=9, color=colour, label=f"{name} (n={len(xs)})", zorder=3)
    ax_time.set_xlabel("time since start [s]")
    ax_time.set_ylabel("TTFT [ms]")
    ax_time.set_yscale("log")
    _log_ticks(ax_time.yaxis, [s.ttft_s * 1000 for s in samples], ScalarFormatter,
               NullFormatter)
    ax_time.set_title(f"TTFT over time — {summary.mode}, tau_mem "
                      f"{summary.settings.tau_mem_tokens} tokens, {summary.cycles} cycles, "
                      f"{summary.swaps} swaps, {summary.fallbacks} fallbacks")
    ax_time.legend(loc="upper left", fontsize=8)
    ax_time.grid(alpha=0.3)

    everything = [s.ttft_s * 1000 for s in samples]
    if everything:
        import numpy as np

        lo, hi = max(min(everything), 1e-3), max(everything)
        bins = np.geomspace(lo, hi * 1.01, 40) if hi > lo else 20
        ax_hist.hist([[s.ttft_s * 1000 for s in samples if not s.inside],
                      [s.ttft_s * 1000 for s in samples if s.inside]], bins=bins,
                     stacked=True, color=["tab:blue", "tab:orange"],
                     label=["outside", "inside"])
        if hi > lo:
            ax_hist.set_xscale("log")
            _log_ticks(ax_hist.xaxis, everything, ScalarFormatter, NullFormatter)
        for key, style in (("p50", "--"), ("p99", ":")):
            value = getattr(summary.ttft, f"{key}_s")
            if value is not None:
                ax_hist.axvline(value * 1000, color="black", ls=style,
                                label=f"{key} {value * 1000:.0f} ms")
    ax_hist.set_xlabel("TTFT [ms]")
    ax_hist.set_ylabel("queries")
    ax_hist.set_title("TTFT distribution")
    ax_hist.legend(fontsize=8)
    return save_figure(fig, path)


def _log_ticks(axis, values_ms: list[float], scalar_formatter, null_formatter) -> None:
    """Readable ticks (in ms) on a log axis that may span less than a decade."""
    if not values_ms:
        return
    lo, hi = min(values_ms), max(values_ms)
    steps = [m * 10 ** e for e in range(-1, 6) for m in (1, 2, 5)]
    ticks = [v for v in steps if lo / 2 <= v <= hi * 2]
    axis.set_ticks(ticks)
    axis.set_major_formatter(scalar_formatter())
    axis.set_minor_formatter(null_formatter())


def plot_bench(rows: list[dict], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (ax_ttft, ax_capsule) = plt.subplots(1, 2, figsize=(13, 5),
                                              gridspec_kw={"width_ratios": [1.6, 1]})
    styles = {"csr": "-", "unordered": "--"}
    series = sorted({(r["resource"], r["m"], r["method"]) for r in rows if r["method"] in styles})
    for resource, m, method in series:
        points = sorted((r["n"], r["ttft_median_s"], r["ttft_min_s"], r["ttft_max_s"])
                        for r in rows if (r["resource"], r.get("m"), r["method"]) == (resource, m, method))
        ns = [p[0] for p in points]
        medians = [p[1] for p in points]
        errors = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
        ax_ttft.errorbar(ns, medians, yerr=errors, ls=styles[method], marker="o", capsize=3,
                         label=f"{resource} {method} (M={m})")
    ax_ttft.set_xscale("log", base=2)
    ax_ttft.set_yscale("log")
    ax_ttft.set_xlabel("static tokens N")
    ax_ttft.set_ylabel("TTFT [s] (median, min-max)")
    ax_ttft.set_title("TTFT: CSR query vs the whole prompt recomputed")
    ax_ttft.grid(True, which="both", alpha=0.3)
    ax_ttft.legend(fontsize="small")

    capsules = sorted((r["resource"], r["n"], r["snapshot_median_s"], r["restore_median_s"])
                      for r in rows if r["method"] == "capsule")
    for resource in sorted({c[0] for c in capsules}):
        mine = [c for c in capsules if c[0] == resource]
        ax_capsule.plot([c[1] for c in mine], [c[2] * 1e3 for c in mine], marker="o",
                        label=f"{resource} snapshot")
        ax_capsule.plot([c[1] for c in mine], [c[3] * 1e3 for c in mine], marker="s",
                        label=f"{resource} restore")
    ax_capsule.set_xscale("log", base=2)
    ax_capsule.set_ylim(bottom=0)
    all_ns = sorted({r["n"] for r in rows})
    for axis in (ax_ttft.xaxis, ax_capsule.xaxis):
        axis.set_ticks(all_ns)
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax_capsule.set_xlabel("static tokens N")
    ax_capsule.set_ylabel("time [ms] (median)")
    ax_capsule.set_title("Capsules: cost does not grow with N")
    ax_capsule.grid(True, alpha=0.3)
    if capsules:
        ax_capsule.legend(fontsize="small")
    else:
        ax_capsule.text(0.5, 0.5, "no capsule rows\n(HTTP resources have none)",
                        ha="center", va="center", transform=ax_capsule.transAxes)
    return save_figure(fig, path)


def plot_fleet(runs: list[dict], path: str | Path) -> Path:
    """`csr-ros fleet` runs: TTFT p99 and the prefix-cache hit ratio against the robot count K,
    one line per (routing policy, server count)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (ax_ttft, ax_hit) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = sorted({(r["routing"], r["servers"]) for r in runs})
    for routing, servers in series:
        points = sorted((r["robots"], r["ttft_p99_s"], r["hit_ratio"]) for r in runs
                        if (r["routing"], r["servers"]) == (routing, servers))
        label = f"{routing}, P={servers}"
        ttft = [(k, t) for k, t, _ in points if t is not None]
        hits = [(k, h) for k, _, h in points if h is not None]
        ax_ttft.plot([k for k, _ in ttft], [t for _, t in ttft], marker="o", label=label)
        ax_hit.plot([k for k, _ in hits], [h for _, h in hits], marker="o", label=label)
    ks = sorted({r["robots"] for r in runs})
    for ax in (ax_ttft, ax_hit):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_ticks(ks)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("robots K")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    ax_ttft.set_ylabel("TTFT p99 [s]")
    ax_ttft.set_title("TTFT p99 of the robots' decisions")
    ax_hit.set_ylabel("cached / prompt tokens of the queries")
    ax_hit.set_ylim(0, 1.05)
    ax_hit.set_title("prefix-cache hit ratio")
    return save_figure(fig, path)


def plot_tokens(timeline: list[tuple[float, str, int]], report: dict, path: Path) -> Path:
    """Cumulative history tokens per source (and in all) against robot time, with tau_mem."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    t0 = timeline[0][0] if timeline else 0.0
    for name in report["sources"]:
        points = [(t - t0, n) for t, s, n in timeline if s == name]
        if points:
            xs, ys = zip(*points)
            ax.step([x / 60 for x in xs], np.cumsum(ys), where="post", label=name)
    if timeline:
        xs = [(t - t0) / 60 for t, _, _ in timeline]
        ax.step(xs, np.cumsum([n for _, _, n in timeline]), where="post", color="black",
                label=f"all ({report['totals']['tokens_per_s']:.1f} tokens/s)")
    ax.axhline(report["tau_mem_tokens"], color="grey", linestyle="--",
               label=f"tau_mem {report['tau_mem_tokens']} tokens")
    ax.set_xlabel("robot time (min)")
    ax.set_ylabel("history tokens (cumulative)")
    ax.set_title(f"{Path(report['bag'][0]).name}: history tokens per source")
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=120)


FAULT_COLOURS = {"kill_primary": "tab:red", "kill_secondary": "tab:orange",
                 "stall": "tab:brown", "kill_host": "tab:purple", "disk_full": "tab:blue",
                 "clock_jump": "tab:cyan", "malformed": "tab:olive", "double": "black"}


def plot_soak(samples_path: Path, decisions_path: Path, summary: dict, path: str | Path) -> Path:
    """A soak (csr_ros.soak): its JSON-lines samples and decisions, and its summary."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float, int, int]]] = {}
    with open(samples_path) as f:
        for line in f:
            sample = json.loads(line)
            for role, value in sample.items():
                if isinstance(value, list):
                    series.setdefault(role, []).append(
                        (sample["robot_s"] / 3600.0, value[0], value[1], value[3]))
    ttft: list[tuple[float, float]] = []
    with open(decisions_path) as f:
        for line in f:
            d = json.loads(line)
            if d["ok"] and d["ttft_s"] is not None:
                ttft.append((d["robot_s"] / 3600.0, d["ttft_s"]))
    fig, axes = plt.subplots(2, 2, figsize=(14, 8.5))
    (ax_rss, ax_fds), (ax_ttft, ax_rec) = axes
    for i, (role, points) in enumerate(sorted(series.items())):
        colour = f"C{i}"
        for k, life in enumerate(_lives(points)):
            hours = [p[0] for p in life]
            ax_rss.plot(hours, [p[1] for p in life], color=colour,
                        label=role if k == 0 else None)
            ax_fds.plot(hours, [p[2] for p in life], color=colour,
                        label=role if k == 0 else None)
    ax_rss.set_ylabel("resident memory [MB]")
    ax_rss.set_title("RSS per process (a new line: the process was restarted)")
    ax_fds.set_ylabel("open file descriptors")
    ax_fds.set_title("open fds per process")
    if ttft:
        ax_ttft.scatter([t for t, _ in ttft], [v * 1000 for _, v in ttft], s=3, alpha=0.4,
                        color="tab:gray", label="decision TTFT")
        ax_ttft.set_yscale("log")
    faults = summary.get("faults", [])
    seen = set()
    for fault in faults:
        colour = FAULT_COLOURS.get(fault["kind"], "black")
        ax_ttft.axvline(fault["at_s"] / 3600.0, color=colour, linestyle="--", alpha=0.7,
                        label=fault["kind"] if fault["kind"] not in seen else None)
        seen.add(fault["kind"])
    ax_ttft.set_ylabel("TTFT [ms]")
    ax_ttft.set_title("TTFT of the decisions, faults marked")
    for ax in (ax_rss, ax_fds, ax_ttft):
        ax.set_xlabel("robot time [h]")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    xs = list(range(1, len(faults) + 1))
    ax_rec.bar(xs, [f["recovery_s"] or 0.0 for f in faults],
               color=[FAULT_COLOURS.get(f["kind"], "black") for f in faults])
    for x, fault in zip(xs, faults):
        if not fault["recovered"]:
            ax_rec.text(x, 0, "not\nrecovered", ha="center", va="bottom", color="red",
                        fontsize="small")
    ax_rec.set_xlabel("fault (in order)")
    ax_rec.set_ylabel("recovery [s, wall]")
    ax_rec.set_title(f"recovery of {len(faults)} faults "
                     f"({sum(f['recovered'] for f in faults)} recovered)")
    ax_rec.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"csr-ros soak: {summary['robot_hours']:.2f} robot-hours at "
                 f"{summary['speedup_achieved']:.1f}x, chunks in {summary['chunks_in']}, lost "
                 f"{summary['chunks_lost']}, duplicated {summary['chunks_duplicated']}, "
                 f"reordered {summary['chunks_reordered']}")
    return save_figure(fig, path)


def _lives(points: list[tuple]) -> list[list[tuple]]:
    """Split samples where the pid (the last item) changes."""
    out: list[list[tuple]] = []
    for point in points:
        if not out or out[-1][-1][-1] != point[-1]:
            out.append([])
        out[-1].append(point)
    return out


def save_figure(fig, path: str | Path, *, dpi: int = 110) -> Path:
    """Lay out, write as PNG (creating the folder) and close a figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
