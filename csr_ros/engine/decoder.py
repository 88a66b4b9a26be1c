"""The engines' interface (`Engine`) and the one decoder both backends share (`Decoder`).

An engine holds one committed token run (batch size 1) and answers queries on top of it:

    engine = make_engine("smollm2", backend="torch")     # TorchEngine, or LlamaCppEngine
    engine.extend(static_ids)                            # prefill only the new tokens, commit
    out = engine.query(dynamic_ids, max_new_tokens=16)   # TTFT pays only the dynamic tokens
    capsule = engine.snapshot(); engine.restore(capsule) # the exact execution state

The hot path, top to bottom (`Decoder.query`, the same for every backend):

    query → [commit: _forward(static tail)] → _forward(dynamic ⊕ forced)
          → choose: _mask (grammar), _sample → TTFT
          → loop: _forward(sampled ⊕ forced) → choose → stop?
          → _rollback to the committed boundary

The decoder owns the checks, the tokens a grammar forces (they ride on the next forward, never
sampled), the stop rules, the loop and the option-trie scoring driver. A backend gives only:

    _forward(ids, decode=)     run ids after the current position; the logits after the last
    _mark() / _rollback(mark)  a point to come back to, and the way back (O(1) for K/V)
    _mask / _sample / _new_rng the logits' array type: torch tensors or numpy arrays
    _score_trie(dynamic, trie) the options' token trie in one pass, rolled back
    snapshot / restore / fork  its capsules (capsule.py has what they share)

Imports neither torch nor llama.cpp: the llama.cpp backend runs where torch is not installed.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from csr_ros.engine.capsule import mismatch_message
from csr_ros.errors import CapsuleMismatchError, ConfigError, ContextOverflowError

BACKENDS = {"torch": ("csr_ros.engine.torch_engine", "TorchEngine"),
            "llamacpp": ("csr_ros.engine.llamacpp", "LlamaCppEngine")}


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
    n_forward_tokens: int       # dynamic tokens plus trie nodes prefilled
    seconds: float              # call start → scores (includes `commit_ids`)
    n_committed: int            # tokens committed by this call


class TokenConstraint(Protocol):
    """Restricts decoding to the continuations a grammar allows (csr_ros.engine.grammar)."""

    def allowed(self, n_vocab: int) -> np.ndarray:
        """[n_vocab] bool: the tokens allowed next."""

    def accept(self, token: int) -> bool:
        """Advance by the sampled token; True once the answer is complete."""

    def forced(self) -> list[int]:
        """The tokens allowed next with no alternative (may be empty). The decoder appends
        them without sampling and feeds them to the next forward with the token before them."""


@runtime_checkable
class Engine(Protocol):
    """What callers of an in-process engine use; `TorchEngine` and `LlamaCppEngine` are both.

    The committed run: `n_committed`, `committed_ids`, `last_logits` ([V] float32 after the
    last committed token, in the backend's array type: torch tensor or numpy array; None when
    empty), `last_logprobs()`; `reset`, `load`, `extend`. Answers: `query`, `score_options`.
    Capsules: `snapshot`, `restore`, `fork`, `scratch`, `save_capsule`, `load_capsule`.
    """

    backend: str                    # "torch" | "llamacpp"
    forward_kind: str               # "lean" | "transformers" | "llama.cpp"
    fingerprint: str                # the model; capsules restore only into the same
    precision: str                  # what capsules must agree on besides the model
    tokenizer: Any
    model_dir: Path | None
    vocab_size: int
    max_context_tokens: int
    eos_ids: tuple[int, ...]
    decode_threads: int | None
    n_committed: int
    committed_ids: tuple[int, ...]
    last_logits: Any

    def last_logprobs(self) -> Any: ...
    def reset(self) -> None: ...
    def load(self, token_ids: Sequence[int]) -> ExtendResult: ...
    def extend(self, token_ids: Sequence[int]) -> ExtendResult: ...
    def query(self, dynamic_ids: Sequence[int], max_new_tokens: int, *,
              stop: Sequence[str] = (), eos_ids: Sequence[int] | None = None,
              commit_ids: Sequence[int] = (), temperature: float = 0.0,
              seed: int | None = None, constraint: TokenConstraint | None = None,
              on_token: Callable[[int], None] | None = None,
              on_text: Callable[[str], None] | None = None) -> Generation: ...
    def score_options(self, dynamic_ids: Sequence[int], options: Sequence[Sequence[int]], *,
                      commit_ids: Sequence[int] = (),
                      end_id: int | None = None) -> OptionScores: ...
    def snapshot(self) -> Any: ...
    def restore(self, capsule) -> None: ...
    def fork(self) -> "Engine": ...
    def scratch(self) -> contextlib.AbstractContextManager: ...
    def save_capsule(self, capsule, path: str | Path) -> Path: ...
    def load_capsule(self, path: str | Path) -> Any: ...
    def set_threads(self, threads: int, decode_threads: int | None = None) -> None: ...
    def close(self) -> None: ...


def make_engine(model="smollm2", *, backend: str = "torch", **options) -> Engine:
    """The engine of `backend` (BACKENDS), its module imported only when asked for."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {tuple(BACKENDS)}, got {backend!r}")
    module_name, class_name = BACKENDS[backend]
    return getattr(importlib.import_module(module_name), class_name)(model, **options)


