"""Answering one question on a resource, and judging the answer.

Questions with choices are scored by the log-likelihood of each choice given the prompt:
- local engine: the request's static tokens are committed (only those not cached yet), the
  dynamic part is prefilled once inside a scratch block, and each choice is scored from a
  scratch of that state, token by token, so the context is never recomputed per choice;
- OpenAI-compatible servers that compute prompt log-probabilities correctly (vLLM, SGLang):
  one streamed request for TTFT, then one request per choice with `echo` and `logprobs`,
  whose prefix is served from the server's cache;
- llama.cpp servers (llama-cpp-python): its echoed log-probabilities are paired one position
  late and cost a sort of the vocabulary per prompt token, so the choice is instead the one a
  greedy answer names (`match_choice`); the prompt lists the choices either way.
A choice's score is the mean log-probability of its tokens (`choice_score="mean"`, the default:
choices of different token lengths compete fairly) or their sum (`"sum"`).

Other (open) questions: a greedy answer, scored as AMA-Bench scores open answers: normalized
exact match and token F1 here (`normalize_answer`, `token_f1`), and an LLM judge
(`csr_ros.eval.judge`) after the run.

TTFT is measured at one point per backend: from the call until the prompt is processed and the
first answer token is known; `decision_s` runs until the answer is chosen (all choices scored,
or greedy decoding finished).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from csr_ros.errors import ConfigError, ResourceError, StateMismatchError
from csr_ros.state import Request

CHOICE_SCORES = ("mean", "sum")


@dataclass(frozen=True)
class Answer:
    prediction: str
    ttft_s: float
    decision_s: float
    choice_scores: tuple[float, ...] = ()


# -- judging ------------------------------------------------------------------------------------

ARTICLES = frozenset({"a", "an", "the"})
# A word is a run of letters and digits (underscores split words: ROS names such as red_mug
# read as "red mug"); an option label "(b)" is kept as one token.
_TOKEN = re.compile(r"\([^\W_]\)|[^\W_]+")


def answer_tokens(text: str) -> list[str]:
    """AMA-Bench's normalization as tokens: lower case, every non-word character a separator,
    the articles a/an/the dropped. Two additions: underscores separate words, and an option
    label such as "(B)" stays one token (so "(A)" is not read as the article "a")."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in ARTICLES]


def normalize_answer(text: str) -> str:
    """The whole answer, normalized: tokens joined by single spaces."""
    return " ".join(answer_tokens(text))


