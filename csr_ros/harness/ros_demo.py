"""`csr-ros demo --ros`: the synthetic episode through a real ROS 2 graph.

    episode_publisher ──/odom /scan /battery_state /detections /speech/text /action_result──▶
    aggregator ──csr/chunks──▶ all_in_one (reconciler: ASR over two in-process engines,
                                           policy: decisions at rate_hz)
    this process (observer) ◀── csr/chunks, csr/decisions, csr/swaps, /diagnostics

Each node runs in its own process, started as `python -m csr_ros.nodes.<node> --ros-args
--params-file <generated file>` (the file is kept next to the JSON, or in a temporary folder).
The report, JSON and plot are those of `csr-ros demo`, computed only from what this process
observed on the topics: decisions (TTFT, actions, last_seq), swap events (cycles, windows) and
the chunk stream (seqs: nothing lost, nothing twice).

Unless --ros-domain-id is given, the run uses a free random ROS domain and localhost-only
discovery: fake odometry must never reach a real robot's graph.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml
from diagnostic_msgs.msg import DiagnosticArray

from csr_ros.actions import Vocabulary
from csr_ros.demo_episode import Episode
from csr_ros.episode_run import (Answered, EpisodeSettings, Event, GraphFigures, RunSummary,
                                 Sample, decision_figures)
from csr_ros.errors import ConfigError, CsrError
from csr_ros.harness.episode_loop import DemoEngines, LiveLine
from csr_ros.harness.ros_graph import NodeProcess, Observer, stop_all
from csr_ros.msg import PolicyDecision, StateChunk, SwapEvent
from csr_ros.nodes.common import CHUNKS_QOS, DECISIONS_QOS, DIAGNOSTICS_QOS, SWAPS_QOS, time_ns
from csr_ros.ros_domain import free_ros_domain
from csr_ros.waiting import wait_until

ROOT_CONFIG = Path(__file__).resolve().parents[2] / "config" / "csr_ros.yaml"
CYCLE_REASONS = ("swap", "sync", "fallback")


def graph_params(settings: EpisodeSettings, engines: DemoEngines, episode: Episode) -> dict:
    """The parameters of the four nodes, from the demo's settings."""
    Vocabulary.parse(episode.action_specs)          # fails here, not in a node, if bad
    # the action list and its syntax are appended by the nodes (actions.in_profile)
    profile = episode.typed_profile("").replace("\n\n", "\n")
    shared = {"model": settings.model, "context_tokens": settings.max_context_tokens,
              "profile": profile, "actions": {"vocabulary": list(episode.action_specs)},
              "resource": {"kind": "local", "threads": engines.threads or 1,
                           "dtype": engines.dtype}}
    aggregator = yaml.safe_load(ROOT_CONFIG.read_text())["/**/aggregator"]["ros__parameters"]
    # vision_msgs is not among the PyPI wheels: the episode publishes detections as text
    aggregator["source"]["detections"] = {"topic": "/detections", "type": "std_msgs/msg/String",
                                          "event": True}
    seen = [f"{name}={pattern}" for name, pattern in episode.seen_patterns.items()]
    return json.loads(json.dumps({     # plain data, no YAML aliases
        "/**/aggregator": {"ros__parameters": aggregator},
        "/**/reconciler": {"ros__parameters": shared | {
            "tau_mem_tokens": settings.tau_mem_tokens,
            "n_catchup_tokens": settings.n_catchup_tokens,
            "reserve_tokens": settings.reserve_tokens,
            "eviction": {"policy": "oldest_fraction", "fraction": settings.eviction_fraction}}},
        "/**/policy": {"ros__parameters": shared | {
            "rate_hz": settings.rate_hz, "max_new_tokens": settings.max_new_tokens,
            "task": episode.typed_task(),
            "actions": shared["actions"] | {"mode": settings.actions, "seen": seen}}},
        "/**/episode_publisher": {"ros__parameters": {
            "seed": settings.seed, "chunk_rate_hz": settings.chunk_rate_hz,
            "detail": settings.detail}},
    }))


@dataclass
class Observed:
    chunks: list[StateChunk] = field(default_factory=list)
    decisions: list[PolicyDecision] = field(default_factory=list)
    swaps: list[SwapEvent] = field(default_factory=list)
    reconciler: dict[str, str] = field(default_factory=dict)    # latest /diagnostics values
    policy: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _diagnostics(seen: Observed, msg: DiagnosticArray) -> None:
    for status in msg.status:
        for node in ("reconciler", "policy"):
            if status.name == f"csr_ros: {node}":
                setattr(seen, node, {kv.key: kv.value for kv in status.values})


