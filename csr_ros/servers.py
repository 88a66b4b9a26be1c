"""Inference servers as subprocesses: one recipe per server, started, checked for health, stopped.

    config = load_vllm_config("config/vllm_cpu.yaml")     # or cpu_vllm_config()
    server = vllm_server(config, port=8001, cpus="0")       # a ManagedServer, not started
    server.command, server.env                              # what `serve --dry-run` prints
    with serving([server]): ...                             # started, healthy, then stopped

Two kinds, each built in one place: vLLM (`vllm_server`, its settings a `VllmConfig` read
from YAML; config/vllm_cpu.yaml is the one source of the CPU flags) and llama.cpp through
llama-cpp-python (`llamacpp_server`, started as `python -m csr_ros.servers llamacpp ...` so
that it also answers `GET /health` and `GET /props` as `llama-server` does). Their command
lines, flags and health checks: docs/openai_and_vllm.md.

The recipes and command builders are pure (tested without the servers installed);
`vllm_server` and `llamacpp_server` are the factories every user calls; `ManagedServer` is the
thin process wrapper. A server it starts ends with the process that started it, even one killed
with SIGKILL (the kernel's parent-death signal), and a port another process holds is refused
with that process's pid and command line before anything waits for health
(docs/openai_and_vllm.md, "Server processes").
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterator, Sequence
from urllib.parse import urlsplit

from csr_ros.cpu import bf16_flags
from csr_ros.errors import (ConfigError, PortInUseError, ResourceTimeoutError,
                            ResourceUnavailableError)
from csr_ros.waiting import wait_until

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)   # health polls would log every request

LOOPBACK = "127.0.0.1"
DEFAULT_LLAMACPP_CONTEXT_TOKENS = 8192
LLAMACPP_API_KEY_ENV = "CSR_ROS_SERVER_API_KEY"   # the key reaches the server here, not in argv

VLLM_API_SERVER = "vllm.entrypoints.openai.api_server"
VLLM_DEVICES = ("cuda", "cpu")
# The vLLM interpreter when a config does not name one: $CSR_ROS_VLLM_PYTHON, else the
# .venv-vllm that `scripts/setup.sh --vllm` makes beside the project's .venv, else this one.
VLLM_PYTHON_ENV = "CSR_ROS_VLLM_PYTHON"
_ROOT = Path(__file__).resolve().parents[1]
_VLLM_VENV_PYTHON = _ROOT / ".venv-vllm" / "bin" / "python"


def _shipped_config(name: str) -> Path:
    """config/NAME of a source checkout, else of a colcon install (share/csr_ros/config)."""
    here = Path(__file__).resolve().parents
    candidates = [_ROOT / "config" / name]
    if len(here) > 4:    # <prefix>/lib/pythonX.Y/site-packages/csr_ros/servers.py
        candidates.append(here[4] / "share" / "csr_ros" / "config" / name)
    return next((path for path in candidates if path.is_file()), candidates[0])


VLLM_CPU_CONFIG = _shipped_config("vllm_cpu.yaml")


# -- the vLLM recipe (config/vllm.yaml, config/vllm_cpu.yaml) ----------------------------------

@dataclass(frozen=True)
class VllmServerSpec:
    name: str
    port: int
    gpu: str | None = None         # device "cuda": CUDA_VISIBLE_DEVICES
    cpus: str | None = None        # device "cpu": VLLM_CPU_OMP_THREADS_BIND ("0", "2-3");
                                   # None: an even share of the cores (`vllm_servers`)


@dataclass(frozen=True)
class VllmConfig:
    """How vLLM servers run: every field is a key of the YAML file. `servers` names the ones
    `csr-ros serve` starts; the rest is the recipe each server runs with. Bad values raise
    ConfigError here, so an override (`dataclasses.replace`) is checked as the file is."""

    model: str                             # a hub id, a model directory, or "smollm2"
    max_model_len: int
    servers: tuple[VllmServerSpec, ...] = ()
    served_model_name: str | None = None
    host: str = LOOPBACK
    device: str = "cuda"
    gpu_memory_utilization: float | None = None
    dtype: str | None = None               # "auto" on CPU: bfloat16 only where native
    kv_cache_gib: int | None = None        # CPU: VLLM_CPU_KVCACHE_SPACE (whole GiB)
    kv_cache_bytes: int | None = None      # --kv-cache-memory-bytes: any size, not with the above
    block_size: int | None = None
    enforce_eager: bool = False
    max_num_seqs: int | None = None
    disable_log_stats: bool = False
    prefix_caching: bool = True
    prompt_tokens_details: bool = True
    priority_scheduling: bool = True
    compact_json: bool = True
    python: str | None = None              # the interpreter with vLLM (default: vllm_python())
    api_key_env: str | None = None
    health_timeout_s: float = 1800.0
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.device not in VLLM_DEVICES:
            raise ConfigError(f"device must be one of {VLLM_DEVICES}, got {self.device!r}")
        for name in ("max_model_len", "block_size", "kv_cache_gib", "kv_cache_bytes",
                     "max_num_seqs"):
            value = getattr(self, name)
            if value is None and name != "max_model_len":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or value != int(value) or value < 1:
                why = (" of GiB >= 1 (vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer)"
                       if name == "kv_cache_gib" else " >= 1")
                raise ConfigError(f"{name} must be a whole number{why}, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.kv_cache_gib is not None and self.kv_cache_bytes is not None:
            raise ConfigError("give kv_cache_gib or kv_cache_bytes, not both "
                              "(VLLM_CPU_KVCACHE_SPACE would override the bytes)")
        if len({s.port for s in self.servers}) != len(self.servers):
            raise ConfigError("two servers share a port")
        object.__setattr__(self, "extra_args", tuple(str(a) for a in self.extra_args))


_CONFIG_KEYS = {f.name for f in fields(VllmConfig)}


def load_vllm_config(path: str | Path) -> VllmConfig:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no vLLM config at {path} (see config/vllm.yaml, "
                          "config/vllm_cpu.yaml)")
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return parse_vllm_config(raw, source=str(path))


def cpu_vllm_config() -> VllmConfig:
    """config/vllm_cpu.yaml, the one source of the vLLM CPU flags: `csr-ros serve` runs it as
    it is; the router's pool and the test servers start from it and override what they must."""
    return load_vllm_config(VLLM_CPU_CONFIG)


