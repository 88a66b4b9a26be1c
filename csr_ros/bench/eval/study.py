"""An evaluation as `csr-ros eval` runs it: inputs, budgets, methods, the judge, the table.

    result = run_study(EvalSettings(input=(Path("run1/"),), questions=Path("q.jsonl")))
    print(result.table)

Every method replays the same episode and is asked the same questions at the same times, on the
same resource and model, one method after another. Budgets take lists (`tau_mem=(1024, 2048)`
runs CSR twice). A method whose budget is not given is matched to CSR: `match=("tokens",)`
gives the window and BM25 as many history tokens as CSR held on average, `("ttft",)` gives them
the history a prefill can process in CSR's TTFT p50 (measured prefill rate); both run side by
side when both are named.

A question with choices shows its options lettered, shuffled with a seed per question
(`shuffle_seed`), and is scored by each rule of `choice_scoring` (label by default; pmi; mean,
length-biased, kept for comparison): one row per method, budget and rule. Beside the window
matched to CSR runs a window of the latest chunk only (`window_chunks`), and the report checks
each row for bias: its most frequent answer, and whether it answers as no memory does.

Open answers are scored by exact match and token F1, and, with `judge_url` (any
OpenAI-compatible server) or `judge_model` (a model the local engine loads), by an LLM judge
after the run, as AMA-Bench scores them. The judge is never the evaluated model unless
`judge_self` allows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from csr_ros.errors import ConfigError
from csr_ros.bench.eval.run import Asking, MethodSpec

FORMATS = ("auto", "bag", "ama", "patrol")
MATCHES = ("tokens", "ttft", "none")


@dataclass(frozen=True)
class EvalSettings:
    """What to evaluate, named as `csr-ros eval`'s options; None budgets are matched to CSR."""
    input: tuple[Path, ...]               # a bag (several files for a split one), AMA, patrol
    questions: Path | None = None         # a bag's questions JSONL
    format: str = "auto"                  # one of FORMATS
    methods: tuple[str, ...] = ("csr", "window", "bm25", "none")
    resource: str = "local"               # local | openai
    url: list[str] | None = None          # openai: R1 (and R2)
    model: str | None = None              # None: smollm2 locally, the server's model
    threads: int | None = None
    backend: str = "auto"
    max_context: int | None = None        # None: the model's, at most 8192 locally
    tau_mem: tuple[int, ...] | None = None    # CSR, one run each (None: half the context)
    eviction: str = "oldest_fraction"
    eviction_fraction: float = 0.5
    keep_tokens: int | None = None        # keep_recent_tokens (None: tau_mem / 2)
    reserve_tokens: int = 256
    n_catchup: int = 64
    window_tokens: tuple[int, ...] | None = None
    window_chunks: tuple[int, ...] = (1,)  # windows of the latest chunks, beside the matched one
    bm25_k: tuple[int, ...] | None = None
    match: tuple[str, ...] = ("tokens",)  # of MATCHES; none alone
    max_new_tokens: int = 16
    choice_scoring: tuple[str, ...] = ("label",)   # rules of scoring.CHOICE_SCORINGS, a row each
    shuffle_seed: int | None = 0          # the options' order per question (None: as given)
    openai_choices: str = "auto"
    judge_url: str | None = None
    judge_model_name: str | None = None
    judge_model: str | None = None
    judge_threads: int | None = None
    judge_max_tokens: int = 16
    judge_self: bool = False
    params: Path | None = None            # a bag's aggregator sources
    topics: list[str] | None = None
    episodes: int | None = None           # ama: the first N
    ama_mcq: str = "text"
    max_questions: int | None = None      # per episode, in time order
    duration_s: float = 600.0             # patrol: generated when absent
    n_questions: int = 60
    seed: int = 0
    questions_out: Path | None = None     # patrol: also write its questions
    sequential: bool = False              # local: one method after another

    def __post_init__(self):
        if not self.methods:
            raise ConfigError("--methods names no method")
        for m in self.methods:
            MethodSpec(m)                                  # validates the name
        if not self.match or any(m not in MATCHES for m in self.match) or \
                ("none" in self.match and len(self.match) > 1):
            raise ConfigError(f"--match takes tokens, ttft, ttft,tokens or none; got "
                              f"{','.join(self.match)!r}")
        Asking(tuple(self.choice_scoring))                 # validates the rules
        if any(n < 1 for n in self.window_chunks):
            raise ConfigError(f"--window-chunks takes counts >= 1, got {self.window_chunks}")