def run_ros_demo(settings: EpisodeSettings, engines: DemoEngines,
                 ros_domain_id: int | None = None) -> RunSummary:
    """The episode through the node processes; `ros_domain_id` None: a free random domain,
    localhost only."""
    if settings.mode != "asr" or settings.resource != "local":
        raise ConfigError("--ros runs ASR on two in-process resources (all_in_one); "
                          "--baseline and --resource openai are for the in-process demo")
    episode = Episode(settings.seed, chunk_rate_hz=settings.chunk_rate_hz,
                      detail=settings.detail)
    workdir = Path(tempfile.mkdtemp(prefix="csr_ros_demo_"))
    params_file = workdir / "params.yaml"
    params_file.write_text(yaml.safe_dump(graph_params(settings, engines, episode),
                                          sort_keys=False))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if ros_domain_id is None:
        env["ROS_DOMAIN_ID"] = str(free_ros_domain())
        env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    else:
        env["ROS_DOMAIN_ID"] = str(ros_domain_id)
    # this process joins the same graph (rclpy reads the domain when its context starts)
    os.environ["ROS_DOMAIN_ID"] = env["ROS_DOMAIN_ID"]
    if "ROS_AUTOMATIC_DISCOVERY_RANGE" in env:
        os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = env["ROS_AUTOMATIC_DISCOVERY_RANGE"]
    print(f"ROS graph in domain {env['ROS_DOMAIN_ID']}; parameters and node logs in {workdir}",
          file=sys.stderr)

    def stop(signum, frame):
        raise KeyboardInterrupt      # leave through `finally`: the node processes are stopped

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    observer = Observer("csr_ros_demo_observer")
    seen = Observed(lock=observer.lock)
    observer.on(StateChunk, "csr/chunks", CHUNKS_QOS, seen.chunks.append)
    observer.on(PolicyDecision, "csr/decisions", DECISIONS_QOS, seen.decisions.append)
    observer.on(SwapEvent, "csr/swaps", SWAPS_QOS, seen.swaps.append)
    observer.on(DiagnosticArray, "/diagnostics", DIAGNOSTICS_QOS,
                lambda msg: _diagnostics(seen, msg))
    procs: dict[str, NodeProcess] = {}

    def start(node: str) -> None:
        procs[node] = NodeProcess(node, params_file, workdir / f"{node}.log", env)

    started_wall_s = time.time()
    stopped_early = ""
    try:
        start("aggregator")
        start("all_in_one")
        # the publisher starts its clock once the aggregator listens to all its topics
        def started() -> bool:                      # the reconciler's 'start' event
            _check_alive(procs)
            return bool(seen.swaps)

        wait_until(started, 900.0, interval_s=0.2, timeout_error=CsrError(
            f"all_in_one did not start within 900 s; see {workdir}"))
        start("episode_publisher")
        started_wall_s = time.time()
        stopped_early = _wait_until_done(settings, seen, procs, started_wall_s)
        # the robot stops; the policy then decides over everything that arrived
        procs["episode_publisher"].stop(signal.SIGTERM)
        def decided_over_the_newest() -> bool:
            with seen.lock:
                newest = max((int(c.seq) for c in seen.chunks), default=-1)
                return any(int(d.last_seq) == newest for d in seen.decisions[-3:])

        wait_until(decided_over_the_newest, 30.0, interval_s=0.2)
    finally:
        order = ("episode_publisher", "aggregator", "all_in_one")
        exits = stop_all([procs[n] for n in order if n in procs], signal.SIGTERM, 20.0)
        time.sleep(0.2)
        observer.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    exit_codes = {node: exit["exit_code"] for node, exit in exits.items()}
    with seen.lock:
        summary = summarize(settings, seen, started_wall_s, time.time())
    return replace(summary, graph=replace(summary.graph, exit_codes=exit_codes,
                                          logs=str(workdir), stopped_early=stopped_early))


def _check_alive(procs: dict[str, NodeProcess]) -> None:
    for proc in procs.values():
        proc.check_alive()


