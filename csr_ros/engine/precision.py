"""What this CPU offers, and the engine precision `dtype="auto"` picks from it, at run time.

One install serves every machine: nothing is compiled for the build machine. torch's CPU kernels
(oneDNN for bf16 matmuls and SDPA, ATen's weight-only int4/int8 matmuls) dispatch on the CPU
they find; this module only decides which of them the engine asks for.

    native bf16 (AVX512-BF16 or AMX-BF16)   torch: bfloat16 activations, K/V and block
                                            matmuls; int4 weight-only decode steps
    otherwise (AVX2 x86, ARM)               llama.cpp in process (`choose_backend`): the
                                            GGUF's own quantized weights on llama.cpp's AVX2 /
                                            NEON kernels; torch float32 where llama-cpp-python
                                            is not installed

The int4/int8 weight-only kernels are fast only with bf16 activations, and bf16 matmuls are fast
only where the CPU has bf16 instructions. Without them (measured on an AVX2-only AMD EPYC, one
576x1536 matmul of a decode step: float32 0.2 ms, int8 with float32 activations 3.9 ms, int8 and
int4 with bf16 activations 0.45 ms, fbgemm dynamic int8 0.36-0.44 ms) no torch kernel beats
float32, which reads four times the bytes of llama.cpp's 4-bit weights per token.
"""

from __future__ import annotations

import importlib.util
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


def llamacpp_available() -> bool:
    """True where llama-cpp-python is installed (scripts/setup.sh builds it portably)."""
    return importlib.util.find_spec("llama_cpp") is not None


def choose_backend(device: str = "cpu", dtype=None) -> str:
    """The local engine `dtype="auto"` runs on: "llamacpp" (the GGUF on llama.cpp's kernels, in
    process) on a CPU without native bf16, where torch can only run float32 (its weight-only
    int8/int4 kernels need bf16 activations to be fast), else "torch". Any other dtype asks for
    the torch engine."""
    if dtype != "auto" or torch.device(device).type != "cpu" or native_bf16():
        return "torch"
    return "llamacpp" if llamacpp_available() else "torch"


def describe() -> dict:
    """JSON-ready facts for benchmark records."""
    flags = cpu_flags()
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16_flags": sorted(f for f in BF16_FLAGS if f in flags),
            "amx_tile": "amx_tile" in flags, "native_bf16": native_bf16(),
            "llamacpp_available": llamacpp_available(),
            "auto_backend": choose_backend("cpu", "auto"),
            "torch_threads": torch.get_num_threads()}
