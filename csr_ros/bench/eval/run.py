"""Replay episodes into memory methods, ask the questions, record every answer.

    resources = EvalResources.local(max_context_tokens=8192)
    specs = [MethodSpec("csr", {"tau_mem_tokens": 2048}),
             MethodSpec("window", {"window_tokens": 512})]
    records = evaluate(episodes, specs, resources, progress=print)

Methods run one after another over the whole input, never interleaved, so that no method finds
another's prompt in a shared server cache (on the local engine each method has its own fork and
every question is asked of all in turn). Every method sees the same observations and is asked
the same questions at the same episode times.

A question with choices shows them lettered, in an order shuffled with a seed per question
(the same order for every method), and is asked once per choice-scoring rule (`scorings`:
label, pmi, mean; csr_ros.bench.eval.scoring) on the same committed state; an open question is asked
once, and its record stands in every rule's row.

Every answer is scored by exact match (`correct`); an open one also by token F1 (`f1`), and
after the run by an LLM judge (`judge_records`). Each record says whether the question's
evidence was inside the prompt (`evidence_covered`, None for a question without evidence).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Sequence

from csr_ros.errors import ConfigError
from csr_ros.bench.eval.episode import NS_PER_S, EvalEpisode, Observation, Question
from csr_ros.bench.eval.evidence import covered, resolve
from csr_ros.bench.eval.methods import METHODS, Bm25Method, CsrMethod, NoMemoryMethod, WindowMethod
from csr_ros.bench.eval.scoring import (CHOICE_SCORINGS, ContentFreePrior, ask, ask_choices,
                                        contains_answer, exact_match, lettered_options,
                                        option_labels, option_order, token_f1)
from csr_ros.layout import Layout
from csr_ros.node_logic.suffix import InstantValue, build_suffix

PROFILE = (
    "You are the memory of a mobile robot. The user message lists what the robot observed, "
    "oldest first, then the current time and one question about what it observed. Answer from "
    "the observations, with the answer only, no explanation.")
INSTANT_STALE_S = 30.0
REPLAY_PROGRESS_S = 30.0          # a progress line this often while chunks replay between questions
LOCAL_MAX_CONTEXT_TOKENS = 8192     # the local engine's default ceiling (K/V per method fork)
NO_RULE = ("",)                   # the rows' rule where no question has choices
LABEL_INSTRUCTION = "Answer with the letter of the right option only."
TEXT_INSTRUCTION = "Answer with one of the options."


@dataclass(frozen=True)
class MethodSpec:
    name: str                          # csr | window | bm25 | none
    budget: dict = field(default_factory=dict)
    note: str = ""                     # how the budget was chosen (e.g. "ttft of csr tau_mem=2048")

    def __post_init__(self):
        if self.name not in METHODS:
            raise ConfigError(f"unknown method {self.name!r}; choose from {', '.join(METHODS)}")


@dataclass
class QuestionRecord:
    method: str
    label: str
    budget: dict
    episode: str
    qid: str
    kind: str
    t_s: float
    question: str
    answer: str
    choices: list
    prediction: str
    correct: bool                      # normalized exact match
    contains: bool                     # the answer appears in the prediction (looser)
    ttft_s: float
    decision_s: float
    prompt_tokens: int
    recomputed_tokens: int
    history_tokens: int                # chunk tokens in the prompt
    history_chunks: int
    sub_type: str = ""
    f1: float | None = None            # token F1 of an open answer (None: a choice question)
    evidence_items: int = 0            # observations the answer rests on (0: none named)
    evidence_covered: bool | None = None   # all of them inside the prompt (None: none named)
    judge: float | None = None         # the judge's score: 1.0 / 0.0, or F1 if it said neither
    judge_parsed: bool | None = None   # the judge's reply held a yes or a no
    judge_reply: str | None = None
    scoring: str = ""                  # the choice-scoring rule of the row (label, pmi, mean)
    shown_choices: list = field(default_factory=list)   # the choices in the order shown
    answer_label: str = ""             # the letter the right option was shown with
    predicted_label: str = ""          # the letter of the option chosen ("" when none was)


class EvalResources:
    """The resources methods run on: `primary` for the single-resource methods and CSR's R1,
    `secondary` for CSR's R2 (another server, or a fork of the local engine's cache)."""

    def __init__(self, kind: str, primary, secondary, tokenizer, *, mode: str = "token",
                 owns_primary: bool = True):
        self.kind = kind
        self.owns_primary = owns_primary
        self.primary = primary
        self.secondary = secondary
        self.tokenizer = tokenizer
        self.mode = mode
        self.layout = Layout.from_tokenizer(tokenizer)

    @property
    def max_context_tokens(self) -> int:
        return min(self.primary.max_context_tokens, self.secondary.max_context_tokens)

    @property
    def backend(self) -> str | None:
        """The local engine's backend (torch or llamacpp); None over HTTP."""
        return self.primary.engine.backend if self.primary.capabilities.capsules else None

    @property
    def engine_choice(self) -> dict | None:
        """How the local engine was chosen (LocalResource.engine_choice); None over HTTP."""
        return getattr(self.primary, "engine_choice", None)

    @classmethod
    def local(cls, model: str = "smollm2", *, max_context_tokens: int | None = None,
              threads: int | None = None, engine=None, backend: str = "auto") -> "EvalResources":
        """`max_context_tokens` None: the model's context, at most LOCAL_MAX_CONTEXT_TOKENS."""
        from csr_ros.resources.local import LocalResource

        owns = engine is None
        if engine is None:
            if max_context_tokens is None:
                max_context_tokens = _local_max_context(model)
            primary = LocalResource(model, name="local-r1", threads=threads,
                                    max_context_tokens=max_context_tokens, backend=backend)
            engine = primary.engine
        else:
            primary = LocalResource.from_engine(engine, name="local-r1")
        secondary = LocalResource.from_engine(engine.fork(), name="local-r2")
        return cls("local", primary, secondary, engine.tokenizer, owns_primary=owns)

    @classmethod
    def openai(cls, urls: Sequence[str], **options) -> "EvalResources":
        """One URL: both CSR roles on one server (its cache holds what was prefilled last);
        two URLs: R1 and R2 on two servers, as deployed."""
        from csr_ros.resources.openai import OpenAIOptions, OpenAIResource

        if not 1 <= len(urls) <= 2:
            raise ConfigError(f"give one or two server URLs, got {len(urls)}")
        primary = OpenAIResource(OpenAIOptions(urls[0], name="openai-r1", **options))
        secondary = OpenAIResource(OpenAIOptions(urls[-1], name="openai-r2", **options))
        return cls("openai", primary, secondary, primary.tokenizer, mode=primary.state_mode)

    def own(self, spec: "MethodSpec") -> "EvalResources":
        """Resources of one method's own, for interleaved runs on the local engine: forks of
        the engine (shared weights, own K/V buffers), so no method disturbs another's cache."""
        from csr_ros.resources.local import LocalResource

        assert self.kind == "local", "only local engines can be forked per method"
        engine = self.primary.engine
        name = spec.name
        primary = LocalResource.from_engine(engine.fork(), name=f"{name}-r1")
        secondary = (LocalResource.from_engine(engine.fork(), name=f"{name}-r2")
                     if spec.name == "csr" else primary)
        return EvalResources("local-fork", primary, secondary, self.tokenizer, mode=self.mode)

    def content_free(self):
        """A resource for the content-free prompt `pmi` calibrates with: on the local engine a
        fork of its own (no method's committed run is touched); over HTTP the primary, which
        scores it statelessly (`choice_logprobs`)."""
        from csr_ros.resources.local import LocalResource

        if self.primary.capabilities.capsules:
            return LocalResource.from_engine(self.primary.engine.fork(), name="content-free")
        return self.primary

    def warm_up(self) -> None:
        """One untimed query per resource: first forwards allocate and initialize kernels, and
        the first HTTP request opens the connection."""
        from csr_ros.state import CsrState

        state = CsrState(tokenizer=self.tokenizer, layout=self.layout,
                         profile="warm-up, not part of any episode", mode=self.mode)
        state.add("warm-up observation", source="warm_up", stamp_ns=0)
        request = state.build_request(task="say ok")
        for resource in (self.primary, self.secondary):
            resource.load((), "")
            resource.query(request, max_new_tokens=2)
            resource.load((), "")

    def close(self) -> None:
        if self.kind == "local-fork":
            for resource in {id(r): r for r in (self.primary, self.secondary)}.values():
                resource.engine.close()
            return
        if self.kind == "local":
            self.secondary.engine.close()        # the fork's buffers; the weights stay shared
            if self.owns_primary:
                self.primary.close()
            return
        self.secondary.close()
        self.primary.close()


