"""One run of the synthetic episode: `EpisodeSettings` in, `RunSummary` out.

    settings = EpisodeSettings(cycles=2, tau_mem_tokens=600)
    summary = run_episode(settings, resources)         # csr_ros.harness.episode_loop
    print(format_report(summary))
    json.dumps(summary.as_json())

The in-process demo (csr_ros.harness.episode_loop), the ROS demo (csr_ros.harness.ros_demo)
and every robot of a fleet run return a `RunSummary`. What both demos measure alike comes from
one function, `decision_figures`, over the answered queries (`Answered`: TTFT, latency, the
action); each adds its own part: `LocalFigures` from the in-process reconciler, `GraphFigures`
from what an observer saw on a ROS 2 graph. `as_json()` writes the keys the reports, the plots
and the docs read.

Pure: no clock, no threads, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Sequence

from csr_ros.errors import ConfigError
from csr_ros.model_store import DEFAULT_MODEL
from csr_ros.reconcile.machine import ReconcileConfig
from csr_ros.stats import percentile
from csr_ros.stream_defaults import DEMO

MODES = ("asr", "sync", "unordered")       # ASR, or a baseline: evict in place, no prefix reuse
ACTION_MODES = ("auto", "choice", "grammar", "json", "free")


@dataclass(frozen=True)
class EpisodeSettings:
    """The episode (seed, chunk size and rate), the policy (rate, budget, actions), ASR's sizes
    and when the run stops; defaults are the demo's row of csr_ros.stream_defaults."""
    seed: int = 0
    cycles: int = 3                        # stop after this many completed eviction cycles
    duration_s: float | None = None        # ... or after this long (None: cycles only)
    paced: bool = False                    # chunks wait for a running reconciliation (tests)
    mode: str = "asr"                      # one of MODES
    tau_mem_tokens: int = DEMO.tau_mem_tokens
    max_context_tokens: int = DEMO.max_context_tokens
    reserve_tokens: int = DEMO.reserve_tokens
    n_catchup_tokens: int = DEMO.n_catchup_tokens
    chunk_rate_hz: float = DEMO.chunk_rate_hz
    rate_hz: float = DEMO.rate_hz
    max_new_tokens: int = DEMO.max_new_tokens
    detail: int = 3                        # detections per camera chunk (sets the chunk size)
    actions: str = "auto"                  # one of ACTION_MODES
    eviction_fraction: float = 0.5         # oldest share of the chunks evicted per cycle
    model: str = DEFAULT_MODEL             # the tokenizer's model (a local engine's weights)
    resource: str = "local"                # local | openai (the servers' tokenizer and mode)
    warm_timeout_s: float | None = None    # retry a warm-up or catch-up step that takes longer
    chunk_log: Path | None = None          # log the chunk stream; check it rebuilds the state
    live_line: bool = True                 # a progress line on stderr
    kill_warmup: int | None = None         # fault injection: kill the secondary in warm-up N

    def __post_init__(self):
        if self.cycles < 1 and self.duration_s is None:
            raise ConfigError("give --cycles >= 1 or --duration-s")
        if self.mode not in MODES or self.actions not in ACTION_MODES:
            raise ConfigError(f"mode must be one of {MODES} and actions one of {ACTION_MODES}, "
                              f"got {self.mode!r}, {self.actions!r}")

    def reconcile_config(self) -> ReconcileConfig:
        return ReconcileConfig(tau_mem_tokens=self.tau_mem_tokens,
                               max_context_tokens=self.max_context_tokens,
                               reserve_tokens=self.reserve_tokens,
                               n_catchup_tokens=self.n_catchup_tokens, mode=self.mode,
                               warm_timeout_s=self.warm_timeout_s)


@dataclass(frozen=True)
class Spread:
    """Count, mean, p50, p99 and max of a set of seconds; None where there are none."""
    n: int
    mean_s: float | None
    p50_s: float | None
    p99_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        values = list(values)
        return cls(len(values), sum(values) / len(values) if values else None,
                   percentile(values, 50), percentile(values, 99), max(values, default=None))

    def keyed(self, tag: str = "") -> dict:
        return {f"n{tag}": self.n, f"mean{tag}_s": self.mean_s, f"p50{tag}_s": self.p50_s,
                f"p99{tag}_s": self.p99_s, f"max{tag}_s": self.max_s}


@dataclass(frozen=True)
class Sample:
    """One answered query on the run's clock (seconds since the episode started)."""
    t_s: float
    ttft_s: float
    inside: bool            # built while a reconciliation ran
    version: int
    n_static: int
    resource: str


