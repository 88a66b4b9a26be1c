"""`csr-ros serve`: start the inference servers, wait until healthy, stop them on Ctrl-C.

    csr-ros serve vllm --config config/vllm.yaml     two vLLM servers, R1 on GPU 0, R2 on GPU 1
    csr-ros serve vllm --config config/vllm_cpu.yaml two vLLM CPU servers, half the cores each
    csr-ros serve llamacpp --port 8001 [--port 8002]  llama.cpp (llama-cpp-python) on this CPU
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from csr_ros.errors import ConfigError
from csr_ros.servers import (DEFAULT_LLAMACPP_CONTEXT_TOKENS, LOOPBACK, VLLM_DEVICES,
                             ManagedServer, cpu_dtype, llamacpp_command, split_cores,
                             vllm_command, vllm_env)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmServerSpec:
    name: str
    port: int
    gpu: str | None = None         # device "cuda": CUDA_VISIBLE_DEVICES
    cpus: str | None = None        # device "cpu": VLLM_CPU_OMP_THREADS_BIND ("0", "2-3")


@dataclass(frozen=True)
class VllmConfig:
    model: str
    max_model_len: int
    servers: tuple[VllmServerSpec, ...]
    served_model_name: str | None = None
    host: str = LOOPBACK
    device: str = "cuda"
    gpu_memory_utilization: float | None = None
    dtype: str | None = None               # "auto" on CPU: bfloat16 only where native
    kv_cache_gib: int | None = None        # CPU: VLLM_CPU_KVCACHE_SPACE (GiB)
    block_size: int | None = None
    priority_scheduling: bool = True
    python: str | None = None              # the interpreter with vLLM (default: vllm_python())
    api_key_env: str | None = None
    health_timeout_s: float = 1800.0
    extra_args: tuple[str, ...] = ()


_KNOWN_KEYS = {"model", "max_model_len", "servers", "served_model_name", "host", "device",
               "gpu_memory_utilization", "dtype", "kv_cache_gib", "block_size",
               "priority_scheduling", "python", "api_key_env", "health_timeout_s", "extra_args"}


def load_vllm_config(path: str | Path) -> VllmConfig:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no vLLM config at {path} (see config/vllm.yaml, "
                          "config/vllm_cpu.yaml)")
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return parse_vllm_config(raw, source=str(path))


def parse_vllm_config(raw: dict, *, source: str = "config",
                      n_cores: int | None = None) -> VllmConfig:
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; known: {sorted(_KNOWN_KEYS)}")
    for key in ("model", "max_model_len", "servers"):
        if key not in raw:
            raise ConfigError(f"{source}: '{key}' is required")
    device = str(raw.get("device") or "cuda")
    if device not in VLLM_DEVICES:
        raise ConfigError(f"{source}: device must be one of {VLLM_DEVICES}, got {device!r}")
    entries = list(raw["servers"] or [])
    if not entries:
        raise ConfigError(f"{source}: 'servers' lists no server")
    default_cpus = (split_cores(n_cores or len(os.sched_getaffinity(0)), len(entries))
                    if device == "cpu" else [None] * len(entries))
    servers = []
    for i, entry in enumerate(entries):
        try:
            name, port = str(entry.get("name", f"r{i + 1}")), int(entry["port"])
            if device == "cuda":
                spec = VllmServerSpec(name=name, port=port, gpu=str(entry["gpu"]))
            else:
                cpus = entry.get("cpus")
                spec = VllmServerSpec(name=name, port=port,
                                      cpus=str(cpus) if cpus is not None else default_cpus[i])
        except (KeyError, TypeError, ValueError, AttributeError):
            need = "'port' and 'gpu'" if device == "cuda" else "'port' (and optionally 'cpus')"
            raise ConfigError(f"{source}: servers[{i}] needs {need}, got {entry!r}") from None
        servers.append(spec)
    if len({s.port for s in servers}) != len(servers):
        raise ConfigError(f"{source}: two servers share a port")
    try:
        max_model_len = int(raw["max_model_len"])
        block_size = int(raw["block_size"]) if raw.get("block_size") is not None else None
        kv_cache_gib = int(raw["kv_cache_gib"]) if raw.get("kv_cache_gib") is not None else None
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: max_model_len, block_size and kv_cache_gib must be "
                          "integers") from None
    dtype = raw.get("dtype")
    if dtype == "auto" and device == "cpu":
        dtype = cpu_dtype()
    return VllmConfig(model=str(raw["model"]), max_model_len=max_model_len,
                      servers=tuple(servers), served_model_name=raw.get("served_model_name"),
                      host=str(raw.get("host") or LOOPBACK), device=device,
                      gpu_memory_utilization=raw.get("gpu_memory_utilization"),
                      dtype=str(dtype) if dtype else None, kv_cache_gib=kv_cache_gib,
                      block_size=block_size,
                      priority_scheduling=bool(raw.get("priority_scheduling", True)),
                      python=raw.get("python"), api_key_env=raw.get("api_key_env"),
                      health_timeout_s=float(raw.get("health_timeout_s") or 1800.0),
                      extra_args=tuple(str(a) for a in raw.get("extra_args") or ()))


def vllm_model_path(model: str) -> str:
    """'smollm2' (the embedded default) is its converted directory; anything else as given."""
    from csr_ros.model_store import DEFAULT_MODEL, resolve_model_dir

    if model in (DEFAULT_MODEL, "default"):
        return str(resolve_model_dir(model, weights=True))
    return model


def vllm_servers(config: VllmConfig, *, env_base: dict[str, str] | None = None,
                 log_dir: Path | None = None) -> list[ManagedServer]:
    """One ManagedServer per configured GPU or set of cores (nothing started)."""
    client_host = LOOPBACK if config.host in ("0.0.0.0", "::") else config.host
    model = vllm_model_path(config.model)
    return [ManagedServer(
        name=spec.name,
        command=vllm_command(model, port=spec.port, host=config.host,
                             max_model_len=config.max_model_len,
                             served_model_name=config.served_model_name,
                             gpu_memory_utilization=config.gpu_memory_utilization,
                             dtype=config.dtype, block_size=config.block_size,
                             priority_scheduling=config.priority_scheduling,
                             extra_args=config.extra_args, python=config.python),
        env=vllm_env(spec.gpu, cpus=spec.cpus, kv_cache_gib=config.kv_cache_gib,
                     api_key_env=config.api_key_env, base=env_base),
        url=f"http://{client_host}:{spec.port}",
        log_path=(log_dir / f"{spec.name}.log") if log_dir else None)
        for spec in config.servers]


def llamacpp_servers(ports: list[int], *, model: str, n_ctx: int, threads: int,
                     host: str = LOOPBACK, alias: str = "smollm2",
                     log_dir: Path | None = None) -> list[ManagedServer]:
    from csr_ros.model_store import resolve_gguf

    gguf = resolve_gguf(model)       # a catalog model is served as its verified joined GGUF
    if not gguf.is_file():
        raise ConfigError(f"{gguf} is not a GGUF file")
    return [ManagedServer(name=f"llama.cpp:{port}", url=f"http://{host}:{port}",
                          command=llamacpp_command(gguf, port=port, host=host, n_ctx=n_ctx,
                                                   n_threads=threads, model_alias=alias),
                          log_path=(log_dir / f"llamacpp-{port}.log") if log_dir else None)
            for port in ports]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=["vllm", "llamacpp"])
    parser.add_argument("--config", default="config/vllm.yaml", help="vllm: the YAML config")
    parser.add_argument("--port", type=int, action="append",
                        help="llamacpp: port to serve on (repeat for several servers; "
                             "default 8001)")
    parser.add_argument("--host", default=LOOPBACK, help="llamacpp: listen address")
    parser.add_argument("--model", default="smollm2",
                        help="llamacpp: 'smollm2' (embedded default), a prepared catalog "
                             "model (csr-ros model list) or a .gguf file")
    parser.add_argument("--alias", default=None,
                        help="llamacpp: the model id clients send (default: the --model name, "
                             "or the .gguf file's name without .gguf)")
    parser.add_argument("--n-ctx", type=int, default=DEFAULT_LLAMACPP_CONTEXT_TOKENS,
                        help="llamacpp: context size in tokens")
    parser.add_argument("--threads", type=int, default=1, help="llamacpp: threads per server")
    parser.add_argument("--log-dir", type=Path, default=None, help="server logs go here")
    parser.add_argument("--timeout-s", type=float, default=None,
                        help="how long to wait for /health (default: config, or 120 s)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands and environment, start nothing")


_SHOWN_ENV = ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE")


def run(args: argparse.Namespace) -> int:
    parallel = False
    if args.kind == "vllm":
        config = load_vllm_config(args.config)
        if args.log_dir is None and not args.dry_run:
            # vLLM's log is where the progress of a first start (a compile of minutes) shows.
            args.log_dir = Path(tempfile.mkdtemp(prefix="csr-ros-vllm-"))
        servers = vllm_servers(config, log_dir=args.log_dir)
        timeout_s = args.timeout_s or config.health_timeout_s
        parallel = config.device == "cpu"   # disjoint cores; GPU loads peak in host memory
    else:
        servers = llamacpp_servers(args.port or [8001], model=args.model, n_ctx=args.n_ctx,
                                   threads=args.threads, host=args.host,
                                   alias=args.alias or Path(args.model).name.removesuffix(".gguf"),
                                   log_dir=args.log_dir)
        timeout_s = args.timeout_s or 120.0
    if args.dry_run:
        for server in servers:
            env = server.env or {}
            shown = [f"{k}={env[k]}" for k in _SHOWN_ENV
                     if k in env and (env[k] or k != "CUDA_VISIBLE_DEVICES")]
            print(f"{server.name}: {' '.join(shown + server.command)}")
        return 0
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
        print(f"server logs in {args.log_dir}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started: list[ManagedServer] = []

    def say(message: str) -> None:
        print(message, flush=True)

    try:
        if parallel:
            for server in servers:
                started.append(server.launch())
            for server in servers:
                server.wait(timeout_s=timeout_s, progress=say)
                print(f"{server.name}: healthy at {server.url}", flush=True)
        else:
            for server in servers:       # one after the other: each load peaks in memory
                started.append(server)
                server.start(timeout_s=timeout_s, progress=say)
                print(f"{server.name}: healthy at {server.url}", flush=True)
        print("serving; Ctrl-C stops", flush=True)
        while not stop.wait(1.0):
            for server in started:
                if not server.running:
                    log.error("%s exited (status %s)", server.name, server.process.returncode)
                    return 1
    except KeyboardInterrupt:
        pass
    finally:
        for server in reversed(started):
            server.stop()
    return 0
