"""What this CPU offers, read at run time (never at build time: the machines change).

    CSR_ROS_CPU_BF16=0   behave as on a CPU without native bf16 (float32 paths): how a
                         machine with bf16 runs what an AVX2-only one would
    CSR_ROS_CPU_BF16=1   take the bf16 flags as present (only where the CPU really has them
                         is that fast; torch still checks its own kernels)

Pure: no torch, so the server recipes read it too.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path

from csr_ros.errors import ConfigError

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_OVERRIDE_ENV = "CSR_ROS_CPU_BF16"


@lru_cache(maxsize=1)
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpuinfo_field(*names: str) -> str | None:
    for line in _cpuinfo().splitlines():
        if line.split(":", 1)[0].strip() in names:
            return line.split(":", 1)[1].strip()
    return None


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags the kernel reports (empty where /proc/cpuinfo is not available)."""
    return frozenset((_cpuinfo_field("flags", "Features") or "").split())


def cpu_model() -> str:
    """The CPU as the kernel names it: x86 `model name` with its family and model numbers
    (a virtual machine may say only "AMD EPYC"); ARM `Model`, or its implementer and part."""
    name = _cpuinfo_field("model name", "Model")
    family, model = _cpuinfo_field("cpu family"), _cpuinfo_field("model")
    if name is not None and family is not None:
        name += f" (family {family}, model {model})"
    if name is None and _cpuinfo_field("CPU part") is not None:
        name = f"{_cpuinfo_field('CPU implementer')}/{_cpuinfo_field('CPU part')}"
    return name or platform.processor() or platform.machine()


def bf16_flags(flags: frozenset[str] | set[str] | None = None) -> bool:
    """True where `flags` (default: this CPU's, unless CSR_ROS_CPU_BF16 says otherwise) hold
    bf16 dot-product instructions (AVX512-BF16 or AMX-BF16)."""
    if flags is None:
        override = os.environ.get(BF16_OVERRIDE_ENV, "").strip()
        if override not in ("", "0", "1"):
            raise ConfigError(f"{BF16_OVERRIDE_ENV} must be 0 or 1, not {override!r}")
        if override:
            return override == "1"
        flags = cpu_flags()
    return any(flag in flags for flag in BF16_FLAGS)
