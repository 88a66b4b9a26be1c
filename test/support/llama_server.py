"""A real OpenAI-compatible server for tests: llama-cpp-python serving the SmolLM2 GGUF.

    def test_something(llama_server):      # the fixtures are test/conftest.py's
        resource = make_resource("openai", url=llama_server.url)

`llama_server` is one server per test session (loopback, a free port, n_ctx 8192, one
thread; defined once, in conftest.py: imported into several modules it would be one per
module); `fresh_llama_server` is one per test, for tests that kill and restart it;
`llama_server_pair` is two per test (R1 and R2 for ASR). Each is a csr_ros.servers
ManagedServer, built by the library's one llama.cpp recipe (`llamacpp_server`): `kill()` and
`start()` keep its port. All skip with the reason when llama-cpp-python or the model is not
installed.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from csr_ros.servers import ManagedServer, free_port, llamacpp_server, serving

N_CTX_TOKENS = 8192
THREADS = int(os.environ.get("CSR_ROS_TEST_THREADS", "1"))
MODEL_ALIAS = "smollm2"


def make_llama_server(log_path: Path, *, n_ctx: int = N_CTX_TOKENS,
                api_key: str | None = None) -> ManagedServer:
    """One server of the SmolLM2 GGUF on a free loopback port (not started)."""
    return llamacpp_server(_gguf_or_skip(), port=free_port(), n_ctx=n_ctx, n_threads=THREADS,
                           model_alias=MODEL_ALIAS, api_key=api_key, log_path=log_path)


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
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    with serving([make_llama_server(log_path)]) as (server,):
        yield server


@pytest.fixture
def fresh_llama_server(tmp_path):
    with serving([make_llama_server(tmp_path / "server.log")]) as (server,):
        yield server


@pytest.fixture
def llama_server_with_key(tmp_path):
    """One server that requires the API key `test-key`."""
    server = make_llama_server(tmp_path / "server.log", api_key="test-key")
    with serving([server]):
        yield server


@pytest.fixture
def llama_server_pair(tmp_path):
    """Two servers (R1, R2) on two free ports, for ASR over HTTP, started one after the other."""
    servers = [make_llama_server(tmp_path / f"server{i}.log") for i in (1, 2)]
    with serving(servers, together=False) as pair:
        yield pair