def parse_vllm_config(raw: dict, *, source: str = "config") -> VllmConfig:
    unknown = sorted(set(raw) - _CONFIG_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; known: {sorted(_CONFIG_KEYS)}")
    for key in ("model", "max_model_len", "servers"):
        if key not in raw:
            raise ConfigError(f"{source}: '{key}' is required")
    device = str(raw.get("device") or "cuda")
    entries = list(raw["servers"] or [])
    if not entries:
        raise ConfigError(f"{source}: 'servers' lists no server")
    servers = []
    for i, entry in enumerate(entries):
        try:
            cpus = entry.get("cpus") if device != "cuda" else None
            servers.append(VllmServerSpec(
                name=str(entry.get("name", f"r{i + 1}")), port=int(entry["port"]),
                gpu=str(entry["gpu"]) if device == "cuda" else None,
                cpus=str(cpus) if cpus is not None else None))
        except (KeyError, TypeError, ValueError, AttributeError):
            need = "'port' and 'gpu'" if device == "cuda" else "'port' (and optionally 'cpus')"
            raise ConfigError(f"{source}: servers[{i}] needs {need}, got {entry!r}") from None
    values = {k: v for k, v in raw.items() if v is not None}
    values |= {"model": str(raw["model"]), "servers": tuple(servers), "device": device}
    if values.get("dtype") == "auto" and device == "cpu":
        values["dtype"] = cpu_dtype()
    try:
        return VllmConfig(**values)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


# -- command lines and environments (pure) -------------------------------------------------

def vllm_python() -> str:
    """The Python that has vLLM installed (see VLLM_PYTHON_ENV)."""
    explicit = os.environ.get(VLLM_PYTHON_ENV)
    if explicit:
        return explicit
    return str(_VLLM_VENV_PYTHON) if _VLLM_VENV_PYTHON.is_file() else sys.executable


def vllm_command(config: VllmConfig, *, port: int, model: str | None = None) -> list[str]:
    """vLLM's OpenAI-compatible server with the flags CSR relies on, as `config` says
    (`model`: the path to serve where `config.model` is a name, see `vllm_model_path`).

    `python -m vllm.entrypoints.openai.api_server --model M`: the same server as `vllm serve M`,
    and it also runs where the `vllm` console script does not (vllm-cpu 0.32.0's looks up its
    own metadata under the name `vllm` and fails). The API key is never put on the command
    line (it would show in `ps`): vLLM reads VLLM_API_KEY from the environment (`vllm_env`).
    """
    c = config
    cmd = [c.python or vllm_python(), "-m", VLLM_API_SERVER, "--model", str(model or c.model),
           "--host", c.host, "--port", str(int(port)), "--max-model-len", str(c.max_model_len)]
    if c.served_model_name:
        cmd += ["--served-model-name", c.served_model_name]
    if c.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
    if c.dtype:
        cmd += ["--dtype", c.dtype]
    if c.block_size is not None:
        cmd += ["--block-size", str(c.block_size)]        # the unit of prefix-cache hits
    if c.prefix_caching:
        cmd.append("--enable-prefix-caching")
    if c.prompt_tokens_details:
        cmd.append("--enable-prompt-tokens-details")     # usage.prompt_tokens_details.cached_tokens
    if c.priority_scheduling:
        cmd += ["--scheduling-policy", "priority"]        # warm-up/catch-up yield to queries
    if c.compact_json:
        # JSON actions without free whitespace: a server-wide setting (vLLM 0.32 ignores it per
        # request) that needs a named backend. With whitespace allowed, SmolLM2 put a newline
        # between every token of a decision and ran out of budget before the action was
        # complete. guidance (llguidance) is the backend the request bodies are checked with.
        cmd += ["--structured-outputs-config",
                '{"backend": "guidance", "disable_any_whitespace": true}']
    if c.enforce_eager:
        cmd.append("--enforce-eager")
    if c.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(c.max_num_seqs)]
    if c.disable_log_stats:
        cmd.append("--disable-log-stats")
    if c.kv_cache_bytes is not None:
        cmd += ["--kv-cache-memory-bytes", str(c.kv_cache_bytes)]
    return cmd + list(c.extra_args)


