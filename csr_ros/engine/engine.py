"""LocalEngine: an in-process torch/transformers model with a committed, cached static state.

The hot path, top to bottom:

    query → [commit: _forward(static tail)] → _forward(dynamic) → _sample → TTFT
          → loop: _forward(one token) → _sample → stop?
          → roll back to the committed boundary

Every forward takes explicit positions and writes K/V into preallocated buffers (`BufferCache`),
so the work of a query grows with its own tokens (plus attention over the cached prefix), never
with a copy of the history. A query's dynamic tokens are never committed: afterwards the length
pointer moves back (O(1)) and linear-attention state is put back (O(state size)).
"""

from __future__ import annotations

import hashlib
import logging
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

import torch

from csr_ros.engine import attention as attention_sdpa_gqa
from csr_ros.engine import lean, precision
from csr_ros.engine.cache import BufferCache
from csr_ros.engine.capsule import Capsule, mismatch_message
from csr_ros.errors import CapsuleError, CapsuleMismatchError, ConfigError, ContextOverflowError

log = logging.getLogger(__name__)

DEFAULT_PREFILL_CHUNK_TOKENS = 512
ATTENTION_KINDS = ("sdpa_gqa", "sdpa")
FORWARD_KINDS = ("auto", "lean", "transformers")
DECODE_WEIGHTS = ("auto",) + lean.WEIGHT_FORMATS
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class ExtendResult:
    n_tokens: int              # tokens prefilled by this call
    seconds: float
    n_committed: int           # committed length afterwards


@dataclass(frozen=True)
class Generation:
    text: str                  # decoded text, cut before a stop string; no trailing EOS
    token_ids: tuple[int, ...]  # every sampled token, including a final EOS
    ttft_s: float              # call start → first sampled token (includes `commit_ids`)
    decode_s: float            # first sampled token → last sampled token
    n_committed: int           # tokens committed by this call (`commit_ids`)
    n_dynamic: int             # dynamic tokens prefilled and then dropped
    finish_reason: str         # "stop" (EOS or stop string) | "length"


@dataclass(frozen=True)
class OptionScores:
    logprobs: tuple[float, ...]  # per option: sum of its tokens' log-probabilities (+ end)
    n_forward_tokens: int       # dynamic tokens plus trie nodes prefilled in the one pass
    seconds: float              # call start → scores (includes `commit_ids`)
    n_committed: int            # tokens committed by this call


