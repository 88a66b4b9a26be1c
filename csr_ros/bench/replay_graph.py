"""A recorded bag through the real nodes, measured: does the policy keep up, and if not, do
the nodes say so and why?

    python -m csr_ros.bench.replay_graph BAG --params config/csr_ros.yaml --out DIR \\
        [--rate 1.0] [--set policy.rate_hz=2.0 --set reconciler.context_tokens=2048 ...]

Starts the aggregator and all_in_one (the reconciler with two in-process resources and the
policy) as their own processes on a params file derived from `--params` (`--set` entries,
resource.kind 'local'), waits for the reconciler's start event, plays the bag with
`csr_ros.nodes.player` (a third process), and records csr/decisions, csr/swaps, /diagnostics
and the nodes' warnings on /rosout. Then stops the nodes with SIGINT and writes
DIR/report.json and DIR/replay.png: decisions/s against rate_hz, TTFT p50/p99, swaps against
synchronous fallbacks, what /diagnostics said last (the policy's rate verdict, the
reconciler's capacity verdict), and how each node exited.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from csr_ros.errors import ConfigError
from csr_ros.harness.ros_graph import NodeProcess, Observer, stop_all
from csr_ros.waiting import wait_until
from csr_ros.stats import percentile


def derived_params(params: Path, sets: list[str]) -> dict:
    """The params file with `node.dotted.name=value` entries applied (YAML values), and both
    all_in_one nodes on local resources."""
    doc = yaml.safe_load(params.read_text(encoding="utf-8"))
    sections = {key.strip("/").split("/")[-1]: key for key in doc}
    entries = ["policy.resource.kind=local", "reconciler.resource.kind=local", *sets]
    for entry in entries:
        name, sep, text = entry.partition("=")
        node, _, param = name.partition(".")
        if not sep or not param or node not in sections:
            raise ConfigError(f"--set {entry!r}: write node.parameter=value with node one of "
                              f"{sorted(sections)}")
        tree = doc[sections[node]]["ros__parameters"]
        *parents, leaf = param.split(".")
        for part in parents:
            tree = tree.setdefault(part, {})
        tree[leaf] = yaml.safe_load(text)
    return doc




class Recorder:
    """What the nodes publish, as (monotonic time, message): decisions, swaps, warnings and
    above on /rosout, and the latest status of each name on /diagnostics."""

    def __init__(self):
        from diagnostic_msgs.msg import DiagnosticArray
        from rcl_interfaces.msg import Log

        from csr_ros.msg import PolicyDecision, SwapEvent
        from csr_ros.nodes.common import DECISIONS_QOS, DIAGNOSTICS_QOS, ROSOUT_QOS, SWAPS_QOS

        self.observer = Observer("csr_replay_recorder")
        self.decisions = self.observer.record(PolicyDecision, "csr/decisions", DECISIONS_QOS)
        self.swaps = self.observer.record(SwapEvent, "csr/swaps", SWAPS_QOS)
        self.logs = self.observer.record(Log, "/rosout", ROSOUT_QOS, lambda m: m.level >= 30)
        self.diagnostics: dict[str, tuple[float, object]] = {}

        def diagnostics(array) -> None:
            for status in array.status:
                self.diagnostics[status.name] = (time.monotonic(), status)

        self.observer.on(DiagnosticArray, "/diagnostics", DIAGNOSTICS_QOS, diagnostics)

    def close(self) -> None:
        self.observer.close()


def run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params = out / "params.yaml"
    doc = derived_params(Path(args.params), args.set)
    params.write_text(yaml.safe_dump(doc, sort_keys=False))
    policy = doc[next(k for k in doc if k.strip("/").endswith("policy"))]["ros__parameters"]
    rate_hz = float(policy.get("rate_hz", 2.0))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    recorder = Recorder()
    procs = [NodeProcess(node, params, out / f"{node}.log", env)
             for node in ("aggregator", "all_in_one")]
    report: dict = {"bag": [str(b) for b in args.bag], "rate": args.rate, "rate_hz": rate_hz,
                    "params": str(params), "sets": args.set}
    try:
        not_started = ConfigError(f"the nodes did not start (see {out}/*.log)")

        def started() -> bool:
            if any(p.proc.poll() is not None for p in procs):
                raise not_started
            return any(m.reason == "start" for _, m in recorder.swaps)

        wait_until(started, args.startup_s, interval_s=0.2, timeout_error=not_started)
        print(f"nodes up; playing {args.bag[0]} at rate {args.rate:g}", file=sys.stderr)
        play_started = time.monotonic()
        player = subprocess.run([sys.executable, "-m", "csr_ros.nodes.player", *map(str, args.bag),
                                 "--rate", str(args.rate)], env=env, capture_output=True,
                                text=True)
        (out / "player.log").write_text(player.stdout + player.stderr)
        time.sleep(args.tail_s)
        play_ended = time.monotonic()
    finally:
        exits = stop_all(procs, signal.SIGINT, 30.0)
        time.sleep(0.5)
        recorder.close()
    window_s = play_ended - play_started
    decisions = [m for t, m in recorder.decisions if play_started <= t <= play_ended]
    ttfts = [m.ttft_s for m in decisions]
    swaps = [m for t, m in recorder.swaps if t >= play_started]
    reasons: dict[str, int] = {}
    for m in swaps:
        reasons[m.reason] = reasons.get(m.reason, 0) + 1
    last = {name: {"level": int.from_bytes(s.level, "little") if isinstance(s.level, bytes)
                   else int(s.level), "message": s.message,
                   "values": {v.key: v.value for v in s.values}}
            for name, (_, s) in recorder.diagnostics.items()}
    warnings = [{"node": m.name, "msg": m.msg} for t, m in recorder.logs if t >= play_started]
    report.update({
        "window_s": round(window_s, 1), "player": player.stdout.strip(),
        "decisions": len(decisions),
        "decisions_per_s": round(len(decisions) / window_s, 4) if window_s > 0 else None,
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else None,
        "version_changes": reasons, "swaps": reasons.get("swap", 0),
        "fallbacks": reasons.get("fallback", 0), "diagnostics": last,
        "warnings": warnings[-20:], "n_warnings": len(warnings), "exits": exits})
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    _plot(out / "replay.png", recorder, play_started, play_ended, rate_hz, report)
    _print(report)
    return 0


def _print(report: dict) -> None:
    p50, p99 = report["ttft_p50_s"], report["ttft_p99_s"]
    print(f"window {report['window_s']} s: {report['decisions']} decisions = "
          f"{report['decisions_per_s']} decisions/s against rate_hz {report['rate_hz']:g}; "
          f"TTFT p50 {p50 if p50 is None else round(p50, 3)} s, "
          f"p99 {p99 if p99 is None else round(p99, 3)} s")
    print(f"version changes: {report['version_changes']} (swaps {report['swaps']}, fallbacks "
          f"{report['fallbacks']})")
    for name, d in sorted(report["diagnostics"].items()):
        print(f"{name} [level {d['level']}]: {d['message']}")
    print("exits: " + ", ".join(f"{k} {v['exit_code']} in {v['exit_s']} s"
                                for k, v in report["exits"].items()))


def _plot(path: Path, recorder: Recorder, t0: float, t1: float, rate_hz: float,
          report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    pts = [(t - t0, m.ttft_s) for t, m in recorder.decisions if t0 <= t <= t1]
    if pts:
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], "o", ms=3, label="TTFT per decision")
    ax1.axhline(1 / rate_hz, color="grey", ls="--", label=f"period at rate_hz {rate_hz:g}")
    ax1.set_ylabel("TTFT (s)")
    ax1.set_yscale("log")
    times = sorted(t - t0 for t, _ in recorder.decisions if t0 <= t <= t1)
    if times:
        window = 20.0
        xs = [x for x in range(0, int(t1 - t0) + 1)]
        ax2.plot(xs, [sum(1 for t in times if x - window < t <= x) / min(window, max(x, 1))
                      for x in xs], label=f"decisions/s (last {window:g} s)")
    ax2.axhline(rate_hz, color="grey", ls="--", label="rate_hz")
    ax2.set_ylabel("decisions/s")
    ax2.set_xlabel("seconds since the bag started playing")
    for t, m in recorder.swaps:
        if t0 <= t <= t1:
            for ax in (ax1, ax2):
                ax.axvline(t - t0, color="red" if m.reason == "fallback" else "green", lw=0.8)
    ax1.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper left", fontsize=8)
    ax1.set_title(f"{report['decisions_per_s']} decisions/s vs rate_hz {rate_hz:g}; swaps "
                  f"{report['swaps']} (green), fallbacks {report['fallbacks']} (red)",
                  fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bag", type=Path, nargs="+")
    parser.add_argument("--params", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=1.0, help="bag playback rate")
    parser.add_argument("--set", action="append", default=[],
                        help="node.parameter=value (YAML) applied to the params file")
    parser.add_argument("--startup-s", type=float, default=300.0,
                        help="wait this long for the reconciler's start event")
    parser.add_argument("--tail-s", type=float, default=5.0,
                        help="keep recording this long after the bag ended")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
