"""`csr-ros bench`: TTFT of CSR queries against the unordered baseline, and capsule timings.

    csr-ros bench --n 512,1024 --repeats 3                       # local engine, ~1-2 min on 2 cores
    csr-ros bench --resource local,openai --url http://127.0.0.1:8001 --n 1024,4096 --json out.json

What is measured and how: csr_ros.bench.ttft_bench; the table and the figures:
csr_ros.bench.bench_report. The local engine runs `--dtype auto` unless told otherwise (see
docs/engine.md). Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from csr_ros.bench.ttft_bench import DECODE_TOKENS, BenchSettings, run_bench
from csr_ros.tools.options import add_engine_options, ints, words


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--resource", default="local",
                        help="resource kind(s), comma-separated: local, openai (default: local)")
    parser.add_argument("--url", default=None,
                        help="server URL(s) for --resource openai, comma-separated: several "
                             "servers run side by side as openai, openai-2, ...")
    add_engine_options(parser, "model", helps={
        "model": "'smollm2', a prepared catalog model (csr-ros model list) or a local model "
                 "directory (weights for local, tokenizer for every resource)"})
    parser.add_argument("--n", default="512,1024",
                        help="static lengths N in tokens, comma-separated")
    parser.add_argument("--m", default="32", help="dynamic lengths M in tokens, comma-separated")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed repeats per cell (median reported)")
    add_engine_options(parser, "threads", "backend", "dtype", backend_choices=None, helps={
        "threads": "torch threads of the local engine",
        "backend": "local engine(s), comma-separated: auto (default: what dtype auto picks on "
                   "this CPU), torch (transformers' weights), llamacpp (the GGUF on llama.cpp "
                   "in process; --dtype/--forward/--decode-weights are torch's). Several run "
                   "side by side as local, local-<backend>",
        "dtype": "local engine dtype: auto (default: the fastest this machine offers, e.g. "
                 "bfloat16 with int4 decode weights on a CPU with native bf16), float32 (the "
                 "exact reference), bfloat16, float16"})
    parser.add_argument("--device", default="cpu", help="local engine device: cpu, cuda, cuda:1")
    parser.add_argument("--decode-weights", default="auto",
                        help="local engine decode-step weights: auto, float, int8, int4")
    parser.add_argument("--decode-threads", type=int, default=None,
                        help="local engine threads for decode steps (default: --threads)")
    parser.add_argument("--forward", default="auto",
                        help="local engine forward: auto, lean, transformers (the reference)")
    parser.add_argument("--max-new-tokens", type=int, default=1,
                        help="tokens decoded per query (TTFT needs only the first); the decode "
                             f"speed runs max(this, {DECODE_TOKENS}) tokens with EOS suppressed")
    parser.add_argument("--no-unordered", action="store_true", help="skip the unordered baseline")
    parser.add_argument("--json", type=Path, default=None, help="write rows, meta and summary here")
    parser.add_argument("--plot", type=Path, default=None,
                        help="write a PNG: TTFT against N per method, capsule times against N")



def run(args: argparse.Namespace) -> int:
    from csr_ros.bench.bench_report import format_table

    settings = BenchSettings(
        kinds=words(args.resource), backends=words(args.backend), urls=words(args.url or ""),
        model=args.model, ns=tuple(sorted(set(ints(args.n, "--n", minimum=1)))),
        ms=tuple(sorted(set(ints(args.m, "--m", minimum=1)))),
        repeats=args.repeats, max_new_tokens=args.max_new_tokens,
        unordered=not args.no_unordered, threads=args.threads, device=args.device,
        dtype=args.dtype, decode_weights=args.decode_weights,
        decode_threads=args.decode_threads, forward=args.forward)
    report = run_bench(settings)
    report["meta"]["argv"] = sys.argv[1:]
    print(format_table(report["rows"], report["summary"]))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}", file=sys.stderr, flush=True)
    if args.plot is not None:
        from csr_ros.plots import plot_bench

        print(f"wrote {plot_bench(report['rows'], args.plot)}", file=sys.stderr, flush=True)
    return 0
