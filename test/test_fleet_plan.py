"""The fleet's pure parts: run plan, seeds, hit ratio, summaries, table; the router's command
line and metric readers; the resource's routing key. No server: the runs themselves are in
test/test_vllm_router_fleet.py, against real vLLM servers behind a real vllm-router."""

from __future__ import annotations

import pytest

from csr_ros.episode_run import Answered, EpisodeSettings, RunSummary, Sample, decision_figures
from csr_ros.errors import ConfigError
from csr_ros.bench.fleet_plan import (RUN_KEYS, RunSpec, cache_counters, hit_ratio, markdown_table,
                                      merge_usage, parse_counts, plan_runs, robot_id, robot_seed,
                                      robot_summary, run_summary, server_cache_delta)
from csr_ros.resources.openai import ROUTING_KEY_HEADER, OpenAIOptions, OpenAIResource
from csr_ros.router import (ROUTER_POLICIES, parse_metrics, routed_per_worker,
                            router_command, vllm_pool_server)

WORKERS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
# vllm-router 0.1.17's /metrics after 16 completions with consistent_hash (as it wrote them)
ROUTER_METRICS = """\
# TYPE vllm_router_processed_requests_total counter
vllm_router_processed_requests_total{worker="http://127.0.0.1:9002"} 12
vllm_router_processed_requests_total{worker="http://127.0.0.1:9001"} 4
# TYPE vllm_router_policy_decisions_total counter
vllm_router_policy_decisions_total{policy="consistent_hash",worker="http://127.0.0.1:9002"} 12
vllm_router_policy_decisions_total{policy="consistent_hash",worker="http://127.0.0.1:9001"} 4
"""
VLLM_METRICS = """\
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2"} 4000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2"} 3000.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.25
"""


def _demo_summary(*, lost: int = 0, rate: float = 1.5, ttfts=(0.1, 0.2, 0.3)) -> RunSummary:
    """A robot's episode summary: one valid decision per TTFT, `rate` of them per second."""
    answered = [Answered(Sample(t_s=float(i), ttft_s=t, inside=False, version=1, n_static=900,
                                resource="r1"), latency_s=t, valid=True, constrained=True,
                         action="wait", error="") for i, t in enumerate(ttfts)]
    return RunSummary(settings=EpisodeSettings(), mode="asr", resource="openai",
                      duration_s=len(ttfts) / rate, cycles=2, swaps=2, sync_evictions=0,
                      fallbacks=0, retries=0, failovers=0, chunks_in=40, chunks_lost=lost,
                      chunks_duplicated=0, chunks_active=20, chunks_evicted=20, final_version=2,
                      state_consistent=True, queries=len(ttfts), failed_queries=0,
                      skipped_ticks=0, mask_s_per_token=None, windows=[], timeline=[],
                      **decision_figures(answered, len(ttfts) / rate))


def _usage(prompt: int, cached: int) -> dict:
    return {"queries": {"requests": 10, "prompt_tokens": prompt, "cached_tokens": cached,
                        "without_usage": 0},
            "prefills": {"requests": 3, "prompt_tokens": 900, "cached_tokens": 300,
                         "without_usage": 0}}


def test_plan_runs_every_server_count_then_routing_then_robot_count():
    specs = plan_runs([1, 2, 4], [1, 2], ["consistent_hash", "round_robin"])
    assert [(s.servers, s.routing, s.robots) for s in specs[:4]] == [
        (1, "consistent_hash", 1), (1, "consistent_hash", 2), (1, "consistent_hash", 4),
        (1, "round_robin", 1)]
    assert len(specs) == 12 and [s.index for s in specs] == list(range(12))


@pytest.mark.parametrize("robots, servers, routings, match", [
    ([], [2], ["round_robin"], "at least one"),
    ([0], [2], ["round_robin"], ">= 1"),
    ([2], [2], ["nearest"], "unknown routing"),
    ([2, 2], [2], ["round_robin"], "given once"),
])
def test_plan_runs_refuses_what_cannot_run(robots, servers, routings, match):
    with pytest.raises(ConfigError, match=match):
        plan_runs(robots, servers, routings, policies=ROUTER_POLICIES)


def test_parse_counts_reads_a_comma_list_and_names_the_option_it_refuses():
    assert parse_counts("1,2, 4,8", "--robots") == [1, 2, 4, 8]
    with pytest.raises(ConfigError, match="--robots"):
        parse_counts("1,two", "--robots")


def test_robot_seeds_never_repeat_across_the_runs_of_a_sweep():
    seeds = [robot_seed(7, run, k) for run in range(12) for k in range(8)]
    assert len(set(seeds)) == len(seeds)
    assert robot_id(3) == "robot_3"


def test_hit_ratio_is_cached_over_prompt_tokens_and_none_without_any():
    assert hit_ratio(900, 1000) == pytest.approx(0.9)
    assert hit_ratio(0, 0) is None


