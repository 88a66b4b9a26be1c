"""`csr-ros replay BAG`: render a recorded bag into chunks with the aggregator's emitter.

    csr-ros replay run1/                                   every topic, printed one per line
    csr-ros replay run1/ --params config/csr_ros.yaml      the aggregator's sources and policy
    csr-ros replay run1/ --params config/csr_ros.yaml --stats --json stats.json
    csr-ros replay run1.bag --jsonl chunks.jsonl --chunk-log chunks.log
    csr-ros replay run1/ --play --rate 2 --delay 10 --clock    publish it on the ROS graph

Which source renders which topic: csr_ros.bag_sources (`--only-configured` renders the params
file's topics alone); the chunks and `--stats`: csr_ros.bag_replay. A chunk log written here
can seed a reconciler (its `chunk_log`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from csr_ros.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", type=Path, nargs="+",
                        help="rosbag2 directory/file or ROS 1 .bag (several for split bags)")
    parser.add_argument("--params", type=Path, default=None,
                        help="parameters file: use its aggregator sources (topics, periods, "
                             "deadbands, keep-alives, events) and its reconciler's tau_mem")
    parser.add_argument("--topics", nargs="+", default=None, help="only these topics")
    parser.add_argument("--only-configured", action="store_true",
                        help="with --params: render only the topics the params file names "
                             "(no source matched by type, no topic added with its type's "
                             "defaults)")
    parser.add_argument("--jsonl", type=Path, default=None, help="write chunks as JSON lines")
    parser.add_argument("--chunk-log", type=Path, default=None,
                        help="append the history chunks to this chunk log")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many chunks")
    parser.add_argument("--play", action="store_true",
                        help="publish the bag on the ROS graph instead (rclpy; for machines "
                             "without `ros2 bag play`): --rate, --start-offset, --delay, "
                             "--clock, --topics")
    from csr_ros.nodes.player import add_play_arguments

    add_play_arguments(parser)
    parser.add_argument("--stats", action="store_true",
                        help="print per-source chunks, tokens, tokens per robot-second, "
                             "coalesced and suppressed messages (instead of the chunks)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the statistics as JSON to this file (implies counting)")
    parser.add_argument("--plot", type=Path, default=None,
                        help="PNG of the history tokens per source against robot time, with "
                             "tau_mem (implies counting)")
    parser.add_argument("--model", default="smollm2",
                        help="model directory, 'smollm2' or a prepared catalog model whose "
                             "tokenizer counts the tokens")


def run(args: argparse.Namespace) -> int:
    for path in args.bag:
        if not path.exists():
            raise ConfigError(f"bag {path} does not exist")
    if args.play:
        from csr_ros.nodes.player import run_play

        return run_play(args)
    from csr_ros.bag_replay import format_stats, replay_bag, tau_mem_tokens
    from csr_ros.bag_sources import plan_sources

    plan = plan_sources(args.bag, args.params, args.topics, only_configured=args.only_configured)
    for note in plan.notes:
        print(f"warning: {note}", file=sys.stderr)
    counting = args.stats or args.json is not None or args.plot is not None
    if not args.stats:
        for topic, p in plan.left_out.items():
            print(f"note: {topic} ({p.type_name}) not rendered: "
                  f"{p.policy.removeprefix('left out: ')}", file=sys.stderr)
    tokenizer = None
    if counting:
        from csr_ros.model_store import resolve_model_dir
        from csr_ros.tokenizer import HFTokenizer

        tokenizer = HFTokenizer(resolve_model_dir(args.model, weights=False))
        tau_mem = tau_mem_tokens(args.params)
    out = args.jsonl.open("w", encoding="utf-8") if args.jsonl else None

    def on_chunk(chunk) -> None:
        if out is not None:
            out.write(json.dumps(vars(chunk), ensure_ascii=False) + "\n")
        elif not counting:
            print(f"{'instant' if chunk.instant else chunk.seq:>7} {chunk.text}")

    try:
        replayed = replay_bag(args.bag, plan, tokenizer=tokenizer, limit=args.limit,
                              on_chunk=on_chunk, chunk_log=args.chunk_log)
    finally:
        if out is not None:
            out.close()
    if counting:
        report = replayed.report(tau_mem, args.bag, args.params, plan)
        if args.stats:
            print(format_stats(report))
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        if args.plot is not None:
            from csr_ros.plots import plot_tokens

            print(f"wrote {plot_tokens(replayed.timeline, report, args.plot)}", file=sys.stderr)
    print(f"{replayed.n_chunks} chunks from {len(plan.sources)} topics", file=sys.stderr)
    return 0
