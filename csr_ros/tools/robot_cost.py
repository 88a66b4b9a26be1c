"""`csr-ros robot-cost`: the CPU seconds the aggregator and the policy node spend per chunk and
per decision against an HTTP server (csr_ros.bench.robot_cpu; docs/benchmarks.md).

    csr-ros robot-cost --json out/robot_cost.json                 # starts llama.cpp's server
    csr-ros robot-cost --url http://gpu-server:8001 --decisions 120
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from csr_ros.bench.robot_cpu import format_report, measure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="an OpenAI-compatible server serving the "
                        "default model (default: start llama.cpp's server on it here)")
    parser.add_argument("--threads", type=int, default=1, help="threads of the started server")
    parser.add_argument("--duration", type=float, default=300.0,
                        help="seconds of the patrol bag whose messages are fed (default 300)")
    parser.add_argument("--decisions", type=int, default=60,
                        help="decisions, spread over the bag (default 60)")
    parser.add_argument("--rate-hz", type=float, default=2.0, help="the policy's rate (default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0, help="patrol seed")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")


def run(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from csr_ros.servers import free_port, llamacpp_servers, serving

    servers = None if args.url else llamacpp_servers([free_port()], model="smollm2", n_ctx=8192,
                                                     threads=args.threads)
    with serving(servers) if servers else nullcontext():
        url = args.url or servers[0].url
        report = measure(url, duration_s=args.duration, decisions=args.decisions,
                         rate_hz=args.rate_hz, max_new_tokens=args.max_new_tokens,
                         seed=args.seed)
    report["meta"]["argv"] = sys.argv[1:]
    print(format_report(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
