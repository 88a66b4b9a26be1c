"""`csr-ros fleet`: K synthetic robots on P servers behind vLLM's router, per routing policy.

    csr-ros fleet --robots 1,2,4,8 --servers 2 --routing consistent_hash,cache_aware,round_robin \\
        --duration-s 45 --json fleet.json --plot fleet.png
    csr-ros fleet --robots 2 --servers 2 --engine llamacpp --routing round_robin --duration-s 30

The command starts P servers on this machine (vLLM's CPU backend by default, or llama.cpp's
server), then for every routing policy and every K a fresh `vllm-router` in front of them and K
robots at once (csr_ros.bench.fleet_runs); what each run measured, the table and the JSON:
csr_ros.bench.fleet_plan. Policies are the router's own (`--policy` of vllm-router 0.1.17).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from csr_ros.errors import ConfigError
from csr_ros.bench.fleet_plan import markdown_table, parse_counts, plan_runs
from csr_ros.router import ENGINES, ROUTER_POLICIES
from csr_ros.stream_defaults import FLEET
from csr_ros.tools.options import add_episode_options, from_args

DURATION_S = 45.0
KV_CACHE_GIB = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--duration-s", type=float, default=DURATION_S,
                        help=f"seconds each run's robots decide for (default {DURATION_S})")
    parser.add_argument("--cycles", type=int, default=0,
                        help="also stop a robot after N completed eviction cycles (default 0: "
                             "only --duration-s stops it)")
    add_episode_options(parser, parser, FLEET, whose="a robot's", each=" per robot",
                        seed_help="base seed: run i's robot k gets base + 1000 i + k",
                        paced_help="the demo's --paced: chunks wait for a running "
                                   "reconciliation, so cycles end in swaps on any machine "
                                   "(tests)")
    parser.add_argument("--kv-cache-gib", type=float, default=KV_CACHE_GIB,
                        help=f"vLLM: KV cache per server in GiB, fractions too (default "
                             f"{KV_CACHE_GIB}; e.g. 0.375 for a pool short of memory, "
                             "as long as one sequence of the servers' 8192 tokens fits)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="server and router logs (default: a new temporary directory)")
    parser.add_argument("--json", type=Path, help="write {'runs': [...]} as JSON")
    parser.add_argument("--markdown", type=Path, help="write the table as markdown")
    parser.add_argument("--plot", type=Path, help="TTFT p99 and hit ratio against K (PNG)")


def run(args: argparse.Namespace) -> int:
    from csr_ros.episode_run import EpisodeSettings
    from csr_ros.bench.fleet_runs import fleet_report, run_fleet

    urls = [u.strip() for u in (args.worker_urls or "").split(",") if u.strip()]
    specs = plan_runs(parse_counts(args.robots, "--robots"),
                      [len(urls)] if urls else parse_counts(args.servers, "--servers"),
                      [r.strip() for r in args.routing.split(",") if r.strip()],
                      policies=ROUTER_POLICIES)
    if args.duration_s <= 0:
        raise ConfigError(f"--duration-s must be positive, got {args.duration_s}")
    settings = from_args(EpisodeSettings, args)
    log_dir = args.log_dir
    if log_dir is None:
        import tempfile

        log_dir = Path(tempfile.mkdtemp(prefix="csr-ros-fleet-"))
    print(f"fleet: {len(specs)} runs on {args.engine}; logs in {log_dir}", file=sys.stderr)
    runs = run_fleet(specs, settings, engine=args.engine, log_dir=Path(log_dir),
                     kv_cache_gib=args.kv_cache_gib, worker_urls=urls,
                     progress=lambda message: print(message, file=sys.stderr))
    table = markdown_table(runs)
    print(table)
    if args.json:
        report = fleet_report(runs, settings, engine=args.engine, kv_cache_gib=args.kv_cache_gib)
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
