"""What a soak found: `FaultRecord` per fault, `SoakSummary` for the run, its JSON and report.

The JSON's keys (`SoakSummary.as_json`) are what the docs and the test check: robot_hours,
wall_s, cycles, swaps, fallbacks, decisions, valid_actions; chunks_in, chunks_lost,
chunks_duplicated, chunks_reordered; faults [{kind, at_s, recovered, recovery_s,
decisions_skipped, ...}]; rss_mb and open_fds per process; log_bytes, restart_s. Pure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from csr_ros.soak.probes import slope
from csr_ros.stats import percentile

WARM_FRACTION = 0.25     # of each process's life, left out of its memory slope (warming up)
MIN_SLOPE_ROBOT_S = 1800.0   # a process younger than this (robot time) gives no slope


@dataclass
class FaultRecord:
    kind: str
    at_s: float                     # robot seconds into the run
    wall_at_s: float                # wall seconds into the run
    detail: str = ""
    recovered: bool = False
    recovery_s: float | None = None  # injection to everything back (wall seconds)
    decisions_skipped: int = 0      # policy ticks without a decision (the safe action held)
    decisions_failed: int = 0       # of those, queries that failed or were lost
    ticks_without_decision: int = 0  # the longest run of policy ticks without an answer
    state_equals_log: bool | None = None   # the state rebuilt from the chunk log, afterwards
    robot_saw: str = ""             # what the robot noticed, in words
    why_not: str = ""               # what was still wrong when the recovery timed out
    extra: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        out = asdict(self)
        for key in ("at_s", "wall_at_s", "recovery_s"):
            if out[key] is not None:
                out[key] = round(out[key], 2)
        return out


@dataclass
class ProcessSeries:
    """Samples of one role (supervisor, state, r1, r2): (robot_s, rss_mb, fds, threads, pid)."""
    role: str
    samples: list[tuple[float, float, int, int, int]] = field(default_factory=list)

    def lives(self) -> list[list[tuple[float, float, int, int, int]]]:
        """The samples split by process (a killed process's successor is another life)."""
        out: list[list] = []
        for sample in self.samples:
            if not out or out[-1][-1][4] != sample[4]:
                out.append([])
            out[-1].append(sample)
        return out

    def summary(self) -> tuple[dict, dict]:
        """rss_mb {start, end, max, slope_mb_per_robot_hour, ...} and open_fds {start, end,
        max, per_process_growth_max}. The slope: each process's least-squares line once warm
        (its first WARM_FRACTION left out), weighted by how long it lived; processes younger
        than MIN_SLOPE_ROBOT_S give none. The fds' growth: over each process's warm part."""
        if not self.samples:
            return {}, {}
        first, last = self.samples[0], self.samples[-1]
        slopes, weights = [], []
        longest = None
        for life in self.lives():
            span_s = life[-1][0] - life[0][0]
            if span_s < MIN_SLOPE_ROBOT_S:
                continue
            warm = _warm(life)
            value = slope([s[0] / 3600.0 for s in warm], [s[1] for s in warm])
            if value is not None:
                slopes.append(value)
                weights.append(span_s)
                if longest is None or span_s > longest[0]:
                    longest = (span_s, value, warm[0][1], warm[-1][1])
        rss = {"start": round(first[1], 1), "end": round(last[1], 1),
               "max": round(max(s[1] for s in self.samples), 1),
               "slope_mb_per_robot_hour": None if not slopes else
               round(sum(s * w for s, w in zip(slopes, weights)) / sum(weights), 3),
               "processes": len(self.lives())}
        if longest is not None:
            rss["longest_life_robot_h"] = round(longest[0] / 3600.0, 2)
            rss["longest_life_slope"] = round(longest[1], 3)
            rss["longest_life_warm_start"] = round(longest[2], 1)
            rss["longest_life_end"] = round(longest[3], 1)
        fds = {"start": first[2], "end": last[2], "max": max(s[2] for s in self.samples)}
        # once warm, as the slope: a state's process opens its secondary's pipe after it serves
        fds["per_process_growth_max"] = max(warm[-1][2] - warm[0][2]
                                            for warm in map(_warm, self.lives()))
        threads = {"start": first[3], "end": last[3], "max": max(s[3] for s in self.samples)}
        return {**rss, "threads": threads}, fds


def _warm(life: list[tuple]) -> list[tuple]:
    """A process's samples after its first WARM_FRACTION (by robot time)."""
    span_s = life[-1][0] - life[0][0]
    return [s for s in life if s[0] >= life[0][0] + WARM_FRACTION * span_s]


@dataclass
class SoakSummary:
    settings: dict
    robot_hours: float
    wall_s: float
    speedup_target: float
    speedup_achieved: float
    held_wall_s: float              # robot time held: the machine did not keep up
    outage_wall_s: float            # the state's process was down: robot time ran at 1x
    slow_windows: list[dict]        # robot time spans run below 90% of the target
    cycles: int
    swaps: int
    fallbacks: int
    failovers: int
    retries: int
    decisions: int
    valid_actions: int
    failed_decisions: int
    skipped_ticks: int
    safe_action: str
    chunks_in: int
    chunks_lost: int
    chunks_duplicated: int
    chunks_reordered: int
    chunks_refused: int
    chunks_corrupt: int
    faults: list[FaultRecord]
    rss_mb: dict
    open_fds: dict
    log_bytes: dict
    restart_s: dict
    ttft: dict
    state_equals_log: bool | None
    host_exits_unexpected: int
    audit_examples: list[str]
    tokens_per_robot_s: float | None
    log_fs: str
    load_average: dict
    hedged_queries: int = 0         # asked on the secondary for a slow or failed primary
    engines: dict = field(default_factory=dict)         # each worker's engine and its choice
    held_by_cause: dict = field(default_factory=dict)   # wall seconds held, per cause
    costs_s: dict = field(default_factory=dict)         # CPU and fsync seconds of the run
    notes: list[str] = field(default_factory=list)
    ended_early: str = ""           # a stop before robot_hours: the signal and robot-hour

    @property
    def ticks_without_decision(self) -> dict:
        """The longest run of policy ticks without a decision, per fault kind."""
        out: dict[str, int] = {}
        for f in self.faults:
            out[f.kind] = max(out.get(f.kind, 0), f.ticks_without_decision)
        return out

    @property
    def allowed_ticks_without_decision(self) -> int:
        return int(self.settings["stale_after_s"] * self.settings["rate_hz"])

    @property
    def ok(self) -> bool:
        """Nothing lost, duplicated, reordered or corrupt; every fault recovered; the state
        equals the state rebuilt from its log; the state's process never died by itself."""
        return (self.chunks_lost == 0 and self.chunks_duplicated == 0
                and self.chunks_reordered == 0 and self.chunks_corrupt == 0
                and all(f.recovered for f in self.faults) and self.state_equals_log is True
                and self.host_exits_unexpected == 0)

    def as_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "faults"}
        out["faults"] = [f.as_json() for f in self.faults]
        out["ticks_without_decision"] = self.ticks_without_decision
        out["allowed_ticks_without_decision"] = self.allowed_ticks_without_decision
        out["ok"] = self.ok
        return out