@dataclass(frozen=True)
class Answered:
    """An answered query as both demos see it: its sample, how long the decision took, and the
    typed action it gave."""
    sample: Sample
    latency_s: float        # query start to the decision's last token
    valid: bool
    constrained: bool
    action: str             # the action's name ('' when not valid)
    error: str              # why it is not a valid action ('' when valid)


@dataclass(frozen=True)
class Event:
    t_s: float
    kind: str               # evict | swap | sync | fallback | failover | retry | start
    version: int
    detail: str


@dataclass(frozen=True)
class LocalFigures:
    """What only the in-process run knows: the reconciler's books and the workers."""
    precision: str | None
    catchup_steps: int
    worker_restarts: int
    injected_kills: int
    inputs: int
    chunks_in_order: bool
    final_static_tokens: int
    primary_reloading_at_end: bool
    invalid_examples: list[dict]
    viability: dict
    headroom_s: float | None
    headroom_min_s: float | None
    keep_up_warnings: int
    held_s: float
    keep_up_last_warning: str | None
    engine_choice: dict | None = None       # how the primary's engine was chosen (calibration)


@dataclass(frozen=True)
class GraphFigures:
    """What only the ROS graph run knows: the chunk topic as observed, the node processes."""
    chunk_streams: int
    chunks_missing_on_topic: list[int]
    chunks_lost_by_reconciler: int
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    logs: str = ""
    stopped_early: str = ""


@dataclass(frozen=True)
class RunSummary:
    settings: EpisodeSettings
    mode: str               # asr | sync | unordered | "asr, ROS 2 graph"
    resource: str
    duration_s: float
    cycles: int             # completed evictions: swaps, synchronous ones and fallbacks
    swaps: int
    sync_evictions: int
    fallbacks: int
    retries: int
    failovers: int
    chunks_in: int
    chunks_lost: int
    chunks_duplicated: int
    chunks_active: int
    chunks_evicted: int
    final_version: int | None
    state_consistent: bool
    queries: int
    failed_queries: int | None
    skipped_ticks: int | None
    mask_s_per_token: float | None
    windows: list[tuple[float, float | None]]      # reconciliations (start, end)
    timeline: list[Event]
    # decision_figures():
    decisions: int
    valid_actions: int
    invalid_actions: int
    invalid_reasons: dict[str, int]
    constrained_decisions: int
    decisions_per_s: float | None
    decision_latency: Spread
    actions_chosen: dict[str, int]
    ttft: Spread
    ttft_inside: Spread
    ttft_outside: Spread
    samples: list[Sample]
    local: LocalFigures | None = None
    graph: GraphFigures | None = None
    chunk_log_rebuilds_state: bool | None = None

    @property
    def ok(self) -> bool:
        """Nothing lost and the state consistent: the demo's exit status."""
        return self.chunks_lost == 0 and self.state_consistent

    def as_json(self) -> dict:
        s, lat = self.settings, self.decision_latency
        out = {"mode": self.mode, "seed": s.seed, "model": s.model, "resource": self.resource,
               "tau_mem_tokens": s.tau_mem_tokens, "chunk_rate_hz": s.chunk_rate_hz,
               "rate_hz": s.rate_hz, "max_context_tokens": s.max_context_tokens,
               "n_catchup_tokens": s.n_catchup_tokens}
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.name not in _APART})
        out.update(
            actions_mode=s.actions,
            decision_latency={"p50_s": lat.p50_s, "p99_s": lat.p99_s, "max_s": lat.max_s,
                              "mean_s": lat.mean_s},
            ttft={**self.ttft.keyed(), **self.ttft_inside.keyed("_inside"),
                  **self.ttft_outside.keyed("_outside")},
            samples=[{**vars(x), "t_s": round(x.t_s, 4), "ttft_s": round(x.ttft_s, 5)}
                     for x in self.samples],
            windows=[list(w) for w in self.windows], timeline=[vars(e) for e in self.timeline])
        if self.local is not None:
            out.update(vars(self.local), paced=s.paced)
        if self.graph is not None:
            out.update({k: v for k, v in vars(self.graph).items()
                        if k != "stopped_early" or v})
        if self.chunk_log_rebuilds_state is not None:
            out["chunk_log_rebuilds_state"] = self.chunk_log_rebuilds_state
        return out


_APART = {"settings", "mode", "resource", "windows", "timeline", "decision_latency", "ttft",
          "ttft_inside", "ttft_outside", "samples", "local", "graph", "chunk_log_rebuilds_state"}


