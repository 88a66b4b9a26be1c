"""`csr-ros demo`: a synthetic robot episode driven through ASR over two resources.

    csr-ros demo                                   # short run on the embedded SmolLM2
    csr-ros demo --cycles 10 --json d.json --plot d.png
    csr-ros demo --cycles 3 --baseline sync --json s.json
    csr-ros demo --cycles 3 --actions free          # free text, parsed afterwards
    csr-ros demo --ros                              # through the ROS 2 nodes, as processes

The run: csr_ros.harness.episode_loop (in process) and csr_ros.harness.ros_demo (--ros); the
summary and its report: csr_ros.episode_run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from csr_ros.episode_run import ACTION_MODES, EpisodeSettings
from csr_ros.stream_defaults import DEMO
from csr_ros.tools.options import add_engine_options, add_episode_options, from_args

PACED = ("hold an episode chunk that could fill the context while a reconciliation runs, and "
         "shift the schedule by the wait: every cycle then ends in a swap on any machine "
         "(tests; a robot cannot wait)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = EpisodeSettings()
    run = parser.add_argument_group("run")
    run.add_argument("--cycles", type=int, default=d.cycles,
                     help=f"stop after N completed eviction cycles (default {d.cycles})")
    run.add_argument("--duration-s", type=float, default=None,
                     help="stop after this many seconds (default: only --cycles stops the run)")
    run.add_argument("--baseline", choices=["none", "sync", "unordered"], default="none",
                     help="sync: evict synchronously on one resource; unordered: no prefix reuse")
    stream = parser.add_argument_group("stream and policy")
    add_episode_options(run, stream, DEMO, seed_help="episode seed (default 0)",
                        paced_help=PACED)
    stream.add_argument("--detail", type=int, default=d.detail,
                        help=f"detections per camera chunk, sets the chunk size "
                             f"(default {d.detail})")
    stream.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                        help=f"decision token budget (default {d.max_new_tokens}); an "
                             "action not complete within it counts as invalid")
    stream.add_argument("--actions", choices=ACTION_MODES, default="auto",
                        help="typed actions by closed choice (auto: when the list is closed), "
                             "grammar or JSON schema; or free text parsed afterwards")
    stream.add_argument("--eviction-fraction", type=float, default=d.eviction_fraction,
                        help=f"oldest fraction of chunks evicted per cycle "
                             f"(default {d.eviction_fraction})")
    stream.add_argument("--n-catchup", dest="n_catchup_tokens", metavar="N_CATCHUP", type=int,
                        default=d.n_catchup_tokens,
                        help=f"catch up while the buffer holds more tokens than this "
                             f"(default {d.n_catchup_tokens})")
    stream.add_argument("--reserve-tokens", type=int, default=d.reserve_tokens,
                        help="context kept free for the dynamic part and the answer")
    res = parser.add_argument_group("resources")
    res.add_argument("--resource", choices=["local", "openai"], default="local")
    add_engine_options(res, helps={
        "model": "local: 'smollm2', a prepared catalog model (csr-ros model list) or a model "
                 "directory; openai: the tokenizer's model",
        "threads": "CPU threads of a local engine answering queries (default: 2, or 1 on a "
                   "one-core machine; with --ros 1, the two engines sharing one process)",
        "dtype": "local engine precision: auto (default: with --backend auto, the backend and "
                 "precision measured fastest here, cached: csr-ros engine show), float32, "
                 "bfloat16",
        "backend": "local engine: auto (default: with --dtype auto, the one measured fastest "
                   "on this machine), torch, llamacpp"})
    res.add_argument("--background-threads", type=int, default=1,
                     help="CPU threads of a local engine while it warms up or catches up "
                          "(default 1)")
    res.add_argument("--r1", help="openai: URL of the primary server")
    res.add_argument("--r2", help="openai: URL of the secondary server (the tokenizer and the "
                                  "prompt mode, ids or text, come from the servers)")
    res.add_argument("--warm-timeout-s", type=float, default=None,
                     help="kill and retry a warm-up or catch-up step that takes longer")
    graph = parser.add_argument_group("ROS 2 graph")
    graph.add_argument("--ros", action="store_true",
                       help="run the episode through real ROS 2 topics: an episode publisher, "
                            "the aggregator and all_in_one, each in its own process; the "
                            "report comes from what is observed on csr/decisions and csr/swaps")
    graph.add_argument("--ros-domain-id", type=int, default=None,
                       help="--ros: the ROS domain (default: a free random one, localhost only)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, help="write the summary as JSON")
    out.add_argument("--plot", type=Path, help="write TTFT over time and its distribution (PNG)")
    out.add_argument("--chunk-log", type=Path,
                     help="append the chunk stream to this crash-safe log and check at the end "
                          "that it rebuilds the same state")
    out.add_argument("--no-progress", action="store_true", help="no live line on stderr")
    out.add_argument("--inject-kill-warmup", dest="kill_warmup", type=int, default=None,
                     metavar="N", help="fault injection: kill the secondary's worker during "
                                       "warm-up N")


def run(args: argparse.Namespace) -> int:
    from csr_ros.episode_run import format_report
    from csr_ros.harness.episode_loop import DemoEngines, run_demo

    settings = from_args(EpisodeSettings, args, live_line=not args.no_progress,
                         mode="asr" if args.baseline == "none" else args.baseline)
    engines = from_args(DemoEngines, args)
    if args.ros:
        from csr_ros.harness.ros_demo import run_ros_demo  # needs rclpy and the interfaces

        summary = run_ros_demo(settings, engines, args.ros_domain_id)
    else:
        summary = run_demo(settings, engines)
    print(format_report(summary))
    if args.json:
        args.json.write_text(json.dumps(summary.as_json(), indent=2) + "\n")
        print(f"summary written to {args.json}")
    if args.plot:
        from csr_ros.plots import plot_run

        plot_run(summary, args.plot)
        print(f"plot written to {args.plot}")
    return 0 if summary.ok else 1
