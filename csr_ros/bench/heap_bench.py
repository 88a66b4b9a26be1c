"""A torch engine's RSS over a stream of prefill lengths: kernel caches bounded or not.

Each setting runs in its own process, because torch and oneDNN read their cache capacities
once, when they make their first kernel (csr_ros/engine/heap.py):

    unbounded  ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024, LRU_CACHE_CAPACITY=1024 (the libraries'
               defaults), no trimming: the engine before its caches were bounded
    bounded    what the package sets on import (SHAPE_CACHE_CAPACITY) and the engine's own
               HeapTrimmer after committed work

The stream is what a robot's state process sees: `reset`, `extend` of M tokens, then a query of
a dynamic part of 18 to 33 tokens (one token generated). Every other extend repeats one of a few
usual lengths (a chunk of 16, 24 or 32 tokens); the rest draw M from [8, 300) at random
(catch-ups, bursts, long chunks). The first 3 steps are a warm-up. Printed per setting: RSS
growth after the warm-up, growth over the second half of the stream (what a bound leaves: near
0), the mean milliseconds of an extend (all, and of the usual lengths), and the queries' TTFT,
mean and p90 over the last two thirds. A kernel evicted from a bounded cache is compiled again,
and these times show what that costs.

    python -m csr_ros.bench.heap_bench --extends 600 --json heap.json --plot heap.png
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from csr_ros.cpu import bf16_flags, cpu_model
from csr_ros.engine.heap import SHAPE_CACHE_ENV
from csr_ros.soak.probes import usage

SETTINGS = ("unbounded", "bounded")
USUAL_TOKENS = (16, 24, 32)
DYNAMIC_TOKENS = (18, 34)      # a query's dynamic part: randrange(18, 34)
WARM_UP_EXTENDS = 3
SAMPLE_EVERY = 10


def _rss_mb() -> float:
    return usage(os.getpid()).rss_mb


def run_stream(setting: str, *, extends: int, dtype: str, threads: int, seed: int) -> dict:
    """In this process (already started with the setting's environment): the stream's figures."""
    from csr_ros.engine.torch_engine import TorchEngine

    engine = TorchEngine("smollm2", dtype=dtype, threads=threads, max_context_tokens=4096)
    if setting == "unbounded":
        engine._heap = None
    rng = random.Random(seed)
    vocab = engine.vocab_size

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    for _ in range(WARM_UP_EXTENDS):
        engine.reset()
        engine.extend(tokens(USUAL_TOKENS[0]))
        engine.query(tokens(DYNAMIC_TOKENS[0]), max_new_tokens=1)
    warm_mb = _rss_mb()
    samples = [(0, warm_mb)]
    all_ms, usual_ms, ttft_ms = [], [], []
    for i in range(extends):
        usual = i % 2 == 0
        n = rng.choice(USUAL_TOKENS) if usual else rng.randrange(8, 300)
        ids = tokens(n)
        engine.reset()
        started = time.perf_counter()
        engine.extend(ids)
        elapsed_ms = 1000 * (time.perf_counter() - started)
        all_ms.append(elapsed_ms)
        if usual:
            usual_ms.append(elapsed_ms)
        answer = engine.query(tokens(rng.randrange(*DYNAMIC_TOKENS)), max_new_tokens=1)
        ttft_ms.append(1000 * answer.ttft_s)
        if (i + 1) % SAMPLE_EVERY == 0:
            samples.append((i + 1, _rss_mb()))
    half = samples[len(samples) // 2][1]
    steady_ttft = sorted(ttft_ms[len(ttft_ms) // 3:])
    return {
        "setting": setting,
        "cache_env": {name: os.environ.get(name) for name in SHAPE_CACHE_ENV},
        "dtype": str(engine.dtype), "extends": extends,
        "warm_rss_mb": round(warm_mb, 1), "end_rss_mb": round(samples[-1][1], 1),
        "growth_mb": round(samples[-1][1] - warm_mb, 1),
        "second_half_growth_mb": round(samples[-1][1] - half, 1),
        "extend_ms_mean": round(statistics.fmean(all_ms), 2),
        "usual_extend_ms_mean": round(statistics.fmean(usual_ms), 2),
        "query_ttft_ms_mean": round(statistics.fmean(steady_ttft), 2),
        "query_ttft_ms_p90": round(steady_ttft[int(0.9 * (len(steady_ttft) - 1))], 2),
        "trims": 0 if engine._heap is None else engine._heap.n_trims,
        "samples": [(n, round(mb, 1)) for n, mb in samples],
    }


def _child_env(setting: str) -> dict:
    env = dict(os.environ)
    for name in SHAPE_CACHE_ENV:
        env.pop(name, None)
        if setting == "unbounded":
            env[name] = "1024"
    return env


def run(*, extends: int, dtype: str, threads: int, seed: int) -> dict:
    """Each setting in a child process, one after the other; the report."""
    results = []
    for setting in SETTINGS:
        print(f"[heap_bench] {setting}: {extends} extends ...", flush=True)
        cmd = [sys.executable, "-m", "csr_ros.bench.heap_bench", "--child", setting,
               "--extends", str(extends), "--dtype", dtype, "--threads", str(threads),
               "--seed", str(seed)]
        out = subprocess.run(cmd, env=_child_env(setting), capture_output=True, text=True,
                             check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{setting} run failed ({out.returncode}): {out.stderr[-2000:]}")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        row = results[-1]
        print(f"  growth {row['growth_mb']:.1f} MB (second half {row['second_half_growth_mb']:.1f}"
              f" MB), extend {row['extend_ms_mean']:.1f} ms mean, usual lengths "
              f"{row['usual_extend_ms_mean']:.1f} ms; query TTFT {row['query_ttft_ms_mean']:.1f} ms"
              f" mean, {row['query_ttft_ms_p90']:.1f} ms p90; {row['dtype']}", flush=True)
    return {"bench": "heap", "measured_utc": dt.datetime.now(dt.timezone.utc).isoformat(),
            "cpu": cpu_model(), "native_bf16": bool(bf16_flags()), "machine": platform.machine(),
            "threads": threads, "seed": seed, "results": results}


def plot(report: dict, path: str | Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from csr_ros.plots import save_figure

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in report["results"]:
        xs, ys = zip(*row["samples"])
        ax.plot(xs, ys, label=f"{row['setting']} ({row['dtype']})")
    ax.set_xlabel("extends (half usual lengths, half random in [8, 300)), each with a query")
    ax.set_ylabel("RSS (MB)")
    ax.set_title(f"torch engine RSS, {report['cpu']}", fontsize=9)
    ax.legend()
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m csr_ros.bench.heap_bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--extends", type=int, default=600)
    parser.add_argument("--dtype", default="bfloat16",
                        help="the engine's dtype (default bfloat16: the growth is oneDNN's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.extends < 2:
        parser.error("--extends must be >= 2")
    if args.child:
        print(json.dumps(run_stream(args.child, extends=args.extends, dtype=args.dtype,
                                    threads=args.threads, seed=args.seed)))
        return 0
    report = run(extends=args.extends, dtype=args.dtype, threads=args.threads, seed=args.seed)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {plot(report, args.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
