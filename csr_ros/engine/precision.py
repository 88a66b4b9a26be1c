"""What this CPU offers, and the engine precision `dtype="auto"` picks from it, at run time.

One install serves every machine: nothing is compiled for the build machine. torch's CPU kernels
(oneDNN for bf16 matmuls and SDPA, ATen's weight-only int4/int8 matmuls) dispatch on the CPU
they find; this module only decides which of them the engine asks for.

    native bf16 (AVX512-BF16 or AMX-BF16)   torch: bfloat16 activations, K/V and block
                                            matmuls; int4 weight-only decode steps
    x86 without it (AVX2)                   torch: float32 activations, K/V and block
                                            matmuls; fp16 weight copies for decode steps
                                            (fbgemm's fp16 GEMM, half the bytes per token)
    llama.cpp in process (anywhere          the GGUF's own quantized weights on its kernels
    llama-cpp-python is installed)          (AVX2, NEON)

These are the candidates; `dtype="auto"` in the local resource takes the one whose decision
measured fastest on this machine (csr_ros.engine.calibration), not a guess from the flags.

The int4/int8 weight-only kernels are fast only with bf16 activations, and bf16 matmuls are fast
only where the CPU has bf16 instructions. Without them (an AVX2-only AMD EPYC, a decode step's
matmuls, 2 threads: int8 with float32 activations about 20x slower than float32, int8 and int4
with bf16 activations 2x slower) fbgemm's fp16-weight GEMM beats float32 for a decode step
(2x on the matmuls, 1.8x on the whole step) without quantizing the activations, and float32
stays the fastest for prefill and queries. docs/engine.md has the figures against llama.cpp.

torch is imported only when asked about: `torch_available` and `llamacpp_available` answer
where it is not installed.
"""

from __future__ import annotations

import importlib.util

from csr_ros.cpu import BF16_FLAGS, bf16_flags, cpu_flags, cpu_model


def native_bf16() -> bool:
    """True where the CPU computes bf16 dot products in hardware and oneDNN can use them
    (csr_ros.cpu: CSR_ROS_CPU_BF16=0 takes the float32 paths on such a CPU)."""
    if not bf16_flags():
        return False
    import torch

    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def choose(device):
    """(torch dtype, decode weights) for `dtype="auto"` on the torch `device`."""
    import torch

    from csr_ros.engine import lean

    if device.type == "cuda":
        return torch.bfloat16, "float"
    if device.type == "cpu" and native_bf16():
        return torch.bfloat16, "int4"
    if device.type == "cpu" and lean.fp16_available():
        return torch.float32, "fp16"
    return torch.float32, "float"


def llamacpp_available() -> bool:
    """True where llama-cpp-python is installed (scripts/setup.sh builds it portably)."""
    return importlib.util.find_spec("llama_cpp") is not None


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def describe() -> dict:
    """JSON-ready facts for benchmark records."""
    import torch

    flags = cpu_flags()
    return {"cpu_model": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16_flags": sorted(f for f in BF16_FLAGS if f in flags),
            "amx_tile": "amx_tile" in flags, "native_bf16": native_bf16(),
            "llamacpp_available": llamacpp_available(),
            "torch_threads": torch.get_num_threads()}