def _local_max_context(model: str) -> int:
    """The model's training context, at most LOCAL_MAX_CONTEXT_TOKENS: every method runs on a
    fork of its own, and each fork holds K/V for a whole context."""
    from csr_ros.model_store import training_context_tokens

    trained = training_context_tokens(model)
    return min(LOCAL_MAX_CONTEXT_TOKENS, trained or LOCAL_MAX_CONTEXT_TOKENS)


def build_method(spec: MethodSpec, resources: EvalResources):
    common = dict(mode=resources.mode)
    budget = dict(spec.budget)
    if spec.name == "csr":
        budget.setdefault("max_context_tokens", resources.max_context_tokens)
        return CsrMethod([resources.primary, resources.secondary], resources.tokenizer,
                         resources.layout, **budget, **common)
    cls = {"window": WindowMethod, "bm25": Bm25Method, "none": NoMemoryMethod}[spec.name]
    return cls(resources.primary, resources.tokenizer, resources.layout, **budget, **common)


def task_text(question: Question, scoring: str = "label",
              shown: Sequence[str] | None = None) -> str:
    """The question as the prompt's dynamic part asks it: the options lettered in the order
    `shown` (default: as given), then how to answer (a letter for `label` scoring, the option's
    words for the others)."""
    if question.choices:
        options = lettered_options(question.choices if shown is None else shown)
        instruction = LABEL_INSTRUCTION if scoring == "label" else TEXT_INSTRUCTION
        return f"Question: {question.question}\nOptions:\n{options}\n{instruction}"
    return f"Question: {question.question}\nAnswer in a few words."


