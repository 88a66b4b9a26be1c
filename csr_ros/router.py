"""A pool of inference servers behind vLLM's router (`vllm-router`, PyPI 0.1.17), as processes.

    pool = ServerPool.start("vllm", n_servers=2, log_dir=...)      # P servers, each on its cores
    pool.start_router("consistent_hash")                           # one URL for the whole pool
    ...  OpenAIResource(OpenAIOptions(pool.router_url, robot_id="robot_0", ...))
    pool.routing_counts()          # requests the router sent to each server (its /metrics)
    pool.stop()

The router is `vllm-router --worker-urls URL... --policy POLICY --host 127.0.0.1 --port N
--prometheus-port M`: a Rust binary in a Python wheel, installed beside vLLM in .venv-vllm
(`scripts/setup.sh --vllm`). Its policies, as its documentation and its 0.1.17 binary say:

- `round_robin`, `random`, `power_of_two`: no affinity;
- `cache_aware`: a radix tree of the request *text* per worker; a request goes to the worker
  whose tree matches most of it when the match rate passes `--cache-threshold`, else to the
  worker with the smallest tree, unless the load is imbalanced (`--balance-abs-threshold`,
  `--balance-rel-threshold`), when it goes to the least loaded;
- `consistent_hash`: a hash ring over a key read from the request: the `X-Session-ID` header
  first (then `X-User-ID`, `X-Tenant-ID`, ..., the body's `session_params.session_id`, `user`),
  falling back to a hash of the whole body. OpenAIResource(robot_id=...) sends that header.

Routing counts come from the router's Prometheus endpoint
(`vllm_router_processed_requests_total{worker=...}`), parsed with prometheus_client; memory per
server is the resident memory of its process group (psutil). The pool's servers are
csr_ros.servers' recipes (its vLLM servers: config/vllm_cpu.yaml's, with the overrides of
`vllm_pool_server`). The command builders and the metric readers are pure; `ServerPool` is the
thin process wrapper.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from csr_ros.errors import ConfigError
from csr_ros.servers import (DEFAULT_LLAMACPP_CONTEXT_TOKENS, LOOPBACK, ManagedServer,
                             cpu_vllm_config, free_port, llamacpp_server, split_cores, start_all,
                             vllm_server)

log = logging.getLogger(__name__)

ROUTER_POLICIES = ("cache_aware", "round_robin", "consistent_hash", "power_of_two", "random")
ENGINES = ("vllm", "llamacpp")
ROUTER_ENV = "CSR_ROS_VLLM_ROUTER"             # the vllm-router executable, where not found
_VENV_VLLM_ROUTER = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "vllm-router"
ROUTED_COUNTER = "vllm_router_processed_requests"   # prometheus_client drops the `_total`
SERVED_MODEL_NAME = "smollm2"        # the llama.cpp servers' alias, as the vLLM recipe's name
# A pool's vLLM server serves K robots: each may have a decision and a warm-up or a straggler in
# flight (docs/fleet_at_scale.md), so it takes more sequences at once than the recipe's R1/R2.
POOL_MAX_NUM_SEQS = 8


def vllm_pool_server(model_dir: str, *, port: int, cpus: str, kv_cache_gib: float,
                     n_ctx: int | None = None, base_env: dict[str, str] | None = None,
                     name: str | None = None, log_path: Path | None = None) -> ManagedServer:
    """One vLLM CPU server of a pool: config/vllm_cpu.yaml's recipe, but with its KV cache in
    bytes (`--kv-cache-memory-bytes`), so that a pool can be short of memory by a fraction of a
    GiB (VLLM_CPU_KVCACHE_SPACE, whole GiB, would override it and is left out), with
    POOL_MAX_NUM_SEQS, and with stats on: the fleet reads each server's prefix-cache counters
    from its /metrics, which vLLM fills only when it keeps stats."""
    if not kv_cache_gib > 0:
        raise ConfigError(f"kv_cache_gib must be positive, got {kv_cache_gib}")
    recipe = cpu_vllm_config()
    return vllm_server(recipe, port=port, name=name, cpus=cpus, log_path=log_path,
                       env_base=base_env, model=str(model_dir),
                       max_model_len=n_ctx or recipe.max_model_len,
                       kv_cache_gib=None, kv_cache_bytes=int(kv_cache_gib * 2**30),
                       max_num_seqs=POOL_MAX_NUM_SEQS, disable_log_stats=False)


def vllm_router_executable() -> str:
    """$CSR_ROS_VLLM_ROUTER, else .venv-vllm/bin/vllm-router, else `vllm-router` on PATH."""
    explicit = os.environ.get(ROUTER_ENV)
    if explicit:
        return explicit
    if _VENV_VLLM_ROUTER.is_file():
        return str(_VENV_VLLM_ROUTER)
    found = shutil.which("vllm-router")
    if found is None:
        raise ConfigError("vllm-router is not installed: run `bash scripts/setup.sh --vllm` "
                          f"(it goes into .venv-vllm), or set ${ROUTER_ENV}")
    return found


def router_command(worker_urls: Sequence[str], *, port: int, policy: str,
                   prometheus_port: int | None = None, host: str = LOOPBACK,
                   cache_threshold: float | None = None,
                   balance_abs_threshold: int | None = None,
                   balance_rel_threshold: float | None = None,
                   startup_timeout_s: int = 300, executable: str | None = None,
                   extra_args: Sequence[str] = ()) -> list[str]:
    """vllm-router's command line for a regular (not prefill/decode) pool."""
    if policy not in ROUTER_POLICIES:
        raise ConfigError(f"routing policy must be one of {ROUTER_POLICIES}, got {policy!r}")
    if not worker_urls:
        raise ConfigError("a router needs at least one worker URL")
    cmd = [executable or vllm_router_executable(), "--worker-urls", *worker_urls,
           "--policy", policy, "--host", host, "--port", str(int(port)),
           "--worker-startup-timeout-secs", str(int(startup_timeout_s)),
           "--log-level", "warning"]
    if prometheus_port is not None:
        cmd += ["--prometheus-host", host, "--prometheus-port", str(int(prometheus_port))]
    if cache_threshold is not None:
        cmd += ["--cache-threshold", str(cache_threshold)]
    if balance_abs_threshold is not None:
        cmd += ["--balance-abs-threshold", str(int(balance_abs_threshold))]
    if balance_rel_threshold is not None:
        cmd += ["--balance-rel-threshold", str(balance_rel_threshold)]
    return cmd + list(extra_args)


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition → (sample name, labels, value), via prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def routed_per_worker(samples: list[tuple[str, dict[str, str], float]],
                      worker_urls: Sequence[str]) -> dict[str, int]:
    """Requests the router sent to each of `worker_urls` (0 for one it never chose)."""
    counts = {url: 0 for url in worker_urls}
    for name, labels, value in samples:
        if name not in (ROUTED_COUNTER, ROUTED_COUNTER + "_total"):
            continue
        worker = labels.get("worker") or labels.get("worker_url") or ""
        for url in worker_urls:
            if worker.rstrip("/") == url.rstrip("/"):
                counts[url] += int(value)
    return counts


