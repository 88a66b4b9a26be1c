"""The in-process inference engine (torch + transformers) and its execution-state capsules.

    engine = LocalEngine("smollm2", threads=2)          # or a model directory, device="cuda"
    fast = LocalEngine("smollm2", dtype="auto")         # bf16 + int4 decode where the CPU has bf16
    engine.extend(static_ids)                           # prefill only the new tokens, commit
    out = engine.query(dynamic_ids, max_new_tokens=16)  # TTFT pays only the dynamic tokens
    capsule = engine.snapshot()                         # O(1) for K/V, copies recurrent state
    engine.restore(capsule)                             # byte-exact, also on hybrid models
    capsule.save("state.capsule")                       # safetensors; engine.load_capsule(path)
    child = engine.fork()                               # shares weights, copies the state
    gguf = LlamaCppEngine("smollm2", threads=2)         # the GGUF on llama.cpp, same interface

The only part of csr_ros that imports torch at module level.
"""

from csr_ros.engine.capsule import Capsule
from csr_ros.engine.engine import ExtendResult, Generation, LocalEngine, OptionScores
from csr_ros.engine.llamacpp import LlamaCppCapsule, LlamaCppEngine

__all__ = ["Capsule", "ExtendResult", "Generation", "LlamaCppCapsule", "LlamaCppEngine",
           "LocalEngine", "OptionScores"]
