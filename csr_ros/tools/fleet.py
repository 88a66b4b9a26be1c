"""`csr-ros fleet`: K synthetic robots on P servers behind vLLM's router, per routing policy.

    csr-ros fleet --robots 1,2,4,8 --servers 2 --routing consistent_hash,cache_aware,round_robin \
        --duration-s 45 --json fleet.json --plot fleet.png
    csr-ros fleet --robots 2 --servers 2 --engine llamacpp --routing round_robin --duration-s 30

The command starts P servers on this machine (vLLM's CPU backend by default, each on its own
cores; or llama.cpp's server), then for every routing policy and every K a fresh `vllm-router`
in front of them, and K robots at once: each the demo's episode loop (csr_ros.tools.demo) with
its own seed, CSR state, ASR pair and 2 Hz policy, its two roles (r1, r2) both at the router's
URL with the routing key `X-Session-ID: robot_k/v<version>` (OpenAIResource
robot_id). For each run it reports the hit ratio (the servers' cached_tokens over the prompt
tokens of the robots' queries), TTFT p50/p99, the slowest robot's decisions per second,
swaps, fallbacks, chunks lost, the router's requests per server (its Prometheus counters), and
each server's memory; JSON, a markdown table and a plot of TTFT p99 and hit ratio against K.

Policies are the router's own (`--policy` of vllm-router 0.1.17): consistent_hash routes on
the key; cache_aware matches the request's prompt against a tree per server; round_robin
ignores both.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import threading
import time
from pathlib import Path

from csr_ros.errors import ConfigError, ResourceError, ResourceTimeoutError
from csr_ros.fleet_plan import (RunSpec, cache_counters, markdown_table, merge_usage, parse_counts,
                           plan_runs, robot_id, robot_seed, robot_summary, run_summary,
                           server_cache_delta)
from csr_ros.router import ENGINES, ROUTER_POLICIES, ServerPool

log = logging.getLogger(__name__)

DEFAULTS = {"duration_s": 45.0, "tau_mem": 1536, "chunk_rate_hz": 1.0, "rate_hz": 2.0,
            "max_context_tokens": 4096, "kv_cache_gib": 1}
ROBOT_END_GRACE_S = 300.0      # a robot's loop past --duration-s: closing decisions, wait_idle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    parser.add_argument("--robots", default="1,2,4,8",
                        help="robot counts K, comma-separated (default 1,2,4,8)")
    parser.add_argument("--servers", default="2",
                        help="server counts P, comma-separated (default 2); the pool starts "
                             "once per P")
    parser.add_argument("--routing", default="consistent_hash,cache_aware,round_robin",
                        help=f"router policies, comma-separated, from {list(ROUTER_POLICIES)} "
                             "(default consistent_hash,cache_aware,round_robin)")
    parser.add_argument("--engine", choices=ENGINES, default="vllm",
                        help="the pool's servers: vllm (CPU backend; default) or llamacpp")
    parser.add_argument("--worker-urls", default=None,
                        help="servers already running (comma-separated URLs), instead of "
                             "starting --servers of them; they are left running")
    parser.add_argument("--duration-s", type=float, default=d["duration_s"],
                        help=f"seconds each run's robots decide for (default {d['duration_s']})")
    parser.add_argument("--cycles", type=int, default=0,
                        help="also stop a robot after N completed eviction cycles (default 0: "
                             "only --duration-s stops it)")
    parser.add_argument("--paced", action="store_true",
                        help="the demo's --paced: chunks wait for a running reconciliation, "
                             "so cycles end in swaps on any machine (tests)")
    parser.add_argument("--seed", type=int, default=0,
                        help="base seed: run i's robot k gets base + 1000 i + k")
    parser.add_argument("--tau-mem", type=int, default=d["tau_mem"],
                        help=f"evict when a robot's static part reaches this many tokens "
                             f"(default {d['tau_mem']})")
    parser.add_argument("--max-context-tokens", type=int, default=d["max_context_tokens"])
    parser.add_argument("--chunk-rate-hz", type=float, default=d["chunk_rate_hz"],
                        help=f"episode chunks per second per robot (default {d['chunk_rate_hz']})")
    parser.add_argument("--rate-hz", type=float, default=d["rate_hz"],
                        help=f"decisions per second per robot (default {d['rate_hz']})")
    parser.add_argument("--kv-cache-gib", type=float, default=d["kv_cache_gib"],
                        help=f"vLLM: KV cache per server in GiB, fractions too (default "
                             f"{d['kv_cache_gib']}; e.g. 0.375 for a pool short of memory, "
                             "as long as one sequence of the servers' 8192 tokens fits)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="server and router logs (default: a new temporary directory)")
    parser.add_argument("--json", type=Path, help="write {'runs': [...]} as JSON")
    parser.add_argument("--markdown", type=Path, help="write the table as markdown")
    parser.add_argument("--plot", type=Path, help="TTFT p99 and hit ratio against K (PNG)")


def run(args: argparse.Namespace) -> int:
    urls = [u.strip() for u in (args.worker_urls or "").split(",") if u.strip()]
    specs = plan_runs(parse_counts(args.robots, "--robots"),
                      [len(urls)] if urls else parse_counts(args.servers, "--servers"),
                      [r.strip() for r in args.routing.split(",") if r.strip()],
                      policies=ROUTER_POLICIES)
    if args.duration_s <= 0:
        raise ConfigError(f"--duration-s must be positive, got {args.duration_s}")
    log_dir = args.log_dir
    if log_dir is None:
        import tempfile

        log_dir = Path(tempfile.mkdtemp(prefix="csr-ros-fleet-"))
    print(f"fleet: {len(specs)} runs on {args.engine}; logs in {log_dir}", file=sys.stderr)
    runs = run_fleet(specs, args, Path(log_dir), worker_urls=urls)
    table = markdown_table(runs)
    print(table)
    if args.json:
        report = {"runs": runs, "settings": _settings(args), "machine": _machine()}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"runs written to {args.json}")
    if args.markdown:
        args.markdown.write_text(table + "\n")
        print(f"table written to {args.markdown}")
    if args.plot:
        from csr_ros.plots import plot_fleet

        plot_fleet(runs, args.plot)
        print(f"plot written to {args.plot}")
    ok = all(r["chunks_lost"] == 0 and all(x["state_consistent"] for x in r["per_robot"])
             for r in runs)
    return 0 if ok else 1


def run_fleet(specs: list[RunSpec], args: argparse.Namespace, log_dir: Path,
              worker_urls: list[str] | None = None) -> list[dict]:
    """Every run of the plan; one pool per server count, one router per run."""
    runs: list[dict] = []
    for servers in dict.fromkeys(s.servers for s in specs):
        started_s = time.monotonic()
        if worker_urls:
            pool = ServerPool.attach(args.engine, worker_urls, log_dir=log_dir / "attached")
        else:
            pool = ServerPool.start(args.engine, servers, log_dir=log_dir / f"P{servers}",
                                    kv_cache_gib=args.kv_cache_gib,
                                    progress=lambda m: print(m, file=sys.stderr))
        with pool:
            print(f"fleet: {servers} {args.engine} servers up in "
                  f"{time.monotonic() - started_s:.0f} s", file=sys.stderr)
            for spec in (s for s in specs if s.servers == servers):
                runs.append(run_once(pool, spec, args))
                print(markdown_table(runs[-1:]).splitlines()[-1], file=sys.stderr)
    return runs


def run_once(pool: ServerPool, spec: RunSpec, args: argparse.Namespace) -> dict:
    """K robots at once through a fresh router with `spec.routing`."""
    router_url = pool.start_router(spec.routing)
    before = {url: cache_counters(s) for url, s in pool.server_metrics().items()}
    results: list[dict | None] = [None] * spec.robots
    errors: list[str] = []
    threads = [threading.Thread(target=_robot, name=f"robot-{k}", daemon=True,
                                args=(k, spec, args, router_url, pool.engine, results, errors))
               for k in range(spec.robots)]
    load_before = os.getloadavg()[0]
    started_s = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.duration_s + ROBOT_END_GRACE_S)
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


def _robot(k: int, spec: RunSpec, args: argparse.Namespace, url: str, engine: str,
           results: list, errors: list) -> None:
    """One robot: the demo's episode loop over its own pair of roles at the router."""
    from csr_ros.reconcile.machine import ReconcileConfig
    from csr_ros.resources.openai import OpenAIResource
    from csr_ros.tools import demo

    rid, seed = robot_id(k), robot_seed(args.seed, spec.index, k)
    demo_args = _demo_args(args, seed)
    config = ReconcileConfig(tau_mem_tokens=demo_args.tau_mem,
                             max_context_tokens=demo_args.max_context_tokens,
                             reserve_tokens=demo_args.reserve_tokens,
                             n_catchup_tokens=demo_args.n_catchup, mode="asr")
    resources = []
    try:
        for name in ("r1", "r2"):
            resources.append(OpenAIResource(url, name=name, robot_id=rid,
                                            max_context_tokens=demo_args.max_context_tokens,
                                            tau_mem_tokens=demo_args.tau_mem,
                                            priority_scheduling=engine == "vllm"))
        summary = demo._run_episode(demo_args, "asr", config, resources)
        results[k] = robot_summary(rid, seed, summary,
                                   merge_usage([r.usage_totals() for r in resources]))
    except Exception as exc:     # reported with the run, which then fails as a whole
        log.exception("%s failed", rid)
        errors.append(f"{rid}: {type(exc).__name__}: {exc}")
    finally:
        for resource in resources:
            resource.close()


def _demo_args(args: argparse.Namespace, seed: int) -> argparse.Namespace:
    """The demo's own defaults, with this robot's seed and the fleet's stream settings."""
    from csr_ros.tools import demo

    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    out = parser.parse_args([])
    out.resource, out.seed, out.no_progress = "openai", seed, True
    out.duration_s, out.cycles, out.paced = args.duration_s, args.cycles, args.paced
    out.tau_mem, out.max_context_tokens = args.tau_mem, args.max_context_tokens
    out.chunk_rate_hz, out.rate_hz = args.chunk_rate_hz, args.rate_hz
    return out


def _settings(args: argparse.Namespace) -> dict:
    return {"engine": args.engine, "duration_s": args.duration_s, "cycles": args.cycles,
            "paced": args.paced, "seed": args.seed, "tau_mem_tokens": args.tau_mem,
            "max_context_tokens": args.max_context_tokens,
            "chunk_rate_hz": args.chunk_rate_hz, "rate_hz": args.rate_hz,
            "kv_cache_gib": args.kv_cache_gib}


def _machine() -> dict:
    return {"cpus": len(os.sched_getaffinity(0)), "load_avg_1m": os.getloadavg()[0],
            "platform": platform.platform()}