def vllm_env(config: VllmConfig, *, gpu: str | int | None = None, cpus: str | None = None,
             base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of one vLLM server, API key passed by variable.

    GPU: pinned to one device with CUDA_VISIBLE_DEVICES. CPU (`cpus` given, e.g. "0" or
    "0-3"): its OpenMP threads bound to those cores (VLLM_CPU_OMP_THREADS_BIND), so two
    servers on one machine do not compete for the same cores, and a KV cache of
    `config.kv_cache_gib` GiB (VLLM_CPU_KVCACHE_SPACE; the CPU backend has no memory fraction).
    """
    env = dict(os.environ if base is None else base)
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus)
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if config.kv_cache_bytes is not None:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)     # whole GiB, and it would override the bytes
    elif config.kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_gib)
    if config.api_key_env:
        key = env.get(config.api_key_env)
        if not key:
            raise ConfigError(f"api_key_env={config.api_key_env!r} is set but that variable "
                              "is empty")
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

    The API key, if any, travels in the environment (LLAMACPP_API_KEY_ENV), not in argv.
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


def _client_url(host: str, port: int) -> str:
    """Where a client on this machine reaches a server bound to `host` (0.0.0.0: loopback)."""
    return f"http://{LOOPBACK if host in ('0.0.0.0', '::') else host}:{int(port)}"


# -- the factories: one server of each kind, not started -------------------------------------

def vllm_model_path(model: str) -> str:
    """'smollm2' (the embedded default) is its converted directory; anything else as given."""
    from csr_ros.model_store import DEFAULT_MODEL, resolve_model_dir

    if model in (DEFAULT_MODEL, "default"):
        return str(resolve_model_dir(model, weights=True))
    return model


def vllm_server(config: VllmConfig | None = None, *, port: int, name: str | None = None,
                gpu: str | int | None = None, cpus: str | None = None,
                log_path: Path | None = None, env_base: dict[str, str] | None = None,
                **overrides: Any) -> ManagedServer:
    """One vLLM server as `config` (default: `cpu_vllm_config()`) runs it, pinned to GPU `gpu`
    or to cores `cpus`. `overrides` are VllmConfig fields (model, max_model_len, dtype, ...)
    that this use must set otherwise; they are checked as the file's values are."""
    config = config or cpu_vllm_config()
    unknown = sorted(set(overrides) - _CONFIG_KEYS)
    if unknown:
        raise ConfigError(f"not vLLM settings: {unknown}; known: {sorted(_CONFIG_KEYS)}")
    config = replace(config, **overrides)
    return ManagedServer(
        name=name or f"vllm:{port}", url=_client_url(config.host, port), log_path=log_path,
        command=vllm_command(config, port=port, model=vllm_model_path(config.model)),
        env=vllm_env(config, gpu=gpu, cpus=cpus, base=env_base),
        health_timeout_s=config.health_timeout_s,
        stop_timeout_s=30.0,              # a loaded vLLM's workers take a while to exit
        parent_death_signal=signal.SIGTERM)   # so that it ends its engine processes itself


def vllm_servers(config: VllmConfig, *, env_base: dict[str, str] | None = None,
                 log_dir: Path | None = None, n_cores: int | None = None) -> list[ManagedServer]:
    """One server per entry of `config.servers`; a CPU server without `cpus` gets an even
    share of the `n_cores` (default: this process's cores)."""
    shares: list[str | None] = [None] * len(config.servers)
    if config.device == "cpu" and any(s.cpus is None for s in config.servers):
        shares = split_cores(n_cores or len(os.sched_getaffinity(0)), len(config.servers))
    config = replace(config, model=vllm_model_path(config.model))    # converted once for all
    return [vllm_server(config, port=spec.port, name=spec.name, gpu=spec.gpu,
                        cpus=spec.cpus or share, env_base=env_base,
                        log_path=(log_dir / f"{spec.name}.log") if log_dir else None)
            for spec, share in zip(config.servers, shares)]


def llamacpp_server(gguf: str | Path, *, port: int, host: str = LOOPBACK,
                    n_ctx: int = DEFAULT_LLAMACPP_CONTEXT_TOKENS, n_threads: int = 1,
                    model_alias: str | None = None, api_key: str | None = None,
                    name: str | None = None, log_path: Path | None = None,
                    python: str | None = None) -> ManagedServer:
    """One llama-cpp-python server of the GGUF file `gguf`; `api_key`, when given, is required
    of every client and reaches the server through its environment."""
    return ManagedServer(
        name=name or f"llama.cpp:{port}", url=_client_url(host, port), log_path=log_path,
        command=llamacpp_command(gguf, port=port, host=host, n_ctx=n_ctx, n_threads=n_threads,
                                 model_alias=model_alias, python=python),
        env={**os.environ, LLAMACPP_API_KEY_ENV: api_key} if api_key else None)


def llamacpp_servers(ports: Sequence[int], *, model: str, n_ctx: int, threads: int,
                     host: str = LOOPBACK, alias: str = "smollm2",
                     log_dir: Path | None = None) -> list[ManagedServer]:
    """One server per port of `model` ('smollm2', a prepared catalog model or a .gguf file)."""
    from csr_ros.model_store import resolve_gguf

    gguf = resolve_gguf(model)       # a catalog model is served as its verified joined GGUF
    if not gguf.is_file():
        raise ConfigError(f"{gguf} is not a GGUF file")
    return [llamacpp_server(gguf, port=port, host=host, n_ctx=n_ctx, n_threads=threads,
                            model_alias=alias,
                            log_path=(log_dir / f"llamacpp-{port}.log") if log_dir else None)
            for port in ports]


# -- processes -----------------------------------------------------------------------------

@dataclass
class ManagedServer:
    """One server subprocess. `start()` returns once `GET health_path` answers 200; a timeout
    not given is the server's own (`health_timeout_s`, `stop_timeout_s`). The server gets
    `parent_death_signal` when this process dies, however it dies (SIGKILL for a server with no
    processes of its own; vLLM takes SIGTERM, which it answers by ending its engine's)."""

    name: str
    command: list[str]
    url: str
    env: dict[str, str] | None = None
    health_path: str = "/health"
    log_path: Path | None = None
    health_timeout_s: float = 120.0
    stop_timeout_s: float = 15.0
    parent_death_signal: int = signal.SIGKILL
    process: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, *, timeout_s: float | None = None, progress=None) -> "ManagedServer":
        """Launch, then wait for health (`progress(message)` every so often while waiting)."""
        self.launch()
        return self.wait(timeout_s=timeout_s, progress=progress)

    @property
    def port(self) -> int:
        return urlsplit(self.url).port

    def launch(self) -> "ManagedServer":
        """Start the process and return at once (`wait` for health); PortInUseError if another
        process holds the port."""
        assert self.process is None or self.process.poll() is not None, f"{self.name} is running"
        check_port_free(self.port, host=urlsplit(self.url).hostname)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        log.info("starting %s: %s", self.name, " ".join(self.command))
        try:
            # Own process group, so stop() reaches the workers a server forks (vLLM does).
            self.process = _spawn(self.command, env=self.env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  preexec_fn=_dies_with_parent(self.parent_death_signal))
        except FileNotFoundError:
            raise ConfigError(f"cannot start {self.name}: {self.command[0]!r} not found") from None
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        return self

    def wait(self, *, timeout_s: float | None = None, progress=None) -> "ManagedServer":
        """Until `GET health_path` answers 200; the server is stopped if it never does."""
        try:
            wait_healthy(self.url, health_path=self.health_path,
                         timeout_s=self.health_timeout_s if timeout_s is None else timeout_s,
                         process=self.process, log_path=self.log_path, progress=progress)
            holder = port_holder(self.port)   # the answer was ours, not that of a process
            if holder is not None and _session(holder[0]) != self.pid:  # that took the port
                raise PortInUseError(f"{self.name}: port {self.port} is held by pid "
                                     f"{holder[0]} ({holder[1]}), not by the server started")
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never launched"
        return self.process.pid

    def kill(self) -> None:
        """Abrupt end (SIGKILL), as a crash would be."""
        if self.running:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, *, timeout_s: float | None = None) -> None:
        """SIGTERM the process group, SIGKILL what is left after timeout_s."""
        if not self.running:
            return
        timeout_s = self.stop_timeout_s if timeout_s is None else timeout_s
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