def test_run_summary_holds_the_issue_keys_and_sums_the_robots():
    spec = RunSpec(index=0, robots=2, servers=2, routing="consistent_hash")
    robots = [robot_summary("robot_0", 0, _demo_summary(rate=1.5), _usage(1000, 950)),
              robot_summary("robot_1", 1, _demo_summary(rate=0.5, lost=0, ttfts=(1.0,)),
                            _usage(1000, 850))]
    run = run_summary(spec, robots, duration_s=30.0, routing_counts={WORKERS[0]: 5},
                      memory_bytes={WORKERS[0]: 1 << 30})
    assert set(RUN_KEYS) <= set(run)
    assert run["hit_ratio"] == pytest.approx(0.9)
    assert run["decisions_per_s_min"] == 0.5
    assert run["ttft_p99_s"] == pytest.approx(0.979)   # over all 4 queries
    assert run["chunks_lost"] == 0 and run["swaps"] == 4
    assert run["prefill_hit_ratio"] == pytest.approx(1 / 3)
    assert "ttfts_s" not in run["per_robot"][0]


def test_merge_usage_adds_a_robots_two_roles():
    merged = merge_usage([_usage(100, 50), _usage(300, 250)])
    assert merged["queries"]["prompt_tokens"] == 400
    assert merged["queries"]["cached_tokens"] == 300
    assert merged["prefills"]["requests"] == 6


def test_markdown_table_has_one_row_per_run_with_the_routing_split():
    spec = RunSpec(index=0, robots=8, servers=2, routing="round_robin")
    run = run_summary(spec, [robot_summary("robot_0", 0, _demo_summary(), _usage(10, 4))],
                      duration_s=1.0, routing_counts={WORKERS[0]: 7, WORKERS[1]: 8},
                      memory_bytes={})
    lines = markdown_table([run]).splitlines()
    assert len(lines) == 3
    assert lines[2].startswith("| 8 | 2 | round_robin | 0.400 |") and "7 / 8" in lines[2]


def test_router_command_names_the_workers_policy_and_metrics_port():
    cmd = router_command(WORKERS, port=30000, policy="consistent_hash", prometheus_port=29000,
                         executable="vllm-router")
    assert cmd[:4] == ["vllm-router", "--worker-urls", *WORKERS]
    assert cmd[cmd.index("--policy") + 1] == "consistent_hash"
    assert cmd[cmd.index("--prometheus-port") + 1] == "29000"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    with pytest.raises(ConfigError, match="routing policy"):
        router_command(WORKERS, port=1, policy="nearest", executable="vllm-router")
    with pytest.raises(ConfigError, match="worker"):
        router_command([], port=1, policy="round_robin", executable="vllm-router")


def test_a_pool_servers_kv_cache_is_given_in_bytes_so_a_fraction_of_a_gib_works():
    server = vllm_pool_server("/models/smollm2", port=8001, cpus="1", kv_cache_gib=0.375,
                              base_env={"VLLM_CPU_KVCACHE_SPACE": "4", "PATH": "/bin"})
    command, env = server.command, server.env
    assert command[command.index("--kv-cache-memory-bytes") + 1] == str(3 * 2**27)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env        # whole GiB, and it would override bytes
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["PATH"] == "/bin"
    with pytest.raises(ConfigError, match="kv_cache_gib must be positive"):
        vllm_pool_server("/models/smollm2", port=8001, cpus="1", kv_cache_gib=0)


def test_routed_counts_are_read_per_worker_from_the_routers_metrics():
    samples = parse_metrics(ROUTER_METRICS)
    assert routed_per_worker(samples, WORKERS) == {WORKERS[0]: 4, WORKERS[1]: 12}


def test_vllm_prefix_cache_counters_give_a_servers_hit_ratio_over_a_run():
    after = cache_counters(parse_metrics(VLLM_METRICS))
    delta = server_cache_delta({"queries": 1000.0, "hits": 500.0}, after)
    assert delta["prompt_tokens"] == 3000 and delta["cached_tokens"] == 2500
    assert delta["kv_cache_usage"] == pytest.approx(0.25)


def test_the_routing_key_is_robot_and_state_version_and_absent_without_a_robot():
    plain = OpenAIResource(OpenAIOptions("http://127.0.0.1:9", check_health=False))
    assert plain.routing_key is None and plain.routing_key_for(3) is None
    keyed = OpenAIResource(OpenAIOptions("http://127.0.0.1:9", name="r2", robot_id="robot_4",
                                         check_health=False))
    assert keyed.routing_key == "robot_4/v0"
    keyed.load((), version=3)            # the run of version 3: its key
    assert keyed.routing_key == "robot_4/v3"
    keyed.extend((), version=3)
    keyed.load(())                       # no version given: the run's version stays
    assert keyed.routing_key == "robot_4/v3"
    # Another client of the same robot (a policy in its own process) keys version 3 the same.
    other = OpenAIResource(OpenAIOptions("http://127.0.0.1:9", name="r1", robot_id="robot_4",
                                         check_health=False))
    assert other.routing_key_for(3) == keyed.routing_key
    assert ROUTING_KEY_HEADER == "X-Session-ID"


@pytest.mark.parametrize("bad", ["robot 1\n", " robot", "roböt"])
def test_a_robot_id_that_cannot_travel_in_a_header_is_refused(bad):
    with pytest.raises(ConfigError, match="robot_id"):
        OpenAIResource(OpenAIOptions("http://127.0.0.1:9", robot_id=bad, check_health=False))
