"""Answering one question on a resource, and judging the answer.

A question with choices shows its options lettered, in an order shuffled per question
(`option_order`), and is scored by a rule of `CHOICE_SCORINGS` (`label`, `pmi` with its
`ContentFreePrior`, `mean`, `sum`), read from the local engine, from a server that computes
prompt log-probabilities (`OpenAIResource.choice_logprobs`), or, on llama.cpp's server, from
a constrained or greedy answer (`pmi` refused there: `check_scoring`). An open question is a
greedy answer, scored by exact match and token F1 (`normalize_answer`, `token_f1`) and by
the judge after the run. The rules, the backends and where TTFT is taken: docs/eval.md,
"Scoring".
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from csr_ros.actions import OutputConstraint
from csr_ros.errors import ConfigError, ResourceError, StateMismatchError
from csr_ros.state import Request

CHOICE_SCORINGS = ("label", "pmi", "mean", "sum")
LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class Answer:
    prediction: str
    ttft_s: float
    decision_s: float
    choice_scores: tuple[float, ...] = ()   # per option as shown (label: per letter)
    label: str = ""                         # the letter of the option chosen ("" if none was)


# -- options as shown ---------------------------------------------------------------------------

def option_labels(n: int) -> tuple[str, ...]:
    """The letters of `n` options: A, B, C, ..."""
    if not 1 <= n <= len(LABELS):
        raise ConfigError(f"a question has {n} options; label scoring letters 1 to "
                          f"{len(LABELS)}")
    return tuple(LABELS[:n])


def option_order(n: int, key: str, seed: int | None) -> tuple[int, ...]:
    """The order the options of a question are shown in: a permutation of range(n) drawn from
    `seed` and the question's `key` (stable across processes, unlike hash()); the given order
    when `seed` is None. The key holds no method, so every method sees the same order."""
    order = list(range(n))
    if seed is None:
        return tuple(order)
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
    return tuple(order)


def lettered_options(options: Sequence[str]) -> str:
    """One line per option: 'A. kitchen'."""
    return "\n".join(f"{label}. {option}"
                     for label, option in zip(option_labels(len(options)), options))


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

def ask(resource, request: Request, *, choices: Sequence[str] = (), scoring: str = "label",
        tokenizer=None, prior: ContentFreePrior | None = None, max_new_tokens: int = 16,
        openai_choices: str = "auto") -> Answer:
    """Answer one question on `resource` (a local or OpenAI resource) for `request`.

    `choices` in the order the prompt shows them (lettered A, B, ... for `label`); `scoring`
    one of CHOICE_SCORINGS; `prior` the content-free log-likelihoods `pmi` subtracts."""
    if not choices:
        started = time.perf_counter()
        result = resource.query(request, max_new_tokens=max_new_tokens, stop=("\n",))
        return Answer(prediction=result.text.strip(), ttft_s=result.ttft_s,
                      decision_s=time.perf_counter() - started)
    return ask_choices(resource, request, choices=choices, scorings=(scoring,),
                       tokenizer=tokenizer, prior=prior, max_new_tokens=max_new_tokens,
                       openai_choices=openai_choices)[scoring]


def ask_choices(resource, request: Request, *, choices: Sequence[str], scorings: Sequence[str],
                tokenizer=None, prior: ContentFreePrior | None = None,
                max_new_tokens: int = 16, openai_choices: str = "auto") -> dict[str, Answer]:
    """Each rule's answer to one question with choices, from one pass: the rules share the
    prompt, so they are `label` alone or rules that score the options' text (pmi, mean, sum:
    the options' log-likelihoods are read once and each rule ranks them its way)."""
    for scoring in scorings:
        if scoring not in CHOICE_SCORINGS:
            raise ConfigError(f"choice scoring must be one of {CHOICE_SCORINGS}, "
                              f"got {scoring!r}")
    if "label" in scorings and len(scorings) > 1:
        raise ConfigError("label scoring asks for a letter, the others for the option's "
                          "words: they need prompts of their own")
    labels = option_labels(len(choices))
    mode = "local" if resource.capabilities.capsules else \
        openai_choice_mode(resource, openai_choices)
    if mode == "local" and tokenizer is None:
        raise ConfigError("scoring choices on the local engine needs the tokenizer")
    if list(scorings) == ["label"]:
        if mode == "generate":
            return {"label": _constrained_label(resource, request, choices, labels)}
        ttft_s, decision_s, logprobs = _logprobs(resource, request, labels, mode, tokenizer,
                                                 single_token=True)
        ranked = {"label": tuple(lps[0] for lps in logprobs)}
    elif mode == "generate":
        if "pmi" in scorings:
            raise ConfigError(_NO_LOGPROBS_FOR_PMI)
        named = _named_choice(resource, request, choices, labels, max_new_tokens)
        return {scoring: named for scoring in scorings}
    else:
        ttft_s, decision_s, logprobs = _logprobs(resource, request, choices, mode, tokenizer)
        ranked = {}
        for scoring in scorings:
            if scoring == "pmi":
                if prior is None:
                    raise ConfigError("pmi scoring needs the content-free prior "
                                      "(ContentFreePrior)")
                ranked[scoring] = tuple(sum(lp) - base
                                        for lp, base in zip(logprobs, prior(choices)))
            elif scoring == "mean":
                ranked[scoring] = tuple(sum(lp) / len(lp) for lp in logprobs)
            else:
                ranked[scoring] = tuple(sum(lp) for lp in logprobs)
    answers = {}
    for scoring, scores in ranked.items():
        best = max(range(len(choices)), key=lambda i: scores[i])
        answers[scoring] = Answer(prediction=choices[best], ttft_s=ttft_s,
                                  decision_s=decision_s, choice_scores=scores,
                                  label=labels[best])
    return answers


