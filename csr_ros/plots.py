"""Plots of a demo run (matplotlib, Agg): TTFT over time with eviction and swap markers, and
the TTFT distribution inside and outside reconciliation windows (CSR paper, Fig. 6 and 7)."""

from __future__ import annotations

from pathlib import Path

MARKERS = {  # timeline kind -> (colour, line style, label)
    "evict": ("tab:orange", "--", "X_E derived (warm-up starts)"),
    "swap": ("tab:green", "-", "swap"),
    "sync": ("tab:red", "-", "synchronous eviction"),
    "fallback": ("tab:red", ":", "fallback (evicted on the primary)"),
    "failover": ("tab:purple", "-.", "failover"),
    "retry": ("tab:brown", ":", "retry"),
}


def plot_run(summary: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    samples = summary["samples"]
    fig, (ax_time, ax_hist) = plt.subplots(1, 2, figsize=(14, 5),
                                           gridspec_kw={"width_ratios": [2.2, 1]})
    for start, end in summary["windows"]:
        end = summary["duration_s"] if end is None else end
        ax_time.axvspan(start, end, color="tab:orange", alpha=0.12, lw=0)
    labelled: set[str] = set()
    for event in summary["timeline"]:
        colour, style, label = MARKERS.get(event["kind"], ("grey", ":", event["kind"]))
        ax_time.axvline(event["t_s"], color=colour, ls=style, lw=1,
                        label=None if label in labelled else label)
        labelled.add(label)
    for inside, colour, name in ((False, "tab:blue", "outside reconciliation"),
                                 (True, "tab:orange", "inside reconciliation")):
        xs = [s["t_s"] for s in samples if s["inside"] == inside]
        ys = [s["ttft_s"] * 1000 for s in samples if s["inside"] == inside]
        ax_time.scatter(xs, ys, s=9, color=colour, label=f"{name} (n={len(xs)})", zorder=3)
    ax_time.set_xlabel("time since start [s]")
    ax_time.set_ylabel("TTFT [ms]")
    ax_time.set_yscale("log")
    _log_ticks(ax_time.yaxis, [s["ttft_s"] * 1000 for s in samples], ScalarFormatter,
               NullFormatter)
    ax_time.set_title(f"TTFT over time — {summary['mode']}, tau_mem {summary['tau_mem_tokens']} "
                      f"tokens, {summary['cycles']} cycles, {summary['swaps']} swaps, "
                      f"{summary['fallbacks']} fallbacks")
    ax_time.legend(loc="upper left", fontsize=8)
    ax_time.grid(alpha=0.3)

    everything = [s["ttft_s"] * 1000 for s in samples]
    if everything:
        import numpy as np

        lo, hi = max(min(everything), 1e-3), max(everything)
        bins = np.geomspace(lo, hi * 1.01, 40) if hi > lo else 20
        ax_hist.hist([[s["ttft_s"] * 1000 for s in samples if not s["inside"]],
                      [s["ttft_s"] * 1000 for s in samples if s["inside"]]], bins=bins,
                     stacked=True, color=["tab:blue", "tab:orange"],
                     label=["outside", "inside"])
        if hi > lo:
            ax_hist.set_xscale("log")
            _log_ticks(ax_hist.xaxis, everything, ScalarFormatter, NullFormatter)
        ttft = summary["ttft"]
        for key, style in (("p50_s", "--"), ("p99_s", ":")):
            if ttft.get(key) is not None:
                ax_hist.axvline(ttft[key] * 1000, color="black", ls=style,
                                label=f"{key[:3]} {ttft[key] * 1000:.0f} ms")
    ax_hist.set_xlabel("TTFT [ms]")
    ax_hist.set_ylabel("queries")
    ax_hist.set_title("TTFT distribution")
    ax_hist.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
