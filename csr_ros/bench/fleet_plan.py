"""K robots sharing P servers behind a router: the run plan, and what a run measured.

    specs = plan_runs(robots=[1, 2, 4, 8], servers=[2], routings=["consistent_hash",
                                                                  "round_robin"])
    robot = robot_summary(robot_id, seed, demo_summary, usage)      # one robot of one run
    run = run_summary(spec, [robot, ...], routing_counts=..., ...)  # the fleet in that run
    print(markdown_table([run, ...]))

Each robot is one synthetic episode (its own seed), its own CSR state, its own ASR pair (two
roles, r1 and r2, on the pool behind the router, each request keyed by robot and state
version) and its own 2 Hz policy: the demo's episode loop, run once per robot
(csr_ros.bench.fleet_runs).

The hit ratio is the servers' own count: the prompt tokens they reported as read from their
prefix cache (`usage.prompt_tokens_details.cached_tokens`) over the prompt tokens of the
same requests, the robots' queries first (what a decision waits for), and the prefills
(warm-ups and catch-ups) apart. Robots start with distinct episodes, but share the profile at
the head of every prompt, as robots of one fleet do.

Pure: no processes, no sockets, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from csr_ros.episode_run import RunSummary
from csr_ros.errors import ConfigError
from csr_ros.stats import percentile

RUN_KEYS = ("robots", "servers", "routing", "hit_ratio", "ttft_p99_s", "decisions_per_s_min",
            "chunks_lost")
SEEDS_PER_RUN = 1000      # run i's robot k has seed base + 1000 i + k: no two runs share one


@dataclass(frozen=True)
class RunSpec:
    index: int            # position in the plan (seeds and log names depend on it)
    robots: int           # K
    servers: int          # P
    routing: str          # the router's policy


def plan_runs(robots: Sequence[int], servers: Sequence[int], routings: Sequence[str],
              *, policies: Sequence[str] | None = None) -> list[RunSpec]:
    """Every (P, routing, K), P outermost (a pool starts once per P), then routing, then K."""
    if not robots or not servers or not routings:
        raise ConfigError("give at least one robot count, server count and routing policy")
    if any(k < 1 for k in robots) or any(p < 1 for p in servers):
        raise ConfigError(f"robot and server counts must be >= 1, got {list(robots)} robots, "
                          f"{list(servers)} servers")
    if policies is not None:
        unknown = [r for r in routings if r not in policies]
        if unknown:
            raise ConfigError(f"unknown routing policy {unknown}: the router has {list(policies)}")
    if len(set(routings)) != len(routings) or len(set(robots)) != len(robots) \
            or len(set(servers)) != len(servers):
        raise ConfigError("each robot count, server count and routing is given once")
    specs = []
    for p in servers:
        for routing in routings:
            for k in robots:
                specs.append(RunSpec(index=len(specs), robots=k, servers=p, routing=routing))
    return specs


def robot_id(k: int) -> str:
    """The routing key's robot part (and the ROS namespace's name): robot_0, robot_1, ..."""
    return f"robot_{k}"


def robot_seed(base_seed: int, run_index: int, k: int) -> int:
    if k >= SEEDS_PER_RUN:
        raise ConfigError(f"at most {SEEDS_PER_RUN} robots per run")
    return base_seed + SEEDS_PER_RUN * run_index + k


def parse_counts(text: str, what: str) -> list[int]:
    """`1,2,4,8` → [1, 2, 4, 8], with a clear error for anything else."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated whole numbers, got {text!r}") from None
    if not values:
        raise ConfigError(f"{what}: no value in {text!r}")
    return values


def hit_ratio(cached_tokens: int, prompt_tokens: int) -> float | None:
    """Cached over prompt tokens; None when nothing was counted."""
    if prompt_tokens <= 0:
        return None
    return cached_tokens / prompt_tokens


def merge_usage(totals: Sequence[dict]) -> dict:
    """Sum OpenAIResource.usage_totals() of several resources (a robot's two roles)."""
    out: dict[str, dict[str, int]] = {}
    for t in totals:
        for kind, tally in t.items():
            row = out.setdefault(kind, {})
            for key, value in tally.items():
                row[key] = row.get(key, 0) + int(value)
    return out