class LocalEngine:
    """One model, one committed token run, batch size 1. Not thread-safe: one caller at a time."""

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
        if threads is not None:
            if int(threads) < 1:
                raise ConfigError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(int(threads))
        if prefill_chunk_tokens < 1:
            raise ConfigError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        self.device = torch.device(device)
        self.model_dir: Path | None = None
        weights_auto = decode_weights == "auto"
        if decode_threads is not None and int(decode_threads) < 1:
            raise ConfigError(f"decode_threads must be >= 1, got {decode_threads}")
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
        self.eos_ids = _eos_ids(self.tokenizer, self.config)
        with torch.inference_mode():
            self.cache = BufferCache(self.config, max_len=self.max_context_tokens,
                                     dtype=self.dtype, device=self.device)
        self._buffers = lean.LeanLlama.buffers(self.cache) if self._lean is not None else None
        self._ids: list[int] = []
        self._last_logits: torch.Tensor | None = None    # [V] float32, logits after the last token

    # -- committed state ----------------------------------------------------------------------

    @property
    def n_committed(self) -> int:
        return self.cache.length

    @property
    def committed_ids(self) -> tuple[int, ...]:
        return tuple(self._ids)

    @property
    def last_logits(self) -> torch.Tensor | None:
        return self._last_logits

    def reset(self) -> None:
        """Drop the committed state (O(1)); capsules taken so far stay valid until overwritten."""
        self.cache.reset()
        self._ids, self._last_logits = [], None

    def load(self, token_ids: Sequence[int]) -> ExtendResult:
        """Replace the committed run: reset, then prefill `token_ids` (a cold prefill)."""
        ids = self._check_ids(token_ids, "token_ids", allow_empty=False)
        self._check_room(len(ids), 0, "load")
        self.reset()
        return self.extend(ids)

    def extend(self, token_ids: Sequence[int]) -> ExtendResult:
        """Prefill only `token_ids` on top of the committed state and commit them."""
        ids = self._check_ids(token_ids, "token_ids", allow_empty=False)
        self._check_room(len(ids), self.n_committed, "extend")
        started = time.perf_counter()
        with torch.inference_mode():
            self._commit(ids)
        return ExtendResult(len(ids), time.perf_counter() - started, self.n_committed)

    # -- the query hot path -------------------------------------------------------------------

    def query(self, dynamic_ids: Sequence[int], max_new_tokens: int, *, stop: Sequence[str] = (),
              eos_ids: Sequence[int] | None = None, commit_ids: Sequence[int] = (),
              temperature: float = 0.0, seed: int | None = None,
              constraint: "TokenConstraint | None" = None,
              on_token: Callable[[int], None] | None = None) -> Generation:
        """Commit `commit_ids`, prefill `dynamic_ids` (not committed), decode, roll back.

        Greedy unless temperature > 0. TTFT runs from the call to the first sampled token.
        `constraint` masks the logits before each sample and ends the generation as soon as
        what it accepts is complete (see `TokenConstraint`). `on_token(n)` is called after
        each sampled token with the answer's tokens so far; an exception it raises (e.g.
        QueryCancelledError) stops the decode between two tokens, after the same roll back.
        """
        commit = self._check_ids(commit_ids, "commit_ids", allow_empty=True)
        dynamic = self._check_ids(dynamic_ids, "dynamic_ids", allow_empty=True)
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {temperature}")
        stop = tuple(s for s in stop if s)
        if stop and self.tokenizer is None:
            raise ConfigError("stop strings need a tokenizer; this engine was built without one")
        if not commit and not dynamic and self._last_logits is None:
            raise ConfigError("query on an empty state needs at least one prompt token")
        self._check_room(len(commit) + len(dynamic) + max_new_tokens, self.n_committed, "query")
        eos = frozenset(self.eos_ids if eos_ids is None else eos_ids)
        generator = None
        if temperature > 0:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(0 if seed is None else int(seed))

        with torch.inference_mode():
            started = time.perf_counter()
            if commit:
                self._commit(commit)
            n_static = self.cache.length
            # Fixed-size copies (empty for attention-only models); K/V roll back by the pointer.
            saved_linear = self.cache.linear_state() if self.cache.has_linear_layers else None
            try:
                # Tokens the grammar forces are never sampled: they ride on the next forward
                # (here, on the dynamic part's), so an answer costs one forward per free choice.
                tokens: list[int] = []
                text, finish = self._take_forced(tokens, constraint, eos, stop, max_new_tokens)
                feed = dynamic + tokens
                if finish is None:
                    logits = self._forward(feed) if feed else self._last_logits
                    token = _sample(_masked(logits, constraint), temperature, generator)
                    tokens.append(token)
                    text, finish = self._finished(tokens, eos, stop, max_new_tokens, constraint)
                ttft_s = time.perf_counter() - started
                if on_token is not None:
                    on_token(len(tokens))
                with _thread_count(self.decode_threads):
                    while finish is None:
                        n_sampled = len(tokens)
                        text, finish = self._take_forced(tokens, constraint, eos, stop,
                                                         max_new_tokens)
                        if finish is not None:
                            break
                        feed = tokens[n_sampled - 1:]     # the sampled token, then any forced
                        logits = _masked(self._forward(feed, decode=True), constraint)
                        token = _sample(logits, temperature, generator)
                        tokens.append(token)
                        text, finish = self._finished(tokens, eos, stop, max_new_tokens,
                                                      constraint)
                        if on_token is not None:
                            on_token(len(tokens))
                decode_s = time.perf_counter() - started - ttft_s
            finally:
                self.cache.truncate(n_static)
                if saved_linear is not None:
                    self.cache.set_linear_state(saved_linear)
        return Generation(text=text, token_ids=tuple(tokens), ttft_s=ttft_s, decode_s=decode_s,
                          n_committed=len(commit), n_dynamic=len(dynamic), finish_reason=finish)

    def score_options(self, dynamic_ids: Sequence[int], options: Sequence[Sequence[int]], *,
                      commit_ids: Sequence[int] = (),
                      end_id: int | None = None) -> OptionScores:
        """Log-probability of each option's tokens after `dynamic_ids`, in one forward pass.

        The options are merged into a token trie and prefilled after the dynamic part in one
        call, each trie node attending to the committed state, the dynamic part and its own
        ancestors (positions continue from the dynamic part along each path). `end_id`, when
        given, is scored after each option (so that a prefix of a longer option is not
        favoured). Like `query`, commits `commit_ids` first and rolls the rest back.
        """
        commit = self._check_ids(commit_ids, "commit_ids", allow_empty=True)
        dynamic = self._check_ids(dynamic_ids, "dynamic_ids", allow_empty=True)
        paths = [self._check_ids(o, "an option", allow_empty=False) for o in options]
        if not paths:
            raise ConfigError("score_options needs at least one option")
        if self.cache.has_linear_layers:
            raise ConfigError("scoring options in one pass needs an attention-only model; "
                              "decode with a grammar constraint instead")
        if not commit and not dynamic and self._last_logits is None:
            raise ConfigError("score_options on an empty state needs at least one prompt token")
        tokens, parents, depths, ends = _trie(paths)
        # A node is fed only if some row after it is read: one with children, or any node when
        # the end token is scored. An option's last token is scored from its parent's row.
        has_child = {p for p in parents if p >= 0}
        fed = [i for i in range(len(tokens)) if end_id is not None or i in has_child]
        row_of = {node: k + 1 for k, node in enumerate(fed)}   # row 0: after the dynamic part
        self._check_room(len(commit) + len(dynamic) + len(fed), self.n_committed,
                         "score_options")
        with torch.inference_mode():
            started = time.perf_counter()
            if commit:
                self._commit(commit)
            n_static = self.cache.length
            try:
                n_dyn, q = len(dynamic), len(dynamic) + len(fed)
                rows = self._tree_logprobs(dynamic, [tokens[i] for i in fed],
                                           [row_of[parents[i]] - 1 if parents[i] >= 0 else -1
                                            for i in fed], [depths[i] for i in fed])
                logprobs = []
                for path_nodes in ends:
                    total, before = 0.0, 0
                    for node in path_nodes:
                        total += float(rows[before, tokens[node]])
                        before = row_of.get(node, -1)
                    if end_id is not None:
                        total += float(rows[before, end_id])
                    logprobs.append(total)
            finally:
                self.cache.truncate(n_static)
        return OptionScores(logprobs=tuple(logprobs), n_forward_tokens=q,
                            seconds=time.perf_counter() - started, n_committed=len(commit))

    def _tree_logprobs(self, dynamic: list[int], tokens: list[int], parents: list[int],
                       depths: list[int]) -> torch.Tensor:
        """Prefill dynamic ⊕ tree nodes in one forward (tree attention); log-softmax rows
        [1 + len(tokens), V]: after the dynamic part, then after each node. Not rolled back."""
        n_static, n_dyn = self.cache.length, len(dynamic)
        q = n_dyn + len(tokens)
        if q == 0:
            return self._last_logits.float().log_softmax(-1)[None]
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
        self.cache.begin_write(q)
        if self._lean is not None:
            logits = self._lean.forward(input_ids, self._buffers, n_static,
                                        positions=position_ids, mask=mask, n_logits=n_rows)
            logits = logits.view(n_rows, -1)
        else:
            logits = self.model(input_ids=input_ids[None], position_ids=position_ids[None],
                                attention_mask=mask[None, None], cache=self.cache,
                                use_cache=True, logits_to_keep=n_rows).logits[0]
        self.cache.advance(q)
        rows = logits.float().log_softmax(-1)
        if not n_dyn:
            rows = torch.cat([self._last_logits.float().log_softmax(-1)[None], rows])
        return rows

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

    def _commit(self, ids: list[int]) -> None:
        """Prefill and commit; on failure the committed state is as before."""
        n_before = self.cache.length
        saved_linear = self.cache.linear_state() if self.cache.has_linear_layers else None
        try:
            logits = self._forward(ids)
        except BaseException:
            self.cache.truncate(n_before)
            if saved_linear is not None:
                self.cache.set_linear_state(saved_linear)
            raise
        self._ids.extend(ids)
        self._last_logits = logits

    def _take_forced(self, tokens: list[int], constraint, eos: frozenset,
                     stop: tuple[str, ...], max_new_tokens: int) -> tuple[str, str | None]:
        """Append the tokens `constraint` forces next (none without a constraint, or where
        it cannot tell); (text so far, finish reason or None to go on), as `_finished`."""
        forced = getattr(constraint, "forced", None)
        text, finish = "", None
        for token in (forced() if forced is not None else ()):
            tokens.append(int(token))
            text, finish = self._finished(tokens, eos, stop, max_new_tokens, constraint)
            if finish is not None:
                break
        return text, finish

    def _finished(self, tokens: list[int], eos: frozenset, stop: tuple[str, ...],
                  max_new_tokens: int, constraint=None) -> tuple[str, str | None]:
        """(text so far, finish reason or None to go on)."""
        ended = tokens[-1] in eos
        # A complete constrained answer stops at once: its end token is never decoded.
        complete = constraint is not None and not ended and constraint.accept(tokens[-1])
        body = tokens[:-1] if ended else tokens
        text = self.tokenizer.decode(body) if self.tokenizer is not None else ""
        if stop:
            cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
            if cut >= 0:
                return text[:cut], "stop"
        if ended or complete:
            return text, "stop"
        if len(tokens) >= max_new_tokens:
            return text, "length"
        return text, None

    # -- capsules -----------------------------------------------------------------------------

    def snapshot(self) -> Capsule:
        """The complete execution state at the committed boundary.

        O(1) for attention K/V (a length into the buffers), O(state) for linear-attention layers.
        """
        with torch.inference_mode():
            logits = None if self._last_logits is None else self._last_logits.clone()
            return Capsule(fingerprint=self.fingerprint, n_tokens=self.n_committed,
                           token_ids=tuple(self._ids), layer_types=self.cache.layer_types,
                           dtype=self.precision, linear_state=self.cache.linear_state(),
                           last_logits=logits, _owner=weakref.ref(self.cache),
                           _seq=self.cache.overwrites.seq)

    def restore(self, capsule: Capsule) -> None:
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

    def fork(self) -> "LocalEngine":
        """An independent engine sharing this one's weights, with a copy of its committed state."""
        child = object.__new__(LocalEngine)
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

    @contextmanager
    def scratch(self) -> Iterator[Capsule]:
        """Run extends/queries in a block, then roll back to the state before it."""
        capsule = self.snapshot()
        try:
            yield capsule
        finally:
            self.restore(capsule)

    def save_capsule(self, capsule: Capsule, path: str | Path) -> Path:
        self._check_capsule(capsule)
        return capsule.save(path)

    def load_capsule(self, path: str | Path) -> Capsule:
        """Read a capsule saved by an engine of the same model (CapsuleMismatchError otherwise)."""
        capsule = Capsule.load(path, expect_fingerprint=self.fingerprint)
        self._check_capsule(capsule)
        return capsule

    def _check_capsule(self, capsule: Capsule) -> None:
        if capsule.fingerprint != self.fingerprint:
            raise CapsuleMismatchError(mismatch_message(capsule.fingerprint, self.fingerprint))
        if capsule.layer_types != self.cache.layer_types:
            msg = (f"capsule layer layout {capsule.layer_types} does not match this engine's "
                   f"{self.cache.layer_types}")
            raise CapsuleMismatchError(msg)
        if capsule.dtype != self.precision:
            msg = f"capsule holds {capsule.dtype} state, this engine runs {self.precision}"
            raise CapsuleMismatchError(msg)
        if capsule.n_tokens > self.max_context_tokens:
            msg = (f"capsule holds {capsule.n_tokens} tokens, more than this engine's "
                   f"max_context_tokens={self.max_context_tokens}")
            raise ContextOverflowError(msg)
        if capsule.is_materialized and len(capsule.kv) != len(self.cache.attention_layers()):
            raise CapsuleError("capsule K/V does not cover every attention layer")

    # -- checks and teardown --------------------------------------------------------------------

    def _check_ids(self, ids: Sequence[int], what: str, *, allow_empty: bool) -> list[int]:
        try:
            ids = [int(i) for i in ids]
        except (TypeError, ValueError):
            raise ConfigError(f"{what} must be a sequence of integer token ids") from None
        if not ids and not allow_empty:
            raise ConfigError(f"{what} is empty: pass at least one token id")
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            msg = (f"{what} holds {len(bad)} id(s) outside the vocabulary [0, {self.vocab_size}), "
                   f"first {bad[0]}: tokenize with this model's tokenizer")
            raise ConfigError(msg)
        return ids

    def _check_room(self, n_new: int, n_base: int, what: str) -> None:
        if n_base + n_new > self.max_context_tokens:
            msg = (f"{what} needs {n_base} + {n_new} = {n_base + n_new} tokens of context, more "
                   f"than max_context_tokens={self.max_context_tokens}; nothing was computed "
                   "(evict old chunks, or lower max_new_tokens)")
            raise ContextOverflowError(msg)

    def close(self) -> None:
        """Free the buffers (and the weights, unless a fork still uses them)."""
        self.__dict__.pop("cache", None)
        self.__dict__.pop("model", None)
        self._last_logits = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class TokenConstraint(Protocol):
    """Restricts decoding to the continuations a grammar allows (csr_ros.engine.grammar)."""

    def mask_(self, logits: torch.Tensor) -> None:
        """Set the logits [V] of every token not allowed next to -inf, in place."""

    def accept(self, token: int) -> bool:
        """Advance by the sampled token; True once the answer is complete."""

    # Optional: `forced() -> list[int]`, the tokens the grammar allows next with no
    # alternative. The engine appends them without sampling and feeds them to the next forward
    # together with the token before them.


def _masked(logits: torch.Tensor, constraint: TokenConstraint | None) -> torch.Tensor:
    if constraint is None:
        return logits
    logits = logits.clone()            # the committed state's last logits stay untouched
    constraint.mask_(logits)
    return logits


def _trie(paths: list[list[int]]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """Token trie of `paths` in insertion (topological) order: node tokens, parent index (-1
    for the root), depth, and each path's node indices."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    children: dict[tuple[int, int], int] = {}
    ends = []
    for path in paths:
        parent, nodes = -1, []
        for depth, token in enumerate(path):
            node = children.get((parent, token))
            if node is None:
                node = len(tokens)
                children[(parent, token)] = node
                tokens.append(token)
                parents.append(parent)
                depths.append(depth)
            nodes.append(node)
            parent = node
        ends.append(nodes)
    return tokens, parents, depths, ends


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


def _sample(logits: torch.Tensor, temperature: float, generator) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype) in _DTYPES:
        return _DTYPES[str(dtype)]
    raise ConfigError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")


def _eos_ids(tokenizer, config) -> tuple[int, ...]:
    if tokenizer is not None and getattr(tokenizer, "eos_token_ids", None):
        return tuple(tokenizer.eos_token_ids)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)


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
