"""Inference servers as subprocesses: build the command line, start, wait for health, stop.

Two kinds:

- **vLLM** (production, one server per GPU): `vllm serve MODEL --enable-prefix-caching
  --enable-prompt-tokens-details --scheduling-policy priority --max-model-len N`, pinned to a
  GPU with CUDA_VISIBLE_DEVICES. Health: `GET /health` answers 200 once the model is loaded.
- **llama.cpp** through llama-cpp-python (tests, demos, CPU machines): llama-cpp-python's
  OpenAI-compatible app, started by `python -m csr_ros.servers llamacpp ...` so that it also
  answers `GET /health` and `GET /props` (context size under
  ``default_generation_settings.n_ctx``) the way llama.cpp's own `llama-server` does. Its
  `/v1/models` does not report the context size; `/props` is how a client learns it.

The command builders are pure functions (tested without the servers installed); `ManagedServer`
is the thin process wrapper.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from csr_ros.errors import ConfigError, ResourceTimeoutError, ResourceUnavailableError

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)   # health polls would log every request

LOOPBACK = "127.0.0.1"
DEFAULT_LLAMACPP_CONTEXT_TOKENS = 8192


# -- command lines (pure) ------------------------------------------------------------------

def vllm_command(model: str, *, port: int, max_model_len: int, host: str = LOOPBACK,
                 served_model_name: str | None = None, gpu_memory_utilization: float | None = None,
                 api_key_env: str | None = None, prefix_caching: bool = True,
                 prompt_tokens_details: bool = True, priority_scheduling: bool = True,
                 extra_args: Sequence[str] = (), executable: str = "vllm") -> list[str]:
    """`vllm serve` with the flags CSR relies on.

    The API key is never put on the command line (it would show in `ps`): vLLM reads
    VLLM_API_KEY from the environment, see `vllm_env`.
    """
    if max_model_len < 1:
        raise ConfigError(f"max_model_len must be positive, got {max_model_len}")
    cmd = [executable, "serve", model, "--host", host, "--port", str(int(port)),
           "--max-model-len", str(int(max_model_len))]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if prefix_caching:
        cmd.append("--enable-prefix-caching")
    if prompt_tokens_details:
        cmd.append("--enable-prompt-tokens-details")     # usage.prompt_tokens_details.cached_tokens
    if priority_scheduling:
        cmd += ["--scheduling-policy", "priority"]        # warm-up/catch-up yield to queries
    cmd += list(extra_args)
    return cmd


def vllm_env(gpu: str | int, *, api_key_env: str | None = None,
             base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of one vLLM server: pinned to one GPU, API key passed by variable."""
    env = dict(os.environ if base is None else base)
    env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if api_key_env:
        key = env.get(api_key_env)
        if not key:
            raise ConfigError(f"api_key_env={api_key_env!r} is set but that variable is empty")
        env["VLLM_API_KEY"] = key
    return env


def llamacpp_command(model_path: str | Path, *, port: int, host: str = LOOPBACK,
                     n_ctx: int = DEFAULT_LLAMACPP_CONTEXT_TOKENS, n_threads: int = 1,
                     model_alias: str | None = None, python: str | None = None) -> list[str]:
    """llama-cpp-python's OpenAI server (plus /health and /props) as a subprocess.

    The API key, if any, travels in the environment (CSR_ROS_SERVER_API_KEY), not in argv.
    """
    if n_ctx < 1 or n_threads < 1:
        raise ConfigError(f"n_ctx and n_threads must be positive, got {n_ctx}, {n_threads}")
    cmd = [python or sys.executable, "-m", "csr_ros.servers", "llamacpp",
           "--model", str(model_path), "--host", host, "--port", str(int(port)),
           "--n-ctx", str(int(n_ctx)), "--n-threads", str(int(n_threads))]
    if model_alias:
        cmd += ["--model-alias", model_alias]
    return cmd


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now (the usual bind-to-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# -- processes -----------------------------------------------------------------------------

@dataclass
class ManagedServer:
    """One server subprocess. `start()` returns once `GET health_path` answers 200."""

    name: str
    command: list[str]
    url: str
    env: dict[str, str] | None = None
    health_path: str = "/health"
    log_path: Path | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, *, timeout_s: float = 120.0) -> "ManagedServer":
        assert self.process is None or self.process.poll() is not None, f"{self.name} is running"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        log.info("starting %s: %s", self.name, " ".join(self.command))
        try:
            # Own process group, so stop() reaches the workers a server forks (vLLM does).
            self.process = subprocess.Popen(self.command, env=self.env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        except FileNotFoundError:
            raise ConfigError(f"cannot start {self.name}: {self.command[0]!r} not found") from None
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        try:
            wait_healthy(self.url, health_path=self.health_path, timeout_s=timeout_s,
                         process=self.process, log_path=self.log_path)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """Abrupt end (SIGKILL), as a crash would be."""
        if self.running:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, *, timeout_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after timeout_s."""
        if not self.running:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0f s; killing it", self.name, timeout_s)
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> "ManagedServer":
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_healthy(url: str, *, health_path: str = "/health", timeout_s: float = 120.0,
                 process: subprocess.Popen | None = None, log_path: Path | None = None,
                 poll_s: float = 0.25) -> None:
    """Poll `url + health_path` until it answers 200; fail early if the process exits."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last_error = "no answer yet"
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                tail = _log_tail(log_path)
                msg = f"server for {url} exited with status {process.returncode} before it was healthy"
                raise ResourceUnavailableError(msg + (f"; log tail:\n{tail}" if tail else ""))
            try:
                response = client.get(url.rstrip("/") + health_path)
                if response.status_code == 200:
                    return
                last_error = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(poll_s)
    raise ResourceTimeoutError(f"{url}{health_path} not healthy after {timeout_s:.0f} s ({last_error})")


def _log_tail(log_path: Path | None, n_chars: int = 2000) -> str:
    if log_path is None or not Path(log_path).is_file():
        return ""
    return Path(log_path).read_text(errors="replace")[-n_chars:]


# -- the llama-cpp-python server, with /health and /props -----------------------------------

def _llamacpp_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m csr_ros.servers llamacpp")
    parser.add_argument("--model", required=True, help="GGUF file")
    parser.add_argument("--host", default=LOOPBACK)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, default=DEFAULT_LLAMACPP_CONTEXT_TOKENS)
    parser.add_argument("--n-threads", type=int, default=1)
    parser.add_argument("--model-alias", default=None)
    args = parser.parse_args(argv)

    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    model = ModelSettings(model=args.model, model_alias=args.model_alias, n_ctx=args.n_ctx,
                          n_threads=args.n_threads, n_threads_batch=args.n_threads,
                          verbose=False)
    server = ServerSettings(host=args.host, port=args.port,
                            api_key=os.environ.get("CSR_ROS_SERVER_API_KEY") or None)
    app = create_app(server_settings=server, model_settings=[model])
    alias = args.model_alias or args.model

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/props")
    def props() -> dict:
        # The shape llama.cpp's llama-server uses, so one client code path reads both.
        return {"model_alias": alias, "model_path": args.model, "total_slots": 1,
                "default_generation_settings": {"n_ctx": args.n_ctx}}

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "llamacpp":
        print("usage: python -m csr_ros.servers llamacpp --model GGUF --port N [...]",
              file=sys.stderr)
        return 2
    return _llamacpp_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
