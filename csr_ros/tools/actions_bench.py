"""`csr-ros actions`: decision latency of typed actions on one local engine, mode by mode.

    csr-ros actions --chunks 60 --reps 10 --json a.json

The demo episode's prompt with `--chunks` chunks cached, then the same decision asked `--reps`
times in each of `--modes`, interleaved (csr_ros.bench.actions_latency). Printed and written:
latency from the call to the last token (p50, p99, max), tokens decoded, the token-mask time
per decoded token, and how many answers parse into a valid action.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from csr_ros.bench.actions_latency import MODES, run_bench
from csr_ros.tools.options import add_engine_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=60, help="episode chunks in the cached "
                                                                "state (default 60)")
    parser.add_argument("--reps", type=int, default=10, help="decisions per mode (default 10)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of "
                                                                 f"{','.join(MODES)}")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    add_engine_options(parser, "threads", "dtype", threads=1, helps={
        "threads": "CPU threads of the engine",
        "dtype": "engine precision: auto (default), float32, bfloat16"})
    parser.add_argument("--seed", type=int, default=0, help="episode seed")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")


def run(args: argparse.Namespace) -> int:
    summary = run_bench(modes=[m.strip() for m in args.modes.split(",") if m.strip()],
                        chunks=args.chunks, reps=args.reps, max_new_tokens=args.max_new_tokens,
                        threads=args.threads, dtype=args.dtype, seed=args.seed)
    for mode, m in summary["modes"].items():
        mask = "-" if m["mask_ms_per_token"] is None else f"{m['mask_ms_per_token']:.3f} ms"
        print(f"{mode:8s} latency p50 {m['p50_s'] * 1000:7.1f} ms  p99 {m['p99_s'] * 1000:7.1f} ms"
              f"  max {m['max_s'] * 1000:7.1f} ms  tokens {m['tokens_mean']:4.1f}  mask/token "
              f"{mask}  valid {m['valid']}/{m['n']}  e.g. {m['example']!r}")
    print(f"state: {summary['static_tokens']} cached tokens, {summary['dynamic_tokens']} "
          f"dynamic, {summary['choices']} choices")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"written to {args.json}")
    return 0