# -- a child that ends with this process; who holds a port -----------------------------------

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl     # resolved here, not in a forked child
# The kernel sends the parent-death signal when the *thread* that forked the child ends, so
# every server is forked by this one thread, which lives as long as the process: a server
# started from a short-lived thread (a fault's, a request's) would otherwise die with it.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="csr-spawn")


def _spawn(command: list[str], **popen: Any) -> subprocess.Popen:
    return _spawner.submit(subprocess.Popen, command, **popen).result()


def _dies_with_parent(sig: int):
    """preexec_fn: `sig` to the child once this process is gone (PR_SET_PDEATHSIG; kept across
    exec, so a Rust or C server gets it too), and an exit if it is gone already."""
    parent = os.getpid()

    def preexec() -> None:
        _prctl(_PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def port_holder(port: int) -> tuple[int, str] | None:
    """The process listening on TCP `port` here, as (pid, command line); None when none
    listens or its owner cannot be seen (another user's process, without root)."""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:            # sl local_address rem_address st ... uid timeout inode
            f = row.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port and f[9] != "0":
                sockets.add(f"socket:[{f[9]}]")
    if not sockets:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fd_dir = f"/proc/{pid}/fd"
            if any(os.readlink(f"{fd_dir}/{fd}") in sockets for fd in os.listdir(fd_dir)):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                return int(pid), " ".join(a.decode(errors="replace") for a in argv if a)
        except OSError:
            continue                # gone meanwhile, or not ours to read
    return None


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def check_port_free(port: int, host: str | None = LOOPBACK) -> None:
    """PortInUseError naming the port and the process that holds it, if a server could not
    bind it now (a socket in TIME_WAIT does not count: servers bind with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET6 if host and ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or LOOPBACK, port))
            return
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    holder = port_holder(port)
    who = (f"pid {holder[0]}: {holder[1]}" if holder else
           "a process this user cannot see, or a socket that does not listen")
    raise PortInUseError(f"port {port} is already in use ({who}); stop it or choose another "
                         "port")


def start_all(servers: Sequence[ManagedServer], *, together: bool = True,
              timeout_s: float | None = None, progress=None) -> None:
    """Start `servers` and wait until each is healthy: `together`, all launched at once (CPU
    servers on disjoint cores), else one after the other (each GPU load peaks in host memory).
    `progress(message)` hears each one healthy. A failure stops them all before it is raised."""
    try:
        if together:
            for server in servers:
                server.launch()
        for server in servers:
            if not together:
                server.launch()
            server.wait(timeout_s=timeout_s, progress=progress)
            if progress is not None:
                progress(f"{server.name}: healthy at {server.url}")
    except BaseException:
        stop_all(servers)
        raise


def stop_all(servers: Sequence[ManagedServer]) -> None:
    for server in reversed(servers):
        server.stop()


@contextmanager
def serving(servers: Sequence[ManagedServer], **start: Any) -> Iterator[list[ManagedServer]]:
    """`start_all(servers, **start)` for the length of a `with` block, `stop_all` after it."""
    start_all(servers, **start)
    try:
        yield list(servers)
    finally:
        stop_all(servers)


def wait_healthy(url: str, *, health_path: str = "/health", timeout_s: float = 120.0,
                 process: subprocess.Popen | None = None, log_path: Path | None = None,
                 poll_s: float = 0.25, progress=None, progress_every_s: float = 15.0) -> None:
    """Poll `url + health_path` until it answers 200; fail early if the process exits.

    `progress(message)`, when given, is called every `progress_every_s` with the time waited
    and the last line of the server's log (a first vLLM start compiles for minutes).
    """
    import httpx

    started = time.monotonic()
    next_progress = started + progress_every_s
    last_error = "no answer yet"
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        def healthy() -> bool:
            nonlocal next_progress, last_error
            if progress is not None and time.monotonic() >= next_progress:
                next_progress += progress_every_s
                line = _last_log_line(log_path)
                progress(f"{url}: starting, {time.monotonic() - started:.0f} s"
                         + (f"; log: {line}" if line else ""))
            if process is not None and process.poll() is not None:
                tail = _log_tail(log_path)
                msg = (f"server for {url} exited with status {process.returncode} before it "
                       "was healthy")
                raise ResourceUnavailableError(msg + (f"; log tail:\n{tail}" if tail else ""))
            try:
                response = client.get(url.rstrip("/") + health_path)
                if response.status_code == 200:
                    return True
                last_error = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            return False
        if wait_until(healthy, timeout_s, interval_s=poll_s):
            return
    raise ResourceTimeoutError(f"{url}{health_path} not healthy after {timeout_s:.0f} s "
                               f"({last_error})")


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
                            api_key=os.environ.get(LLAMACPP_API_KEY_ENV) or None)
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
    usage = "usage: python -m csr_ros.servers llamacpp --model GGUF --port N [...]"
    if argv in (["-h"], ["--help"]):
        print(f"{usage}\n\nllama.cpp's server, ended with the process that started it "
              "(`python -m csr_ros.servers llamacpp --help`: its options)")
        return 0
    if not argv or argv[0] != "llamacpp":
        print(usage, file=sys.stderr)
        return 2
    return _llamacpp_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
