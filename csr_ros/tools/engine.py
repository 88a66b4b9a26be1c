"""`csr-ros engine`: the local engine's backend and precision on this machine.

    csr-ros engine calibrate [--model M] [--threads T] [--json OUT]
        measure every candidate (torch bf16, torch float32 with fp16 decode, llama.cpp in
        process) on the main job's decision and cache the fastest for `dtype auto`
        (library: csr_ros.engine.calibration; docs/engine.md#calibration)
    csr-ros engine show [--model M] [--threads T]
        the cached choice under this machine's key, without measuring
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from csr_ros.engine import calibration
from csr_ros.errors import ConfigError
from csr_ros.tools.options import add_engine_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text in (("calibrate", "measure the candidates again and cache the fastest"),
                            ("show", "the cached choice for this machine, if any")):
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_engine_options(p, "model", "threads", helps={
            "model": "the model (default smollm2)",
            "threads": "compute threads the engine will run on (default: all this process "
                       "may use)"})
        p.add_argument("--json", type=Path, default=None, help="write the choice here")
    calibrate = sub.choices["calibrate"]
    calibrate.add_argument("--reps", type=int, default=calibration.REPS,
                           help=f"timed decisions per candidate (default {calibration.REPS})")
    calibrate.add_argument("--chunks", type=int, default=calibration.CHUNKS,
                           help=f"chunks of cached history (default {calibration.CHUNKS})")


def run(args: argparse.Namespace) -> int:
    if args.threads is not None and args.threads < 1:
        raise ConfigError("--threads must be >= 1")
    if args.action == "calibrate":
        if args.reps < 1 or args.chunks < 1:
            raise ConfigError("--reps and --chunks must be >= 1")
        choice = calibration.calibrate(args.model, threads=args.threads, force=True,
                                       reps=args.reps, chunks=args.chunks)
    else:
        key = calibration.machine_key(args.model, args.threads)
        choice = calibration.read_cached(
            calibration.cache_path(calibration.default_directory(), key), key)
        if choice is None:
            print("no calibration cached for this machine, model, threads and versions: "
                  "the first local engine with dtype auto measures, or "
                  "`csr-ros engine calibrate`")
            return 1
    print(choice.summary())
    for name, figure in choice.figures.items():
        step_ms = 1000 * figure["decode_s_per_token"]
        print(f"  {name:<11} decision {1000 * figure['decision_s']:6.0f} ms  TTFT "
              f"{1000 * figure['ttft_s']:5.0f} ms  decode {step_ms:5.1f} ms/token  "
              f"{figure['tokens']:.0f} tokens  {figure['answer']!r}")
    if args.json is not None:
        args.json.write_text(json.dumps(choice.as_dict(), indent=1))
    return 0
