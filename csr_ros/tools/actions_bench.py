"""`csr-ros actions`: decision latency of typed actions on one local engine, mode by mode.

    csr-ros actions --chunks 60 --reps 10 --json a.json

The demo episode's prompt (its typed-action profile and `--chunks` chunks, cached once), then
the same decision asked `--reps` times in each mode, the modes interleaved so that load on the
machine hits them alike: `choice` (the closed list scored in one pass), `grammar` (decoded under
the vocabulary's grammar with llguidance masks), `free` (unconstrained text, parsed after).
Printed and written: latency from the call to the last token (p50, p99, max), tokens decoded,
the token-mask time per decoded token, and how many answers parse into a valid action.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

from csr_ros.actions import SeenValues, Vocabulary
from csr_ros.demo_episode import Episode
from csr_ros.errors import ConfigError
from csr_ros.layout import Layout
from csr_ros.state import CsrState
from csr_ros.stats import percentile

MODES = ("choice", "grammar", "free")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=60, help="episode chunks in the cached "
                                                                "state (default 60)")
    parser.add_argument("--reps", type=int, default=10, help="decisions per mode (default 10)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of "
                                                                 f"{','.join(MODES)}")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the engine")
    parser.add_argument("--dtype", default="auto", help="engine precision: auto (default), "
                                                        "float32, bfloat16")
    parser.add_argument("--seed", type=int, default=0, help="episode seed")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")


def run(args: argparse.Namespace) -> int:
    summary = run_bench(args)
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


def run_bench(args: argparse.Namespace) -> dict:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise ConfigError(f"--modes takes a comma-separated list of {MODES}, got {args.modes!r}")
    if args.reps < 1 or args.chunks < 1:
        raise ConfigError("--reps and --chunks must be >= 1")
    from csr_ros.resources.local import LocalResource

    resource = LocalResource("smollm2", threads=args.threads, max_context_tokens=8192,
                             dtype=args.dtype)
    try:
        tokenizer = resource.engine.tokenizer
        episode = Episode(args.seed)
        vocab = Vocabulary.parse(episode.action_specs)
        seen = SeenValues(episode.seen_patterns)
        state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                         profile=episode.typed_profile(vocab.describe()))
        for item in itertools.islice(episode.stream(), args.chunks):
            state.add(item.text, source=item.source)
            seen.observe(item.text)
        bound = vocab.bind(seen.values())
        request = state.build_request(task=episode.typed_task(),
                                      suffix=episode.suffix(args.chunks / 2))
        resource.load(request.static_ids)
        constraints = {"choice": bound.constraint("choice"),
                       "grammar": bound.constraint("grammar"), "free": None}
        for mode in modes:                                  # warm-up, not timed
            resource.query(request, max_new_tokens=args.max_new_tokens,
                           constraint=constraints[mode], stop=("\n",))
        rows: dict[str, list[tuple[float, object]]] = {m: [] for m in modes}
        for _ in range(args.reps):
            for mode in modes:
                started = time.perf_counter()
                result = resource.query(request, max_new_tokens=args.max_new_tokens,
                                        constraint=constraints[mode],
                                        stop=("\n",) if constraints[mode] is None else ())
                rows[mode].append((time.perf_counter() - started, result))
        precision = resource.engine.precision
    finally:
        resource.close()
    out = {}
    for mode, items in rows.items():
        latencies = [s for s, _ in items]
        results = [r for _, r in items]
        decoded = sum(r.n_generated for r in results) if mode != "choice" else 0
        mask_s = sum(r.mask_s for r in results)
        valid = sum(bound.decide(r.text, constrained=r.constrained,
                                 finish_reason=r.finish_reason).valid for r in results)
        out[mode] = {"n": len(items), "p50_s": percentile(latencies, 50),
                     "p99_s": percentile(latencies, 99), "max_s": max(latencies),
                     "tokens_mean": sum(r.n_generated for r in results) / len(results),
                     "mask_ms_per_token": 1000 * mask_s / decoded if decoded and mask_s else None,
                     "valid": valid, "example": results[0].text}
    return {"chunks": args.chunks, "reps": args.reps, "threads": args.threads,
            "precision": precision,
            "static_tokens": len(request.static_ids), "dynamic_tokens": len(request.dynamic_ids),
            "choices": len(constraints["choice"].choices), "modes": out}
