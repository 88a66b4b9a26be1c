"""TorchEngine: an in-process torch/transformers model with a committed, cached static state.

The hot path, top to bottom (the loop is `Decoder.query`, shared with the llama.cpp backend):

    query → [commit: _forward(static tail)] → _forward(dynamic) → _sample → TTFT
          → loop: _forward(one token) → _sample → stop?
          → _rollback to the committed boundary

Every forward takes explicit positions and writes K/V into preallocated buffers (`BufferCache`),
so the work of a query grows with its own tokens (plus attention over the cached prefix), never
with a copy of the history. A query's dynamic tokens are never committed: afterwards the length
pointer moves back (O(1)) and linear-attention state is put back (O(state size)).

Its capsule, `TorchCapsule`, holds the K/V as a length into those buffers while attached.

The only part of csr_ros that imports torch at module level (with cache.py, lean.py and
attention.py below it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Iterator, Sequence

import numpy as np
import torch

from csr_ros.engine import attention as attention_sdpa_gqa
from csr_ros.engine import lean, precision
from csr_ros.engine.cache import BufferCache
from csr_ros.engine.capsule import CapsuleBase
from csr_ros.engine.decoder import Decoder, ExtendResult, OptionTrie, check_positive, eos_ids_of
from csr_ros.engine.heap import HeapTrimmer
from csr_ros.errors import CapsuleError, CapsuleMismatchError, ConfigError

log = logging.getLogger(__name__)

DEFAULT_PREFILL_CHUNK_TOKENS = 512
ATTENTION_KINDS = ("sdpa_gqa", "sdpa")
FORWARD_KINDS = ("auto", "lean", "transformers")
DECODE_WEIGHTS = ("auto",) + lean.WEIGHT_FORMATS
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True, eq=False)
class TorchCapsule(CapsuleBase):
    """The torch engine's state: K/V of every attention layer, linear-attention state.

    Attached (taken by `snapshot`): K/V is a length into the engine's buffers (O(1)); it goes
    stale once those positions are overwritten. Materialized: `kv` holds copies.

    File tensors: kv.<layer>.k, kv.<layer>.v [1, H_kv, n_tokens, D] per attention layer,
    conv.<layer>.<slot> and recurrent.<layer>.<slot> (linear-attention state); metadata adds
    layer_types.
    """

    backend: ClassVar[str] = "torch"
    framework: ClassVar[str] = "torch"

    fingerprint: str                            # model the state belongs to
    n_tokens: int                               # committed position (K/V length)
    token_ids: tuple[int, ...]
    layer_types: tuple[str, ...]
    dtype: str                                  # the engine's `precision`
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
        return sum(t.numel() * t.element_size() for t in tensors) + self.kv_nbytes()

    def kv_nbytes(self) -> int:
        """Bytes of the K/V this capsule holds itself (zero while attached)."""
        return sum(t.numel() * t.element_size() for pair in self.kv or () for t in pair)

    def _stale_reason(self) -> str | None:
        low = self.owner().overwrites.min_since(self._seq)
        if low is not None and low < self.n_tokens:
            return (f"position {low} of its K/V was overwritten since it was taken (a reset, "
                    "load or restore of an earlier state followed by new tokens)")
        return None

    def _own_copy(self) -> dict:
        with torch.inference_mode():
            kv = tuple((layer.keys[:, :, :self.n_tokens].clone(),
                        layer.values[:, :, :self.n_tokens].clone())
                       for _, layer in self.owner().attention_layers())
        return {"kv": kv, "_seq": 0}

    def _tensors(self) -> dict[str, torch.Tensor]:
        attention_idx = [i for i, kind in enumerate(self.layer_types) if kind == "full_attention"]
        tensors = {}
        for idx, (k, v) in zip(attention_idx, self.kv):
            tensors[f"kv.{idx}.k"] = k.contiguous().cpu()
            tensors[f"kv.{idx}.v"] = v.contiguous().cpu()
        tensors.update({name: t.contiguous().cpu() for name, t in self.linear_state.items()})
        if self.last_logits is not None:
            tensors["logits"] = self.last_logits.contiguous().cpu()
        tensors["token_ids"] = torch.tensor(self.token_ids, dtype=torch.int64)
        return tensors

    def _metadata(self) -> dict[str, str]:
        return {"layer_types": json.dumps(self.layer_types)}

    @classmethod
    def _from_file(cls, metadata: dict, tensors: dict) -> "TorchCapsule":
        layer_types = tuple(json.loads(metadata["layer_types"]))
        kv = tuple((tensors[f"kv.{i}.k"], tensors[f"kv.{i}.v"])
                   for i, kind in enumerate(layer_types) if kind == "full_attention")
        linear = {name: t for name, t in tensors.items()
                  if name.startswith(("conv.", "recurrent."))}
        return cls(fingerprint=metadata["fingerprint"], n_tokens=int(metadata["n_tokens"]),
                   token_ids=tuple(tensors["token_ids"].tolist()), layer_types=layer_types,
                   dtype=metadata["dtype"], linear_state=linear,
                   last_logits=tensors.get("logits"), kv=kv)


class TorchEngine(Decoder):
    """One model, one committed token run, batch size 1. Not thread-safe: one caller at a time."""

    backend: ClassVar[str] = "torch"
    capsule_type: ClassVar[type] = TorchCapsule

    def __init__(self, model="smollm2", *, device: str = "cpu", dtype=None,
                 threads: int | None = None, max_context_tokens: int | None = None,
                 prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
                 fingerprint: str | None = None, tokenizer=None, attention: str = "sdpa_gqa",
                 forward: str = "auto", decode_weights: str = "auto",
                 decode_threads: int | None = None):
        """`model`: 'smollm2', a local Hugging Face model directory, or a loaded
        `PreTrainedModel` (then `fingerprint` defaults to a hash of its config and weights; the
        model is moved to `device` and `dtype` in place).

        `dtype`: None (float32 on CPU, the exact reference; bfloat16 on CUDA), "float32",
        "bfloat16", "float16", or "auto": the fastest setting this machine offers (see
        `csr_ros.engine.precision`), bfloat16 with int4 decode weights on a CPU with native bf16.

        `forward`: "lean" (a llama forward with few ops per token, `csr_ros.engine.lean`),
        "transformers" (the model's own forward, the reference), or "auto": lean where the
        architecture allows it.

        `decode_weights`: weights of single-token decode steps in the lean forward: "float"
        (the model's own), "int8" or "int4" (weight-only copies, bf16 activations, CPU), or
        "auto" (int4 when `dtype="auto"` chose bf16 on a CPU, else float).

        `decode_threads`: torch threads for single-token steps (decoding); None: as `threads`.
        On a quiet 2-core machine two threads decode faster (69 against 44 tokens/s at N=1024);
        on a CPU shared with other busy work, 1 avoids threads waiting for each other at each of
        a decode step's hundreds of tiny ops (docs/engine.md has both measurements). torch's
        thread count is per process.

        `attention`: for the transformers forward: "sdpa_gqa" (SDPA reading grouped K/V heads in
        place, the default) or "sdpa" (transformers' own, which copies K/V per query head when a
        mask is needed).
        """
        if attention not in ATTENTION_KINDS:
            raise ConfigError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
        if forward not in FORWARD_KINDS:
            raise ConfigError(f"forward must be one of {FORWARD_KINDS}, got {forward!r}")
        if decode_weights not in DECODE_WEIGHTS:
            msg = f"decode_weights must be one of {DECODE_WEIGHTS}, got {decode_weights!r}"
            raise ConfigError(msg)
        check_positive(threads=threads, decode_threads=decode_threads,
                       prefill_chunk_tokens=prefill_chunk_tokens)
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.device = torch.device(device)
        self.model_dir: Path | None = None
        weights_auto = decode_weights == "auto"
        self.decode_threads = None if decode_threads is None else int(decode_threads)
        if isinstance(dtype, str) and dtype == "auto":
            dtype, auto_weights = precision.choose(self.device)
            decode_weights = auto_weights if weights_auto else decode_weights
        elif weights_auto:
            decode_weights = "float"
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM

            from csr_ros.model_store import model_fingerprint, resolve_model_dir
            from csr_ros.tokenizer import HFTokenizer

            self.model_dir = resolve_model_dir(str(model))
            self.dtype = _resolve_dtype(dtype, self.device)
            started = time.perf_counter()
            # Load as stored (fp32 for the embedded model) and cast afterwards: quantized decode
            # weights are made from the stored weights, not from a bf16 rounding of them.
            load_dtype = (torch.float32 if decode_weights != "float" or self.device.type == "cpu"
                          else self.dtype)
            net = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=load_dtype,
                                                       attn_implementation="sdpa")
            log.info("loaded %s in %.1f s", self.model_dir, time.perf_counter() - started)
            self.tokenizer = tokenizer or HFTokenizer(self.model_dir)
            self.fingerprint = fingerprint or model_fingerprint(self.model_dir)
        else:
            net = model
            self.dtype = _resolve_dtype(dtype, self.device) if dtype is not None else net.dtype
            self.tokenizer = tokenizer
            self.fingerprint = fingerprint or _module_fingerprint(net)
        kind = attention_sdpa_gqa.register() if attention == "sdpa_gqa" else "sdpa"
        net.set_attn_implementation(kind)
        self.attention = attention
        self.config = net.config
        limit = getattr(self.config, "max_position_embeddings", None)
        if max_context_tokens is None and limit is None:
            msg = "the model config has no max_position_embeddings: pass max_context_tokens"
            raise ConfigError(msg)
        self.max_context_tokens = int(max_context_tokens or limit)
        if limit is not None and self.max_context_tokens > limit:
            msg = (f"max_context_tokens={self.max_context_tokens} exceeds the model's "
                   f"max_position_embeddings={limit}")
            raise ConfigError(msg)
        if self.max_context_tokens < 1:
            raise ConfigError(f"max_context_tokens must be >= 1, got {self.max_context_tokens}")
        self.prefill_chunk_tokens = int(prefill_chunk_tokens)
        reason = lean.unsupported_reason(net)
        if weights_auto and (reason is not None or forward == "transformers"):
            decode_weights = "float"
        if forward == "lean" and reason is not None:
            raise ConfigError(f"forward='lean' does not run this model: {reason}")
        if decode_weights != "float" and (reason is not None or forward == "transformers"):
            msg = (f"decode_weights={decode_weights!r} needs the lean forward "
                   f"({reason or 'forward=transformers was asked for'})")
            raise ConfigError(msg)
        use_lean = forward != "transformers" and reason is None
        if forward == "auto" and reason is not None:
            log.info("transformers' forward runs this model (the lean forward does not: %s)",
                     reason)
        self.forward_kind = "lean" if use_lean else "transformers"
        self.decode_weights = decode_weights
        self.model = net.to(device=self.device).eval()
        with torch.inference_mode():
            # Built before the cast to `dtype`: quantized copies come from the loaded weights.
            self._lean = (lean.LeanLlama(net, max_len=self.max_context_tokens, device=self.device,
                                         dtype=self.dtype, step_weights=decode_weights)
                          if self.forward_kind == "lean" else None)
        self.model = net.to(dtype=self.dtype)
        # What capsules must agree on besides the model: K/V dtype and the decode weights.
        self.precision = str(self.dtype) + ("" if decode_weights == "float"
                                            else f"+{decode_weights}-decode")
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.eos_ids = eos_ids_of(self.tokenizer, self.config)
        with torch.inference_mode():
            self.cache = BufferCache(self.config, max_len=self.max_context_tokens,
                                     dtype=self.dtype, device=self.device)
        self._buffers = lean.LeanLlama.buffers(self.cache) if self._lean is not None else None
        self._ids: list[int] = []
        self._last_logits: torch.Tensor | None = None    # [V] float32, logits after the last token
        # Committed work gives freed kernel-cache pages back now and then (heap.py).
        self._heap = HeapTrimmer() if self.device.type == "cpu" else None

    @property
    def last_logits(self) -> torch.Tensor | None:
        return self._last_logits

    def reset(self) -> None:
        """Drop the committed state (O(1)); capsules taken so far stay valid until overwritten."""
        self.cache.reset()
        self._ids, self._last_logits = [], None

    def set_threads(self, threads: int, decode_threads: int | None = None) -> None:
        """torch's compute threads (per process) from the next call on; `decode_threads`, when
        given, for single-token steps."""
        check_positive(threads=threads, decode_threads=decode_threads)
        torch.set_num_threads(int(threads))
        if decode_threads is not None:
            self.decode_threads = int(decode_threads)

    # -- the backend's steps (the loop is Decoder.query) --------------------------------------

    def _forward(self, ids: list[int], *, decode: bool = False) -> torch.Tensor:
        """Prefill `ids` at the cache position in blocks; the logits after the last one, [V] fp32.

        Only the last position goes through lm_head (logits_to_keep=1 / the lean forward).
        `decode`: a decode step (a sampled token and any forced after it), never committed; the
        lean forward may run it on the decode weights.
        """
        logits = None
        for start in range(0, len(ids), self.prefill_chunk_tokens):
            block = ids[start:start + self.prefill_chunk_tokens]
            pos = self.cache.length
            if self._lean is not None:
                input_ids = torch.tensor(block, dtype=torch.long, device=self.device)
                self.cache.begin_write(len(block))
                step = len(block) == 1 or (decode and len(block) <= lean.STEP_MAX_TOKENS)
                with _thread_count(self.decode_threads if step else None):
                    logits = self._lean.forward(input_ids, self._buffers, pos, step=step)
                self.cache.advance(len(block))
                continue
            input_ids = torch.tensor([block], dtype=torch.long, device=self.device)      # [1, q]
            position_ids = torch.arange(pos, pos + len(block), device=self.device)[None]  # [1, q]
            self.cache.begin_write(len(block))
            out = self.model(input_ids=input_ids, position_ids=position_ids, cache=self.cache,
                             use_cache=True, logits_to_keep=1)
            self.cache.advance(len(block))
            logits = out.logits[0, -1]
        return logits.float()

    def _mask(self, logits: torch.Tensor, allowed: np.ndarray) -> torch.Tensor:
        """A copy of `logits` with every token not `allowed` at -inf (the committed state's
        last logits stay untouched)."""
        keep = torch.from_numpy(allowed).to(logits.device)
        return logits.masked_fill(~keep, float("-inf"))

    def _sample(self, logits: torch.Tensor, temperature: float, generator) -> int:
        if temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator))

    def _new_rng(self, seed: int) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        return generator

    def _mark(self) -> tuple[int, dict | None]:
        # Fixed-size copies (empty for attention-only models); K/V roll back by the pointer.
        linear = self.cache.linear_state() if self.cache.has_linear_layers else None
        return self.cache.length, linear

    def _rollback(self, mark: tuple[int, dict | None]) -> None:
        length, linear = mark
        self.cache.truncate(length)
        if linear is not None:
            self.cache.set_linear_state(linear)

    def _compute(self):
        return torch.inference_mode()

    def _decode_steps(self):
        return _thread_count(self.decode_threads)

    @staticmethod
    def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
        return logits.float().log_softmax(-1)

    # -- closed choices in one pass -------------------------------------------------------------

    def _check_can_score(self) -> None:
        if self.cache.has_linear_layers:
            raise ConfigError("scoring options in one pass needs an attention-only model; "
                              "decode with a grammar constraint instead")

    def _trie_positions(self, trie: OptionTrie) -> int:
        return len(trie.fed)              # every fed node takes a cache position of its own

    def _score_trie(self, dynamic: list[int], trie: OptionTrie) -> torch.Tensor:
        """Prefill dynamic ⊕ the trie's fed nodes in one forward (tree attention), then roll
        back; log-softmax rows [1 + len(fed), V]: after the dynamic part, then after each node."""
        n_static, n_dyn = self.cache.length, len(dynamic)
        tokens = [trie.tokens[i] for i in trie.fed]
        fed_index = {node: k for k, node in enumerate(trie.fed)}
        parents = [fed_index.get(trie.parents[i], -1) for i in trie.fed]
        depths = [trie.depths[i] for i in trie.fed]
        q = n_dyn + len(tokens)
        if q == 0:
            return self._log_softmax(self._last_logits)[None]
        mask = torch.zeros(q, n_static + q, dtype=torch.bool, device=self.device)  # [q, N + q]
        mask[:, :n_static] = True
        if n_dyn:                                                  # causal within dynamic
            mask[:n_dyn, n_static:n_static + n_dyn] = torch.ones(
                n_dyn, n_dyn, dtype=torch.bool, device=self.device).tril()
            mask[n_dyn:, n_static:n_static + n_dyn] = True
        base = n_static + n_dyn
        for i, parent in enumerate(parents):                      # ancestors-or-self of node i
            row = mask[n_dyn + i]
            if parent >= 0:
                row[base:] |= mask[n_dyn + parent, base:]
            row[base + i] = True
        positions = list(range(n_static, base)) + [base + d for d in depths]
        input_ids = torch.tensor(dynamic + tokens, dtype=torch.long, device=self.device)
        position_ids = torch.tensor(positions, device=self.device)                # [q]
        n_rows = len(tokens) + (1 if n_dyn else 0)
        # K/V of the nodes go past the committed length, which is not advanced: that is the
        # roll back.
        self.cache.begin_write(q)
        if self._lean is not None:
            logits = self._lean.forward(input_ids, self._buffers, n_static,
                                        positions=position_ids, mask=mask, n_logits=n_rows)
            logits = logits.view(n_rows, -1)
        else:
            logits = self.model(input_ids=input_ids[None], position_ids=position_ids[None],
                                attention_mask=mask[None, None], cache=self.cache,
                                use_cache=True, logits_to_keep=n_rows).logits[0]
        rows = self._log_softmax(logits)
        if not n_dyn:
            rows = torch.cat([self._log_softmax(self._last_logits)[None], rows])
        return rows


    # -- capsules -----------------------------------------------------------------------------

    def snapshot(self) -> TorchCapsule:
        """The complete execution state at the committed boundary.

        O(1) for attention K/V (a length into the buffers), O(state) for linear-attention layers.
        """
        with torch.inference_mode():
            logits = None if self._last_logits is None else self._last_logits.clone()
            return TorchCapsule(fingerprint=self.fingerprint, n_tokens=self.n_committed,
                                token_ids=tuple(self._ids), layer_types=self.cache.layer_types,
                                dtype=self.precision, linear_state=self.cache.linear_state(),
                                last_logits=logits, _owner=weakref.ref(self.cache),
                                _seq=self.cache.overwrites.seq)

    def restore(self, capsule: TorchCapsule) -> None:
        """Make `capsule` the committed state (byte-exact).

        A capsule of this engine's own buffers moves the pointer (O(1) for K/V); a materialized
        or loaded capsule, or one of another engine, is copied in (O(n_tokens)).
        """
        self._check_capsule(capsule)
        cache = self.cache
        with torch.inference_mode():
            attached = not capsule.is_materialized and capsule.owner() is cache
            if attached:
                capsule.check_fresh()
                cache.cursor.length = capsule.n_tokens
            else:
                if capsule.is_materialized:
                    kv = capsule.kv
                else:
                    capsule.check_fresh()
                    n = capsule.n_tokens
                    kv = [(layer.keys[:, :, :n], layer.values[:, :, :n])
                          for _, layer in capsule.owner().attention_layers()]
                cache.cursor.length = 0
                cache.begin_write(capsule.n_tokens)
                for (_, layer), (k, v) in zip(cache.attention_layers(), kv):
                    layer.keys[:, :, :capsule.n_tokens].copy_(k)
                    layer.values[:, :, :capsule.n_tokens].copy_(v)
                cache.advance(capsule.n_tokens)
            cache.set_linear_state(capsule.linear_state)
            if len(self._ids) >= capsule.n_tokens and attached:
                # Fresh and attached: nothing below n_tokens changed since the snapshot.
                del self._ids[capsule.n_tokens:]
            else:
                self._ids = list(capsule.token_ids)
            self._last_logits = (None if capsule.last_logits is None
                                 else capsule.last_logits.to(self.device, copy=True))

    def fork(self) -> "TorchEngine":
        """An independent engine sharing this one's weights, with a copy of its committed state."""
        child = object.__new__(TorchEngine)
        child.__dict__.update({k: v for k, v in self.__dict__.items()
                               if k not in ("cache", "_ids", "_buffers")})
        with torch.inference_mode():
            child.cache = BufferCache(self.config, max_len=self.max_context_tokens,
                                      dtype=self.dtype, device=self.device)
        child._buffers = (lean.LeanLlama.buffers(child.cache) if self._lean is not None
                          else None)
        child._ids, child._last_logits = [], None
        child.restore(self.snapshot())
        return child

    def _check_capsule_layout(self, capsule: TorchCapsule) -> None:
        if capsule.layer_types != self.cache.layer_types:
            msg = (f"capsule layer layout {capsule.layer_types} does not match this engine's "
                   f"{self.cache.layer_types}")
            raise CapsuleMismatchError(msg)
        if capsule.is_materialized and len(capsule.kv) != len(self.cache.attention_layers()):
            raise CapsuleError("capsule K/V does not cover every attention layer")

    def extend(self, token_ids: Sequence[int]) -> ExtendResult:
        result = super().extend(token_ids)
        if self._heap is not None:
            self._heap.maybe_trim()
        return result

    # -- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the buffers (and the weights, unless a fork still uses them)."""
        self.__dict__.pop("cache", None)
        self.__dict__.pop("model", None)
        self._last_logits = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


@contextmanager
def _thread_count(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `n` inside the block (None: unchanged)."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype) in _DTYPES:
        return _DTYPES[str(dtype)]
    raise ConfigError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")


def _module_fingerprint(model) -> str:
    """Config plus every weight byte: fine for small in-memory models; pass `fingerprint` for
    large ones."""
    digest = hashlib.sha256(type(model).__name__.encode())
    digest.update(model.config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
