"""Robots behind a real vllm-router in front of the session's two real vLLM CPU servers.

The router (vllm-router 0.1.17 in .venv-vllm, from `scripts/setup.sh --vllm`) is started by
each test on a free loopback port and stopped after it. What is asserted holds at any speed:
where requests land (each query finds its robot's committed run in the server's prefix
cache), that no chunk is lost, that swaps land.
"""

from __future__ import annotations

import json
import uuid

import pytest

from csr_ros import cli
from csr_ros.bench.fleet_plan import RUN_KEYS
from csr_ros.layout import Layout
from csr_ros.resources.openai import OpenAIOptions, OpenAIResource
from csr_ros.router import ServerPool, vllm_router_executable
from csr_ros.state import CsrState
from support.vllm_server import BLOCK_SIZE, VLLM_REQUIRED  # vllm_pair: a conftest fixture

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture
def pool(vllm_pair, tmp_path):
    """The session's two vLLM servers as a pool; the router is the test's own."""
    try:
        vllm_router_executable()
    except Exception as exc:
        if VLLM_REQUIRED:
            pytest.fail(f"vllm-router is required here: {exc}")
        pytest.skip(str(exc))
    for server in vllm_pair:
        if not server.running:
            server.start()
    pool = ServerPool.attach("vllm", [s.url for s in vllm_pair], log_dir=tmp_path / "router")
    yield pool
    pool.stop_router()


def test_consistent_hash_on_the_robot_key_keeps_each_robots_run_on_one_server(pool, tokenizer):
    url = pool.start_router("consistent_hash")
    layout = Layout.from_tokenizer(tokenizer)
    n_requests = 0
    for k in range(4):
        # A history no other robot (and no earlier test) has: only the server that holds
        # this robot's committed run can serve it from its cache.
        state = CsrState(tokenizer=tokenizer, layout=layout,
                         profile=f"Robot {uuid.uuid4().hex} of a test fleet, number {k}.")
        for i in range(12):
            state.add(f"odometry {k}.{i}: x={i * 0.25:.2f} m, y={k - i * 0.1:.2f} m, "
                      f"battery {90 - i}%", source="odom")
        with OpenAIResource(OpenAIOptions(url, name="r1", robot_id=f"robot_{k}",
                                          check_health=True)) as res:
            res.load(state.static_ids)
            n_requests += 1
            for q in range(3):
                committed = res.n_committed
                state.add(f"speech {k}.{q}: Alice said please bring the red mug", source="speech")
                request = state.build_request(task="Which action next?")
                result = res.query(request, max_new_tokens=2)
                n_requests += 1
                # every full block of what this role committed before is read from the cache
                assert result.cached_tokens >= (committed // BLOCK_SIZE) * BLOCK_SIZE, \
                    f"robot_{k} query {q} missed its own prefix: {result.cached_tokens} of " \
                    f"{committed} committed tokens cached"
            usage = res.usage_totals()
            assert usage["queries"]["requests"] == 3 and usage["queries"]["without_usage"] == 0
    counts = pool.routing_counts()
    assert sum(counts.values()) >= n_requests
    assert set(counts) == set(pool.worker_urls)


def test_a_small_fleet_behind_the_router_loses_no_chunk_and_its_swaps_land(pool, tmp_path):
    out = tmp_path / "fleet.json"
    code = cli.main(["fleet", "--robots", "2", "--worker-urls", ",".join(pool.worker_urls),
                     "--routing", "consistent_hash", "--duration-s", "240", "--cycles", "1",
                     "--paced", "--tau-mem", "768", "--chunk-rate-hz", "2",
                     "--seed", str(uuid.uuid4().int % 10_000 * 10_000),
                     "--log-dir", str(tmp_path / "logs"), "--json", str(out),
                     "--markdown", str(tmp_path / "fleet.md"), "--plot", str(tmp_path / "f.png")])
    assert code == 0
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert set(RUN_KEYS) <= set(run)
    assert (run["robots"], run["servers"], run["routing"]) == (2, 2, "consistent_hash")
    assert run["chunks_lost"] == 0
    for robot in run["per_robot"]:
        assert robot["chunks_lost"] == 0 and robot["state_consistent"]
        assert robot["swaps"] >= 1, f"{robot['robot_id']}: no swap landed"
        assert robot["failed_queries"] == 0
        # after the swap the queries follow the new key to the server that was warmed
        assert robot["query_cached_tokens"] > 0 and robot["hit_ratio"] > 0.5, robot
    assert sum(run["routing_counts"].values()) > 0
    assert (tmp_path / "f.png").stat().st_size > 0
    assert (tmp_path / "fleet.md").read_text().count("| 2 | 2 | consistent_hash |") == 1