def decision_figures(answered: Sequence[Answered], duration_s: float) -> dict:
    """The RunSummary fields both demos compute alike from their answered queries."""
    reasons: dict[str, int] = {}
    chosen: dict[str, int] = {}
    for a in answered:
        if a.valid:
            chosen[a.action] = chosen.get(a.action, 0) + 1
        else:
            kind = "incomplete" if a.error.startswith("incomplete") else "unparsable"
            reasons[kind] = reasons.get(kind, 0) + 1
    valid = sum(a.valid for a in answered)
    return {
        "decisions": len(answered), "valid_actions": valid,
        "invalid_actions": len(answered) - valid, "invalid_reasons": reasons,
        "constrained_decisions": sum(a.constrained for a in answered),
        "decisions_per_s": len(answered) / duration_s if duration_s > 0 else None,
        "decision_latency": Spread.of([a.latency_s for a in answered]),
        "actions_chosen": dict(sorted(chosen.items(), key=lambda kv: -kv[1])),
        "ttft": Spread.of([a.sample.ttft_s for a in answered]),
        "ttft_inside": Spread.of([a.sample.ttft_s for a in answered if a.sample.inside]),
        "ttft_outside": Spread.of([a.sample.ttft_s for a in answered if not a.sample.inside]),
        "samples": [a.sample for a in answered]}


def _num(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def _spread(label: str, x: Spread) -> str:
    return (f"  TTFT {label:<8}n={x.n:4d} mean {_ms(x.mean_s)}  p50 {_ms(x.p50_s)}  p99 "
            f"{_ms(x.p99_s)}  max {_ms(x.max_s)}")


def format_report(s: RunSummary) -> str:
    """The demo's printed report."""
    local, lat = s.local, s.decision_latency
    reloading = local is not None and local.primary_reloading_at_end
    precision = local.precision if local is not None else None
    valid_pct = "-" if not s.decisions else f"{100.0 * s.valid_actions / s.decisions:.1f}%"
    lines = [
        f"csr-ros demo ({s.mode}, {s.resource} {s.settings.model}"
        f"{'' if not precision else ' on ' + precision}, seed {s.settings.seed}): "
        f"{s.duration_s:.0f} s, tau_mem {s.settings.tau_mem_tokens} tokens",
        f"  cycles {s.cycles}  swaps {s.swaps}  sync evictions {s.sync_evictions}  "
        f"fallbacks {s.fallbacks}  retries {s.retries}  failovers {s.failovers}",
        f"  chunks in {s.chunks_in}  lost {s.chunks_lost}  active {s.chunks_active}  "
        f"evicted {s.chunks_evicted}  state consistent {s.state_consistent}"
        f"{'  (the primary was still re-prefilling it)' if reloading else ''}",
        f"  queries {s.queries}  failed {s.failed_queries}  skipped ticks "
        f"{s.skipped_ticks}  decisions/s {_num(s.decisions_per_s)}",
        f"  actions ({s.settings.actions}): valid {s.valid_actions}/{s.decisions} "
        f"({valid_pct})  constrained {s.constrained_decisions}  invalid "
        f"{s.invalid_reasons or 0}",
        f"  decision latency p50 {_ms(lat.p50_s)}  p99 {_ms(lat.p99_s)}  max "
        f"{_ms(lat.max_s)}" + ("" if s.mask_s_per_token is None else
                               f"  (token mask {s.mask_s_per_token * 1000:.2f} ms/token)"),
        _spread("all", s.ttft), _spread("inside", s.ttft_inside),
        _spread("outside", s.ttft_outside)]
    if local is not None and local.engine_choice is not None:
        from csr_ros.engine.calibration import describe

        lines.insert(1, f"  engine {describe(local.engine_choice)}")
    if local is not None and local.headroom_min_s is not None:
        end = "-" if local.headroom_s is None else f"{local.headroom_s:.1f} s"
        lines.append(f"  viability headroom {end} at the end, {local.headroom_min_s:.1f} s at "
                     "worst (paper eq. 54)")
    if local is not None and local.keep_up_warnings:
        lines.append(f"  did not keep up ({local.keep_up_warnings} warnings); the last: "
                     f"{local.keep_up_last_warning}")
    if s.chunk_log_rebuilds_state is not None:
        lines.append(f"  chunk log rebuilds the same state: {s.chunk_log_rebuilds_state}")
    return "\n".join(lines)
