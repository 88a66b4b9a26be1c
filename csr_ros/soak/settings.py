"""What a soak runs: `SoakSettings`, and the fault kinds it can inject. Pure."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from csr_ros.errors import ConfigError
from csr_ros.model_store import DEFAULT_MODEL
from csr_ros.stream_defaults import DEMO

# Each kind, and what it does (csr_ros.soak.faults injects them).
FAULT_KINDS = {
    "kill_primary": "SIGKILL of the primary's worker process or server, then a restart",
    "kill_secondary": "SIGKILL of the secondary's worker process or server, then a restart",
    "stall": "SIGSTOP of the primary's worker process or server for longer than the query "
             "timeout, then SIGCONT",
    "kill_host": "SIGKILL of the process that holds the state, then a restart from the chunk "
                 "log and the last capsule",
    "disk_full": "the chunk log's file system full (ENOSPC), then freed",
    "clock_jump": "the wall clock the stream and the chunk log read jumps forwards, then back "
                  "(simulated: an offset added where they read it)",
    "malformed": "a burst of malformed sensor messages and chunk payloads (non-UTF-8, empty, "
                 "oversized, NaN) through the aggregator's and the reconciler's entry points",
    "double": "two faults at once: both workers (or servers) killed, or the state's process "
              "killed, while a reconciliation runs",
}
RESOURCES = ("local", "openai")


def parse_faults(text: str) -> tuple[str, ...]:
    """`all`, `none` or a comma list of FAULT_KINDS."""
    text = text.strip()
    if text in ("", "none"):
        return ()
    if text == "all":
        return tuple(FAULT_KINDS)
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise ConfigError(f"unknown fault kinds {unknown}; the kinds are {list(FAULT_KINDS)}, "
                          "or 'all'")
    return kinds


@dataclass(frozen=True)
class SoakSettings:
    """A soak: `robot_hours` of the patrol's sensor stream, `speedup` times faster than wall time
    where the machine keeps up, with faults every `fault_every_s` (wall seconds, seeded)."""
    robot_hours: float = 1.0
    speedup: float = 10.0
    seed: int = 0
    faults: tuple[str, ...] = ()
    fault_every_s: float = 180.0          # mean wall time between faults
    max_faults: int | None = None         # after this many faults the run ends (tests)
    resource: str = "local"               # local: engines in worker processes; openai: servers
    r1: str | None = None                 # openai: the servers' URLs (None: start llama.cpp)
    r2: str | None = None
    server_threads: int = 1               # llama.cpp servers the soak starts
    model: str = DEFAULT_MODEL
    threads: int | None = None            # a local engine's threads (None: min(2, cores))
    background_threads: int = 1
    dtype: str = "auto"
    backend: str = "auto"
    tau_mem_tokens: int = DEMO.tau_mem_tokens
    max_context_tokens: int = DEMO.max_context_tokens
    reserve_tokens: int = DEMO.reserve_tokens
    n_catchup_tokens: int = DEMO.n_catchup_tokens
    max_chunk_tokens: int = 256           # longer chunks are truncated (as the nodes do)
    rate_hz: float = 1.0                  # decisions per wall second (a late one skips ticks)
    keep_up_s: float = 10.0               # a decision slower than this holds robot time
    max_new_tokens: int = DEMO.max_new_tokens
    query_timeout_s: float = 60.0         # a query not answered in this time fails over
    hedge_after_s: float = 2.0            # ... and by this time it is asked on the secondary
                                          # too, where it holds a consistent state (0: never)
    stale_after_s: float = 5.0            # no decision for this long: the robot's watchdog
                                          # holds the safe action (the report's bound per fault)
    op_timeout_s: float = 180.0           # a load or extend not done in this time fails
    capsule_every_s: float = 0.0          # a capsule after every version change (0), or less
    log_fs_mb: int = 512                  # the small file system that holds the chunk log
    retain_bytes: int = 4 * 1024 * 1024   # the chunk log's segments beyond this are archived
    retain_s: float = 6 * 3600.0          # ... and those older than this (wall clock)
    ring_chunks: int = 8192               # what the aggregator can resend after a restart
    recovery_timeout_s: float = 600.0     # a fault not recovered by then is a failure
    probe_every_s: float = 2.0
    progress_every_s: float = 5.0
    workdir: Path | None = None           # None: a temporary directory, removed afterwards
    live_line: bool = True

    def __post_init__(self):
        if self.robot_hours <= 0 or self.speedup <= 0 or self.rate_hz <= 0:
            raise ConfigError("robot_hours, speedup and rate_hz must be > 0")
        if self.resource not in RESOURCES:
            raise ConfigError(f"resource must be one of {RESOURCES}, got {self.resource!r}")
        if (self.r1 is None) != (self.r2 is None):
            raise ConfigError("give both --r1 and --r2, or neither (the soak starts two "
                              "llama.cpp servers)")
        if self.r1 is not None and self.resource != "openai":
            raise ConfigError("--r1/--r2 are servers: use --resource openai")
        if self.max_faults is not None and self.max_faults < 1:
            raise ConfigError(f"max_faults must be >= 1, got {self.max_faults}")
        if self.hedge_after_s < 0 or self.stale_after_s <= 0:
            raise ConfigError("hedge_after_s must be >= 0 (0: never) and stale_after_s > 0")
        if self.fault_every_s <= 0:
            raise ConfigError(f"fault_every_s must be > 0, got {self.fault_every_s}")
        for kind in self.faults:
            if kind not in FAULT_KINDS:
                raise ConfigError(f"unknown fault kind {kind!r}; the kinds are "
                                  f"{list(FAULT_KINDS)}")
        if self.tau_mem_tokens + self.reserve_tokens > self.max_context_tokens:
            raise ConfigError(f"tau_mem_tokens {self.tau_mem_tokens} + reserve_tokens "
                              f"{self.reserve_tokens} exceed max_context_tokens "
                              f"{self.max_context_tokens}")

    @property
    def robot_s(self) -> float:
        return self.robot_hours * 3600.0

    @property
    def allowed_ticks_without_decision(self) -> int:
        """Policy ticks in a row without a decision before the watchdog's safe action."""
        return int(self.stale_after_s * self.rate_hz)

    @property
    def starts_servers(self) -> bool:
        return self.resource == "openai" and self.r1 is None

    def as_json(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(self).items()}
