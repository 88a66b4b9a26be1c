"""The in-process inference engine (torch + transformers) and its execution-state capsules.

The only part of csr_ros that imports torch at module level.
"""

from csr_ros.engine.capsule import Capsule
from csr_ros.engine.engine import ExtendResult, Generation, LocalEngine

__all__ = ["Capsule", "ExtendResult", "Generation", "LocalEngine"]
