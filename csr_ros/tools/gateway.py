"""`csr-ros gateway`: serve /v1/chat/completions and /v1/completions in front of the reconciler.

    csr-ros gateway --port 8000                          # local engines in worker processes
    csr-ros gateway --resource openai --r1 URL --r2 URL  # OpenAI-compatible servers
    csr-ros gateway --bench --json out/gateway.json      # TTFT through it against direct
    csr-ros gateway --bench stream                       # first streamed piece against last
    csr-ros gateway --bench tools --requests 100         # valid tool calls, required and auto
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from csr_ros.gateway.service import GatewayConfig
from csr_ros.reconcile.machine import ReconcileConfig
from csr_ros.resources.http_errors import API_KEY_ENV
from csr_ros.stream_defaults import GATEWAY
from csr_ros.tools.options import add_engine_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--host", default="127.0.0.1", help="address to listen on (default: loopback only; "
      "beyond it an API key is needed, or --insecure-no-auth)")
    a("--port", type=int, default=8000)
    a("--api-key", default=os.environ.get(API_KEY_ENV) or None,
      help=f"every request must carry `Authorization: Bearer KEY` (default: ${API_KEY_ENV})")
    a("--insecure-no-auth", action="store_true",
      help="serve beyond loopback without an API key (anyone who reaches the port is served)")
    a("--resource", choices=("local", "openai"), default="local",
      help="local: two in-process engines per session, each in a worker process; openai: "
           "two OpenAI-compatible servers (--r1, --r2), shared by the sessions")
    a("--r1", help="URL of R1 (--resource openai)")
    a("--r2", help="URL of R2 (--resource openai)")
    add_engine_options(parser, "model", "threads", "dtype", helps={
        "model": "model name or directory (default: the embedded one)",
        "threads": "compute threads of each local engine",
        "dtype": "local engine precision (auto, float32, bfloat16)"})
    a("--model-name", default="csr-ros", help="the model id clients send and /v1/models lists")
    a("--background-threads", type=int, default=1,
      help="threads of a local engine while it warms up or catches up")
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
    a("--bench", nargs="?", const="overhead", choices=("overhead", "stream", "tools"),
      help="overhead (the default): TTFT through the gateway against the same queries sent "
           "to the resource; stream: a streamed answer's first piece against its last; "
           "tools: how many tool calls come back valid")
    a("--n", type=int, default=4096, help="--bench: history tokens")
    a("--m", type=int, default=32, help="--bench: dynamic tokens")
    a("--repeats", type=int, default=10, help="--bench: queries per side")
    a("--bench-max-tokens", type=int, default=None,
      help="--bench: tokens per answer (overhead: 1, stream and tools: 64)")
    a("--requests", type=int, default=100, help="--bench tools: requests per tool_choice")
    a("--tool-choices", default="required,auto", help="--bench tools: which, comma-separated")
    a("--json", type=Path, help="--bench: write the figures here")


def run(args: argparse.Namespace) -> int:
    from csr_ros.gateway.app import check_exposure
    from csr_ros.gateway.service import backend_factory

    if not args.bench:
        check_exposure(args.host, args.api_key, insecure_no_auth=args.insecure_no_auth)

    config = GatewayConfig(
        reconcile=ReconcileConfig(tau_mem_tokens=args.tau_mem,
                                  max_context_tokens=args.max_context_tokens,
                                  reserve_tokens=args.reserve_tokens,
                                  n_catchup_tokens=args.n_catchup),
        default_profile=args.profile, max_sessions=args.max_sessions,
        default_max_tokens=args.default_max_tokens, model_name=args.model_name)
    factory = backend_factory(args.resource, model=args.model, r1=args.r1, r2=args.r2,
                              threads=args.threads, background_threads=args.background_threads,
                              dtype=args.dtype, max_context_tokens=args.max_context_tokens,
                              tau_mem_tokens=args.tau_mem)
    if args.bench:
        return _bench(args, config, factory)
    import uvicorn

    from csr_ros.gateway.app import build_app
    from csr_ros.gateway.service import Gateway

    gateway = Gateway(factory, config)
    try:
        print(f"csr-ros gateway: http://{args.host}:{args.port}/v1 ({args.resource}, at most "
              f"{args.max_sessions} sessions, "
              f"{'API key required' if args.api_key else 'no API key'})", file=sys.stderr,
              flush=True)
        uvicorn.run(build_app(gateway, api_key=args.api_key), host=args.host, port=args.port,
                    log_level="warning")
    finally:
        gateway.close()
    return 0


def _bench(args: argparse.Namespace, config: GatewayConfig, factory) -> int:
    progress = lambda message: print(message, file=sys.stderr, flush=True)   # noqa: E731
    if args.bench == "overhead":
        from csr_ros.bench.overhead_bench import format_summary, run_bench

        summary = run_bench(factory, config, n_tokens=args.n, m_tokens=args.m,
                            repeats=args.repeats, max_tokens=args.bench_max_tokens or 1,
                            progress=progress)
    elif args.bench == "stream":
        from csr_ros.bench.client_bench import format_stream, run_stream_bench

        summary = run_stream_bench(factory, config, max_tokens=args.bench_max_tokens or 64,
                                   repeats=args.repeats, progress=progress)
        format_summary = format_stream
    else:
        from csr_ros.bench.client_bench import format_tools, run_tools_bench

        choices = tuple(c.strip() for c in args.tool_choices.split(",") if c.strip())
        summary = run_tools_bench(factory, config, n=args.requests, choices=choices,
                                  max_tokens=args.bench_max_tokens or 64, progress=progress)
        format_summary = format_tools
    summary.update(resource=args.resource, model=args.model, dtype=args.dtype,
                   threads=args.threads, r1=args.r1, argv=sys.argv[1:])
    print(format_summary(summary))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
