"""The one interface every inference resource implements, and the capabilities it declares.

A resource holds a *committed* static token run (what its KV cache / prefix cache holds) and
answers queries whose static part extends that run:

    load(ids)     replace the committed run (a warm-up: full prefill, no decoding)
    extend(ids)   append to the committed run (catch-up: prefill only the new tokens)
    query(req)    prefill req's static tokens beyond the committed run (committing them), then
                  its dynamic tokens (not committed), then decode; TTFT is measured at the first
                  sampled token on a monotonic clock; `constraint` (csr_ros.actions) restricts
                  the answer to a grammar, a JSON schema or a closed list of choices; `on_token`
                  (tokens so far) and `on_text` (text so far) follow the answer as it is
                  decoded, and what they raise stops it

Every resource takes `version=` (the CSR state version of the run: a routing key behind a
router) and `timeout_s=` (enforced where `capabilities.timeout`; the others bound their calls
their own way, e.g. an HTTP read timeout). What else a resource can do it declares in
`capabilities`; callers read the flags, they never probe for attributes:

    flag            what the resource then has                                  who
    score_choices   score_choices(request, options) -> actions.ChoiceScores      local
    echo_logprobs   info, check_health(), prompt_of(request),                   openai
                    choice_logprobs(prompt, choices), echo_logprobs(prompt, text)
    capsules        engine: an in-process csr_ros.engine.Engine (snapshot,      local
                    restore, save_capsule, load_capsule, scratch, query)
    routing_key     routing_key, routing_key_for(version), last_routing_key     openai, robot_id
    set_threads     set_threads(n): compute threads from the next call on       local
    background      set_background(background, few_threads=): yield the CPU     process
    timeout         timeout_s= enforced: a call that overruns kills the worker  process
    worker          apply(func, *args), call(path): run next to the resource    process

Backends: `local` (in-process engines, torch or llama.cpp: resources/local.py), `openai`
(OpenAI-compatible servers: vLLM, SGLang, llama.cpp's: resources/openai.py), and any of them
in a worker process (`ProcessResource`, resources/process.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

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


@dataclass(frozen=True)
class Capabilities:
    """What a resource can do beyond the `Resource` protocol (the table in the module
    docstring says which attributes each flag promises)."""

    score_choices: bool = False
    echo_logprobs: bool = False
    capsules: bool = False
    routing_key: bool = False
    set_threads: bool = False
    background: bool = False
    timeout: bool = False
    worker: bool = False


@runtime_checkable
class Resource(Protocol):
    name: str
    max_context_tokens: int

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def n_committed(self) -> int: ...

    @property
    def committed_ids(self) -> tuple[int, ...]: ...

    @property
    def state_mode(self) -> str:
        """The CsrState mode that fits: "token", or "text" where prompts travel as text."""

    def load(self, ids: Sequence[int], text: str | None = None, *, version: int | None = None,
             timeout_s: float | None = None) -> PrefillResult: ...

    def extend(self, ids: Sequence[int], text: str | None = None, *, version: int | None = None,
               timeout_s: float | None = None) -> PrefillResult: ...

    def query(self, request: Request, *, max_new_tokens: int, stop: Sequence[str] = (),
              constraint: OutputConstraint | None = None,
              on_token: Callable[[int], None] | None = None,
              on_text: Callable[[str], None] | None = None,
              timeout_s: float | None = None) -> QueryResult: ...

    def close(self) -> None: ...
