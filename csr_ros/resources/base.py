"""The one interface every inference resource implements.

A resource holds a *committed* static token run (what its KV cache / prefix cache holds) and
answers queries whose static part extends that run:

    load(ids)     replace the committed run (a warm-up: full prefill, no decoding)
    extend(ids)   append to the committed run (catch-up: prefill only the new tokens)
    query(req)    prefill req's static tokens beyond the committed run (committing them), then
                  its dynamic tokens (not committed), then decode; TTFT is measured at the first
                  sampled token on a monotonic clock; `constraint` (csr_ros.actions) restricts
                  the answer to a grammar, a JSON schema or a closed list of choices

Backends: `local` (in-process torch engine with capsules), `openai` (HTTP servers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from csr_ros.actions import OutputConstraint
from csr_ros.state import Request


@dataclass(frozen=True)
class PrefillResult:
    n_tokens: int              # tokens prefilled by this call
    seconds: float
    n_committed: int           # committed run length afterwards


@dataclass(frozen=True)
class QueryResult:
    text: str
    token_ids: tuple[int, ...]
    ttft_s: float              # request start → first sampled token
    decode_s: float            # first token → last token
    n_prompt: int              # static + dynamic tokens of the request
    n_extended: int            # static tokens that were not committed yet and were prefilled now
    cached_tokens: int | None  # prompt tokens the server reports as served from its cache
    finish_reason: str         # "stop" | "length"
    resource: str = ""
    constrained: bool = False  # decoded under an output constraint (grammar, choice, JSON)
    choice_logprobs: tuple[float, ...] | None = None   # closed choice: each option's score
    mask_s: float = 0.0        # time spent computing token masks (local grammar decoding)

    @property
    def n_generated(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class Resource(Protocol):
    name: str
    max_context_tokens: int

    @property
    def n_committed(self) -> int: ...

    def load(self, ids: Sequence[int], text: str | None = None) -> PrefillResult: ...

    def extend(self, ids: Sequence[int], text: str | None = None) -> PrefillResult: ...

    def query(self, request: Request, *, max_new_tokens: int, stop: Sequence[str] = (),
              constraint: OutputConstraint | None = None) -> QueryResult: ...

    def close(self) -> None: ...
