"""A long-lived CPU engine's heap: bounded per-shape kernel caches, freed pages given back.

On a CPU with native bf16, torch runs bf16 matmuls through oneDNN, which JIT-compiles kernels
for each matrix shape and keeps them in two LRU caches, each of 1024 entries by default:
oneDNN's primitive cache (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`) and torch's own cache of oneDNN
operators (`LRU_CACHE_CAPACITY`). A prefill block of M tokens is a new shape for every new M,
and a robot's chunks, catch-ups and dynamic parts come in hundreds of lengths. Measured with
the embedded model in bf16 on a 2-core Xeon with AMX: each new M cost about 2.8 MB, 300
lengths cost 848 MB, and a second pass over the same lengths cost nothing. So a worker's RSS
climbed for hours until the caches filled. float32 on CPU runs another GEMM library and shows
no such growth. The side-by-side figures come from `python -m csr_ros.bench.heap_bench`.

`bound_shape_caches` sets both capacities to `SHAPE_CACHE_CAPACITY`, unless the environment
already sets them. That keeps the shapes every query repeats (one-token decode steps, the usual
dynamic part) hot, and bounds the rest. Evicting and re-creating kernels frees memory in pieces
glibc keeps, so a `HeapTrimmer` gives freed pages back (`malloc_trim`) at most once per
`interval_s`, after committed work. It never runs on the query path. Both libraries read the
capacities when they make their first kernel, so the package sets them on import, before any
engine runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable, MutableMapping

from csr_ros.errors import ConfigError

SHAPE_CACHE_CAPACITY = 64
SHAPE_CACHE_ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
TRIM_INTERVAL_S = 10.0


def bound_shape_caches(environ: MutableMapping[str, str] | None = None,
                       capacity: int = SHAPE_CACHE_CAPACITY) -> dict[str, str]:
    """Set each kernel-cache capacity that `environ` (default os.environ) leaves unset.

    Returns the capacities in effect, the user's own included.
    """
    if capacity < 1:    # torch's LRU cache crashes the process at 0
        raise ConfigError(f"capacity must be >= 1, got {capacity}")
    env = os.environ if environ is None else environ
    for name in SHAPE_CACHE_ENV:
        env.setdefault(name, str(capacity))
    return {name: env[name] for name in SHAPE_CACHE_ENV}


def _malloc_trim() -> Callable[[], bool] | None:
    """glibc's malloc_trim(0), or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: bool(trim(0))


class HeapTrimmer:
    """Give freed heap pages back to the OS, at most once per `interval_s` of `clock`."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 trim: Callable[[], bool] | None = None):
        if interval_s <= 0:
            raise ConfigError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self._clock = clock
        self._trim = trim if trim is not None else _malloc_trim()
        self._last_s: float | None = None
        self.n_trims = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe_trim(self) -> bool:
        """Trim if `interval_s` has passed since the last trim (or none ran); True if it ran."""
        if self._trim is None:
            return False
        now_s = self._clock()
        if self._last_s is not None and now_s - self._last_s < self.interval_s:
            return False
        self._last_s = now_s
        self._trim()
        self.n_trims += 1
        return True