def process_group_rss_bytes(pgid: int) -> int:
    """Resident memory of every live process in group `pgid` (a server and its workers)."""
    import psutil

    total = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                total += proc.memory_info().rss
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return total


# -- processes -----------------------------------------------------------------------------

@dataclass
class ServerPool:
    """P servers (vLLM CPU or llama.cpp) and, once started, a router in front of them."""

    engine: str
    servers: list[ManagedServer]
    log_dir: Path
    router: ManagedServer | None = None
    metrics_url: str | None = None
    _router_starts: int = field(default=0, repr=False)

    @property
    def worker_urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def router_url(self) -> str:
        assert self.router is not None, "start_router() first"
        return self.router.url

    @classmethod
    def start(cls, engine: str, n_servers: int, *, log_dir: Path, kv_cache_gib: float = 1,
              n_ctx: int | None = None, timeout_s: float = 1800.0,
              progress=None) -> "ServerPool":
        """Start `n_servers` on free loopback ports, each on its own cores, all at once.

        `kv_cache_gib`: each vLLM server's KV cache, any size that holds one `n_ctx` sequence
        (a fraction of a GiB models a pool short of memory). `n_ctx` (tokens): default, the
        vLLM recipe's max_model_len, or llama.cpp's default context."""
        if engine not in ENGINES:
            raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
        if n_servers < 1:
            raise ConfigError(f"a pool needs at least one server, got {n_servers}")
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        if engine == "vllm":
            from csr_ros.model_store import resolve_model_dir

            model_dir = resolve_model_dir(weights=True)
            n_cores = len(os.sched_getaffinity(0))
            cores = split_cores(n_cores, n_servers) if n_cores >= n_servers \
                else [str(i % n_cores) for i in range(n_servers)]
            servers = [vllm_pool_server(str(model_dir), port=free_port(), cpus=cpus,
                                        kv_cache_gib=kv_cache_gib, n_ctx=n_ctx,
                                        name=f"vllm-{i}", log_path=log_dir / f"vllm-{i}.log")
                       for i, cpus in enumerate(cores)]
        else:
            from csr_ros.model_store import default_gguf_path

            gguf = default_gguf_path()
            servers = [llamacpp_server(gguf, port=free_port(), model_alias=SERVED_MODEL_NAME,
                                       n_ctx=n_ctx or DEFAULT_LLAMACPP_CONTEXT_TOKENS,
                                       name=f"llamacpp-{i}",
                                       log_path=log_dir / f"llamacpp-{i}.log")
                       for i in range(n_servers)]
        start_all(servers, timeout_s=timeout_s, progress=progress)
        return cls(engine=engine, servers=servers, log_dir=log_dir)

    @classmethod
    def attach(cls, engine: str, worker_urls: Sequence[str], *, log_dir: Path) -> "ServerPool":
        """Servers someone else started (not stopped here; their memory is not read)."""
        if engine not in ENGINES:
            raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
        if not worker_urls:
            raise ConfigError("give at least one worker URL")
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        servers = [ManagedServer(name=f"{engine}-{i}", url=url.rstrip("/"), command=[])
                   for i, url in enumerate(worker_urls)]
        return cls(engine=engine, servers=servers, log_dir=log_dir)

    def start_router(self, policy: str, *, timeout_s: float = 120.0, **options) -> str:
        """(Re)start the router with `policy` in front of the pool; returns its URL.

        A new router starts with empty routing state and zeroed counters."""
        self.stop_router()
        port, metrics_port = free_port(), free_port()
        self._router_starts += 1
        self.router = ManagedServer(
            name=f"vllm-router-{policy}", url=f"http://{LOOPBACK}:{port}",
            log_path=self.log_dir / f"router-{self._router_starts}-{policy}.log",
            command=router_command(self.worker_urls, port=port, policy=policy,
                                   prometheus_port=metrics_port, **options))
        self.router.start(timeout_s=timeout_s)
        self.metrics_url = f"http://{LOOPBACK}:{metrics_port}/metrics"
        return self.router.url

    def router_metrics(self) -> list[tuple[str, dict[str, str], float]]:
        return parse_metrics(_get_text(self.metrics_url)) if self.metrics_url else []

    def routing_counts(self) -> dict[str, int]:
        """Requests the router has sent to each server since it started."""
        return routed_per_worker(self.router_metrics(), self.worker_urls)

    def server_metrics(self) -> dict[str, list[tuple[str, dict[str, str], float]]]:
        """Each vLLM server's own /metrics (prefix-cache counters); {} for llama.cpp."""
        if self.engine != "vllm":
            return {}
        return {s.url: parse_metrics(_get_text(s.url + "/metrics")) for s in self.servers}

    def memory_bytes(self) -> dict[str, int]:
        """Resident memory of each server's process group."""
        return {s.url: process_group_rss_bytes(s.process.pid) for s in self.servers
                if s.running}

    def stop_router(self) -> None:
        if self.router is not None:
            self.router.stop()
        self.router = None
        self.metrics_url = None

    def stop(self) -> None:
        self.stop_router()
        for server in self.servers:
            server.stop(timeout_s=30.0)

    def __enter__(self) -> "ServerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _get_text(url: str) -> str:
    import httpx

    from csr_ros.errors import ResourceUnavailableError

    try:
        response = httpx.get(url, timeout=10.0, trust_env=False)
    except httpx.HTTPError as exc:
        raise ResourceUnavailableError(f"cannot read {url} ({type(exc).__name__}: {exc})") \
            from None
    if response.status_code != 200:
        raise ResourceUnavailableError(f"{url} answered HTTP {response.status_code}")
    return response.text
