"""K synthetic robots on P servers behind vLLM's router, run by run (`csr-ros fleet`).

    runs = run_fleet(plan_runs(...), EpisodeSettings(duration_s=45, ...), engine="vllm",
                     log_dir=Path("logs"))
    report = fleet_report(runs, settings, engine="vllm", kv_cache_gib=1)

One pool per server count (`ServerPool.start`, or `attach` to servers already running), and for
every run a fresh router with the run's policy and K robots at once: each the demo's episode
loop (csr_ros.harness.episode_loop.run_episode) with its own seed, CSR state, ASR pair and
policy, its two roles (r1, r2) both at the router's URL with the routing key
`X-Session-ID: robot_k/v<version>` (OpenAIResource robot_id). What a run measured and the
table: csr_ros.bench.fleet_plan.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from csr_ros.episode_run import EpisodeSettings
from csr_ros.errors import ResourceError, ResourceTimeoutError
from csr_ros.bench.fleet_plan import (RunSpec, cache_counters, markdown_table, merge_usage,
                                      robot_id, robot_seed, robot_summary, run_summary,
                                      server_cache_delta)
from csr_ros.harness.episode_loop import run_episode
from csr_ros.resources.openai import OpenAIOptions, OpenAIResource
from csr_ros.router import ServerPool

log = logging.getLogger(__name__)

ROBOT_END_GRACE_S = 300.0      # a robot's loop past duration_s: closing decisions, wait_idle


def run_fleet(specs: list[RunSpec], settings: EpisodeSettings, *, engine: str, log_dir: Path,
              kv_cache_gib: float = 1, worker_urls: list[str] | None = None,
              progress: Callable[[str], None] = lambda message: None) -> list[dict]:
    """Every run of the plan; one pool per server count, one router per run. `settings`: each
    robot's episode (its seed is the base of the robots' seeds)."""
    runs: list[dict] = []
    for servers in dict.fromkeys(s.servers for s in specs):
        started_s = time.monotonic()
        if worker_urls:
            pool = ServerPool.attach(engine, worker_urls, log_dir=log_dir / "attached")
        else:
            pool = ServerPool.start(engine, servers, log_dir=log_dir / f"P{servers}",
                                    kv_cache_gib=kv_cache_gib, progress=progress)
        with pool:
            progress(f"fleet: {servers} {engine} servers up in "
                     f"{time.monotonic() - started_s:.0f} s")
            for spec in (s for s in specs if s.servers == servers):
                runs.append(run_once(pool, spec, settings))
                progress(markdown_table(runs[-1:]).splitlines()[-1])
    return runs


def run_once(pool: ServerPool, spec: RunSpec, settings: EpisodeSettings) -> dict:
    """K robots at once through a fresh router with `spec.routing`."""
    router_url = pool.start_router(spec.routing)
    before = {url: cache_counters(s) for url, s in pool.server_metrics().items()}
    results: list[dict | None] = [None] * spec.robots
    errors: list[str] = []
    threads = [threading.Thread(target=_robot, name=f"robot-{k}", daemon=True,
                                args=(k, spec, settings, router_url, pool.engine, results,
                                      errors))
               for k in range(spec.robots)]
    load_before = os.getloadavg()[0]
    started_s = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(settings.duration_s + ROBOT_END_GRACE_S)
    duration_s = time.monotonic() - started_s
    what = f"run {spec.index} ({spec.robots} robots, {spec.routing})"
    if errors:
        raise ResourceError(f"{what}: " + "; ".join(errors))
    if any(r is None for r in results):
        raise ResourceTimeoutError(f"{what}: a robot was still running "
                                   f"{ROBOT_END_GRACE_S:.0f} s after --duration-s")
    after = {url: cache_counters(s) for url, s in pool.server_metrics().items()}
    summary = run_summary(spec, results, duration_s=round(duration_s, 3),
                          routing_counts=pool.routing_counts(), memory_bytes=pool.memory_bytes(),
                          server_cache={url: server_cache_delta(before.get(url, {}), after[url])
                                        for url in after},
                          engine=pool.engine)
    summary["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    pool.stop_router()
    return summary


def _robot(k: int, spec: RunSpec, settings: EpisodeSettings, url: str, engine: str,
           results: list, errors: list) -> None:
    """One robot: the demo's episode loop over its own pair of roles at the router."""
    rid, seed = robot_id(k), robot_seed(settings.seed, spec.index, k)
    mine = replace(settings, seed=seed, resource="openai", live_line=False)
    resources = []
    try:
        for name in ("r1", "r2"):
            resources.append(OpenAIResource(OpenAIOptions(
                url, name=name, robot_id=rid, max_context_tokens=mine.max_context_tokens,
                tau_mem_tokens=mine.tau_mem_tokens, priority_scheduling=engine == "vllm")))
        summary = run_episode(mine, resources)
        results[k] = robot_summary(rid, seed, summary,
                                   merge_usage([r.usage_totals() for r in resources]))
    except Exception as exc:     # reported with the run, which then fails as a whole
        log.exception("%s failed", rid)
        errors.append(f"{rid}: {type(exc).__name__}: {exc}")
    finally:
        for resource in resources:
            resource.close()


def fleet_report(runs: list[dict], settings: EpisodeSettings, *, engine: str,
                 kv_cache_gib: float) -> dict:
    """`--json`: the runs, the settings they ran with and the machine."""
    s = settings
    return {"runs": runs,
            "settings": {"engine": engine, "duration_s": s.duration_s, "cycles": s.cycles,
                         "paced": s.paced, "seed": s.seed, "tau_mem_tokens": s.tau_mem_tokens,
                         "max_context_tokens": s.max_context_tokens,
                         "chunk_rate_hz": s.chunk_rate_hz, "rate_hz": s.rate_hz,
                         "kv_cache_gib": kv_cache_gib},
            "machine": {"cpus": len(os.sched_getaffinity(0)),
                        "load_avg_1m": os.getloadavg()[0], "platform": platform.platform()}}
