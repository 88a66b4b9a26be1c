"""`csr-ros serve`: start the inference servers, wait until healthy, stop them on Ctrl-C.

    csr-ros serve vllm --config config/vllm.yaml     two vLLM servers, R1 on GPU 0, R2 on GPU 1
    csr-ros serve vllm --config config/vllm_cpu.yaml two vLLM CPU servers, half the cores each
    csr-ros serve llamacpp --port 8001 [--port 8002]  llama.cpp (llama-cpp-python) on this CPU

The servers are csr_ros.servers' recipes (`vllm_servers`, `llamacpp_servers`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import tempfile
import threading
from pathlib import Path

from csr_ros.servers import (DEFAULT_LLAMACPP_CONTEXT_TOKENS, LOOPBACK, ManagedServer,
                             llamacpp_servers, load_vllm_config, start_all, stop_all,
                             vllm_servers)

log = logging.getLogger(__name__)


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
    if args.kind == "vllm":
        config = load_vllm_config(args.config)
        if args.log_dir is None and not args.dry_run:
            # vLLM's log is where the progress of a first start (a compile of minutes) shows.
            args.log_dir = Path(tempfile.mkdtemp(prefix="csr-ros-vllm-"))
        servers = vllm_servers(config, log_dir=args.log_dir)
        together = config.device == "cpu"   # disjoint cores; GPU loads peak in host memory
    else:
        servers = llamacpp_servers(args.port or [8001], model=args.model, n_ctx=args.n_ctx,
                                   threads=args.threads, host=args.host,
                                   alias=args.alias or Path(args.model).name.removesuffix(".gguf"),
                                   log_dir=args.log_dir)
        together = False
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
    return serve(servers, together=together, timeout_s=args.timeout_s)


def serve(servers: list[ManagedServer], *, together: bool, timeout_s: float | None) -> int:
    """Start `servers`, then keep them until Ctrl-C or SIGTERM (1 if one of them exits)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        start_all(servers, together=together, timeout_s=timeout_s,
                  progress=lambda message: print(message, flush=True))
        print("serving; Ctrl-C stops", flush=True)
        while not stop.wait(1.0):
            for server in servers:
                if not server.running:
                    log.error("%s exited (status %s)", server.name, server.process.returncode)
                    return 1
    except KeyboardInterrupt:
        pass
    finally:
        stop_all(servers)
    return 0
