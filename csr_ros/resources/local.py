"""`local`: the Resource interface over an in-process `Engine`: torch + transformers
(`TorchEngine`) or llama.cpp (`LlamaCppEngine`, backend="llamacpp", which needs no torch).

    make_resource("local", model="smollm2", threads=2)
    make_resource("local", model="smollm2", threads=2, backend="llamacpp")

Token mode only: the committed run is token ids; `text` arguments are accepted and ignored.
Construction takes plain keyword values only, so a worker process can build one from pickled
kwargs. The engine stays reachable as `.engine` for capsules (snapshot / restore / save / load):
`capabilities.capsules`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Sequence

from csr_ros.actions import ChoiceScores, OutputConstraint
from csr_ros.engine.decoder import Engine, check_positive, make_engine
from csr_ros.errors import ConfigError, ResourceError, StateMismatchError
from csr_ros.resources.base import Capabilities, PrefillResult, QueryResult
from csr_ros.state import Request

BACKENDS = ("torch", "llamacpp", "auto")


class LocalResource:
    capabilities = Capabilities(score_choices=True, capsules=True, set_threads=True)
    state_mode = "token"

    def __init__(self, model: str = "smollm2", *, name: str = "local", threads: int | None = None,
                 device: str = "cpu", max_context_tokens: int | None = None,
                 dtype: str | None = None, prefill_chunk_tokens: int = 512,
                 forward: str = "auto", decode_weights: str = "auto",
                 decode_threads: int | None = None, backend: str = "auto"):
        """`backend`: "torch" (TorchEngine: transformers' weights, capsules on every model),
        "llamacpp" (LlamaCppEngine: the GGUF on llama.cpp's kernels, in process; `dtype`,
        `forward` and `decode_weights` are the torch engine's and stay at their defaults), or
        "auto" (the default: torch, unless dtype="auto" on a CPU, where the fastest of the
        machine's candidates is taken, measured once per machine: `calibration.resolve`;
        torch whenever `forward` or `decode_weights` asks for something of its own).
        `engine_choice` says how the engine was chosen, with the calibration's figures."""
        self.name = name
        self.engine_choice = {"how": "set", "backend": backend}
        if backend == "auto":
            from csr_ros.engine import calibration

            options, self.engine_choice = calibration.resolve(
                model, device=device, dtype=dtype, forward=forward,
                decode_weights=decode_weights, threads=threads)
            backend = options["backend"]
            dtype = options.get("dtype", dtype)
            decode_weights = options.get("decode_weights", decode_weights)
        if backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
        common = dict(threads=threads, decode_threads=decode_threads,
                      max_context_tokens=max_context_tokens,
                      prefill_chunk_tokens=prefill_chunk_tokens)
        if backend == "llamacpp":
            _check_llamacpp_options(device=device, dtype=dtype, forward=forward,
                                    decode_weights=decode_weights)
            engine = make_engine(model, backend=backend, **common)
        else:
            engine = make_engine(model, backend=backend, device=device, dtype=dtype,
                                 forward=forward, decode_weights=decode_weights, **common)
        self._adopt(engine)
        self.engine_choice["precision"] = engine.precision

    @classmethod
    def from_engine(cls, engine: Engine, *, name: str = "local") -> "LocalResource":
        """A resource over an existing engine (e.g. `engine.fork()`: shared weights, own cache)."""
        self = cls.__new__(cls)
        self.name = name
        self.engine_choice = {"how": "given", "backend": engine.backend}
        self._adopt(engine)
        return self

    def _adopt(self, engine: Engine) -> None:
        self.engine = engine
        self.backend = engine.backend
        self.max_context_tokens = engine.max_context_tokens
        self._lock = threading.Lock()       # one call at a time: the engine is not thread-safe
        self._closed = False
        self._compiler = None               # llguidance's vocabulary, built on first use
        self._option_cache: dict[str, list[int]] = {}

    @contextlib.contextmanager
    def _engine_held(self) -> Iterator[None]:
        """The engine, one call at a time; a closed resource refuses the call. A node's worker
        can still hold a query for a resource its node has just closed: it gets an error, and
        the engine's freed memory is never touched."""
        with self._lock:
            if self._closed:
                raise ResourceError(f"{self.name} was closed")
            yield

    @property
    def n_committed(self) -> int:
        return self.engine.n_committed

    @property
    def committed_ids(self) -> tuple[int, ...]:
        return self.engine.committed_ids

    def load(self, ids: Sequence[int], text: str | None = None, *, version: int | None = None,
             timeout_s: float | None = None) -> PrefillResult:
        """Make the committed run `ids`. Where the run the engine holds is a start of `ids`,
        only the rest is prefilled, as a server's prefix cache would: a failover that reloads
        the version a warm-up just loaded, plus the chunks since, then costs the chunks since.
        An extend on a committed run is exact on every model (a catch-up is one); anything
        else is a cold prefill. `n_tokens` counts what was prefilled."""
        ids = tuple(ids)
        with self._engine_held():
            if not ids:
                self.engine.reset()
                return PrefillResult(0, 0.0, 0)
            held = self.engine.committed_ids
            if not held or ids[:len(held)] != held:
                result = self.engine.load(ids)
            elif len(held) == len(ids):
                return PrefillResult(0, 0.0, len(held))
            else:
                result = self.engine.extend(ids[len(held):])
        return PrefillResult(result.n_tokens, result.seconds, result.n_committed)

    def extend(self, ids: Sequence[int], text: str | None = None, *, version: int | None = None,
               timeout_s: float | None = None) -> PrefillResult:
        with self._engine_held():
            if not ids:
                return PrefillResult(0, 0.0, self.engine.n_committed)
            result = self.engine.extend(ids)
        return PrefillResult(result.n_tokens, result.seconds, result.n_committed)

    def query(self, request: Request, *, max_new_tokens: int, stop: Sequence[str] = (),
              constraint: OutputConstraint | None = None,
              on_token: Callable[[int], None] | None = None,
              on_text: Callable[[str], None] | None = None,
              timeout_s: float | None = None) -> QueryResult:
        """`constraint`: a grammar or JSON schema masks each sampled token (llguidance); a
        closed choice is scored in one forward pass instead of decoded. `on_token(n)` and
        `on_text(text)`: called with the answer's tokens and text so far after each token
        (once for a choice); what they raise stops the decode between two tokens
        (Decoder.query). An in-process computation cannot be abandoned: `timeout_s` is not
        enforced."""
        static = request.static_ids
        with self._engine_held():
            n = self._n_committed_below(request)
            if constraint is not None and constraint.kind == "choice":
                result = self._choose(request, constraint, n)
                if on_token is not None:
                    on_token(result.n_generated)
                if on_text is not None:
                    on_text(result.text)
                return result
            token_constraint = None
            if constraint is not None:
                token_constraint = self._grammar_compiler().compile(constraint)
            # Static tokens past the committed run are committed inside the query (counted in TTFT).
            generation = self.engine.query(request.dynamic_ids, max_new_tokens, stop=stop,
                                           commit_ids=static[n:], constraint=token_constraint,
                                           on_token=on_token, on_text=on_text)
        return QueryResult(text=generation.text, token_ids=generation.token_ids,
                           ttft_s=generation.ttft_s, decode_s=generation.decode_s,
                           n_prompt=len(static) + len(request.dynamic_ids),
                           n_extended=generation.n_committed, cached_tokens=n,
                           finish_reason=generation.finish_reason, resource=self.name,
                           constrained=constraint is not None,
                           mask_s=0.0 if token_constraint is None else token_constraint.mask_s)

    def score_choices(self, request: Request, options: Sequence[str]) -> ChoiceScores:
        """Every option's log-probability from the cached state."""
        with self._engine_held():
            ids, scores = self._score(request, options, self._n_committed_below(request))
        return ChoiceScores(options=tuple(options), logprobs=scores.logprobs,
                            n_tokens=tuple(len(i) for i in ids))

    def _n_committed_below(self, request: Request) -> int:
        """Under the lock: the committed run's length, which `request` must extend."""
        n, committed = self.engine.n_committed, self.engine.committed_ids
        if request.static_ids[:n] != committed:
            raise StateMismatchError(_mismatch_message(request.static_ids, committed, self.name))
        return n

    def _score(self, request: Request, options: Sequence[str], n: int):
        """Under the lock: the options' ids and their scores, committing the static tail."""
        ids = [self._option_ids(o) for o in options]
        return ids, self.engine.score_options(request.dynamic_ids, ids,
                                              commit_ids=request.static_ids[n:],
                                              end_id=self._end_id(ids))

    def _choose(self, request: Request, constraint: OutputConstraint, n: int) -> QueryResult:
        """Under the lock: the best-scoring choice, as a query result (no decoding)."""
        ids, scores = self._score(request, constraint.choices, n)
        best = max(range(len(ids)), key=scores.logprobs.__getitem__)
        # The whole answer is known when the one pass ends: TTFT is the decision's latency.
        return QueryResult(text=constraint.choices[best], token_ids=tuple(ids[best]),
                           ttft_s=scores.seconds, decode_s=0.0,
                           n_prompt=len(request.static_ids) + len(request.dynamic_ids),
                           n_extended=scores.n_committed, cached_tokens=n, finish_reason="stop",
                           resource=self.name, constrained=True,
                           choice_logprobs=scores.logprobs)

    def _option_ids(self, option: str) -> list[int]:
        ids = self._option_cache.get(option)
        if ids is None:
            ids = self.engine.tokenizer.encode_data(option)
            if len(self._option_cache) > 4096:
                self._option_cache.clear()
            self._option_cache[option] = ids
        return ids

    def _end_id(self, options: list[list[int]]) -> int | None:
        """The token that ends an answer (the chat template's end of turn), scored after each
        option only when one option is a proper prefix of another: otherwise every option is
        told apart by its own tokens and the extra rows would be wasted work."""
        whole = {tuple(o) for o in options}
        if not any(tuple(o[:k]) in whole for o in options for k in range(1, len(o))):
            return None
        tokenizer = self.engine.tokenizer
        eos = getattr(tokenizer, "eos_token", None)
        if eos:
            ids = tokenizer.encode_template(eos)
            if len(ids) == 1:
                return ids[0]
        return self.engine.eos_ids[0] if self.engine.eos_ids else None

    def _grammar_compiler(self):
        if self._compiler is None:
            from csr_ros.engine.grammar import GrammarCompiler

            if self.engine.model_dir is None:
                raise ConfigError("grammar decoding needs the model's tokenizer.json: build "
                                  "the engine from a model directory")
            self._compiler = GrammarCompiler(self.engine.model_dir / "tokenizer.json",
                                             vocab_size=self.engine.vocab_size,
                                             eos_ids=self.engine.eos_ids)
        return self._compiler

    def set_threads(self, threads: int) -> None:
        """Compute threads from the next call on: torch's (per process), or the llama.cpp
        engine's own."""
        check_positive(threads=threads)
        with self._engine_held():
            self.engine.set_threads(int(threads))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.engine.close()


def _check_llamacpp_options(*, device: str, dtype, forward: str, decode_weights: str) -> None:
    given = {"device": (device, "cpu"), "forward": (forward, "auto"),
             "decode_weights": (decode_weights, "auto")}
    bad = [f"{k}={v!r}" for k, (v, default) in given.items() if v != default]
    if dtype not in (None, "auto"):
        bad.append(f"dtype={dtype!r}")
    if bad:
        msg = (f"{', '.join(bad)} set(s) the torch engine; backend='llamacpp' runs the GGUF's own "
               "weights on the CPU: leave them at their defaults or use backend='torch'")
        raise ConfigError(msg)


def _mismatch_message(static: tuple[int, ...], committed: tuple[int, ...], name: str) -> str:
    if len(static) < len(committed):
        where = (f"the request has {len(static)} static tokens, fewer than the "
                 f"{len(committed)} committed")
    else:
        i = next(i for i, (a, b) in enumerate(zip(static, committed)) if a != b)
        where = (f"first difference at token {i} ({static[i]} in the request, "
                 f"{committed[i]} committed)")
    return (f"resource {name!r}: the request's static tokens do not start with the committed run: "
            f"{where}; load() the request's state first (a version swap or eviction was missed?)")