class OptionTrie:
    """The options' token trie, nodes in insertion (topological) order.

    A node is fed to the model only if a row after it is read: one with children, or any node
    when the end token is scored. An option's last token is scored from its parent's row.
    Rows: 0 after the dynamic part, k + 1 after `fed[k]`.
    """

    def __init__(self, paths: list[list[int]], end_id: int | None):
        self.tokens: list[int] = []        # node -> token
        self.parents: list[int] = []       # node -> parent node, -1 for the root
        self.depths: list[int] = []
        self.ends: list[list[int]] = []    # option -> its nodes
        self.end_id = end_id
        children: dict[tuple[int, int], int] = {}
        for path in paths:
            parent, nodes = -1, []
            for depth, token in enumerate(path):
                node = children.get((parent, token))
                if node is None:
                    node = children[(parent, token)] = len(self.tokens)
                    self.tokens.append(token)
                    self.parents.append(parent)
                    self.depths.append(depth)
                nodes.append(node)
                parent = node
            self.ends.append(nodes)
        has_child = {p for p in self.parents if p >= 0}
        self.fed = [i for i in range(len(self.tokens)) if end_id is not None or i in has_child]
        self.longest = max(len(p) for p in paths) + (1 if end_id is not None else 0)

    def logprobs(self, rows) -> list[float]:
        """Each option's summed log-probability from log-softmax `rows[r][token]`."""
        row_of = {node: k + 1 for k, node in enumerate(self.fed)}
        scores = []
        for nodes in self.ends:
            total, before = 0.0, 0
            for node in nodes:
                total += float(rows[before][self.tokens[node]])
                before = row_of.get(node, -1)
            if self.end_id is not None:
                total += float(rows[before][self.end_id])
            scores.append(total)
        return scores