def robot_summary(rid: str, seed: int, demo: RunSummary, usage: dict) -> dict:
    """One robot of a run: the demo loop's summary and its two resources' usage."""
    queries = usage.get("queries", {})
    prefills = usage.get("prefills", {})
    return {
        "robot_id": rid, "seed": seed,
        "decisions_per_s": demo.decisions_per_s, "rate_hz": demo.settings.rate_hz,
        "decisions": demo.decisions, "queries": demo.queries,
        "failed_queries": demo.failed_queries,
        "ttft_p50_s": demo.ttft.p50_s, "ttft_p99_s": demo.ttft.p99_s,
        "swaps": demo.swaps, "fallbacks": demo.fallbacks, "cycles": demo.cycles,
        "chunks_in": demo.chunks_in, "chunks_lost": demo.chunks_lost,
        "state_consistent": demo.state_consistent,
        "query_prompt_tokens": queries.get("prompt_tokens", 0),
        "query_cached_tokens": queries.get("cached_tokens", 0),
        "queries_without_usage": queries.get("without_usage", 0),
        "hit_ratio": hit_ratio(queries.get("cached_tokens", 0), queries.get("prompt_tokens", 0)),
        "prefill_prompt_tokens": prefills.get("prompt_tokens", 0),
        "prefill_cached_tokens": prefills.get("cached_tokens", 0),
        "ttfts_s": [s.ttft_s for s in demo.samples],
    }


def run_summary(spec: RunSpec, robots: Sequence[dict], *, duration_s: float,
                routing_counts: dict[str, int], memory_bytes: dict[str, int],
                server_cache: dict[str, dict] | None = None, engine: str = "vllm") -> dict:
    """The fleet in one run: the RUN_KEYS first, then the details behind them."""
    cached = sum(r["query_cached_tokens"] for r in robots)
    prompt = sum(r["query_prompt_tokens"] for r in robots)
    p_cached = sum(r["prefill_cached_tokens"] for r in robots)
    p_prompt = sum(r["prefill_prompt_tokens"] for r in robots)
    rates = [r["decisions_per_s"] for r in robots if r["decisions_per_s"] is not None]
    ttfts = [t for r in robots for t in r["ttfts_s"]]
    return {
        "robots": spec.robots, "servers": spec.servers, "routing": spec.routing,
        "hit_ratio": hit_ratio(cached, prompt),
        "ttft_p99_s": percentile(ttfts, 99),
        "decisions_per_s_min": min(rates) if rates else None,
        "chunks_lost": sum(r["chunks_lost"] for r in robots),
        "engine": engine, "duration_s": duration_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "prefill_hit_ratio": hit_ratio(p_cached, p_prompt),
        "queries": sum(r["queries"] for r in robots),
        "failed_queries": sum(r["failed_queries"] for r in robots),
        "swaps": sum(r["swaps"] for r in robots),
        "fallbacks": sum(r["fallbacks"] for r in robots),
        "routing_counts": dict(routing_counts),
        "memory_bytes": dict(memory_bytes),
        "server_cache": dict(server_cache or {}),
        "per_robot": [{k: v for k, v in r.items() if k != "ttfts_s"} for r in robots],
    }


def server_cache_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """A vLLM server's prefix-cache counters over a run (every request: queries, warm-ups,
    catch-ups) and its KV cache use at the end; `before`/`after` from cache_counters()."""
    queries = after.get("queries", 0.0) - before.get("queries", 0.0)
    hits = after.get("hits", 0.0) - before.get("hits", 0.0)
    return {"prompt_tokens": int(queries), "cached_tokens": int(hits),
            "hit_ratio": hit_ratio(int(hits), int(queries)),
            "kv_cache_usage": after.get("kv_cache_usage")}


def cache_counters(samples: Sequence[tuple[str, dict, float]]) -> dict[str, float]:
    """vLLM's /metrics samples → prefix-cache queries and hits (tokens), KV cache use."""
    out: dict[str, float] = {}
    for name, _, value in samples:
        if name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total"):
            out["queries"] = out.get("queries", 0.0) + value
        elif name in ("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total"):
            out["hits"] = out.get("hits", 0.0) + value
        elif name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            out["kv_cache_usage"] = max(out.get("kv_cache_usage", 0.0), value)
    return out


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(runs: Sequence[dict]) -> str:
    """One row per run: the issue's columns, then swaps, fallbacks and the routing split."""
    lines = ["| robots K | servers P | routing | hit ratio | TTFT p50 s | TTFT p99 s | "
             "decisions/s min (per robot) | chunks lost | swaps | fallbacks | "
             "requests per server |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        split = " / ".join(str(n) for n in r.get("routing_counts", {}).values()) or "-"
        lines.append(f"| {r['robots']} | {r['servers']} | {r['routing']} | "
                     f"{_fmt(r['hit_ratio'], '.3f')} | {_fmt(r.get('ttft_p50_s'), '.3f')} | "
                     f"{_fmt(r['ttft_p99_s'], '.3f')} | {_fmt(r['decisions_per_s_min'])} | "
                     f"{r['chunks_lost']} | {r.get('swaps', '-')} | {r.get('fallbacks', '-')} | "
                     f"{split} |")
    return "\n".join(lines)