@dataclass(frozen=True)
class StudyResult:
    format: str
    rows: list[dict]                 # per method and budget (csr_ros.bench.eval.report.summarize)
    records: list                    # every answer (QuestionRecord)
    table: str                       # markdown, with a note on the judge
    meta: dict                       # what ran, for the JSON
    plot_title: str

    def as_json(self, argv: list[str]) -> dict:
        """What `--json` writes: the rows, what ran (with the command line) and every answer."""
        from csr_ros.bench.eval.run import records_as_dicts

        return {"methods": self.rows, "meta": {**self.meta, "argv": argv},
                "questions": records_as_dicts(self.records)}


def run_study(s: EvalSettings, progress: Callable[[str], None] | None = None) -> StudyResult:
    """Load the input, fix the budgets, run every method, judge the open answers."""
    from csr_ros.bench.eval.report import bias_table, bias_warnings, markdown_table, summarize
    from csr_ros.bench.eval.run import evaluate
    from csr_ros.bench.eval.scoring import check_scoring

    judge_spec = check_judge(s)
    fmt, episodes = load_input(s)
    if s.max_questions is not None:
        for e in episodes:
            e.questions = sorted(e.questions, key=lambda q: q.t_s)[:s.max_questions]
    n_questions = sum(len(e.questions) for e in episodes)
    n_obs = sum(len(e.observations) for e in episodes)
    _say(progress, f"{fmt}: {len(episodes)} episode(s), {n_obs} observations, "
                   f"{n_questions} questions")
    resources = make_resources(s)
    started = time.monotonic()
    try:
        check_scoring(resources.primary, s.choice_scoring, s.openai_choices)
        max_context = resources.max_context_tokens
        csr_specs = [MethodSpec("csr", csr_budget(s, tau, max_context))
                     for tau in s.tau_mem or [max_context // 2]]
        kwargs = dict(max_new_tokens=s.max_new_tokens, scorings=s.choice_scoring,
                      shuffle_seed=s.shuffle_seed, openai_choices=s.openai_choices,
                      progress=progress)
        resources.warm_up()
        # Budgets are fixed before the run (so every method can be asked each question in
        # turn): CSR's history at each question is a deterministic fold of the chunks.
        csr_rows = [plan_csr(spec, episodes, resources, s.choice_scoring[0])
                    for spec in csr_specs]
        others = []
        for name in s.methods:
            if name == "csr":
                continue
            seen = []
            for match in s.match:
                for budget, note in other_budgets(name, s, match, csr_rows, resources,
                                                  episodes, progress):
                    if budget not in seen:
                        seen.append(budget)
                        others.append(MethodSpec(name, budget, note))
            if name == "window":
                # The latest chunk alone: what the robot's current state answers, not memory.
                others += [MethodSpec("window", {"window_chunks": n},
                                      "the latest chunk" if n == 1 else f"the latest {n} chunks")
                           for n in s.window_chunks]
        specs = (csr_specs if "csr" in s.methods else []) + others
        interleave = resources.kind == "local" and not s.sequential
        records, runs = evaluate(episodes, specs, resources, interleave=interleave,
                                 **kwargs)
        if s.sequential:
            for run_ in runs:
                run_["interleaved"] = False
    finally:
        resources.close()
    judge_name = None
    if judge_spec is not None and any(not r.choices for r in records):
        from csr_ros.bench.eval.run import judge_records

        judge = make_judge(s, judge_spec)
        judge_name = judge.name
        judge_started = time.monotonic()
        try:
            n_asked = judge_records(records, judge, episodes, progress=progress)
        finally:
            judge.close()
        _say(progress, f"judge {judge_name}: {n_asked} verdicts in "
                       f"{time.monotonic() - judge_started:.0f} s")
    elif judge_spec is not None:
        _say(progress, "judge: no open question (every question has choices), nothing judged")
        if judge_spec[0] == "url":
            judge_spec[1].close()
    rows = summarize(records, runs)
    warnings = bias_warnings(rows)
    table = markdown_table(rows)
    n_choice = sum(bool(q.choices) for e in episodes for q in e.questions)
    if n_choice:
        table += "\n\n" + bias_table(rows) + "\n\n" + options_note(s, n_choice)
    if any(r["n_open"] for r in rows):
        table += ("\n\nOpen answers judged by " + judge_name if judge_name else
                  "\n\nNo judge ran (--judge-url or --judge-model): the judge column is empty")
    if warnings:
        table += "\n\n" + "\n".join(f"**Warning:** {w}" for w in warnings)
    for warning in warnings:
        _say(progress, f"warning: {warning}")
    meta = {"input": [str(p) for p in s.input], "format": fmt,
            "resource": s.resource, "urls": s.url,
            "model": s.model or "smollm2", "backend": resources.backend,
            "engine_choice": resources.engine_choice,
            "max_context_tokens": max_context, "match": ",".join(s.match),
            "choice_scoring": list(s.choice_scoring) if n_choice else [],
            "shuffle_seed": s.shuffle_seed, "options": options_note(s, n_choice),
            "warnings": warnings, "judge": judge_name,
            "n_episodes": len(episodes),
            "n_questions": n_questions, "wall_s": time.monotonic() - started}
    engine = s.resource if resources.backend is None else f"{resources.backend} local"
    scored = f", scored by {'/'.join(s.choice_scoring)}" if n_choice else ""
    title = (f"{fmt}: {n_questions} questions, {s.model or 'smollm2'} ({engine}), "
             f"budgets matched by {' and '.join(s.match)}{scored}")
    return StudyResult(fmt, rows, records, table, meta, title)


def options_note(s: EvalSettings, n_choice: int) -> str:
    """How the options of the questions with choices were shown and scored (the report's
    line under the table)."""
    if not n_choice:
        return "no question has choices"
    order = ("in the order given (--no-shuffle)" if s.shuffle_seed is None else
             f"in an order shuffled per question, seed {s.shuffle_seed} (the same for every "
             "method and rule)")
    return (f"{n_choice} questions with choices: options shown lettered {order}; scored by "
            f"{', '.join(s.choice_scoring)}")


# -- inputs -------------------------------------------------------------------------------------

def load_input(s: EvalSettings) -> tuple[str, list]:
    from csr_ros.bench.eval import episode as ep

    fmt = s.format
    first = s.input[0]
    if fmt == "auto":
        if s.questions is not None:
            fmt = "bag"
        elif first.suffix in (".jsonl", ".json"):
            fmt = "ama"
        elif (first / "ground_truth.json").exists():
            fmt = "patrol"
        else:
            raise ConfigError(f"cannot tell the format of {first}: pass --format, and "
                              "--questions for a bag")
    if fmt == "ama":
        if len(s.input) != 1:
            raise ConfigError("--format ama reads one file (JSONL, or a single-episode .json)")
        return fmt, ep.ama_episodes(first, limit=s.episodes, mcq=s.ama_mcq)
    if fmt == "bag":
        if s.questions is None:
            raise ConfigError("a bag needs --questions (JSONL with t_s, question, answer)")
        questions = ep.load_questions(s.questions)
        return fmt, [ep.bag_episode(list(s.input), questions, params=s.params,
                                    topics=s.topics)]
    from csr_ros.bench.eval.patrol_questions import patrol_episode

    if len(s.input) != 1:
        raise ConfigError("--format patrol takes one directory")
    episode = patrol_episode(first, duration_s=s.duration_s, n_questions=s.n_questions,
                             seed=s.seed, params=s.params)
    if s.questions_out is not None:
        from csr_ros.bench.eval.episode import write_questions

        write_questions(episode.questions, s.questions_out)
    return fmt, [episode]


def make_resources(s: EvalSettings):
    from csr_ros.bench.eval.run import EvalResources

    if s.resource == "local":
        if s.url:
            raise ConfigError("--url is for --resource openai")
        model = s.model or "smollm2"
        return EvalResources.local(model, max_context_tokens=s.max_context,
                                   threads=s.threads, backend=s.backend)
    if not s.url:
        raise ConfigError("--resource openai needs --url (once, or twice for R1 and R2)")
    options = {"max_context_tokens": s.max_context}
    if s.model:
        options["model"] = s.model
    return EvalResources.openai(s.url, **options)


# -- the judge ----------------------------------------------------------------------------------

def check_judge(s: EvalSettings):
    """The judge, checked before the run: None, ('local', MODEL) (loaded after the run), or
    ('url', client) (connected now, so a wrong URL fails before a long run). Never the
    evaluated model itself (the same --url, the same served model name, the same local model)
    unless --judge-self."""
    if s.judge_url and s.judge_model:
        raise ConfigError("give --judge-url or --judge-model, not both")
    if s.judge_model_name and not s.judge_url:
        raise ConfigError("--judge-model-name names the model of a --judge-url server")
    if s.judge_url:
        same = [u for u in (s.url or []) if _same_url(u, s.judge_url)]
        if same and not s.judge_self:
            raise ConfigError(f"--judge-url {s.judge_url} is the server being evaluated; "
                              "judge with another model, or pass --judge-self to allow it")
        from csr_ros.bench.eval.judge_clients import OpenAIJudgeClient

        client = OpenAIJudgeClient(s.judge_url, model=s.judge_model_name,
                                   max_tokens=s.judge_max_tokens)
        evaluated = s.model or ("smollm2" if s.resource == "local" else None)
        if evaluated and client.model == evaluated and not s.judge_self:
            client.close()
            raise ConfigError(f"--judge-url {s.judge_url} serves {client.model!r}, the "
                              "model being evaluated; judge with another model, or pass "
                              "--judge-self to allow it")
        return "url", client
    if s.judge_model:
        if s.resource == "local" and not s.judge_self:
            from csr_ros.model_store import resolve_model_dir

            judged = resolve_model_dir(s.model or "smollm2", weights=False).resolve()
            if resolve_model_dir(s.judge_model, weights=False).resolve() == judged:
                raise ConfigError(f"--judge-model {s.judge_model} is the model being "
                                  "evaluated; judge with another model, or pass --judge-self "
                                  "to allow it")
        return "local", s.judge_model
    if s.judge_self:
        raise ConfigError("--judge-self allows the evaluated model as the judge: name it with "
                          "--judge-url or --judge-model")
    return None


def _same_url(a: str, b: str) -> bool:
    def norm(u: str) -> str:
        u = u.strip().rstrip("/").removesuffix("/v1").replace("localhost", "127.0.0.1")
        return u.lower()
    return norm(a) == norm(b)


def make_judge(s: EvalSettings, spec):
    from csr_ros.bench.eval.judge import Judge
    from csr_ros.bench.eval.judge_clients import LocalJudgeClient

    kind, where = spec
    if kind == "url":
        return Judge(where)
    return Judge(LocalJudgeClient(where, threads=s.judge_threads or s.threads,
                                  max_tokens=s.judge_max_tokens))


# -- budgets ------------------------------------------------------------------------------------

def csr_budget(s: EvalSettings, tau_mem: int, max_context: int) -> dict:
    budget = {"tau_mem_tokens": tau_mem, "max_context_tokens": max_context,
              "eviction": s.eviction, "reserve_tokens": s.reserve_tokens,
              "n_catchup_tokens": s.n_catchup}
    if s.eviction == "oldest_fraction":
        budget["eviction_params"] = {"fraction": s.eviction_fraction}
    else:
        budget["eviction_params"] = {"keep_tokens": s.keep_tokens or tau_mem // 2}
    return budget


def other_budgets(name: str, s: EvalSettings, match: str, csr_rows: list[dict], resources,
                  episodes, progress) -> list[tuple[dict, str]]:
    """The window's and BM25's budgets: as given, else matched to each CSR row; with a note
    saying which CSR row and how."""
    if name == "none":
        return [({}, "")]
    given = s.window_tokens if name == "window" else s.bm25_k
    what = "--window-tokens" if name == "window" else "--bm25-k"
    if given is not None:
        return [({"window_tokens": v} if name == "window" else {"k": v}, "given")
                for v in given]
    if match == "none" or not csr_rows:
        default = [512] if name == "window" else [8]
        if match != "none":
            _say(progress, f"{name}: no CSR run to match; {what} {default[0]}")
        return [({"window_tokens": v} if name == "window" else {"k": v}, "default")
                for v in default]
    chunk_tokens = mean_chunk_tokens(resources, episodes)
    budgets = []
    for row in csr_rows:
        history = row["history_tokens_mean"] or 0.0
        if match == "ttft":
            rate = prefill_rate(resources, episodes, progress)
            ttft_s = csr_ttft(row, resources, progress)
            history = max(0.0, ttft_s * rate - row["dynamic_tokens_mean"])
        tokens = int(round(history))
        budget = ({"window_tokens": tokens} if name == "window"
                  else {"k": max(1, int(round(tokens / max(chunk_tokens, 1.0))))})
        _say(progress, f"{name}: {budget} matches {row['label']} by {match} "
                       f"({tokens} history tokens; chunks {chunk_tokens:.0f} tokens on average)")
        budgets.append((budget, f"{match} of {row['label']}"))
    return budgets


def plan_csr(spec, episodes, resources, scoring: str = "label") -> dict:
    """CSR's history at each question, folded from the chunks without a model: the same state,
    eviction policy and threshold as the run (a replay waits for each reconciliation, so no
    chunk arrives during one). Also a representative request for TTFT calibration."""
    from csr_ros.bench.eval.episode import Observation
    from csr_ros.bench.eval.run import clock_suffix, profile_text, task_text
    from csr_ros.eviction import make_policy
    from csr_ros.node_logic.suffix import InstantValue
    from csr_ros.state import CsrState

    budget = spec.budget
    evict = make_policy(budget["eviction"], **budget["eviction_params"])
    tau = budget["tau_mem_tokens"]
    history, dynamic, requests = [], [], []
    for episode in episodes:
        state = CsrState(tokenizer=resources.tokenizer, layout=resources.layout,
                         profile=profile_text(episode), mode=resources.mode)
        instant: dict = {}
        for item in episode.timeline():
            if isinstance(item, Observation):
                if item.instant:
                    instant[item.source] = InstantValue(item.source, item.text, item.stamp_ns)
                    continue
                state.add(item.text, source=item.source, stamp_ns=item.stamp_ns)
                if state.n_static >= tau:
                    state = state.evicted(evict(state.chunk_tokens))
                continue
            suffix = clock_suffix(instant, item.t_s, episode.start_ns) if episode.clock else ""
            request = state.build_request(task=task_text(item, scoring), suffix=suffix)
            history.append(state.n_static - len(state.prefix_ids))
            dynamic.append(request.n_dynamic)
            requests.append(request)
    mean = sum(history) / len(history) if history else 0.0
    typical = min(requests, key=lambda r: abs(r.n_static - mean)) if requests else None
    return {"label": f"csr tau_mem={tau}", "history_tokens_mean": mean,
            "dynamic_tokens_mean": sum(dynamic) / len(dynamic) if dynamic else 0.0,
            "typical_request": typical}


def csr_ttft(row: dict, resources, progress, repeats: int = 3) -> float:
    """CSR's TTFT on its typical question: the static part cached, the question prefilled
    (median of `repeats`), measured on the primary before the run, once per CSR row (the
    window and BM25 are matched to the same figure)."""
    if "ttft_s" in row:
        return row["ttft_s"]
    request = row["typical_request"]
    if request is None:
        return 0.0
    resource = resources.primary
    _say(progress, f"{row['label']}: measuring TTFT on a typical question, first a prefill of "
                   f"its {request.n_static} cached tokens")
    resource.load(request.static_ids, request.static_text)
    samples = sorted(resource.query(request, max_new_tokens=1).ttft_s for _ in range(repeats))
    resource.load((), "")
    ttft_s = row["ttft_s"] = samples[len(samples) // 2]
    _say(progress, f"{row['label']}: TTFT {ttft_s:.3f} s on a typical question "
                   f"({request.n_static} tokens cached, {request.n_dynamic} new)")
    return ttft_s


def mean_chunk_tokens(resources, episodes) -> float:
    counts = [len(resources.tokenizer.encode_data(o.text)) for e in episodes
              for o in e.observations if not o.instant]
    return sum(counts) / len(counts) if counts else 1.0


_rate_cache: dict[int, float] = {}


def prefill_rate(resources, episodes, progress, n_tokens: int = 512) -> float:
    """Prefill tokens/s on the primary after a cached prefix (the episode's own text)."""
    key = id(resources)
    if key in _rate_cache:
        return _rate_cache[key]
    from csr_ros.state import CsrState

    state = CsrState(tokenizer=resources.tokenizer, layout=resources.layout, profile="rate",
                     mode=resources.mode)
    for e in episodes:
        for o in e.observations:
            if not o.instant and state.n_static < n_tokens + len(state.prefix_ids):
                state.add(o.text, source=o.source, stamp_ns=o.stamp_ns)
    resource = resources.primary
    ids = state.static_ids[len(state.prefix_ids):]
    text = state.static_text[len(state.prefix_text):] if resources.mode == "text" else None
    seconds = []
    for _ in range(3):
        resource.load(state.prefix_ids, state.prefix_text if resources.mode == "text" else None)
        seconds.append(resource.extend(ids, text).seconds)
    resource.load((), "")
    seconds_s = sorted(seconds)[1]
    rate = len(ids) / max(seconds_s, 1e-6)
    _say(progress, f"prefill rate {rate:.0f} tokens/s "
                   f"({len(ids)} tokens after the profile in {seconds_s:.2f} s, median of 3)")
    _rate_cache[key] = rate
    return rate


def _say(progress, message: str) -> None:
    if progress is not None:
        progress(message)
