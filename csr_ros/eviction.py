"""Eviction policies as plain functions of the chunk token counts.

Each returns how many of the oldest chunks to drop. The prefix is never a chunk, so it is
never evicted. Policies are looked up by name from configuration via `POLICIES`.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from csr_ros.errors import ConfigError


def drop_oldest_fraction(chunk_tokens: Sequence[int], fraction: float = 0.5) -> int:
    """Drop the oldest `fraction` of the chunks (the CSR paper drops half)."""
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"eviction fraction must be in (0, 1], got {fraction}")
    return min(len(chunk_tokens), math.ceil(len(chunk_tokens) * fraction))


def keep_recent_tokens(chunk_tokens: Sequence[int], keep_tokens: int) -> int:
    """Drop the fewest oldest chunks so the rest hold at most `keep_tokens` tokens."""
    if keep_tokens < 0:
        raise ConfigError(f"keep_tokens must be >= 0, got {keep_tokens}")
    kept = 0
    for i in range(len(chunk_tokens) - 1, -1, -1):
        kept += chunk_tokens[i]
        if kept > keep_tokens:
            return i + 1
    return 0


EvictionPolicy = Callable[[Sequence[int]], int]

POLICIES = {"oldest_fraction": drop_oldest_fraction, "keep_recent_tokens": keep_recent_tokens}


def make_policy(name: str, **params) -> EvictionPolicy:
    """`make_policy('oldest_fraction', fraction=0.5)` → a function of the chunk token counts."""
    if name not in POLICIES:
        raise ConfigError(f"unknown eviction policy {name!r}; choose one of {sorted(POLICIES)}")
    func = POLICIES[name]
    func([], **params)  # validates the parameters now, not at the first eviction
    return lambda chunk_tokens: func(chunk_tokens, **params)
