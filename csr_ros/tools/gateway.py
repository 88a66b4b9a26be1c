"""`csr-ros gateway`: serve /v1/chat/completions and /v1/completions in front of the reconciler.

    csr-ros gateway --port 8000                          # local engines in worker processes
    csr-ros gateway --resource openai --r1 URL --r2 URL  # OpenAI-compatible servers
    csr-ros gateway --bench --json out/gateway.json      # TTFT through it against direct
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from csr_ros.errors import ConfigError
from csr_ros.gateway.service import Backend, GatewayConfig
from csr_ros.reconcile.machine import ReconcileConfig
from csr_ros.stream_defaults import GATEWAY

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    a("--port", type=int, default=8000)
    a("--resource", choices=("local", "openai"), default="local",
      help="local: two in-process engines per session, each in a worker process; openai: "
           "two OpenAI-compatible servers (--r1, --r2), shared by the sessions")
    a("--r1", help="URL of R1 (--resource openai)")
    a("--r2", help="URL of R2 (--resource openai)")
    a("--model", default="smollm2", help="model name or directory (default: the embedded one)")
    a("--model-name", default="csr-ros", help="the model id clients send and /v1/models lists")
    a("--threads", type=int, default=None, help="compute threads of each local engine")
    a("--background-threads", type=int, default=1,
      help="threads of a local engine while it warms up or catches up")
    a("--dtype", default="auto", help="local engine precision (auto, float32, bfloat16)")
    a("--max-context-tokens", type=int, default=GATEWAY.max_context_tokens)
    a("--tau-mem", type=int, default=GATEWAY.tau_mem_tokens,
      help="history tokens that start an eviction")
    a("--reserve-tokens", type=int, default=GATEWAY.reserve_tokens,
      help="dynamic part + answer of one query; also the largest max_tokens")
    a("--n-catchup", type=int, default=GATEWAY.n_catchup_tokens)
    a("--max-sessions", type=int, default=4,
      help="sessions held at once; a new one closes the least recently used idle one")
    a("--default-max-tokens", type=int, default=GATEWAY.max_new_tokens)
    a("--profile", default="You are a helpful assistant.",
      help="the system message of a chat that sends none")
    a("--bench", action="store_true",
      help="measure TTFT through the gateway against the same queries sent to the resource")
    a("--n", type=int, default=4096, help="--bench: history tokens")
    a("--m", type=int, default=32, help="--bench: dynamic tokens")
    a("--repeats", type=int, default=10, help="--bench: queries per side")
    a("--bench-max-tokens", type=int, default=1, help="--bench: tokens per answer")
    a("--json", type=Path, help="--bench: write the figures here")


def run(args: argparse.Namespace) -> int:
    config = GatewayConfig(
        reconcile=ReconcileConfig(tau_mem_tokens=args.tau_mem,
                                  max_context_tokens=args.max_context_tokens,
                                  reserve_tokens=args.reserve_tokens,
                                  n_catchup_tokens=args.n_catchup),
        default_profile=args.profile, max_sessions=args.max_sessions,
        default_max_tokens=args.default_max_tokens, model_name=args.model_name)
    factory = backend_factory(args)
    if args.bench:
        return _bench(args, config, factory)
    import uvicorn

    from csr_ros.gateway.app import build_app
    from csr_ros.gateway.service import Gateway

    gateway = Gateway(factory, config)
    try:
        print(f"csr-ros gateway: http://{args.host}:{args.port}/v1 ({args.resource}, at most "
              f"{args.max_sessions} sessions)", file=sys.stderr, flush=True)
        uvicorn.run(build_app(gateway), host=args.host, port=args.port, log_level="warning")
    finally:
        gateway.close()
    return 0


def backend_factory(args: argparse.Namespace):
    """session key -> Backend: two fresh resources named r1 and r2, and their tokenizer."""
    from csr_ros.model_store import resolve_model_dir

    model_dir = resolve_model_dir(args.model, weights=False)
    if args.resource == "openai":
        if not args.r1 or not args.r2:
            raise ConfigError("--resource openai needs --r1 URL and --r2 URL")
        from csr_ros.resources.factory import make_resource

        def openai_backend(key: str) -> Backend:
            resources = [make_resource("openai", url=url, name=name, model_dir=model_dir,
                                       max_context_tokens=args.max_context_tokens,
                                       tau_mem_tokens=args.tau_mem)
                         for url, name in ((args.r1, "r1"), (args.r2, "r2"))]
            return Backend(resources, resources[0].tokenizer, resources[0].state_mode)

        return openai_backend
    from csr_ros.resources.process import start_side_by_side
    from csr_ros.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(model_dir)
    threads = args.threads or min(2, os.cpu_count() or 1)

    def local_backend(key: str) -> Backend:
        resources = start_side_by_side(("r1", "r2"), "local", model=args.model,
                                       threads=threads, dtype=args.dtype,
                                       background_threads=args.background_threads,
                                       max_context_tokens=args.max_context_tokens)
        return Backend(resources, tokenizer, "token")

    return local_backend


def _bench(args: argparse.Namespace, config: GatewayConfig, factory) -> int:
    from csr_ros.gateway.overhead_bench import SESSION, format_summary, run_bench

    if args.n + args.m + config.reconcile.reserve_tokens > args.max_context_tokens:
        raise ConfigError(f"--n {args.n} + --m {args.m} + --reserve-tokens do not fit in "
                          f"--max-context-tokens {args.max_context_tokens}")
    if args.n >= args.tau_mem:
        raise ConfigError(f"--n {args.n} must stay below --tau-mem {args.tau_mem}: the bench "
                          "measures queries, not evictions")
    summary = run_bench(factory(SESSION), config, n_tokens=args.n, m_tokens=args.m,
                        repeats=args.repeats, max_tokens=args.bench_max_tokens,
                        progress=lambda message: print(message, file=sys.stderr, flush=True))
    summary.update(resource=args.resource, model=args.model, dtype=args.dtype,
                   threads=args.threads, r1=args.r1, argv=sys.argv[1:])
    print(format_summary(summary))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
