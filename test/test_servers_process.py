"""Server processes: start, health, stop, clear errors when a server never comes up or its port
is taken, and no server left running once whoever started it is killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from csr_ros.errors import PortInUseError, ResourceTimeoutError, ResourceUnavailableError
from csr_ros.servers import ManagedServer, free_port, port_holder, wait_healthy
from csr_ros.soak.probes import alive
from support.llama_server import _gguf_or_skip
from support.waiting import wait_for

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "csr_ros.cli"]


def _http_server(port: int) -> ManagedServer:
    """The standard library's HTTP server as a stand-in that starts in a moment."""
    return ManagedServer(name="http", url=f"http://127.0.0.1:{port}", health_path="/",
                         command=[sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                                  str(port)])


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


def test_sigkill_of_csr_ros_serve_leaves_no_server_process_and_frees_the_port(tmp_path):
    _gguf_or_skip()
    port = free_port()
    with open(tmp_path / "serve.out", "wb") as out:
        serve = subprocess.Popen(CLI + ["serve", "llamacpp", "--port", str(port)], cwd=ROOT,
                                 stdout=out, stderr=subprocess.STDOUT)
    server_pid = None
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=300, process=serve)
        server_pid, command = port_holder(port)
        assert server_pid != serve.pid and "csr_ros.servers llamacpp" in command
        serve.send_signal(signal.SIGKILL)       # as an OOM killer or a crashed supervisor would
        serve.wait()
        wait_for(lambda: not alive(server_pid), timeout_s=30, what="the server to end")
        wait_for(lambda: port_holder(port) is None, timeout_s=30, what="the port to be free")
    finally:
        serve.kill()
        if alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)


def test_csr_ros_serve_on_a_taken_port_is_refused_naming_the_port_and_its_holder():
    _gguf_or_skip()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(CLI + ["serve", "llamacpp", "--port", str(port)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"port {port} is already in use (pid {os.getpid()}: " in done.stderr
    assert "healthy" not in done.stdout + done.stderr


def test_a_taken_port_is_refused_before_any_process_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = _http_server(taken.getsockname()[1])
        with pytest.raises(PortInUseError, match=rf"port {server.port} .*pid {os.getpid()}"):
            server.start(timeout_s=30)
    assert server.process is None


def test_a_server_started_from_a_thread_that_has_ended_keeps_serving():
    # The parent-death signal follows the forking thread, not the process: a server started
    # from a short-lived thread (a fault's, a request's) must outlive that thread.
    server, thread_ids = _http_server(free_port()), []
    thread = threading.Thread(target=lambda: (thread_ids.append(threading.get_native_id()),
                                              server.start(timeout_s=60)))
    thread.start()
    thread.join()
    try:
        wait_for(lambda: not Path(f"/proc/self/task/{thread_ids[0]}").exists(),
                 what="the starting thread to be gone")
        assert httpx.get(server.url, trust_env=False).status_code == 200
        assert server.running
    finally:
        server.stop()
