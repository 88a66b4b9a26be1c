"""An LLM judge for open answers, following AMA-Bench's protocol.

    messages = judge_messages(question, reference, prediction, context=...)
    verdict = read_verdict(reply, prediction=prediction, reference=reference)

The protocol (AMA-Bench's `compute_llm_as_judge`, in its `utils/evaluation_metrics.py`):
- the judge sees the question, the reference answer and the predicted answer (with the task's
  type and description as context when there are any), and is asked whether the prediction is
  correct, with a bare "yes" or "no";
- its reply is read after removing any `<think>...</think>` block; the last "yes" or "no" in
  it, as a whole word, counts (a judge that explains before answering is still read right);
- a reply with neither scores the token F1 of the prediction against the reference instead;
- a question's judge score is 1.0, 0.0 or that F1; judge accuracy is the share of questions
  scored 1.0, as AMA-Bench reports it.

Greedy decoding (temperature 0) makes a verdict a function of its three inputs, so verdicts are
cached per (question, reference, prediction): methods that answer alike are judged once.

Pure: the judge model is reached through a client (`csr_ros.bench.eval.judge_clients`) whose
`complete(system, user) -> str` returns the reply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from csr_ros.bench.eval.scoring import token_f1

JUDGE_SYSTEM = "You are an expert evaluator of answers to questions about an agent's history."

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    score: float               # 1.0 (yes), 0.0 (no), or the token F1 when the reply says neither
    parsed: bool               # the reply held a yes or a no
    reply: str


class JudgeClient(Protocol):
    name: str

    def complete(self, system: str, user: str) -> str: ...


def judge_messages(question: str, reference: str, prediction: str, *,
                   context: dict[str, str] | None = None) -> tuple[str, str]:
    """(system, user) messages asking whether `prediction` answers `question` as `reference`
    does. `context`: e.g. {"Task type": ..., "Task": ...}; empty values are left out."""
    lines = ["Decide whether the predicted answer to the question below is correct. Judge it "
             "against the reference answer on three points: are its facts right, is it "
             "complete, and does it answer the question that was asked."]
    extra = [f"{key}: {value}" for key, value in (context or {}).items() if str(value).strip()]
    if extra:
        lines += [""] + extra
    lines += ["", f"Question: {question}", "", f"Reference answer: {reference}", "",
              f"Predicted answer: {prediction}", "",
              'Is the predicted answer correct? Reply with "yes" or "no" only, with no '
              "explanation."]
    return JUDGE_SYSTEM, "\n".join(lines)


def last_yes_no(reply: str) -> bool | None:
    """True for a final "yes", False for a final "no", None when the reply holds neither."""
    words = _YES_NO.findall(_THINK.sub(" ", reply))
    if not words:
        return None
    return words[-1].lower() == "yes"


def read_verdict(reply: str, *, prediction: str, reference: str) -> Verdict:
    said = last_yes_no(reply)
    if said is None:
        return Verdict(score=token_f1(prediction, reference), parsed=False, reply=reply)
    return Verdict(score=1.0 if said else 0.0, parsed=True, reply=reply)


class Judge:
    """Judges answers with one client, caching each verdict."""

    def __init__(self, client: JudgeClient):
        self.client = client
        self.name = client.name
        self._cache: dict[tuple[str, str, str, tuple], Verdict] = {}
        self.n_calls = 0

    def __call__(self, question: str, reference: str, prediction: str, *,
                 context: dict[str, str] | None = None) -> Verdict:
        key = (question, reference, prediction, tuple(sorted((context or {}).items())))
        if key not in self._cache:
            system, user = judge_messages(question, reference, prediction, context=context)
            self.n_calls += 1
            self._cache[key] = read_verdict(self.client.complete(system, user),
                                            prediction=prediction, reference=reference)
        return self._cache[key]

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            close()