def kill_host_restarts(faults: list[FaultRecord]) -> dict:
    """Each kill_host's restart of the state's process, [robot-hour, seconds], and the last
    one's time over the first's: a process that aged over the day restarts slower."""
    runs = [[round(f.at_s / 3600.0, 2), f.extra["restart_s"]] for f in faults
            if f.kind == "kill_host" and f.extra.get("restart_s")]
    return {"kill_host": runs,
            "last_over_first": round(runs[-1][1] / runs[0][1], 2) if len(runs) > 1 else None}


def ttft_figures(ttfts_s: list[float]) -> dict:
    if not ttfts_s:
        return {"n": 0}
    return {"n": len(ttfts_s), "p50_s": round(percentile(ttfts_s, 50), 4),
            "p99_s": round(percentile(ttfts_s, 99), 4), "max_s": round(max(ttfts_s), 4)}


def format_report(s: SoakSummary) -> str:
    """The report printed at the end of a soak."""
    recovered = sum(f.recovered for f in s.faults)
    lines = [
        f"csr-ros soak: {s.robot_hours:.2f} robot-hours in {s.wall_s / 60:.1f} min, speedup "
        f"{s.speedup_achieved:.1f}x of {s.speedup_target:g}x (robot time held "
        f"{s.held_wall_s:.0f} s where the machine did not keep up; {s.outage_wall_s:.0f} s "
        "at 1x while the state's process restarted)",
        f"  cycles {s.cycles}  swaps {s.swaps}  fallbacks {s.fallbacks}  failovers "
        f"{s.failovers}  retries {s.retries}",
        f"  chunks in {s.chunks_in}  lost {s.chunks_lost}  duplicated {s.chunks_duplicated}  "
        f"reordered {s.chunks_reordered}  refused (malformed input) {s.chunks_refused}  "
        f"corrupt {s.chunks_corrupt}",
        f"  decisions {s.decisions}  valid {s.valid_actions}  failed {s.failed_decisions}  "
        f"skipped ticks {s.skipped_ticks} (safe action {s.safe_action} held)",
        f"  robot time held by cause (wall s): " + "  ".join(
            f"{k} {v:.0f}" for k, v in s.held_by_cause.items()) + "; seconds spent: " + "  ".join(
            f"{k} {v:g}" for k, v in s.costs_s.items()),
        f"  TTFT p50 {_ms(s.ttft.get('p50_s'))}  p99 {_ms(s.ttft.get('p99_s'))}  max "
        f"{_ms(s.ttft.get('max_s'))}",
        f"  faults {len(s.faults)}, recovered {recovered}; state equals the state rebuilt "
        f"from the chunk log: {s.state_equals_log}; unexpected exits of the state's process "
        f"{s.host_exits_unexpected}"]
    if s.ended_early:
        lines.insert(1, f"  ENDED EARLY ({s.ended_early}): the figures are for the robot time run")
    if s.faults:
        lines.append(
            f"  ticks without a decision, the longest run per fault kind (stale_after_s "
            f"{s.settings['stale_after_s']:g} s at {s.settings['rate_hz']:g} Hz allows "
            f"{s.allowed_ticks_without_decision}; {s.hedged_queries} hedged queries): " +
            "  ".join(f"{k} {v}" for k, v in s.ticks_without_decision.items()))
    for f in s.faults:
        rec = f"recovered in {f.recovery_s:.1f} s" if f.recovered else \
            f"NOT RECOVERED ({f.why_not})"
        lines.append(f"    {f.at_s / 3600:6.2f} h  {f.kind:<14} {rec}; skipped "
                     f"{f.decisions_skipped}; {f.robot_saw}")
    for role, rss in s.rss_mb.items():
        fds = s.open_fds.get(role, {})
        slope_text = "-" if rss.get("slope_mb_per_robot_hour") is None else \
            f"{rss['slope_mb_per_robot_hour']:+.2f} MB/robot-h"
        lines.append(f"  {role:<10} RSS {rss['start']:.0f} -> {rss['end']:.0f} MB (max "
                     f"{rss['max']:.0f}, {slope_text}, {rss['processes']} process(es))  fds "
                     f"{fds.get('start')} -> {fds.get('end')}")
    lines.append(f"  chunk log {s.log_bytes.get('end', 0) / 1e6:.1f} MB at the end (max "
                 f"{s.log_bytes.get('max', 0) / 1e6:.1f} MB, capsules up to "
                 f"{s.log_bytes.get('capsules_max', 0) / 1e6:.0f} MB, archive "
                 f"{s.log_bytes.get('archive_end', 0) / 1e6:.1f} MB); restart "
                 f"{_ms(s.restart_s.get('median_s'))} median over "
                 f"{s.restart_s.get('n', 0)} restarts")
    if s.restart_s.get("last_over_first") is not None:
        first, last = s.restart_s["kill_host"][0], s.restart_s["kill_host"][-1]
        lines.append(f"  kill_host restarts: {first[1]:.1f} s at robot-hour {first[0]:.2f}, "
                     f"{last[1]:.1f} s at {last[0]:.2f} ({s.restart_s['last_over_first']:.2f}x "
                     "the first)")
    for name, engine in s.engines.items():
        lines.append(f"  engine of {name}: {engine['choice']}")
    lines.append(f"  load average {s.load_average}")
    for note in s.notes:
        lines.append(f"  note: {note}")
    lines.append("  OK" if s.ok else "  FAILED: see above")
    return "\n".join(lines)


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"
