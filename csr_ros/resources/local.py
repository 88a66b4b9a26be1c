"""`local`: the Resource interface over the in-process engine (torch + transformers).

    make_resource("local", model="smollm2", threads=2)

Token mode only: the committed run is token ids; `text` arguments are accepted and ignored.
Construction takes plain keyword values only, so a worker process can build one from pickled
kwargs. The engine stays reachable as `.engine` for capsules (snapshot / restore / save / load).
"""

from __future__ import annotations

import threading
from typing import Sequence

from csr_ros.engine import LocalEngine
from csr_ros.errors import StateMismatchError
from csr_ros.resources.base import PrefillResult, QueryResult
from csr_ros.state import Request


class LocalResource:
    def __init__(self, model: str = "smollm2", *, name: str = "local", threads: int | None = None,
                 device: str = "cpu", max_context_tokens: int | None = None,
                 dtype: str | None = None, prefill_chunk_tokens: int = 512):
        self.name = name
        self.engine = LocalEngine(model, device=device, dtype=dtype, threads=threads,
                                  max_context_tokens=max_context_tokens,
                                  prefill_chunk_tokens=prefill_chunk_tokens)
        self.max_context_tokens = self.engine.max_context_tokens
        self._lock = threading.Lock()       # one call at a time: the engine is not thread-safe

    @property
    def n_committed(self) -> int:
        return self.engine.n_committed

    @property
    def committed_ids(self) -> tuple[int, ...]:
        return self.engine.committed_ids

    def load(self, ids: Sequence[int], text: str | None = None) -> PrefillResult:
        with self._lock:
            if not ids:
                self.engine.reset()
                return PrefillResult(0, 0.0, 0)
            result = self.engine.load(ids)
        return PrefillResult(result.n_tokens, result.seconds, result.n_committed)

    def extend(self, ids: Sequence[int], text: str | None = None) -> PrefillResult:
        with self._lock:
            if not ids:
                return PrefillResult(0, 0.0, self.engine.n_committed)
            result = self.engine.extend(ids)
        return PrefillResult(result.n_tokens, result.seconds, result.n_committed)

    def query(self, request: Request, *, max_new_tokens: int,
              stop: Sequence[str] = ()) -> QueryResult:
        with self._lock:
            n = self.engine.n_committed
            static = request.static_ids
            committed = self.engine.committed_ids
            if static[:n] != committed:
                raise StateMismatchError(_mismatch_message(static, committed, self.name))
            # Static tokens past the committed run are committed inside the query (counted in TTFT).
            generation = self.engine.query(request.dynamic_ids, max_new_tokens, stop=stop,
                                           commit_ids=static[n:])
        return QueryResult(text=generation.text, token_ids=generation.token_ids,
                           ttft_s=generation.ttft_s, decode_s=generation.decode_s,
                           n_prompt=len(static) + len(request.dynamic_ids),
                           n_extended=generation.n_committed, cached_tokens=n,
                           finish_reason=generation.finish_reason, resource=self.name)

    def close(self) -> None:
        with self._lock:
            self.engine.close()


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
