"""`csr-ros serve`: start the inference servers, wait until healthy, stop them on Ctrl-C.

    csr-ros serve vllm --config config/vllm.yaml     two vLLM servers, R1 on GPU 0, R2 on GPU 1
    csr-ros serve llamacpp --port 8001 [--port 8002]  llama.cpp (llama-cpp-python) on this CPU
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from csr_ros.errors import ConfigError
from csr_ros.servers import (DEFAULT_LLAMACPP_CONTEXT_TOKENS, LOOPBACK, ManagedServer,
                             llamacpp_command, vllm_command, vllm_env)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmServerSpec:
    name: str
    port: int
    gpu: str


@dataclass(frozen=True)
class VllmConfig:
    model: str
    max_model_len: int
    servers: tuple[VllmServerSpec, ...]
    served_model_name: str | None = None
    host: str = LOOPBACK
    gpu_memory_utilization: float | None = None
    api_key_env: str | None = None
    health_timeout_s: float = 1800.0
    extra_args: tuple[str, ...] = ()


def load_vllm_config(path: str | Path) -> VllmConfig:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no vLLM config at {path} (see config/vllm.yaml)")
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return parse_vllm_config(raw, source=str(path))


def parse_vllm_config(raw: dict, *, source: str = "config") -> VllmConfig:
    known = {"model", "max_model_len", "servers", "served_model_name", "host",
             "gpu_memory_utilization", "api_key_env", "health_timeout_s", "extra_args"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; known: {sorted(known)}")
    for key in ("model", "max_model_len", "servers"):
        if key not in raw:
            raise ConfigError(f"{source}: '{key}' is required")
    servers = []
    for i, entry in enumerate(raw["servers"] or []):
        try:
            servers.append(VllmServerSpec(name=str(entry.get("name", f"r{i + 1}")),
                                          port=int(entry["port"]), gpu=str(entry["gpu"])))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(f"{source}: servers[{i}] needs 'port' and 'gpu', "
                              f"got {entry!r}") from None
    if not servers:
        raise ConfigError(f"{source}: 'servers' lists no server")
    if len({s.port for s in servers}) != len(servers):
        raise ConfigError(f"{source}: two servers share a port")
    try:
        max_model_len = int(raw["max_model_len"])
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: max_model_len must be an integer") from None
    return VllmConfig(model=str(raw["model"]), max_model_len=max_model_len,
                      servers=tuple(servers), served_model_name=raw.get("served_model_name"),
                      host=str(raw.get("host") or LOOPBACK),
                      gpu_memory_utilization=raw.get("gpu_memory_utilization"),
                      api_key_env=raw.get("api_key_env"),
                      health_timeout_s=float(raw.get("health_timeout_s") or 1800.0),
                      extra_args=tuple(str(a) for a in raw.get("extra_args") or ()))


def vllm_servers(config: VllmConfig, *, env_base: dict[str, str] | None = None,
                 log_dir: Path | None = None) -> list[ManagedServer]:
    """One ManagedServer per configured GPU (nothing started)."""
    client_host = LOOPBACK if config.host in ("0.0.0.0", "::") else config.host
    return [ManagedServer(
        name=spec.name,
        command=vllm_command(config.model, port=spec.port, host=config.host,
                             max_model_len=config.max_model_len,
                             served_model_name=config.served_model_name,
                             gpu_memory_utilization=config.gpu_memory_utilization,
                             extra_args=config.extra_args),
        env=vllm_env(spec.gpu, api_key_env=config.api_key_env, base=env_base),
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


def run(args: argparse.Namespace) -> int:
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    if args.kind == "vllm":
        config = load_vllm_config(args.config)
        servers = vllm_servers(config, log_dir=args.log_dir)
        timeout_s = args.timeout_s or config.health_timeout_s
    else:
        servers = llamacpp_servers(args.port or [8001], model=args.model, n_ctx=args.n_ctx,
                                   threads=args.threads, host=args.host,
                                   alias=args.alias or Path(args.model).name.removesuffix(".gguf"),
                                   log_dir=args.log_dir)
        timeout_s = args.timeout_s or 120.0
    if args.dry_run:
        for server in servers:
            gpu = (server.env or {}).get("CUDA_VISIBLE_DEVICES")
            prefix = f"CUDA_VISIBLE_DEVICES={gpu} " if gpu is not None else ""
            print(f"{server.name}: {prefix}{' '.join(server.command)}")
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started: list[ManagedServer] = []
    try:
        for server in servers:           # one after the other: each load peaks in memory
            started.append(server.start(timeout_s=timeout_s))
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