class Decoder:
    """The committed run, the checks, the decode loop and the scoring driver of an engine.

    Subclasses set `vocab_size`, `max_context_tokens`, `tokenizer`, `eos_ids`, `fingerprint`,
    `precision`, `_ids` and `_last_logits`, and give the hooks named in the module docstring.
    Not thread-safe: one caller at a time.
    """

    backend: ClassVar[str]
    capsule_type: ClassVar[type]

    # -- committed state ----------------------------------------------------------------------

    @property
    def n_committed(self) -> int:
        return len(self._ids)

    @property
    def committed_ids(self) -> tuple[int, ...]:
        return tuple(self._ids)

    def last_logprobs(self):
        """Log-softmax of the logits after the last committed token, [V] (the backend's array
        type: both index with a token id and have `argmax`); None on an empty state."""
        return None if self._last_logits is None else self._log_softmax(self._last_logits)

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
        with self._compute():
            self._commit(ids)
        return ExtendResult(len(ids), time.perf_counter() - started, self.n_committed)

    @contextmanager
    def scratch(self) -> Iterator[Any]:
        """Run extends/queries in a block, then roll back to the state before it."""
        capsule = self.snapshot()
        try:
            yield capsule
        finally:
            self.restore(capsule)

    # -- the query hot path -------------------------------------------------------------------

    def query(self, dynamic_ids: Sequence[int], max_new_tokens: int, *, stop: Sequence[str] = (),
              eos_ids: Sequence[int] | None = None, commit_ids: Sequence[int] = (),
              temperature: float = 0.0, seed: int | None = None,
              constraint: TokenConstraint | None = None,
              on_token: Callable[[int], None] | None = None,
              on_text: Callable[[str], None] | None = None) -> Generation:
        """Commit `commit_ids`, prefill `dynamic_ids` (not committed), decode, roll back.

        Greedy unless temperature > 0. TTFT runs from the call to the first sampled token.
        `constraint` masks the logits before each sample and ends the generation as soon as
        what it accepts is complete (see `TokenConstraint`). `on_token(n)` is called after
        each sampled token with the answer's tokens so far, then `on_text(text)` with the
        answer's text so far (cut before a stop string; a character whose bytes are not all
        decoded yet reads U+FFFD), which is what a stream sends on; an exception either raises
        (e.g. QueryCancelledError) stops the decode between two tokens, after the same roll
        back.
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
        rng = self._new_rng(0 if seed is None else int(seed)) if temperature > 0 else None
        tokens: list[int] = []

        def choose(logits) -> tuple[str, str | None]:
            """Sample the next token from `logits` (masked by the constraint); as `_finished`."""
            if constraint is not None:
                logits = self._mask(logits, constraint.allowed(logits.shape[-1]))
            tokens.append(self._sample(logits, temperature, rng))
            return self._finished(tokens, eos, stop, max_new_tokens, constraint)

        def progress(text: str) -> None:
            if on_token is not None:
                on_token(len(tokens))
            if on_text is not None:
                on_text(text)

        with self._compute():
            started = time.perf_counter()
            if commit:
                self._commit(commit)
            mark = self._mark()
            try:
                # Tokens the grammar forces are never sampled: they ride on the next forward
                # (here, on the dynamic part's), so an answer costs one forward per free choice.
                text, finish = self._take_forced(tokens, constraint, eos, stop, max_new_tokens)
                feed = dynamic + tokens
                if finish is None:
                    text, finish = choose(self._forward(feed) if feed else self._last_logits)
                ttft_s = time.perf_counter() - started
                progress(text)
                with self._decode_steps():
                    while finish is None:
                        n_sampled = len(tokens)
                        text, finish = self._take_forced(tokens, constraint, eos, stop,
                                                         max_new_tokens)
                        if finish is not None:
                            break
                        feed = tokens[n_sampled - 1:]     # the sampled token, then any forced
                        text, finish = choose(self._forward(feed, decode=True))
                        progress(text)
                decode_s = time.perf_counter() - started - ttft_s
            finally:
                self._rollback(mark)
        return Generation(text=text, token_ids=tuple(tokens), ttft_s=ttft_s, decode_s=decode_s,
                          n_committed=len(commit), n_dynamic=len(dynamic), finish_reason=finish)

    def score_options(self, dynamic_ids: Sequence[int], options: Sequence[Sequence[int]], *,
                      commit_ids: Sequence[int] = (),
                      end_id: int | None = None) -> OptionScores:
        """Log-probability of each option's tokens after `dynamic_ids`, from the cached state.

        The options are merged into a token trie and prefilled after the dynamic part in one
        pass per group of options (`_option_groups`), each trie node attending to the committed
        state, the dynamic part and its own ancestors (positions continue from the dynamic part
        along each path). `end_id`, when given, is scored after each option (so that a prefix of
        a longer option is not favoured). Like `query`, commits `commit_ids` first and rolls the
        rest back.
        """
        commit = self._check_ids(commit_ids, "commit_ids", allow_empty=True)
        dynamic = self._check_ids(dynamic_ids, "dynamic_ids", allow_empty=True)
        paths = [self._check_ids(o, "an option", allow_empty=False) for o in options]
        if not paths:
            raise ConfigError("score_options needs at least one option")
        self._check_can_score()
        if not commit and not dynamic and self._last_logits is None:
            raise ConfigError("score_options on an empty state needs at least one prompt token")
        tries = [OptionTrie(group, end_id) for group in self._option_groups(paths)]
        room = max(self._trie_positions(trie) for trie in tries)
        self._check_room(len(commit) + len(dynamic) + room, self.n_committed, "score_options")
        logprobs: list[float] = []
        n_forward = 0
        with self._compute():
            started = time.perf_counter()
            if commit:
                self._commit(commit)
            for trie in tries:
                logprobs += trie.logprobs(self._score_trie(dynamic, trie))
                n_forward += len(dynamic) + len(trie.fed)
        return OptionScores(logprobs=tuple(logprobs), n_forward_tokens=n_forward,
                            seconds=time.perf_counter() - started, n_committed=len(commit))

    # -- shared steps -------------------------------------------------------------------------

    def _commit(self, ids: list[int]) -> None:
        """Prefill and commit; on failure the committed state is as before."""
        mark = self._mark()
        try:
            logits = self._forward(ids)
        except BaseException:
            self._rollback(mark)
            raise
        self._ids.extend(ids)
        self._last_logits = logits

    def _take_forced(self, tokens: list[int], constraint: TokenConstraint | None, eos: frozenset,
                     stop: tuple[str, ...], max_new_tokens: int) -> tuple[str, str | None]:
        """Append the tokens `constraint` forces next (none without a constraint, or where
        it cannot tell); (text so far, finish reason or None to go on), as `_finished`."""
        text, finish = "", None
        for token in (constraint.forced() if constraint is not None else ()):
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

    def save_capsule(self, capsule, path: str | Path) -> Path:
        """Check the capsule is this engine's, then write it to one safetensors file."""
        self._check_capsule(capsule)
        return capsule.save(path)

    def load_capsule(self, path: str | Path):
        """Read a capsule saved by an engine of the same model (CapsuleMismatchError otherwise)."""
        capsule = self.capsule_type.load(path, expect_fingerprint=self.fingerprint)
        self._check_capsule(capsule)
        return capsule

    def _check_capsule(self, capsule) -> None:
        if not isinstance(capsule, self.capsule_type):
            msg = (f"a {type(capsule).__name__} holds another backend's state: restore it into "
                   f"an engine of that backend (backend={capsule.backend!r}); this "
                   f"{self.backend} engine restores only its own capsules")
            raise CapsuleMismatchError(msg)
        if capsule.fingerprint != self.fingerprint:
            raise CapsuleMismatchError(mismatch_message(capsule.fingerprint, self.fingerprint))
        self._check_capsule_layout(capsule)
        if capsule.dtype != self.precision:
            msg = f"capsule holds {capsule.dtype} state, this engine runs {self.precision}"
            raise CapsuleMismatchError(msg)
        if capsule.n_tokens > self.max_context_tokens:
            msg = (f"capsule holds {capsule.n_tokens} tokens, more than this engine's "
                   f"max_context_tokens={self.max_context_tokens}")
            raise ContextOverflowError(msg)

    def _check_capsule_layout(self, capsule) -> None:
        """Backend-specific agreement of the capsule's layout with this engine's (optional)."""

    # -- checks -------------------------------------------------------------------------------

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

    def _check_can_score(self) -> None:
        """Raise ConfigError where this engine cannot score options in one pass (optional)."""

    # -- backend hooks with a default ---------------------------------------------------------

    def _compute(self) -> contextlib.AbstractContextManager:
        """The context every computation runs in (torch: inference mode)."""
        return contextlib.nullcontext()

    def _decode_steps(self) -> contextlib.AbstractContextManager:
        """The context of the single-token decode loop (torch: its decode thread count)."""
        return contextlib.nullcontext()

    def _option_groups(self, paths: list[list[int]]) -> list[list[list[int]]]:
        """The options scored together in one pass (default: all of them)."""
        return [paths]


def eos_ids_of(tokenizer, config=None) -> tuple[int, ...]:
    """The token ids that end an answer: the tokenizer's, else the model config's."""
    if tokenizer is not None and tokenizer.eos_token_ids:
        return tuple(tokenizer.eos_token_ids)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)


def check_positive(**counts: int | None) -> None:
    """ConfigError for a count (threads, tokens, slots) below 1; None: not given."""
    for name, value in counts.items():
        if value is not None and int(value) < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")


__all__ = ["BACKENDS", "Decoder", "Engine", "ExtendResult", "Generation", "OptionScores",
           "OptionTrie", "TokenConstraint", "check_positive", "eos_ids_of", "make_engine"]