def content_free_request(resources: EvalResources, profile: str = PROFILE):
    """The fixed content-free prompt `pmi` calibrates with: the profile and the instruction
    to answer with an option, and no memory, question or options."""
    from csr_ros.state import CsrState

    state = CsrState(tokenizer=resources.tokenizer, layout=resources.layout, profile=profile,
                     mode=resources.mode)
    return state.build_request(task=TEXT_INSTRUCTION)


def profile_text(episode: EvalEpisode, profile: str = PROFILE) -> str:
    return profile + ("\n" + episode.context if episode.context else "")


@dataclass(frozen=True)
class Asking:
    """How every question of a run is asked, the same for every method."""

    scorings: tuple[str, ...] = ("label",)   # choice-scoring rules, each a row per method;
                                             # NO_RULE where no question has choices
    shuffle_seed: int | None = 0              # None: the options in their given order
    max_new_tokens: int = 16                  # open answers
    openai_choices: str = "auto"

    def __post_init__(self):
        if self.scorings == NO_RULE:
            return
        bad = [r for r in self.scorings if r not in CHOICE_SCORINGS]
        if not self.scorings or bad or len(set(self.scorings)) != len(self.scorings):
            raise ConfigError(f"--choice-scoring takes distinct rules of "
                              f"{', '.join(CHOICE_SCORINGS)}; got {','.join(self.scorings)!r}")

    def shown(self, episode: EvalEpisode, question: Question) -> tuple[str, ...]:
        """The question's choices in the order its prompt shows them."""
        key = f"{episode.name}\x00{question.qid}\x00{question.t_s!r}\x00{question.question}"
        order = option_order(len(question.choices), key, self.shuffle_seed)
        return tuple(question.choices[i] for i in order)


