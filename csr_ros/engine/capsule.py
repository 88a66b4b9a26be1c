"""Execution-state capsules: the complete restorable state of an engine at a committed boundary.

A capsule taken from a live engine is cheap: it refers to the engine's own cache (a length into
the torch engine's append-only K/V buffers, a spare sequence id sharing llama.cpp's cells) and
copies only what is small (linear-attention state, the last logits, the token ids). Such a
capsule is *attached* and goes stale once what it refers to is overwritten. `materialize()`
copies the state out, which makes a capsule independent of any engine; `save()` writes a
materialized capsule to one safetensors file, `load()` reads it back.

This module holds what both backends' capsules share (`CapsuleBase`: attachment, pickling,
the file's frame and its checks); `TorchCapsule` (torch_engine.py) and `LlamaCppCapsule`
(llamacpp.py) hold their backend's state. Imports no torch.

File frame (safetensors): the backend's tensors, `token_ids` [n_tokens] int64, `logits` [V]
float32 (absent when n_tokens == 0); metadata: format, fingerprint, n_tokens, dtype, and what
the backend adds.
"""

from __future__ import annotations

import importlib
from dataclasses import fields, replace
from pathlib import Path
from typing import ClassVar

from csr_ros.errors import CapsuleError, CapsuleMismatchError, StaleCapsuleError

FORMATS = {"torch": "csr_ros.capsule/1", "llamacpp": "csr_ros.llamacpp_capsule/1"}


class CapsuleBase:
    """Shared by the capsule dataclasses, which have the fields fingerprint, n_tokens,
    token_ids, dtype, last_logits and _owner (a weak reference to what they are attached to),
    and give `is_materialized`, `nbytes`, `kv_nbytes`, the attachment hooks `_stale_reason`
    and `_own_copy`, and the file hooks `_tensors`, `_metadata` and `_from_file`."""

    backend: ClassVar[str]
    framework: ClassVar[str]              # safetensors' module for the tensors: torch | numpy

    def owner(self):
        return None if self._owner is None else self._owner()

    def check_fresh(self) -> None:
        """Raise StaleCapsuleError if what this attached capsule refers to was overwritten."""
        if self.is_materialized:
            return
        if self.owner() is None:
            msg = ("the engine this capsule was taken from is gone, and the capsule holds no "
                   "state of its own: materialize() or save() capsules that must outlive it")
            raise CapsuleError(msg)
        reason = self._stale_reason()
        if reason is not None:
            msg = (f"capsule of {self.n_tokens} tokens is stale: {reason}; materialize() "
                   "capsules you want to keep longer")
            raise StaleCapsuleError(msg)

    def materialize(self):
        """A copy that owns its state, so it survives overwrites, other engines and restarts."""
        if self.is_materialized:
            return self
        self.check_fresh()
        return replace(self, _owner=None, **self._own_copy())

    def __reduce__(self):
        # A capsule leaving its process (pickle, a worker pipe) carries its own state: what it
        # may refer to stays behind. Public fields come first, in constructor order.
        full = self.materialize()
        return (type(full), tuple(getattr(full, f.name) for f in fields(full)
                                  if not f.name.startswith("_")))

    def save(self, path: str | Path) -> Path:
        """Write the capsule to one safetensors file (materializing it if attached)."""
        full = self.materialize()
        metadata = {"format": FORMATS[self.backend], "fingerprint": self.fingerprint,
                    "n_tokens": str(self.n_tokens), "dtype": self.dtype, **full._metadata()}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        safetensors = importlib.import_module(f"safetensors.{self.framework}")
        safetensors.save_file(full._tensors(), str(tmp), metadata=metadata)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path, *, expect_fingerprint: str | None = None):
        """Read a saved capsule (materialized, on CPU); refuse one of another model or backend
        early, before its tensors are read."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise CapsuleError(f"no capsule file at {path}")
        try:
            with safe_open(str(path), framework="numpy") as f:
                metadata = f.metadata() or {}
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise CapsuleError(f"{path} is not a readable capsule file: {exc}") from None
        kind = metadata.get("format")
        other = next((backend for backend, name in FORMATS.items() if name == kind), None)
        if other is not None and other != cls.backend:
            msg = (f"{path} holds the {other} engine's state, not the {cls.backend} engine's: "
                   f"restore it into an engine with backend={other!r}")
            raise CapsuleMismatchError(msg)
        if other is None:
            msg = (f"{path} is not a csr_ros capsule (format {kind!r}, expected "
                   f"{FORMATS[cls.backend]!r})")
            raise CapsuleError(msg)
        fingerprint = metadata["fingerprint"]
        if expect_fingerprint is not None and fingerprint != expect_fingerprint:
            raise CapsuleMismatchError(mismatch_message(fingerprint, expect_fingerprint, path))
        tensors = importlib.import_module(f"safetensors.{cls.framework}").load_file(str(path))
        capsule = cls._from_file(metadata, tensors)
        assert len(capsule.token_ids) == capsule.n_tokens, \
            f"{path}: {len(capsule.token_ids)} ids for {capsule.n_tokens} tokens"
        return capsule


def mismatch_message(capsule_fingerprint: str, engine_fingerprint: str, where=None) -> str:
    source = f" ({where})" if where is not None else ""
    return (f"capsule{source} was made by model {capsule_fingerprint}, but this engine runs model "
            f"{engine_fingerprint}: a capsule only restores into an engine of the same model")
