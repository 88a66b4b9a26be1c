"""What each kind of OpenAI-compatible completions server understands, beyond the common API.

    kind        prompts    generated ids       output constraints            prompt log-probs
    vllm        token ids  return_token_ids    structured_outputs (>= 0.10.2),  yes; choices by
                                               guided_* before                  logprob_token_ids
    sglang      token ids  -                   (none known)                     yes (echo)
    llama.cpp   text       -                   grammar (GBNF)                   no: one position
                                                                                late (echo)
    openai      text       -                   (none known)                     no

llama-cpp-python rejects token-id prompts, and pairs each echoed token with the logits
computed *at* it, sorting the whole vocabulary per prompt token, so it is never asked for them.
How an output constraint travels (docs/openai_and_vllm.md): vLLM >= 0.10.2 reads
`structured_outputs` {choice | json | grammar}, older vLLM `guided_choice` / `guided_json` /
`guided_grammar` (removed in 0.12, and silently ignored there); llama.cpp's server `grammar`.
Pure: the resource (openai.py) asks the server and picks the dialect here.
"""

from __future__ import annotations

from dataclasses import dataclass

from csr_ros.actions import OutputConstraint

STRUCTURED_APIS = ("auto", "structured_outputs", "guided", "grammar", "none")
VLLM_STRUCTURED_OUTPUTS_SINCE = (0, 10, 2)
MAX_LOGPROB_TOKEN_IDS = 128                    # vLLM's bound on logprob_token_ids per request


@dataclass(frozen=True)
class ServerInfo:
    kind: str                      # "vllm" | "sglang" | "llama.cpp" | "openai" (unknown)
    model: str                     # the model id requests are sent for
    models: tuple[str, ...]        # every id the server lists
    context_tokens: int | None     # the server's context maximum, when it reports one
    version: str | None = None     # vLLM's GET /version, when it answers


@dataclass(frozen=True)
class Dialect:
    kind: str
    token_prompts: bool            # accepts prompts as token ids
    returns_token_ids: bool        # `return_token_ids`: the generated ids in each streamed piece
    prompt_logprobs: bool          # computes the log-probabilities of echoed prompts correctly
    choice_token_ids: bool         # scores next tokens named by `logprob_token_ids`
    structured: str                # how output constraints travel (STRUCTURED_APIS)

    def structured_api(self, version: str | None) -> str:
        if self.kind == "vllm":
            number = version_tuple(version)
            if number is not None and number < VLLM_STRUCTURED_OUTPUTS_SINCE:
                return "guided"
        return self.structured


DIALECTS = {
    "vllm": Dialect("vllm", True, True, True, True, "structured_outputs"),
    "sglang": Dialect("sglang", True, False, True, False, "none"),
    "llama.cpp": Dialect("llama.cpp", False, False, False, False, "grammar"),
    "openai": Dialect("openai", False, False, False, False, "none"),
}


def server_kind(owners: set[str], props: dict | None) -> str:
    """The kind of server from the `owned_by` of its /v1/models entries and its /props."""
    if "vllm" in owners:
        return "vllm"
    if "sglang" in owners:
        return "sglang"
    if props is not None and "default_generation_settings" in props:
        return "llama.cpp"
    return "openai"


def server_context_tokens(entries: list[dict], model: str, props: dict | None) -> int | None:
    """vLLM lists max_model_len per model; llama.cpp servers say n_ctx in /props."""
    for entry in entries:
        if entry.get("id") == model and isinstance(entry.get("max_model_len"), int):
            return entry["max_model_len"]
    if props:
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        if isinstance(n_ctx, int) and n_ctx > 0:
            return n_ctx
    return None


def structured_fields(api: str, constraint: OutputConstraint) -> dict:
    """The request fields that make a server of `api` decode only what `constraint` allows
    (empty for "none")."""
    if api == "structured_outputs":
        if constraint.kind == "choice":
            return {"structured_outputs": {"choice": list(constraint.choices)}}
        if constraint.kind == "json":
            return {"structured_outputs": {"json": constraint.json_schema}}
        return {"structured_outputs": {"grammar": constraint.grammar}}
    if api == "guided":
        if constraint.kind == "choice":
            return {"guided_choice": list(constraint.choices)}
        if constraint.kind == "json":
            return {"guided_json": constraint.json_schema}
        return {"guided_grammar": constraint.grammar}
    if api == "grammar":
        # llama-cpp-python's completions take a GBNF grammar only; the vocabulary's grammar
        # allows exactly its choices (and parses like the JSON form's decisions).
        return {"grammar": constraint.grammar}
    return {}


def choice_prefixes(tails) -> list[tuple[int, ...]]:
    """The distinct proper prefixes of the token sequences (the empty one first), in order:
    the points at which the next token of some choice must be scored."""
    seen: dict[tuple[int, ...], None] = {}
    for tail in tails:
        for i in range(len(tail)):
            seen.setdefault(tuple(tail[:i]), None)
    return list(seen)


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """"0.10.2" / "0.11.0rc1" / "0.9.1+cu126" → (0, 10, 2) / (0, 11, 0) / (0, 9, 1)."""
    if not version:
        return None
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts) if parts else None