def evaluate(episodes: Sequence[EvalEpisode], specs: Sequence[MethodSpec],
             resources: EvalResources, *, max_new_tokens: int = 16,
             scorings: Sequence[str] = ("label",), shuffle_seed: int | None = 0,
             openai_choices: str = "auto", profile: str = PROFILE,
             progress: Callable[[str], None] | None = None, interleave: bool | None = None
             ) -> tuple[list[QuestionRecord], list[dict]]:
    """(every answer, one summary of the run per method spec and scoring rule: label, budget,
    scoring, CSR counters).

    `scorings`: the choice-scoring rules (csr_ros.bench.eval.scoring.CHOICE_SCORINGS); a question with
    choices is asked once per rule, an open one once (when no question has choices, the rows
    carry no rule). `shuffle_seed`: the options' order per question (None: as given).
    `interleave` (default: on the local engine): every method has its own fork of the engine
    and each question is asked of all methods in turn, so a change in the machine's load hits
    every method alike. Otherwise (HTTP servers, whose prefix cache is shared) the methods run
    one after another over the whole input.
    """
    asking = Asking(tuple(scorings), shuffle_seed, max_new_tokens, openai_choices)
    if not any(q.choices for e in episodes for q in e.questions):
        asking = replace(asking, scorings=NO_RULE)
    if interleave is None:
        interleave = resources.kind == "local"
    prior_resource = prior = None
    if "pmi" in asking.scorings:
        prior_resource = resources.content_free()
        prior = ContentFreePrior(prior_resource, content_free_request(resources, profile),
                                 resources.tokenizer, openai_choices)
    try:
        if interleave:
            return _evaluate_interleaved(episodes, specs, resources, asking=asking,
                                         prior=prior, profile=profile, progress=progress)
        return _evaluate_sequential(episodes, specs, resources, asking=asking, prior=prior,
                                    profile=profile, progress=progress)
    finally:
        if prior_resource is not None and prior_resource is not resources.primary:
            prior_resource.close()


def _runs(method, spec: MethodSpec, asking: Asking, **extra) -> list[dict]:
    """One run summary per scoring rule (the rows of the report)."""
    return [{"method": method.name, "label": method.label, "budget": method.budget,
             "matched": spec.note, "scoring": scoring, **extra} for scoring in asking.scorings]


def _evaluate_sequential(episodes, specs, resources, *, asking, prior, profile, progress):
    records: list[QuestionRecord] = []
    runs: list[dict] = []
    n_questions = sum(len(e.questions) for e in episodes)
    for spec in specs:
        method = build_method(spec, resources)
        mine: list[QuestionRecord] = []
        started = time.monotonic()
        try:
            extra: dict = {}
            for episode in episodes:
                mine.extend(_run_episode(method, episode, asking=asking, prior=prior,
                                         profile=profile, tokenizer=resources.tokenizer,
                                         progress=progress,
                                         done_before=len(mine) // len(asking.scorings),
                                         n_total=n_questions))
                for key, value in method.end().items():
                    extra[key] = extra.get(key, 0) + value
        finally:
            method.close()
        runs.extend(_runs(method, spec, asking, wall_s=time.monotonic() - started, **extra))
        records.extend(mine)
        if progress is not None:
            n_ok = sum(r.correct for r in mine)
            progress(f"[{method.label}] done: {n_ok}/{len(mine)} correct in "
                     f"{time.monotonic() - started:.0f} s")
    return records, runs


def _evaluate_interleaved(episodes, specs, resources, *, asking, prior, profile, progress):
    owned = [resources.own(spec) for spec in specs]
    methods = [build_method(spec, own) for spec, own in zip(specs, owned)]
    per_method: list[list[QuestionRecord]] = [[] for _ in methods]
    extras: list[dict] = [{} for _ in methods]
    started = time.monotonic()
    n_total = sum(len(e.questions) for e in episodes)
    n_done = 0
    try:
        for episode in episodes:
            for method in methods:
                method.begin(profile_text(episode, profile))
            evidence = evidence_keys(episode)
            instant: dict[str, InstantValue] = {}
            n_observations, n_seen, said_s = len(episode.observations), 0, time.monotonic()
            for item in episode.timeline():
                if isinstance(item, Observation):
                    n_seen += 1
                    if item.instant:
                        instant[item.source] = InstantValue(item.source, item.text,
                                                            item.stamp_ns)
                    else:
                        for method in methods:
                            method.observe(item)
                    if progress is not None and time.monotonic() - said_s >= REPLAY_PROGRESS_S:
                        said_s = time.monotonic()
                        progress(f"[replay {episode.name}] {n_seen}/{n_observations} "
                                 f"observations, {said_s - started:.0f} s")
                    continue
                suffix = (clock_suffix(instant, item.t_s, episode.start_ns)
                          if episode.clock else "")
                line = []
                for i, method in enumerate(methods):
                    records = _ask_all(method, episode, item, suffix, n_done, asking=asking,
                                       prior=prior, tokenizer=resources.tokenizer,
                                       evidence=evidence[item])
                    per_method[i].extend(records)
                    line.append(f"{method.label}: " + _said(records))
                n_done += 1
                if progress is not None:
                    progress(f"[{n_done}/{n_total} t={item.t_s:.0f}s {item.kind or '-'}] "
                             + " | ".join(line))
            for i, method in enumerate(methods):
                for key, value in method.end().items():
                    extras[i][key] = extras[i].get(key, 0) + value
    finally:
        for method in methods:
            method.close()
        for own in owned:
            own.close()
    wall_s = time.monotonic() - started
    runs = [run for m, spec, extra in zip(methods, specs, extras)
            for run in _runs(m, spec, asking, wall_s=wall_s, interleaved=True, **extra)]
    if progress is not None:
        for m, mine in zip(methods, per_method):
            for scoring in asking.scorings:
                ours = [r for r in mine if r.scoring == scoring]
                rule = f" ({scoring})" if scoring else ""
                progress(f"[{m.label}{rule}] {sum(r.correct for r in ours)}/{len(ours)} "
                         "correct")
    return [r for mine in per_method for r in mine], runs