def exact_match(prediction: str, answer: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(answer) != ""


def token_f1(prediction: str, answer: str) -> float:
    """Token F1 of the normalized answers (the SQuAD measure AMA-Bench uses): 1.0 when both
    are empty, 0.0 when only one is."""
    said, gold = answer_tokens(prediction), answer_tokens(answer)
    if not said or not gold:
        return 1.0 if not said and not gold else 0.0
    common = sum((Counter(said) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(said), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def contains_answer(prediction: str, answer: str) -> bool:
    """The normalized answer appears as whole words in the normalized prediction (a looser
    reading of a free answer, reported beside exact match)."""
    said, gold = normalize_answer(prediction), normalize_answer(answer)
    return bool(gold) and re.search(r"(?<![a-z0-9])" + re.escape(gold) + r"(?![a-z0-9])",
                                    said) is not None






# -- asking -------------------------------------------------------------------------------------

def ask(resource, request: Request, *, choices: Sequence[str] = (), tokenizer=None,
        max_new_tokens: int = 16, choice_score: str = "mean",
        openai_choices: str = "auto") -> Answer:
    """Answer one question on `resource` (a local or OpenAI resource) for `request`."""
    if choice_score not in CHOICE_SCORES:
        raise ConfigError(f"choice_score must be one of {CHOICE_SCORES}, got {choice_score!r}")
    if not choices:
        started = time.perf_counter()
        result = resource.query(request, max_new_tokens=max_new_tokens, stop=("\n",))
        return Answer(prediction=result.text.strip(), ttft_s=result.ttft_s,
                      decision_s=time.perf_counter() - started)
    if resource.capabilities.capsules:
        if tokenizer is None:
            raise ConfigError("scoring choices on the local engine needs the tokenizer")
        choice_ids = [list(tokenizer.encode_data(c)) for c in choices]
        ttft_s, decision_s, logprobs = score_choices_local(resource, request, choice_ids)
    elif openai_choice_mode(resource, openai_choices) == "logprobs":
        ttft_s, decision_s, logprobs = score_choices_openai(resource, request, choices)
    else:
        started = time.perf_counter()
        result = resource.query(request, max_new_tokens=max_new_tokens, stop=("\n",))
        named = match_choice(result.text, choices)
        return Answer(prediction=named if named is not None else result.text.strip(),
                      ttft_s=result.ttft_s, decision_s=time.perf_counter() - started)
    scores = tuple(sum(lp) / len(lp) if choice_score == "mean" else sum(lp) for lp in logprobs)
    best = max(range(len(choices)), key=lambda i: scores[i])
    return Answer(prediction=choices[best], ttft_s=ttft_s, decision_s=decision_s,
                  choice_scores=scores)


def score_choices_local(resource, request: Request, choice_ids: Sequence[Sequence[int]]
                        ) -> tuple[float, float, list[list[float]]]:
    """(ttft_s, decision_s, per-token log-probs of each choice) on a `LocalResource`.

    The static tokens past the committed run are committed (as a query would); the dynamic
    part and the choices are computed inside scratch blocks and rolled back.
    """
    if any(len(ids) == 0 for ids in choice_ids):
        raise ConfigError("a choice tokenizes to nothing; choices must be non-empty text")
    engine = resource.engine
    n = engine.n_committed
    if tuple(request.static_ids[:n]) != engine.committed_ids:
        msg = (f"resource {resource.name!r}: the request's static tokens do not extend the "
               f"{n} committed tokens; load the request's state first")
        raise StateMismatchError(msg)
    started = time.perf_counter()
    if len(request.static_ids) > n:
        engine.extend(request.static_ids[n:])
    logprobs: list[list[float]] = []
    with engine.scratch():
        if request.dynamic_ids:
            engine.extend(request.dynamic_ids)
        first = engine.last_logprobs()                      # [V]: the first answer token
        int(first.argmax())
        ttft_s = time.perf_counter() - started
        for ids in choice_ids:
            with engine.scratch():
                lps = [float(first[ids[0]])]
                for prev, tok in zip(ids[:-1], ids[1:]):
                    engine.extend([prev])
                    lps.append(float(engine.last_logprobs()[tok]))
            logprobs.append(lps)
    return ttft_s, time.perf_counter() - started, logprobs


OPENAI_CHOICE_MODES = ("auto", "logprobs", "generate")


def openai_choice_mode(resource, requested: str = "auto") -> str:
    """'logprobs' (echo + logprobs per choice) on servers that compute prompt log-probabilities
    correctly (vLLM, SGLang); 'generate' (a greedy answer matched to the choices) elsewhere:
    llama-cpp-python's echoed log-probabilities are one position late and sort the vocabulary
    per prompt token (minutes for a few thousand tokens)."""
    if requested not in OPENAI_CHOICE_MODES:
        raise ConfigError(f"openai choice mode must be one of {OPENAI_CHOICE_MODES}, "
                          f"got {requested!r}")
    if requested != "auto":
        return requested
    if not resource.capabilities.echo_logprobs:
        return "generate"
    info = resource.info or resource.check_health()
    return "logprobs" if info.kind in ("vllm", "sglang") else "generate"


def score_choices_openai(resource, request: Request,
                         choices: Sequence[str]) -> tuple[float, float, list[list[float]]]:
    """(ttft_s, decision_s, per-token log-probs of each choice) over an OpenAI-compatible
    server: a one-token streamed query gives TTFT (and warms the server's prefix cache), then
    the choices are scored from that cache (`OpenAIResource.choice_logprobs`)."""
    started = time.perf_counter()
    first = resource.query(request, max_new_tokens=1)
    prompt = resource.prompt_of(request)
    logprobs = resource.choice_logprobs(prompt, choices)
    for choice, lps in zip(choices, logprobs):
        if not lps:
            raise ResourceError(f"{resource.url} returned no log-probabilities for the choice "
                                f"{choice!r}")
    return first.ttft_s, time.perf_counter() - started, logprobs


def match_choice(prediction: str, choices: Sequence[str]) -> str | None:
    """The choice a free answer names: equal after normalization, else the choice named
    earliest in it (longest first on ties); None if it names none."""
    said = normalize_answer(prediction)
    normalized = [normalize_answer(c) for c in choices]
    for choice, norm in zip(choices, normalized):
        if said == norm:
            return choice
    found = []
    for choice, norm in zip(choices, normalized):
        m = re.search(r"(?<![a-z0-9])" + re.escape(norm) + r"(?![a-z0-9])", said) if norm else None
        if m:
            found.append((m.start(), -len(norm), choice))
    return min(found)[2] if found else None
