"""What this CPU offers, and the engine precision `dtype="auto"` picks from it, at run time.

One install serves every machine: nothing is compiled for the build machine. torch's CPU kernels
(oneDNN for bf16 matmuls and SDPA, ATen's weight-only int4/int8 matmuls) dispatch on the CPU
they find; this module only decides which of them the engine asks for.

    native bf16 (AVX512-BF16 or AMX-BF16)   bfloat16 activations, K/V and block matmuls;
                                            int4 weight-only decode steps
    otherwise                               float32 everywhere (the exact reference)

The int4/int8 weight-only kernels are fast only with bf16 activations, and bf16 matmuls are fast
only where the CPU has bf16 instructions, so without them float32 is the fast choice as well as
the exact one.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags the kernel reports (empty where /proc/cpuinfo is not available)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def native_bf16() -> bool:
    """True where the CPU computes bf16 dot products in hardware and oneDNN can use them."""
    if not any(flag in cpu_flags() for flag in BF16_FLAGS):
        return False
    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def choose(device: torch.device) -> tuple[torch.dtype, str]:
    """(dtype, decode weights) for `dtype="auto"` on `device`."""
    if device.type == "cuda":
        return torch.bfloat16, "float"
    if device.type == "cpu" and native_bf16():
        return torch.bfloat16, "int4"
    return torch.float32, "float"


def describe() -> dict:
    """JSON-ready facts for benchmark records."""
    flags = cpu_flags()
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16_flags": sorted(f for f in BF16_FLAGS if f in flags),
            "amx_tile": "amx_tile" in flags, "native_bf16": native_bf16(),
            "torch_threads": torch.get_num_threads()}