def _said(records: Sequence[QuestionRecord]) -> str:
    """'ok 0.52s' for one rule; 'label ok 0.52s, pmi no 0.61s' for several."""
    parts = [f"{r.scoring + ' ' if len(records) > 1 else ''}{'ok' if r.correct else 'no'} "
             f"{r.ttft_s:.2f}s" for r in records]
    return ", ".join(parts)


def evidence_keys(episode: EvalEpisode) -> dict[Question, frozenset]:
    """Each question's evidence resolved to the observations it names (empty: none named)."""
    return {q: resolve(q.evidence, episode.observations,
                       where=f"{episode.name}: question {q.qid or q.question!r}")
            for q in episode.questions}


def _ask_all(method, episode: EvalEpisode, question: Question, suffix: str, index: int, *,
             asking: Asking, prior: ContentFreePrior | None, tokenizer,
             evidence: frozenset = frozenset()) -> list[QuestionRecord]:
    """The question's records, one per scoring rule, in the order of `asking.scorings`. A
    question with choices is asked once for `label` (a letter) and once for the rules that
    score the options' words (pmi, mean, sum share that prompt and its log-likelihoods), its
    options in the same shuffled order; an open question once for all rules."""
    if not question.choices:
        record = _ask_one(method, episode, question, suffix, index, scorings=asking.scorings[:1],
                          shown=(), asking=asking, prior=prior, tokenizer=tokenizer,
                          evidence=evidence)[0]
        return [record] + [replace(record, scoring=s) for s in asking.scorings[1:]]
    shown = asking.shown(episode, question)
    groups = [[s for s in asking.scorings if s == "label"],
              [s for s in asking.scorings if s != "label"]]
    by_rule = {}
    for group in filter(None, groups):
        for record in _ask_one(method, episode, question, suffix, index, scorings=tuple(group),
                               shown=shown, asking=asking, prior=prior, tokenizer=tokenizer,
                               evidence=evidence):
            by_rule[record.scoring] = record
    return [by_rule[s] for s in asking.scorings]


def _ask_one(method, episode: EvalEpisode, question: Question, suffix: str, index: int, *,
             scorings: tuple[str, ...], shown: Sequence[str], asking: Asking,
             prior: ContentFreePrior | None, tokenizer,
             evidence: frozenset = frozenset()) -> list[QuestionRecord]:
    """One prompt, one answer per rule of `scorings` (rules that share the prompt)."""
    resource, request, prepared = method.prompt(task_text(question, scorings[0], shown),
                                                suffix, question.question)
    if shown:
        answers = ask_choices(resource, request, choices=shown, scorings=scorings,
                              tokenizer=tokenizer, prior=prior,
                              max_new_tokens=asking.max_new_tokens,
                              openai_choices=asking.openai_choices)
    else:
        answers = {scorings[0]: ask(resource, request, max_new_tokens=asking.max_new_tokens)}
    n_history = request.n_static - len(_prefix_ids(method))
    labels = option_labels(len(shown)) if shown else ()
    covered_ = covered(evidence, method.last_chunks, method.seen) if evidence else None
    return [QuestionRecord(
        method=method.name, label=method.label, budget=method.budget, episode=episode.name,
        qid=question.qid or f"{episode.name}/{index}", kind=question.kind,
        t_s=question.t_s, question=question.question, answer=question.answer,
        choices=list(question.choices), prediction=answer.prediction,
        correct=exact_match(answer.prediction, question.answer),
        contains=contains_answer(answer.prediction, question.answer), ttft_s=answer.ttft_s,
        decision_s=answer.decision_s, prompt_tokens=prepared.n_prompt,
        recomputed_tokens=prepared.n_recomputed, history_tokens=n_history,
        history_chunks=len(method.last_chunks), sub_type=question.sub_type,
        f1=None if question.choices else token_f1(answer.prediction, question.answer),
        evidence_items=len(evidence), evidence_covered=covered_,
        scoring=scoring, shown_choices=list(shown),
        answer_label=labels[shown.index(question.answer)] if shown else "",
        predicted_label=answer.label) for scoring, answer in answers.items()]


