"""A real OpenAI-compatible server for tests: llama-cpp-python serving the SmolLM2 GGUF.

    def test_something(llama_server):      # the fixtures are test/conftest.py's
        resource = make_resource("openai", url=llama_server.url)

`llama_server` is one server per test session (loopback, a free port, n_ctx 8192, one
thread; defined once, in conftest.py: imported into several modules it would be one per
module); `fresh_llama_server` is one per test, for tests that kill and restart it;
`llama_server_pair` is two per test (R1 and R2 for ASR). All skip with the reason when
llama-cpp-python or the model is not installed.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from csr_ros.servers import LOOPBACK, ManagedServer, free_port, llamacpp_command

N_CTX_TOKENS = 8192
THREADS = int(os.environ.get("CSR_ROS_TEST_THREADS", "1"))
MODEL_ALIAS = "smollm2"


class LlamaServer:
    """A handle on one server process; `kill()` and `start()` keep the same port."""

    def __init__(self, gguf: Path, log_path: Path, *, api_key: str | None = None):
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = log_path
        self._server = ManagedServer(
            name=f"llama.cpp:{self.port}", url=self.url, log_path=log_path,
            env={**os.environ, "CSR_ROS_SERVER_API_KEY": api_key} if api_key else None,
            command=llamacpp_command(gguf, port=self.port, n_ctx=N_CTX_TOKENS,
                                     n_threads=THREADS, model_alias=MODEL_ALIAS))

    def start(self) -> "LlamaServer":
        self._server.start(timeout_s=120.0)
        return self

    def kill(self) -> None:
        self._server.kill()

    def stop(self) -> None:
        self._server.stop()

    @property
    def running(self) -> bool:
        return self._server.running

    @property
    def pid(self) -> int:
        return self._server.process.pid


def _gguf_or_skip() -> Path:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed: pip install 'llama-cpp-python[server]'")
    for module in ("uvicorn", "fastapi", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"llama-cpp-python's server extra is missing ({module}): "
                        "pip install 'llama-cpp-python[server]'")
    from csr_ros.errors import ModelNotFoundError
    from csr_ros.model_store import default_gguf_path

    try:
        return default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    server = LlamaServer(_gguf_or_skip(), tmp_path_factory.mktemp("llama") / "server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fresh_llama_server(tmp_path):
    server = LlamaServer(_gguf_or_skip(), tmp_path / "server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def llama_server_with_key(tmp_path):
    """One server that requires the API key `test-key`."""
    server = LlamaServer(_gguf_or_skip(), tmp_path / "server.log", api_key="test-key")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def llama_server_pair(tmp_path):
    """Two servers (R1, R2) on two free ports, for ASR over HTTP."""
    gguf = _gguf_or_skip()
    servers = [LlamaServer(gguf, tmp_path / f"server{i}.log") for i in (1, 2)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()
