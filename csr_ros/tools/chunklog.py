"""`csr-ros chunklog`: the chunk log's restart benchmark, and what a log holds.

    csr-ros chunklog bench [--behind N ...] [--age-days D ...] [--json OUT]
        restart time of synthetic logs with N chunks behind their last checkpoint, and of
        robots D days old at the measured 8 tokens per robot-second (library: bench_restart)
    csr-ros chunklog info PATH
        segments, checkpoint, and what a restart of the log at PATH reads
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from csr_ros.bench.restart_bench import bench_restart
from csr_ros.chunklog import Checkpoint, read_from_checkpoint, segment_files
from csr_ros.errors import ConfigError

DAY_S = 86_400


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    bench = sub.add_parser("bench", help="restart time against the history behind the "
                                         "checkpoint and the robot's age")
    bench.add_argument("--behind", type=int, nargs="+", default=[1_000, 1_000_000],
                       help="chunks behind the last checkpoint, one log each "
                            "(default 1000 1000000)")
    bench.add_argument("--age-days", type=float, nargs="+", default=[1, 365],
                       help="robot ages in days, one log each at 8 tokens per robot-second "
                            "(default 1 365: a year is 13.1 million chunks, about 1.4 GB)")
    bench.add_argument("--repeats", type=int, default=5,
                       help="timed restarts per log after one warm-up (default 5)")
    bench.add_argument("--model", default="smollm2",
                       help="whose tokenizer rebuilds the state (default smollm2)")
    bench.add_argument("--no-tokenizer", action="store_true",
                       help="only open and read the log, rebuild no state")
    bench.add_argument("--dir", type=Path, default=None,
                       help="where the logs are written (default: a temporary directory)")
    bench.add_argument("--keep", action="store_true", help="keep the logs afterwards")
    bench.add_argument("--json", type=Path, default=None, help="write the figures here")
    info = sub.add_parser("info", help="what a chunk log holds and what a restart reads")
    info.add_argument("path", type=Path, help="a chunk log (directory or single file)")


def run(args: argparse.Namespace) -> int:
    return _bench(args) if args.action == "bench" else _info(args)


def _bench(args: argparse.Namespace) -> int:
    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="csr-chunklog-bench-") as tmp:
        report = bench_restart(args.dir or Path(tmp), behind=tuple(args.behind),
                               ages_s=tuple(d * DAY_S for d in args.age_days),
                               repeats=args.repeats,
                               model=None if args.no_tokenizer else args.model,
                               keep=args.keep and args.dir is not None, progress=progress)
    print(f"{report['tokens_per_robot_s']:g} tokens per robot-second, "
          f"{report['tokens_per_chunk']:g} tokens per chunk: "
          f"{report['chunks_per_robot_day']:,} chunks a day, "
          f"{report['chunks_per_robot_year']:,} a year; the state at tau_mem "
          f"{report['tau_mem_tokens']} is {report['state_chunks_at_tau_mem']} chunks")
    print(f"{'log':<16} {'chunks':>12} {'behind ckpt':>12} {'segments':>9} {'MB':>9} "
          f"{'read segs':>9} {'read kB':>8} {'restart ms':>11} {'min ms':>8} {'open ms':>8} "
          f"{'fold ms':>8}")
    for name, case in report["cases"].items():
        print(f"{name:<16} {case['chunks']:>12,} {case['chunks_behind_checkpoint']:>12,} "
              f"{case['segments']:>9,} {case['log_bytes'] / 1e6:>9.1f} "
              f"{case['segments_read']:>9} {case['bytes_read'] / 1e3:>8.1f} "
              f"{case['restart_s']['median'] * 1e3:>11.2f} {case['restart_s']['min'] * 1e3:>8.2f} "
              f"{case['open_s'] * 1e3:>8.2f} {case['rebuild_s'] * 1e3:>8.2f}")
    for name, ratio in report["ratios"].items():
        print(f"{name}: {ratio['median']:.3f}x (median), {ratio['min']:.3f}x (min)")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def _info(args: argparse.Namespace) -> int:
    """Read only: a running writer's log can be looked at."""
    if not args.path.exists():
        raise ConfigError(f"no chunk log at {args.path}")
    files = segment_files(args.path)
    total = sum(f.stat().st_size for f in files)
    print(f"{args.path}: {len(files)} segments, {total:,} bytes"
          + (f" ({files[0].name} to {files[-1].name})" if files else ""))
    records = read_from_checkpoint(args.path)
    checkpoint = next((r for r in records if isinstance(r, Checkpoint)), None)
    if args.path.is_file():
        print("a single-file log of the first format: it becomes segment 0 when opened for "
              "appending")
    elif checkpoint is None:
        print("no checkpoint: a restart reads every segment")
    else:
        print(f"checkpoint v{checkpoint.version}: chunks {checkpoint.first_seq} to "
              f"{checkpoint.next_seq - 1}, {checkpoint.n_static_tokens} static tokens, stream "
              f"{checkpoint.stream or '-'}, capsule {checkpoint.capsule or '-'}; a restart "
              f"reads segments {checkpoint.keep_segment} to {int(files[-1].stem)}")
    print(f"a restart folds {len(records):,} records")
    return 0