def _run_episode(method, episode: EvalEpisode, *, asking: Asking,
                 prior: ContentFreePrior | None, profile: str, tokenizer, progress,
                 done_before: int, n_total: int) -> list[QuestionRecord]:
    method.begin(profile_text(episode, profile))
    evidence = evidence_keys(episode)
    instant: dict[str, InstantValue] = {}
    out: list[QuestionRecord] = []
    n_asked = 0
    for item in episode.timeline():
        if isinstance(item, Observation):
            if item.instant:
                instant[item.source] = InstantValue(item.source, item.text, item.stamp_ns)
            else:
                method.observe(item)
            continue
        question = item
        suffix = ""
        if episode.clock:
            suffix = clock_suffix(instant, question.t_s, episode.start_ns)
        records = _ask_all(method, episode, question, suffix, n_asked, asking=asking,
                           prior=prior, tokenizer=tokenizer, evidence=evidence[question])
        out.extend(records)
        n_asked += 1
        if progress is not None:
            n_ok = sum(r.correct for r in out)
            progress(f"[{method.label}] {done_before + n_asked}/{n_total} questions, episode "
                     f"{episode.name}: {n_ok}/{len(out)} correct, last "
                     f"{_said(records)}, {records[-1].recomputed_tokens} tokens recomputed")
    return out


def _prefix_ids(method) -> tuple[int, ...]:
    if isinstance(method, CsrMethod):
        return method.reconciler.machine.active.prefix_ids
    return method.history.state.prefix_ids


def clock_suffix(instant: dict[str, InstantValue], t_s: float, start_ns: int) -> str:
    """The dynamic suffix of a question at episode time `t_s`: the current time on the chunks'
    clock (whole seconds since the first message, as the renderer prefixes chunks), then the
    fresh instant values with their ages, as the policy node builds them."""
    now_ns = start_ns + int(round(t_s * NS_PER_S))
    lines = build_suffix(instant, now_ns, stale_s=INSTANT_STALE_S).splitlines()[1:]
    return "\n".join([f"now: {int(t_s)}s"] + lines)


def judge_context(episode: EvalEpisode) -> dict[str, str]:
    """What the judge is told of the episode besides the question: its task type and task."""
    task = episode.context.removeprefix("Task: ") if episode.context.startswith("Task: ") else ""
    return {"Task type": str(episode.meta.get("task_type") or ""), "Task": task}


def judge_records(records: Sequence[QuestionRecord], judge, episodes: Sequence[EvalEpisode], *,
                  progress: Callable[[str], None] | None = None) -> int:
    """Score every open answer with `judge` (a `csr_ros.bench.eval.judge.Judge`), in place; returns
    how many the judge was asked (identical answers to the same question are judged once)."""
    contexts = {e.name: judge_context(e) for e in episodes}
    todo = [r for r in records if not r.choices]
    for n, record in enumerate(todo, 1):
        verdict = judge(record.question, record.answer, record.prediction,
                        context=contexts.get(record.episode))
        record.judge, record.judge_parsed = verdict.score, verdict.parsed
        record.judge_reply = verdict.reply
        if progress is not None and (n % 10 == 0 or n == len(todo)):
            progress(f"[judge {judge.name}] {n}/{len(todo)} answers judged "
                     f"({judge.n_calls} asked)")
    return judge.n_calls


def records_as_dicts(records: Sequence[QuestionRecord]) -> list[dict]:
    return [asdict(r) for r in records]


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
