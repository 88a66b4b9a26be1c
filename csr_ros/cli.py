"""`csr-ros`: a thin main() over the tool modules in csr_ros.tools."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from csr_ros.errors import CsrError

# subcommand name -> module in csr_ros.tools; each module is imported only when its command runs
# (so `csr-ros --help` stays fast and does not import torch).
SUBCOMMANDS = {
    "bench": ("bench", "TTFT of CSR queries against the unordered baseline, capsule timings"),
    "demo": ("demo", "a synthetic robot episode with ASR over two resources (the main job)"),
    "actions": ("actions_bench", "typed-action decision latency: closed choice, grammar, free"),
    "serve": ("serve", "start inference servers (vLLM on a GPU server, llama.cpp for tests)"),
    "model": ("model", "prepare or inspect a model (the embedded default or a catalog one)"),
    "replay": ("replay", "render a rosbag (ROS 2 or ROS 1) into chunks as the aggregator would"),
    "patrol": ("patrol", "write a deterministic home-patrol rosbag2 with its ground truth"),
    "check-params": ("check_params", "validate a parameters file of the ROS 2 nodes"),
    "eval": ("eval", "memory recall against decision latency: CSR, window, BM25, no memory"),
    "gateway": ("gateway", "an OpenAI-compatible HTTP front door over the reconciler"),
    "fleet": ("fleet", "K robots on P servers behind vLLM's router, per routing policy"),
    "chunklog": ("chunklog", "the chunk log: restart benchmark (bench), what a log holds (info)"),
    "robot-cost": ("robot_cost", "CPU seconds of the robot side per chunk and per decision"),
    "engine": ("engine", "the local engine's backend on this machine: calibrate, show"),
    "soak": ("soak", "compressed robot-days with injected faults: nothing lost, all recovered"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="csr-ros", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        p.set_defaults(_parser=p)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """What `csr-ros ARGV` runs with (its subcommand's module in `_module`)."""
    parser = build_parser()
    # Two passes: find the subcommand, then let its module add its own arguments.
    # (-h/--help waits for the second pass, so `csr-ros demo --help` lists demo's options.)
    first = [a for a in argv if a not in ("-h", "--help")]
    if any(a in SUBCOMMANDS for a in first):
        known, _ = parser.parse_known_args(first)
        module = importlib.import_module(f"csr_ros.tools.{known._module}")
        module.add_arguments(known._parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    module = importlib.import_module(f"csr_ros.tools.{args._module}")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(module.run(args) or 0)
    except CsrError as exc:
        print(f"csr-ros {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
