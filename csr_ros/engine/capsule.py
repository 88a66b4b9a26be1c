"""Execution-state capsules: the complete restorable state of an engine at a committed boundary.

A capsule taken from a live engine is cheap: attention K/V are referenced as a length into the
engine's append-only buffers (O(1)); only linear-attention conv/recurrent state (fixed size), the
last logits and the token ids are copied. Such a capsule is *attached* to the buffers it was taken
from and goes stale once those positions are overwritten. `materialize()` copies the K/V prefix
out, which makes a capsule independent of any engine; `save()` writes a materialized capsule to
one safetensors file.

File layout (safetensors):
    kv.<layer>.k, kv.<layer>.v   [1, H_kv, n_tokens, D]  per attention layer
    conv.<layer>.<slot>          linear-attention conv state
    recurrent.<layer>.<slot>     linear-attention recurrent state
    logits                       [V] float32, absent when n_tokens == 0
    token_ids                    [n_tokens] int64
    metadata: format, fingerprint, n_tokens, layer_types, dtype
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from csr_ros.errors import CapsuleError, CapsuleMismatchError, StaleCapsuleError

FORMAT = "csr_ros.capsule/1"


@dataclass(frozen=True, eq=False)
class Capsule:
    fingerprint: str                            # model the state belongs to
    n_tokens: int                               # committed position (K/V length)
    token_ids: tuple[int, ...]
    layer_types: tuple[str, ...]
    dtype: str                                  # K/V dtype, e.g. "torch.float32"
    linear_state: dict[str, torch.Tensor]       # copies, see BufferCache.linear_state
    last_logits: torch.Tensor | None            # [V] float32 copy; None at n_tokens == 0
    kv: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None   # materialized K/V
    _owner: weakref.ref | None = field(default=None, repr=False)      # BufferCache attached to
    _seq: int = 0                               # owner's overwrite-log position at snapshot

    @property
    def is_materialized(self) -> bool:
        return self.kv is not None

    def nbytes(self) -> int:
        """Bytes this capsule holds itself (attached K/V counts as zero)."""
        tensors = list(self.linear_state.values())
        if self.last_logits is not None:
            tensors.append(self.last_logits)
        for k, v in self.kv or ():
            tensors += [k, v]
        return sum(t.numel() * t.element_size() for t in tensors)

    # -- attachment -------------------------------------------------------------------------

    def owner(self):
        return None if self._owner is None else self._owner()

    def check_fresh(self) -> None:
        """Raise StaleCapsuleError if the K/V this attached capsule points to was overwritten."""
        if self.is_materialized:
            return
        cache = self.owner()
        if cache is None:
            msg = ("the engine this capsule was taken from is gone, and the capsule holds no K/V "
                   "of its own: materialize() or save() capsules that must outlive their engine")
            raise CapsuleError(msg)
        low = cache.overwrites.min_since(self._seq)
        if low is not None and low < self.n_tokens:
            msg = (f"capsule of {self.n_tokens} tokens is stale: position {low} of its K/V was "
                   "overwritten since it was taken (a reset, load or restore of an earlier state "
                   "followed by new tokens); materialize() capsules you want to keep across that")
            raise StaleCapsuleError(msg)

    def materialize(self) -> "Capsule":
        """A copy that owns its K/V, so it survives overwrites, other engines and restarts."""
        if self.is_materialized:
            return self
        self.check_fresh()
        cache = self.owner()
        with torch.inference_mode():
            kv = tuple((layer.keys[:, :, :self.n_tokens].clone(),
                        layer.values[:, :, :self.n_tokens].clone())
                       for _, layer in cache.attention_layers())
        return replace(self, kv=kv, _owner=None, _seq=0)

    def __reduce__(self):
        # A capsule leaving its process (pickle, a worker pipe) carries its own K/V: the buffers
        # it may point into stay behind.
        full = self.materialize()
        return (Capsule, (full.fingerprint, full.n_tokens, full.token_ids, full.layer_types,
                          full.dtype, full.linear_state, full.last_logits, full.kv))

    # -- disk -------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the capsule to one safetensors file (materializing K/V if attached)."""
        from safetensors.torch import save_file

        full = self.materialize()
        tensors: dict[str, torch.Tensor] = {}
        attention_idx = [i for i, kind in enumerate(self.layer_types) if kind == "full_attention"]
        for idx, (k, v) in zip(attention_idx, full.kv):
            tensors[f"kv.{idx}.k"] = k.contiguous().cpu()
            tensors[f"kv.{idx}.v"] = v.contiguous().cpu()
        for name, t in full.linear_state.items():
            tensors[name] = t.contiguous().cpu()
        if full.last_logits is not None:
            tensors["logits"] = full.last_logits.contiguous().cpu()
        tensors["token_ids"] = torch.tensor(full.token_ids, dtype=torch.int64)
        metadata = {"format": FORMAT, "fingerprint": self.fingerprint,
                    "n_tokens": str(self.n_tokens), "layer_types": json.dumps(self.layer_types),
                    "dtype": self.dtype}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=metadata)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path, *, expect_fingerprint: str | None = None) -> "Capsule":
        """Read a saved capsule (materialized, on CPU); refuse one of another model early."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_file():
            raise CapsuleError(f"no capsule file at {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise CapsuleError(f"{path} is not a readable capsule file: {exc}") from None
        if metadata.get("format") != FORMAT:
            msg = (f"{path} is not a csr_ros capsule (format {metadata.get('format')!r}, "
                   f"expected {FORMAT!r})")
            raise CapsuleError(msg)
        fingerprint = metadata["fingerprint"]
        if expect_fingerprint is not None and fingerprint != expect_fingerprint:
            raise CapsuleMismatchError(mismatch_message(fingerprint, expect_fingerprint, path))
        tensors = load_file(str(path))
        layer_types = tuple(json.loads(metadata["layer_types"]))
        n_tokens = int(metadata["n_tokens"])
        kv = tuple((tensors[f"kv.{i}.k"], tensors[f"kv.{i}.v"])
                   for i, kind in enumerate(layer_types) if kind == "full_attention")
        linear = {name: t for name, t in tensors.items()
                  if name.startswith(("conv.", "recurrent."))}
        token_ids = tuple(tensors["token_ids"].tolist())
        assert len(token_ids) == n_tokens, f"{path}: {len(token_ids)} ids for {n_tokens} tokens"
        return cls(fingerprint=fingerprint, n_tokens=n_tokens, token_ids=token_ids,
                   layer_types=layer_types, dtype=metadata["dtype"], linear_state=linear,
                   last_logits=tensors.get("logits"), kv=kv)


def mismatch_message(capsule_fingerprint: str, engine_fingerprint: str, where=None) -> str:
    source = f" ({where})" if where is not None else ""
    return (f"capsule{source} was made by model {capsule_fingerprint}, but this engine runs model "
            f"{engine_fingerprint}: a capsule only restores into an engine of the same model")
