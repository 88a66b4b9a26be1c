"""Decision latency of typed actions on one local engine, mode by mode (`csr-ros actions`).

    summary = run_bench(modes=("choice", "grammar", "free"), chunks=60, reps=10)

The demo episode's prompt (its typed-action profile and `chunks` chunks, cached once), then the
same decision asked `reps` times in each mode, the modes interleaved so that load on the
machine hits them alike: `choice` (the closed list scored in one pass), `grammar` (decoded under
the vocabulary's grammar with llguidance masks), `free` (unconstrained text, parsed after).
Per mode: latency from the call to the last token (p50, p99, max), tokens decoded, the
token-mask time per decoded token, and how many answers parse into a valid action.
"""

from __future__ import annotations

import time
from typing import Sequence

from csr_ros.demo_episode import Episode, typed_decision
from csr_ros.errors import ConfigError
from csr_ros.stats import percentile

MODES = ("choice", "grammar", "free")


def run_bench(*, modes: Sequence[str] = MODES, chunks: int = 60, reps: int = 10,
              max_new_tokens: int = 24, threads: int = 1, dtype: str = "auto",
              seed: int = 0) -> dict:
    """The latency figures per mode, and the state they were taken on."""
    if not modes or any(m not in MODES for m in modes):
        raise ConfigError(f"--modes takes a comma-separated list of {MODES}, got "
                          f"{','.join(modes)!r}")
    if reps < 1 or chunks < 1:
        raise ConfigError("--reps and --chunks must be >= 1")
    from csr_ros.resources.local import LocalResource

    resource = LocalResource("smollm2", threads=threads, max_context_tokens=8192,
                             dtype=dtype)
    try:
        tokenizer = resource.engine.tokenizer
        request, bound = typed_decision(Episode(seed), tokenizer, chunks)
        resource.load(request.static_ids)
        constraints = {"choice": bound.constraint("choice"),
                       "grammar": bound.constraint("grammar"), "free": None}
        for mode in modes:                                  # warm-up, not timed
            resource.query(request, max_new_tokens=max_new_tokens,
                           constraint=constraints[mode], stop=("\n",))
        rows: dict[str, list[tuple[float, object]]] = {m: [] for m in modes}
        for _ in range(reps):
            for mode in modes:
                started = time.perf_counter()
                result = resource.query(request, max_new_tokens=max_new_tokens,
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
    return {"chunks": chunks, "reps": reps, "threads": threads,
            "precision": precision,
            "static_tokens": len(request.static_ids), "dynamic_tokens": len(request.dynamic_ids),
            "choices": len(constraints["choice"].choices), "modes": out}
