"""Server processes: start, health, stop, and clear errors when a server never comes up."""

from __future__ import annotations

import sys

import httpx
import pytest

from csr_ros.errors import ResourceTimeoutError, ResourceUnavailableError
from csr_ros.servers import ManagedServer, free_port, wait_healthy

pytestmark = pytest.mark.server


def test_a_server_that_exits_before_it_is_healthy_is_reported_with_its_log(tmp_path):
    port = free_port()
    server = ManagedServer(name="broken", url=f"http://127.0.0.1:{port}",
                           command=[sys.executable, "-c", "print('no model here'); raise SystemExit(3)"],
                           log_path=tmp_path / "broken.log")
    with pytest.raises(ResourceUnavailableError, match=r"exited with status 3(.|\n)*no model here"):
        server.start(timeout_s=30)
    assert not server.running


def test_waiting_for_a_port_nobody_serves_times_out_with_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ResourceTimeoutError, match=url):
        wait_healthy(url, timeout_s=0.5, poll_s=0.1)


def test_the_llamacpp_server_answers_health_and_props_and_stops(fresh_llama_server):
    with httpx.Client(base_url=fresh_llama_server.url, trust_env=False) as client:
        assert client.get("/health").json() == {"status": "ok"}
        props = client.get("/props").json()
        assert props["default_generation_settings"]["n_ctx"] == 8192
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["smollm2"]
    fresh_llama_server.stop()
    assert not fresh_llama_server.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(fresh_llama_server.url + "/health", trust_env=False)
