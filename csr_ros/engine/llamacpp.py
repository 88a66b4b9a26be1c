"""LlamaCppEngine: an `Engine` over llama.cpp, in process, without torch.

llama-cpp-python's low-level API (the `llama_cpp` module: llama.h through ctypes) runs the
GGUF's own quantized weights on llama.cpp's CPU kernels (AVX2, NEON), which decode several times
faster than float32 torch on CPUs without native bf16. The token ids come from the project's
tokenizer, as for the torch engine; at load the GGUF's vocabulary is checked to agree with it.

CSR with sequence-level cache operations, in one unified KV cache (cells carry sequence ids):

    sequence 0                committed static prefix, positions [0, n)
    query                     dynamic tokens and sampled ones decoded in sequence 0 at [n, ...),
                              then `seq_rm(0, n, -1)`: an O(1) rollback, nothing copied
    capsule slots 1..C        `seq_cp(0, slot)`: the slot shares sequence 0's cells (no K/V
                              copied); restore is `seq_rm(0)` + `seq_cp(slot, 0)`
    option sequences          closed choice: the prefix shared with one sequence per option
                              (`seq_cp`), the dynamic part and the options' token trie decoded
                              in one batch, each trie node a member of every option through it

The hot path, top to bottom (the loop is `Decoder.query`, shared with the torch engine):

    query → [commit: _forward(static tail, seq 0)] → _forward(dynamic) → _sample → TTFT
          → loop: _forward(one token) → _sample → stop?
          → _rollback: seq_rm back to the committed length

A capsule leaving the engine (`materialize`, `save`, pickling) holds the slot's bytes from
`llama_state_seq_get_data`; restoring those is `llama_state_seq_set_data`. Recurrent and hybrid
models are refused: their state cannot be cut back to a position by `seq_rm`; the torch engine
(`TorchEngine`) runs them, capsules included.

Imports neither torch nor anything that does: the backend for a robot where torch is not
installed. Logits are numpy arrays.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from csr_ros.engine.capsule import CapsuleBase
from csr_ros.engine.decoder import Decoder, OptionTrie, check_positive, eos_ids_of
from csr_ros.errors import CapsuleError, ConfigError, ContextOverflowError, ResourceError

log = logging.getLogger(__name__)

DEFAULT_PREFILL_CHUNK_TOKENS = 512
DEFAULT_CAPSULE_SLOTS = 4
OPTION_SEQUENCES = 32           # options scored per batch; more options take more batches
_COMMITTED = 0                  # the sequence id of the committed prefix
_TOKENIZER_SAMPLE = ("The robot is in the kitchen at t=12.5s; it sees a red_mug (0.93) at "
                     "1.2 m.\n  Battery: 87%, état: OK — 日本語, emoji 🙂, code `go_to(room)`.")

_backend_lock = threading.Lock()
_log_callback = None            # kept alive here: llama.cpp holds a pointer to it


def _llama():
    """The `llama_cpp` module, its backend initialised once and its logging sent to ours."""
    global _log_callback
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError("backend='llamacpp' needs llama-cpp-python: bash scripts/setup.sh "
                          "--server (or pip install llama-cpp-python==0.3.36)") from None
    with _backend_lock:
        if _log_callback is None:
            llama_cpp.llama_backend_init()
            _log_callback = llama_cpp.llama_log_callback(_route_log)
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
    return llama_cpp


# ggml_log_level: DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (the previous line goes on)
_GGML_WARN, _GGML_ERROR = 3, 4
# Warnings about a model's own metadata that llama.cpp corrects as it loads: facts about the
# GGUF, said once per model at info, not a fault of the run.
_METADATA_NOTICES = ("control-looking token", "special_eos_id is not in special_eog_ids")
_loading = threading.local()    # .path: the GGUF this thread is loading
_notices_said: set[tuple[str, str]] = set()


def _route_log(level: int, text: bytes, user_data) -> None:
    """llama.cpp's log: errors at ERROR, warnings at WARNING, the model-metadata notices once
    per model at INFO; the rest (its load report, debug output) is dropped."""
    message = text.decode("utf-8", "replace").rstrip()
    if level == _GGML_ERROR:
        log.error("llama.cpp: %s", message)
    elif level != _GGML_WARN or "n_ctx_seq" in message:
        # n_ctx_seq > n_ctx_train: the cell pool is larger than the training context on
        # purpose (capsule slots); positions never pass max_context_tokens.
        return
    elif any(notice in message for notice in _METADATA_NOTICES):
        model = str(getattr(_loading, "path", "") or "a model")
        if (model, message) not in _notices_said:
            _notices_said.add((model, message))
            log.info("llama.cpp, loading %s: %s", Path(model).name, message)
    else:
        log.warning("llama.cpp: %s", message)


class _Model:
    """A loaded GGUF, shared by an engine and its forks; freed with the last of them."""

    def __init__(self, path: Path):
        self.lib = _llama()
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0
        _loading.path = path
        try:
            self.ptr = self.lib.llama_model_load_from_file(str(path).encode(), params)
        finally:
            _loading.path = None
        if not self.ptr:
            raise ConfigError(f"llama.cpp cannot load {path}: not a GGUF it reads")
        self.path = path
        self.vocab = self.lib.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(self.lib.llama_vocab_n_tokens(self.vocab))

    def __del__(self):
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            self.lib.llama_model_free(ptr)


@dataclass(frozen=True, eq=False)
class LlamaCppCapsule(CapsuleBase):
    """The complete state of a LlamaCppEngine at a committed boundary.

    Attached (taken by `snapshot`): the engine's capsule slot shares the committed cells, so it
    costs no copy; it goes stale when the slot is recycled (more live capsules than slots).
    Materialized: `data` holds the sequence's bytes (`llama_state_seq_get_data`), independent of
    any engine of the same model and context settings; in a file, the tensor `state`.
    """

    backend: ClassVar[str] = "llamacpp"
    framework: ClassVar[str] = "numpy"

    fingerprint: str
    n_tokens: int
    token_ids: tuple[int, ...]
    dtype: str                                  # the engine's `precision`
    last_logits: np.ndarray | None              # [V] float32; None at n_tokens == 0
    data: bytes | None = None                   # materialized sequence state
    _owner: weakref.ref | None = field(default=None, repr=False)
    _slot: int = -1
    _generation: int = -1

    @property
    def is_materialized(self) -> bool:
        return self.data is not None

    def nbytes(self) -> int:
        """Bytes this capsule holds itself (an attached slot counts as zero)."""
        logits = 0 if self.last_logits is None else self.last_logits.nbytes
        return logits + self.kv_nbytes()

    def kv_nbytes(self) -> int:
        """Bytes of the sequence state this capsule holds itself (zero while attached)."""
        return len(self.data or b"")

    def owner(self) -> "LlamaCppEngine | None":
        engine = super().owner()
        return None if engine is None or engine._ctx is None else engine

    def _stale_reason(self) -> str | None:
        engine = self.owner()
        if engine._slot_generation[self._slot] != self._generation:
            return (f"its capsule slot was reused by a later snapshot (this engine keeps "
                    f"{engine.capsule_slots} attached capsules)")
        return None

    def _own_copy(self) -> dict:
        return {"data": self.owner()._sequence_bytes(self._slot), "_slot": -1, "_generation": -1}

    def _tensors(self) -> dict[str, np.ndarray]:
        tensors = {"state": np.frombuffer(self.data, dtype=np.uint8),
                   "token_ids": np.asarray(self.token_ids, dtype=np.int64)}
        if self.last_logits is not None:
            tensors["logits"] = np.ascontiguousarray(self.last_logits, dtype=np.float32)
        return tensors

    def _metadata(self) -> dict[str, str]:
        return {}

    @classmethod
    def _from_file(cls, metadata: dict, tensors: dict) -> "LlamaCppCapsule":
        return cls(fingerprint=metadata["fingerprint"], n_tokens=int(metadata["n_tokens"]),
                   token_ids=tuple(int(i) for i in tensors["token_ids"]),
                   dtype=metadata["dtype"], last_logits=tensors.get("logits"),
                   data=tensors["state"].tobytes())


class LlamaCppEngine(Decoder):
    """One GGUF model, one committed token run in sequence 0. Not thread-safe: one caller at a
    time."""

    backend: ClassVar[str] = "llamacpp"
    framework: ClassVar[str] = "numpy"
    capsule_type: ClassVar[type] = LlamaCppCapsule
    forward_kind = "llama.cpp"

    def __init__(self, model="smollm2", *, threads: int | None = None,
                 decode_threads: int | None = None, max_context_tokens: int | None = None,
                 prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS, tokenizer=None,
                 capsule_slots: int = DEFAULT_CAPSULE_SLOTS, kv_cells: int | None = None,
                 flash_attn: bool = False, _shared: tuple[_Model, Path] | None = None):
        """`model`: 'smollm2' (the embedded GGUF), a catalog name or a .gguf path; the tokenizer
        comes from its converted directory (no weights converted).

        `threads`: llama.cpp's threads for batches (prefill, a decode step with forced tokens);
        `decode_threads`: for single-token steps (default: `threads`; default of both: the
        CPUs this process may run on).

        `capsule_slots`: capsules that can stay attached at once (sequence ids, no memory of
        their own while they share the committed cells). `kv_cells`: cells of the unified KV
        cache, default 2 x max_context_tokens, so that attached capsules of an earlier state
        leave room for a full context.

        `flash_attn`: llama.cpp's flash attention (off by default, as in llama-cpp-python's
        server). On the CPU its results depend on how many rows a batch holds: a closed choice
        scored in one batch differed from the same options in a smaller one by a third of a
        nat; without it they agree (docs/engine.md).
        """
        from csr_ros.model_store import model_fingerprint, resolve_gguf, resolve_model_dir
        from csr_ros.tokenizer import HFTokenizer

        check_positive(prefill_chunk_tokens=prefill_chunk_tokens, capsule_slots=capsule_slots,
                       threads=threads, decode_threads=decode_threads)
        loading = _shared is None
        if loading:
            gguf = Path(model) if isinstance(model, Path) else resolve_gguf(str(model))
            named = str(model) in ("smollm2", "default")
            model_dir = resolve_model_dir(str(model) if named else str(gguf), weights=False)
            started = time.perf_counter()
            _shared = (_Model(gguf), model_dir)
            log.info("llama.cpp loaded %s in %.1f s", gguf, time.perf_counter() - started)
        self._model, self.model_dir = _shared
        gguf_model = self._model
        lib = self.lib = gguf_model.lib
        reason = _unsupported_reason(lib, gguf_model.ptr)
        if reason is not None:
            raise ConfigError(f"backend='llamacpp' does not run {gguf_model.path.name}: {reason}; "
                              "use the torch engine (backend='torch'), which has capsules for it")
        self.tokenizer = tokenizer or HFTokenizer(self.model_dir)
        self.fingerprint = "llamacpp-" + model_fingerprint(self.model_dir)
        limit = int(lib.llama_model_n_ctx_train(gguf_model.ptr))
        self.max_context_tokens = int(max_context_tokens or limit)
        if not 1 <= self.max_context_tokens <= limit:
            msg = (f"max_context_tokens must be in [1, {limit}] (the model's training context), "
                   f"got {self.max_context_tokens}")
            raise ConfigError(msg)
        self.vocab_size = gguf_model.n_vocab
        self.eos_ids = eos_ids_of(self.tokenizer)
        self.device = "cpu"
        self.capsule_slots = int(capsule_slots)
        self.prefill_chunk_tokens = int(prefill_chunk_tokens)
        self.threads = int(threads) if threads is not None else _cpu_count()
        self.decode_threads = None if decode_threads is None else int(decode_threads)
        self._settings = dict(threads=threads, decode_threads=decode_threads,
                              max_context_tokens=self.max_context_tokens,
                              prefill_chunk_tokens=prefill_chunk_tokens,
                              capsule_slots=capsule_slots, kv_cells=kv_cells,
                              flash_attn=flash_attn)
        self._first_option_seq = 1 + self.capsule_slots
        self._n_seq = self._first_option_seq + OPTION_SEQUENCES
        params = lib.llama_context_default_params()
        params.n_ctx = int(kv_cells or 2 * self.max_context_tokens)
        params.n_batch = params.n_ubatch = self.prefill_chunk_tokens
        params.n_seq_max = self._n_seq
        params.kv_unified = True          # one cell pool: seq_cp shares cells instead of copying
        params.swa_full = True            # sliding-window layers keep every cell: exact capsules
        params.no_perf = True
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                  else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        params.n_threads = self.decode_threads or self.threads
        params.n_threads_batch = self.threads
        self._ctx_ptr = lib.llama_init_from_model(gguf_model.ptr, params)
        if not self._ctx_ptr:
            raise ResourceError(f"llama.cpp could not create a context of {params.n_ctx} cells")
        self.precision = f"llama.cpp {_file_type(lib, gguf_model.ptr)}"
        self._mem_ptr = lib.llama_get_memory(self._ctx_ptr)
        self._batch = lib.llama_batch_init(self.prefill_chunk_tokens, 0, self._n_seq)
        n = self.prefill_chunk_tokens
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(n,))
        self._positions = np.ctypeslib.as_array(self._batch.pos, shape=(n,))
        self._n_seq_ids = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n,))
        self._outputs = np.ctypeslib.as_array(self._batch.logits, shape=(n,))
        self._seq_rows = [np.ctypeslib.as_array(self._batch.seq_id[i], shape=(self._n_seq,))
                          for i in range(n)]
        for row in self._seq_rows:
            row[0] = _COMMITTED
        self._n_seq_ids[:] = 1
        self._ids: list[int] = []
        self._last_logits: np.ndarray | None = None       # [V] float32 after the last token
        self._length = 0                                   # positions decoded in sequence 0
        self._slot_generation = [0] * (1 + self.capsule_slots)
        self._slot_order: list[int] = []                   # attached slots, oldest first
        self._released: list[tuple[int, int]] = []         # (slot, generation) of dead capsules
        if loading:
            self._check_vocabulary()

    # -- the context ---------------------------------------------------------------------------

    @property
    def _ctx(self):
        """The llama.cpp context. A closed engine is an error here, never a NULL or freed
        pointer passed to llama.cpp: a node's queued query ran on an engine closed just
        before it, and llama_decode(NULL) ended the whole process with a segmentation fault."""
        ctx = getattr(self, "_ctx_ptr", None)
        if not ctx:
            raise ResourceError("this llama.cpp engine was closed")
        return ctx

    @property
    def _mem(self):
        """The context's memory (the KV cells); a closed engine is an error, as for `_ctx`."""
        return self._mem_ptr if self._ctx else None

    # -- committed state ----------------------------------------------------------------------

    @property
    def last_logits(self) -> np.ndarray | None:
        """The logits after the last committed token, a [V] float32 numpy array (a copy)."""
        return None if self._last_logits is None else self._last_logits.copy()

    def set_threads(self, threads: int, decode_threads: int | None = None) -> None:
        """llama.cpp's threads from the next decode on: `threads` for batches, `decode_threads`
        (default: the engine's own, at most `threads`) for single-token steps."""
        check_positive(threads=threads, decode_threads=decode_threads)
        decode = int(decode_threads) if decode_threads is not None else min(
            self.decode_threads or int(threads), int(threads))
        self.lib.llama_set_n_threads(self._ctx, decode, int(threads))

    def reset(self) -> None:
        """Drop the committed state; attached capsules keep their cells."""
        self._free_released_slots()
        self.lib.llama_memory_seq_rm(self._mem, _COMMITTED, -1, -1)
        self._ids, self._last_logits, self._length = [], None, 0

    # -- the backend's steps (the loop is Decoder.query) --------------------------------------

    def _forward(self, ids: list[int], *, decode: bool = False) -> np.ndarray:
        """Decode `ids` in sequence 0 after the last decoded position; the logits after the last
        one. (llama.cpp picks its threads by batch size: `decode` changes nothing here.)"""
        start = self._length
        rows = self._decode(ids, list(range(start, start + len(ids))), None, [len(ids) - 1])
        self._length = start + len(ids)
        return rows[len(ids) - 1]

    @staticmethod
    def _mask(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        return np.where(allowed, logits, np.float32(-np.inf))  # a copy: logits stay intact

    @staticmethod
    def _sample(logits: np.ndarray, temperature: float, rng) -> int:
        if temperature <= 0:
            return int(np.argmax(logits))
        scaled = (logits.astype(np.float64) - float(np.max(logits))) / temperature
        probs = np.exp(scaled)
        return int(rng.choice(len(probs), p=probs / probs.sum()))

    @staticmethod
    def _new_rng(seed: int) -> np.random.Generator:
        return np.random.default_rng(seed)

    def _mark(self) -> int:
        return self._length

    def _rollback(self, n_tokens: int) -> None:
        ok = self.lib.llama_memory_seq_rm(self._mem, _COMMITTED, n_tokens, -1)
        assert ok, f"llama.cpp refused to remove sequence 0 from position {n_tokens}"
        self._length = n_tokens

    @staticmethod
    def _log_softmax(row: np.ndarray) -> np.ndarray:
        row = row.astype(np.float64)
        top = float(np.max(row))
        return row - (top + float(np.log(np.exp(row - top).sum())))

    # -- closed choices: option sequences ---------------------------------------------------------

    def _option_groups(self, paths: list[list[int]]) -> list[list[list[int]]]:
        """Up to OPTION_SEQUENCES options per batch: each gets a sequence id of its own."""
        return [paths[i:i + OPTION_SEQUENCES] for i in range(0, len(paths), OPTION_SEQUENCES)]

    def _trie_positions(self, trie: OptionTrie) -> int:
        return trie.longest               # positions by depth: options share cells, not places

    def _score_trie(self, dynamic: list[int], trie: OptionTrie) -> list[np.ndarray]:
        """Each option gets a sequence that shares the committed cells (`seq_cp`); the dynamic
        part is decoded once as a member of all of them and the trie after it, each node a
        member of the options through it; the option sequences are removed afterwards,
        sequence 0 is never touched. Log-softmax rows: after the dynamic part, then after each
        fed node."""
        seq_of_option = [self._first_option_seq + j for j in range(len(trie.ends))]
        members: dict[int, list[int]] = {}               # trie node -> option sequences
        for j, nodes in enumerate(trie.ends):
            for node in nodes:
                members.setdefault(node, []).append(seq_of_option[j])
        n_static, n_dyn = self._length, len(dynamic)
        feed = dynamic + [trie.tokens[i] for i in trie.fed]
        positions = (list(range(n_static, n_static + n_dyn))
                     + [n_static + n_dyn + trie.depths[i] for i in trie.fed])
        seqs = [seq_of_option] * n_dyn + [members[i] for i in trie.fed]
        # Rows read: after the dynamic part (its last token), then after each fed node.
        out_rows = ([n_dyn - 1] if dynamic else []) + [n_dyn + k for k in range(len(trie.fed))]
        for seq in seq_of_option:
            self.lib.llama_memory_seq_cp(self._mem, _COMMITTED, seq, -1, -1)
        try:
            rows = self._decode(feed, positions, seqs, out_rows) if feed else {}
        finally:
            for seq in seq_of_option:
                self.lib.llama_memory_seq_rm(self._mem, seq, -1, -1)
        first = rows[n_dyn - 1] if dynamic else self._last_logits
        return [self._log_softmax(first)] + [self._log_softmax(rows[n_dyn + k])
                                             for k in range(len(trie.fed))]

    # -- decoding -----------------------------------------------------------------------------

    def _decode(self, ids: list[int], positions: list[int], seqs: list[list[int]] | None,
                out_rows: list[int]) -> dict[int, np.ndarray]:
        """Decode tokens at explicit positions, in batches of `prefill_chunk_tokens`; `seqs`:
        each token's sequence ids (None: all in sequence 0). The logits of `out_rows`, [V]
        float32 copies."""
        lib, ctx, n_batch = self.lib, self._ctx, self.prefill_chunk_tokens
        wanted = set(out_rows)
        rows: dict[int, np.ndarray] = {}
        for start in range(0, len(ids), n_batch):
            n = min(n_batch, len(ids) - start)
            self._tokens[:n] = ids[start:start + n]
            self._positions[:n] = positions[start:start + n]
            outputs = [i for i in range(n) if start + i in wanted]
            self._outputs[:n] = 0
            self._outputs[outputs] = 1
            if seqs is not None:
                for i in range(n):
                    members = seqs[start + i]
                    self._n_seq_ids[i] = len(members)
                    self._seq_rows[i][:len(members)] = members
            self._batch.n_tokens = n
            try:
                rc = lib.llama_decode(ctx, self._batch)
                if rc == 1 and self._release_slots():
                    rc = lib.llama_decode(ctx, self._batch)
            finally:
                if seqs is not None:
                    self._n_seq_ids[:n] = 1
                    for i in range(n):
                        self._seq_rows[i][0] = _COMMITTED
            if rc == 1:
                msg = (f"llama.cpp has no free KV cell for {n} tokens ({self._settings['kv_cells']}"
                       " cells): attached capsules hold cells of earlier states; pass a larger "
                       "kv_cells")
                raise ContextOverflowError(msg)
            if rc != 0:
                raise ResourceError(f"llama_decode failed with status {rc}")
            for i in outputs:
                pointer = lib.llama_get_logits_ith(ctx, i)
                rows[start + i] = np.ctypeslib.as_array(pointer, shape=(self.vocab_size,)).copy()
        return rows

    # -- capsules -----------------------------------------------------------------------------

    def snapshot(self) -> LlamaCppCapsule:
        """The complete state at the committed boundary: a capsule slot that shares sequence
        0's cells (`seq_cp`, no K/V copied), the token ids and a copy of the last logits."""
        slot = self._take_slot()
        self.lib.llama_memory_seq_rm(self._mem, slot, -1, -1)
        self.lib.llama_memory_seq_cp(self._mem, _COMMITTED, slot, -1, -1)
        logits = None if self._last_logits is None else self._last_logits.copy()
        generation = self._slot_generation[slot]
        capsule = LlamaCppCapsule(fingerprint=self.fingerprint, n_tokens=self.n_committed,
                                  token_ids=tuple(self._ids), dtype=self.precision,
                                  last_logits=logits, _owner=weakref.ref(self), _slot=slot,
                                  _generation=generation)
        # A capsule nobody holds frees its slot at the engine's next snapshot.
        weakref.finalize(capsule, self._released.append, (slot, generation))
        return capsule

    def restore(self, capsule: LlamaCppCapsule) -> None:
        """Make `capsule` the committed state, exactly: an attached capsule of this engine by
        `seq_cp` from its slot, any other by `llama_state_seq_set_data`."""
        self._check_capsule(capsule)
        lib = self.lib
        if not capsule.is_materialized and capsule.owner() is self:
            capsule.check_fresh()
            lib.llama_memory_seq_rm(self._mem, _COMMITTED, -1, -1)
            lib.llama_memory_seq_cp(self._mem, capsule._slot, _COMMITTED, -1, -1)
        else:
            data = capsule.materialize().data
            lib.llama_memory_seq_rm(self._mem, _COMMITTED, -1, -1)
            if not self._set_sequence_bytes(data) and not (
                    self._release_slots() and self._set_sequence_bytes(data)):
                self._ids, self._last_logits, self._length = [], None, 0
                msg = (f"llama.cpp could not restore a capsule of {capsule.n_tokens} tokens "
                       "(not enough free KV cells, or state from other context settings); "
                       "the committed state is now empty")
                raise CapsuleError(msg)
        self._ids, self._length = list(capsule.token_ids), capsule.n_tokens
        self._last_logits = (None if capsule.last_logits is None
                             else np.array(capsule.last_logits, dtype=np.float32))

    def fork(self) -> "LlamaCppEngine":
        """An independent engine sharing this one's model weights, with a copy of its state."""
        child = LlamaCppEngine(tokenizer=self.tokenizer, _shared=(self._model, self.model_dir),
                               **self._settings)
        child.restore(self.snapshot())
        return child

    def _free_released_slots(self) -> None:
        """Give back the cells of capsules nobody holds any more (their slots were kept until
        now: a finalizer may run on any thread, llama.cpp is called from the engine's)."""
        while self._released:
            slot, generation = self._released.pop()
            if self._slot_generation[slot] == generation and slot in self._slot_order:
                self._slot_order.remove(slot)
                self._slot_generation[slot] += 1
                self.lib.llama_memory_seq_rm(self._mem, slot, -1, -1)

    def _take_slot(self) -> int:
        """A free capsule slot; with none free, the oldest attached capsule's (it goes stale)."""
        self._free_released_slots()
        free = [s for s in range(1, 1 + self.capsule_slots) if s not in self._slot_order]
        slot = free[0] if free else self._slot_order.pop(0)
        if not free:
            self._slot_generation[slot] += 1
        self._slot_order.append(slot)
        return slot

    def _release_slots(self) -> bool:
        """Free every capsule slot (its capsules go stale) to make room; True if any was held."""
        held = bool(self._slot_order)
        for slot in self._slot_order:
            self._slot_generation[slot] += 1
            self.lib.llama_memory_seq_rm(self._mem, slot, -1, -1)
        if held:
            log.warning("llama.cpp KV cells ran out: %d attached capsule(s) released (stale)",
                        len(self._slot_order))
        self._slot_order.clear()
        return held

    def _sequence_bytes(self, seq: int) -> bytes:
        size = self.lib.llama_state_seq_get_size(self._ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        written = self.lib.llama_state_seq_get_data(self._ctx, buffer, size, seq)
        assert written == size, f"llama.cpp wrote {written} of {size} sequence-state bytes"
        return bytes(buffer)

    def _set_sequence_bytes(self, data: bytes) -> bool:
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return self.lib.llama_state_seq_set_data(self._ctx, buffer, len(data), _COMMITTED) > 0

    # -- checks and teardown --------------------------------------------------------------------

    def _check_vocabulary(self) -> None:
        """The project's tokenizer and the GGUF's vocabulary must give the same ids."""
        checks = [("data text", self.tokenizer.encode_data(_TOKENIZER_SAMPLE),
                   self._llama_tokenize(_TOKENIZER_SAMPLE, special=False))]
        special = [t for t in self.tokenizer.special_tokens if t][:4]
        if special:
            text = f"{special[0]}user\nhello{special[-1]}\n"
            checks.append(("template text", self.tokenizer.encode_template(text),
                           self._llama_tokenize(text, special=True)))
        tok_vocab = getattr(self.tokenizer, "vocab_size", None)
        if tok_vocab is not None and tok_vocab > self.vocab_size:
            msg = (f"the tokenizer has {tok_vocab} tokens, the GGUF {self.vocab_size}: "
                   f"{self._model.path.name} is not this tokenizer's model")
            raise ConfigError(msg)
        for what, ours, theirs in checks:
            if ours != theirs:
                i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                         min(len(ours), len(theirs)))
                msg = (f"the tokenizer in {self.model_dir} and {self._model.path.name}'s "
                       f"vocabulary disagree on a {what} sample at token {i} ({ours[i:i + 3]} "
                       f"against {theirs[i:i + 3]}): use the tokenizer converted from this GGUF")
                raise ConfigError(msg)

    def _llama_tokenize(self, text: str, *, special: bool) -> list[int]:
        data = text.encode("utf-8")
        buffer = (self.lib.llama_token * (len(data) + 16))()
        n = self.lib.llama_tokenize(self._model.vocab, data, len(data), buffer, len(buffer),
                                    False, special)
        assert n >= 0, f"llama_tokenize needed {-n} tokens"
        return list(buffer[:n])

    def close(self) -> None:
        """Free the context (and the model, unless a fork still uses it)."""
        ctx, self._ctx_ptr = getattr(self, "_ctx_ptr", None), None
        if ctx:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(ctx)
        self._model = None
        self._last_logits = None

    def __del__(self):
        self.close()


def _unsupported_reason(lib, model) -> str | None:
    if lib.llama_model_is_recurrent(model) or lib.llama_model_is_hybrid(model):
        return ("its recurrent state cannot be cut back to the committed length, so a query "
                "cannot be rolled back")
    if not lib.llama_model_has_decoder(model) or lib.llama_model_has_encoder(model):
        return "it is not a decoder-only model"
    return None


def _file_type(lib, model) -> str:
    """The GGUF's weight type as llama.cpp names it, e.g. 'Q4_1' (from the model description)."""
    buffer = ctypes.create_string_buffer(256)
    lib.llama_model_desc(model, buffer, len(buffer))
    words = buffer.value.decode("utf-8", "replace").split()
    return words[-1] if words else "gguf"  # e.g. "llama 135M Q4_1"


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


__all__ = ["LlamaCppCapsule", "LlamaCppEngine"]
