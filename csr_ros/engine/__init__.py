"""The in-process inference engines and their execution-state capsules.

    engine = TorchEngine("smollm2", threads=2)          # or a model directory, device="cuda"
    fast = TorchEngine("smollm2", dtype="auto")         # bf16 + int4 decode where the CPU has bf16
    engine.extend(static_ids)                           # prefill only the new tokens, commit
    out = engine.query(dynamic_ids, max_new_tokens=16)  # TTFT pays only the dynamic tokens
    capsule = engine.snapshot()                         # O(1) for K/V, copies recurrent state
    engine.restore(capsule)                             # byte-exact, also on hybrid models
    capsule.save("state.capsule")                       # safetensors; engine.load_capsule(path)
    child = engine.fork()                               # shares weights, copies the state
    gguf = LlamaCppEngine("smollm2", threads=2)         # the GGUF on llama.cpp, without torch
    engine = make_engine("smollm2", backend="llamacpp") # either, by name

Both are `Engine`s (decoder.py: the interface and the one decode loop they share). Names are
imported on first use, so importing this package imports neither torch nor llama.cpp. Importing
it bounds torch's per-shape kernel caches before any engine runs (heap.py says why).
"""

from csr_ros.engine.heap import bound_shape_caches
from csr_ros.lazy import lazy_names

bound_shape_caches()

_HOMES = {"Engine": "decoder", "ExtendResult": "decoder", "Generation": "decoder",
          "OptionScores": "decoder", "make_engine": "decoder",
          "TorchCapsule": "torch_engine", "TorchEngine": "torch_engine",
          "LlamaCppCapsule": "llamacpp", "LlamaCppEngine": "llamacpp"}

__all__ = sorted(_HOMES)

__getattr__ = lazy_names(__name__, _HOMES)