_NO_LOGPROBS_FOR_PMI = ("pmi scoring needs the options' log-likelihoods, which this server does "
                        "not give (llama.cpp's echoes them one position late): use "
                        "--choice-scoring label, or a vLLM or SGLang server")


def check_scoring(resource, scorings: Sequence[str], openai_choices: str = "auto") -> None:
    """Refuse, before a run, a scoring rule `resource` cannot apply."""
    for scoring in scorings:
        if scoring not in CHOICE_SCORINGS:
            raise ConfigError(f"choice scoring must be one of {CHOICE_SCORINGS}, "
                              f"got {scoring!r}")
    if "pmi" in scorings and not resource.capabilities.capsules and \
            openai_choice_mode(resource, openai_choices) == "generate":
        raise ConfigError(_NO_LOGPROBS_FOR_PMI)


def _logprobs(resource, request: Request, texts: Sequence[str], mode: str, tokenizer, *,
              single_token: bool = False) -> tuple[float, float, list[list[float]]]:
    """(ttft_s, decision_s, per-token log-probs of each of `texts` as the answer)."""
    if mode == "local":
        ids = [list(tokenizer.encode_data(t)) for t in texts]
        if single_token and any(len(i) != 1 for i in ids):
            raise ConfigError(f"the option letters {list(texts)} are not one token each in this "
                              "tokenizer; score by pmi instead")
        return score_choices_local(resource, request, ids)
    ttft_s, decision_s, logprobs = score_choices_openai(resource, request, texts)
    if single_token and any(len(lp) != 1 for lp in logprobs):
        raise ConfigError(f"the option letters {list(texts)} are not one token each in "
                          f"{resource.url}'s tokenizer; score by pmi instead")
    return ttft_s, decision_s, logprobs


def _constrained_label(resource, request: Request, choices: Sequence[str],
                       labels: Sequence[str]) -> Answer:
    """A greedy one-token answer that the server may only draw from the letters (a grammar):
    the letter with the highest logit, as `label` scoring reads it elsewhere."""
    grammar = "root ::= " + " | ".join(f'"{label}"' for label in labels)
    started = time.perf_counter()
    result = resource.query(request, max_new_tokens=1,
                            constraint=OutputConstraint("choice", grammar, tuple(labels)))
    said = result.text.strip()
    if said in labels:
        return Answer(prediction=choices[labels.index(said)], ttft_s=result.ttft_s,
                      decision_s=time.perf_counter() - started, label=said)
    # A server that ignored the grammar: the answer names no option and is scored wrong.
    return Answer(prediction=said, ttft_s=result.ttft_s,
                  decision_s=time.perf_counter() - started)


def _named_choice(resource, request: Request, choices: Sequence[str], labels: Sequence[str],
                  max_new_tokens: int) -> Answer:
    """The option a greedy answer names (mean and sum where no log-probabilities are given)."""
    started = time.perf_counter()
    result = resource.query(request, max_new_tokens=max_new_tokens, stop=("\n",))
    named = match_choice(result.text, choices)
    return Answer(prediction=named if named is not None else result.text.strip(),
                  ttft_s=result.ttft_s, decision_s=time.perf_counter() - started,
                  label=labels[list(choices).index(named)] if named is not None else "")


class ContentFreePrior:
    """Each option's summed log-likelihood after a fixed content-free prompt, computed once per
    option text (so once per option set) and shared by every method of a run: what `pmi`
    subtracts so that an option's own wording does not decide the answer.

    `request`: the content-free prompt (no memory, no question, no options). `resource`: a
    resource of its own on the local engine (a fork: its committed run is the content-free
    prompt), or an OpenAI resource (scored statelessly, `choice_logprobs`)."""

    def __init__(self, resource, request: Request, tokenizer, openai_choices: str = "auto"):
        self.resource = resource
        self.request = request
        self.tokenizer = tokenizer
        self.mode = ("local" if resource.capabilities.capsules
                     else openai_choice_mode(resource, openai_choices))
        if self.mode == "generate":
            raise ConfigError(_NO_LOGPROBS_FOR_PMI)
        self._scores: dict[str, float] = {}

    @property
    def n_scored(self) -> int:
        """Options scored so far (each once)."""
        return len(self._scores)

    def __call__(self, options: Sequence[str]) -> tuple[float, ...]:
        missing = [o for o in dict.fromkeys(options) if o not in self._scores]
        if missing:
            if self.mode == "local":
                if self.resource.committed_ids != self.request.static_ids:
                    self.resource.load(self.request.static_ids)
                ids = [list(self.tokenizer.encode_data(o)) for o in missing]
                _, _, logprobs = score_choices_local(self.resource, self.request, ids)
            else:
                prompt = (list(self.request.ids) if self.request.text is None
                          else self.request.text)
                logprobs = self.resource.choice_logprobs(prompt, missing)
            for option, lps in zip(missing, logprobs):
                self._scores[option] = sum(lps)
        return tuple(self._scores[o] for o in options)


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