def _wait_until_done(settings: EpisodeSettings, seen: Observed, procs: dict[str, NodeProcess],
                     started_wall_s: float) -> str:
    live = LiveLine(width=100)
    cycles_done_at = None
    while True:
        time.sleep(0.25)
        _check_alive(procs)
        with seen.lock:
            cycles = sum(s.reason in CYCLE_REASONS for s in seen.swaps)
            n_decisions, n_chunks = len(seen.decisions), len(seen.chunks)
            last = seen.decisions[-1] if seen.decisions else None
            version = seen.swaps[-1].version if seen.swaps else -1
        elapsed_s = time.time() - started_wall_s
        if settings.duration_s is not None and elapsed_s >= settings.duration_s:
            return ""
        if cycles >= settings.cycles > 0:
            cycles_done_at = n_decisions if cycles_done_at is None else cycles_done_at
            if n_decisions - cycles_done_at >= 3:       # a few decisions on the last version
                return ""
        if settings.live_line:
            line = (f"{elapsed_s:6.1f}s chunks {n_chunks:4d} decisions {n_decisions:4d} v{version}"
                    f" cycles {cycles} ttft "
                    f"{'-' if last is None else f'{last.ttft_s:.3f}s'}")
            live.show(line)


def _int(text: str) -> int:
    return int(text) if str(text).isdigit() else 0


def summarize(settings: EpisodeSettings, seen: Observed, started_wall_s: float,
              ended_wall_s: float) -> RunSummary:
    """The `csr-ros demo` summary, from the observed topics only."""

    def rel(stamp) -> float:
        return time_ns(stamp) / 1e9 - started_wall_s

    decisions = [d for d in seen.decisions if rel(d.stamp) >= -1.0]
    events = list(seen.swaps)
    cycle_events = [s for s in events if s.reason in CYCLE_REASONS]
    windows = [(rel(s.stamp) - s.window_s, rel(s.stamp)) for s in cycle_events
               if s.window_s > 0]

    def inside(t_s: float) -> bool:
        return any(a <= t_s <= b for a, b in windows)

    seqs = [int(c.seq) for c in seen.chunks]
    expected = set(range(min(seqs), max(seqs) + 1)) if seqs else set()
    missing = sorted(expected - set(seqs))
    twice = len(seqs) - len(set(seqs))
    reconciler_lost = sum(_int(v) for k, v in seen.reconciler.items() if "lost" in k)
    evicted = max((int(s.evicted_before_seq) for s in events), default=0)
    final_seq = max(seqs) if seqs else -1
    caught_up = bool(decisions) and max(int(d.last_seq) for d in decisions) == final_seq
    duration_s = ended_wall_s - started_wall_s
    answered = [Answered(Sample(rel(d.stamp), float(d.ttft_s), inside(rel(d.stamp)),
                                int(d.version), int(d.static_tokens), d.resource),
                         latency_s=float(d.decision_s) if d.decision_s > 0
                         else float(d.ttft_s + d.decode_s),
                         valid=bool(d.valid), constrained=bool(d.constrained),
                         action=d.action_name if d.valid else "", error=d.error)
                for d in decisions]
    return RunSummary(
        settings=settings, mode="asr, ROS 2 graph", resource="local",
        duration_s=round(duration_s, 3), cycles=len(cycle_events),
        swaps=sum(s.reason == "swap" for s in events),
        sync_evictions=sum(s.reason == "sync" for s in events),
        fallbacks=sum(s.reason == "fallback" for s in events),
        retries=_int(seen.reconciler.get("retries", "0")),
        failovers=sum(s.reason == "failover" for s in events),
        chunks_in=len(seqs), chunks_lost=len(missing) + twice + reconciler_lost,
        chunks_duplicated=twice, chunks_active=max(0, final_seq + 1 - evicted),
        chunks_evicted=evicted, final_version=events[-1].version if events else None,
        state_consistent=caught_up and not missing and twice == 0,
        queries=len(decisions), failed_queries=None, skipped_ticks=None,
        mask_s_per_token=None, windows=[(round(a, 3), round(b, 3)) for a, b in windows],
        timeline=[Event(round(rel(s.stamp), 3), s.reason, int(s.version),
                        f"chunks from seq {s.evicted_before_seq} on {s.primary}")
                  for s in events],
        **decision_figures(answered, duration_s),
        graph=GraphFigures(chunk_streams=len({c.stream for c in seen.chunks}),
                           chunks_missing_on_topic=missing,
                           chunks_lost_by_reconciler=reconciler_lost))
