"""`csr-ros soak`: compressed robot-days through the real parts, with faults at seeded times.

    csr-ros soak --robot-hours 0.5 --speedup 10 --faults all --fault-every-s 60
    csr-ros soak --robot-hours 24 --speedup 20 --faults all --fault-every-s 240 \\
        --json day.json --plot day.png --workdir runs/day
    csr-ros soak --resource openai --robot-hours 2 --faults all       # two llama.cpp servers
    csr-ros soak --resource openai --r1 URL --r2 URL ...              # servers already running

The run and its checks: csr_ros.soak (run_soak); docs/reliability.md says what each fault
does and what the figures mean. Exits 1 unless nothing was lost, duplicated or reordered,
every fault recovered and the state equals the state rebuilt from its chunk log.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from csr_ros.soak import FAULT_KINDS, SoakSettings, format_report, parse_faults, run_soak
from csr_ros.tools.options import add_engine_options, from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SoakSettings()
    run = parser.add_argument_group("run")
    run.add_argument("--robot-hours", type=float, default=d.robot_hours,
                     help=f"robot time to run (default {d.robot_hours})")
    run.add_argument("--speedup", type=float, default=d.speedup,
                     help=f"robot time per wall second where the machine keeps up (default "
                          f"{d.speedup}); where it does not, robot time is held and the "
                          "report says where")
    run.add_argument("--seed", type=int, default=d.seed, help="patrol and fault seed")
    run.add_argument("--faults", type=parse_faults, default=(),
                     help="'all', 'none' or a comma list of: " + ", ".join(FAULT_KINDS))
    run.add_argument("--fault-every-s", type=float, default=d.fault_every_s,
                     help=f"mean wall seconds between faults (default {d.fault_every_s:g})")
    run.add_argument("--max-faults", type=int, default=None,
                     help="end the run once this many faults are behind it (with --faults "
                          "all and 8 or more, every kind once)")
    run.add_argument("--workdir", type=Path, default=None,
                     help="keep the run here: samples, decisions, the state's log "
                          "(default: a temporary directory)")
    run.add_argument("--quiet", dest="live_line", action="store_false",
                     help="no progress lines")
    res = parser.add_argument_group("resources")
    res.add_argument("--resource", choices=["local", "openai"], default=d.resource,
                     help="local engines in worker processes, or OpenAI-compatible servers")
    res.add_argument("--r1", default=None, help="openai: the first server's URL")
    res.add_argument("--r2", default=None, help="openai: the second server's URL (without "
                                                "both, two llama.cpp servers are started)")
    res.add_argument("--server-threads", type=int, default=d.server_threads)
    add_engine_options(res, model=d.model, dtype=d.dtype, backend=d.backend)
    stream = parser.add_argument_group("stream and policy")
    stream.add_argument("--tau-mem", dest="tau_mem_tokens", type=int, default=d.tau_mem_tokens)
    stream.add_argument("--max-context-tokens", type=int, default=d.max_context_tokens)
    stream.add_argument("--reserve-tokens", type=int, default=d.reserve_tokens)
    stream.add_argument("--n-catchup", dest="n_catchup_tokens", type=int,
                        default=d.n_catchup_tokens)
    stream.add_argument("--rate-hz", type=float, default=d.rate_hz,
                        help=f"decisions per wall second (default {d.rate_hz:g})")
    stream.add_argument("--keep-up-s", type=float, default=d.keep_up_s,
                        help=f"a decision slower than this holds robot time: the state does not "
                             f"keep up (default {d.keep_up_s:g})")
    stream.add_argument("--query-timeout-s", type=float, default=d.query_timeout_s)
    stream.add_argument("--hedge-after-s", type=float, default=d.hedge_after_s,
                        help=f"a decision not answered by then is asked on the secondary too, "
                             f"where it holds a consistent state; 0: never (default "
                             f"{d.hedge_after_s:g})")
    stream.add_argument("--stale-after-s", type=float, default=d.stale_after_s,
                        help=f"the robot's watchdog: no decision for this long holds the safe "
                             f"action; the report's bound on ticks without a decision per fault "
                             f"(default {d.stale_after_s:g})")
    stream.add_argument("--op-timeout-s", type=float, default=d.op_timeout_s)
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, default=None, help="write the figures here")
    out.add_argument("--plot", type=Path, default=None,
                     help="RSS and fds per process, TTFT with the faults, recovery times")


def run(args: argparse.Namespace) -> int:
    settings = from_args(SoakSettings, args)
    summary = run_soak(settings, plot=args.plot, json_path=args.json)
    print(format_report(summary))
    for path in (args.json, args.plot):
        if path:
            print(f"wrote {path}", file=sys.stderr)
    return 0 if summary.ok else 1
