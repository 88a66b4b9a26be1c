"""`csr-ros eval`: memory recall against decision latency, CSR against the usual alternatives.

    csr-ros eval run1/ --questions q.jsonl --methods csr,window,bm25,none --json e.json --plot e.png
    csr-ros eval episodes.jsonl --format ama --tau-mem 2048 --match tokens
    csr-ros eval patrol_out/ --format patrol --duration-s 600 --n-questions 60
    csr-ros eval task_alfworld_1.json --judge-url http://127.0.0.1:8080   # an AMA episode
    csr-ros eval run1/ --questions q.jsonl --resource openai \
        --url http://gpu:8001 --url http://gpu:8002

Every method replays the same episode and is asked the same questions at the same times, on the
same resource and model, one method after another. Budgets are parameters and take lists
(`--tau-mem 1024,2048` runs CSR twice). A method whose budget is not given is matched to CSR:
`--match tokens` gives the window and BM25 as many history tokens as CSR held on average,
`--match ttft` gives them the history a prefill can process in CSR's TTFT p50 (measured
prefill rate); `--match ttft,tokens` runs both side by side. Progress goes to stderr, the
table to stdout.

Open answers are scored by exact match and token F1, and, with `--judge-url` (any
OpenAI-compatible server) or `--judge-model` (a model the local engine loads), by an LLM judge
after the run, as AMA-Bench scores them. The judge is never the evaluated model unless
`--judge-self` asks for it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from csr_ros.errors import ConfigError

FORMATS = ("auto", "bag", "ama", "patrol")
MATCHES = ("tokens", "ttft", "none")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path, nargs="+",
                        help="bag (rosbag2 directory/file or ROS 1 .bag; several for a split "
                             "bag), AMA-Bench JSONL or single-episode .json, or a patrol "
                             "directory (written if absent)")
    parser.add_argument("--questions", type=Path, default=None,
                        help="questions JSONL (t_s, question, answer, choices?) for a bag")
    parser.add_argument("--format", choices=FORMATS, default="auto",
                        help="input format (auto: .jsonl and .json are ama, --questions means "
                             "bag)")
    parser.add_argument("--methods", default="csr,window,bm25,none",
                        help="comma-separated: csr, window, bm25, none (default all four)")
    res = parser.add_argument_group("resource")
    res.add_argument("--resource", choices=("local", "openai"), default="local")
    res.add_argument("--url", action="append", default=None,
                     help="OpenAI-compatible server; twice for CSR's R1 and R2 on two servers")
    res.add_argument("--model", default=None,
                     help="local: 'smollm2' (default), a prepared catalog model (csr-ros model "
                          "list) or a model dir; openai: the served model id")
    res.add_argument("--threads", type=int, default=None, help="local engine CPU threads")
    res.add_argument("--backend", choices=("auto", "torch", "llamacpp"), default="auto",
                     help="local engine: auto (what dtype auto picks on this CPU), torch, or "
                          "llamacpp (the GGUF on llama.cpp's kernels, in process: no float32 "
                          "conversion, the fast one for a 1.5B model on a CPU)")
    res.add_argument("--max-context", type=int, default=None,
                     help="context tokens (default: the model's, at most 8192 locally)")
    budget = parser.add_argument_group("budgets (comma-separated lists run each value)")
    budget.add_argument("--tau-mem", default=None,
                        help="CSR: evict when the static part reaches this many tokens "
                             "(default: half the context)")
    budget.add_argument("--eviction", default="oldest_fraction",
                        choices=("oldest_fraction", "keep_recent_tokens"))
    budget.add_argument("--eviction-fraction", type=float, default=0.5,
                        help="oldest_fraction: share of chunks evicted per cycle (default 0.5)")
    budget.add_argument("--keep-tokens", type=int, default=None,
                        help="keep_recent_tokens: chunk tokens kept (default tau_mem / 2)")
    budget.add_argument("--reserve-tokens", type=int, default=256)
    budget.add_argument("--n-catchup", type=int, default=64)
    budget.add_argument("--window-tokens", default=None, help="window: history tokens K")
    budget.add_argument("--bm25-k", default=None, help="bm25: chunks retrieved k")
    budget.add_argument("--match", default="tokens",
                        help="budgets not given are matched to CSR's: tokens (default), ttft, "
                             "both (ttft,tokens), or none")
    ask = parser.add_argument_group("asking")
    ask.add_argument("--max-new-tokens", type=int, default=16, help="greedy answers")
    ask.add_argument("--choice-score", choices=("mean", "sum"), default="mean",
                     help="a choice's log-likelihood per token (mean, default) or summed")
    ask.add_argument("--openai-choices", choices=("auto", "logprobs", "generate"),
                     default="auto", help="choices over HTTP: echo logprobs or a greedy answer "
                                          "matched to them (auto: logprobs on vLLM/SGLang)")
    judge = parser.add_argument_group("judge (open answers, AMA-Bench's protocol)")
    judge.add_argument("--judge-url", default=None,
                       help="an OpenAI-compatible server to judge open answers (chat "
                            "completions, temperature 0)")
    judge.add_argument("--judge-model-name", default=None,
                       help="--judge-url: the served model's id, if the server needs one")
    judge.add_argument("--judge-model", default=None,
                       help="judge on the local engine: a model name or directory it loads")
    judge.add_argument("--judge-threads", type=int, default=None,
                       help="--judge-model: CPU threads (default: --threads)")
    judge.add_argument("--judge-max-tokens", type=int, default=16,
                       help="tokens of a judge's reply (default 16: the verdict is yes or no)")
    judge.add_argument("--judge-self", action="store_true",
                       help="allow the evaluated model (same --model, or a --url) as the judge")
    src = parser.add_argument_group("input")
    src.add_argument("--params", type=Path, default=None,
                     help="bag: parameters file with the aggregator's sources")
    src.add_argument("--topics", nargs="+", default=None, help="bag: only these topics")
    src.add_argument("--episodes", type=int, default=None, help="ama: the first N episodes")
    src.add_argument("--ama-mcq", choices=("text", "label"), default="text",
                     help="ama: score a multiple-choice question over its options' texts "
                          "(default) or over the labels (A), (B), ...")
    src.add_argument("--max-questions", type=int, default=None,
                     help="ask only the first N questions (in time order) of each episode")
    src.add_argument("--duration-s", type=float, default=600.0,
                     help="patrol: robot time generated when INPUT does not exist (default 600)")
    src.add_argument("--n-questions", type=int, default=60, help="patrol: questions generated")
    src.add_argument("--seed", type=int, default=0, help="patrol: generator seed")
    src.add_argument("--questions-out", type=Path, default=None,
                     help="patrol: also write the generated questions as JSONL")
    src.add_argument("--write-ama", type=Path, default=None,
                     help="patrol: write each INPUT patrol (one episode each, questions after "
                          "the last chunk) as AMA-Bench JSONL to this file, and stop")
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, default=None, help="write rows and answers as JSON")
    out.add_argument("--markdown", type=Path, default=None, help="write the table as markdown")
    out.add_argument("--plot", type=Path, default=None, help="PNG: accuracy against TTFT")
    out.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    out.add_argument("--sequential", action="store_true",
                     help="local: run the methods one after another instead of asking each "
                          "question of all in turn (HTTP resources always run one after another)")


def run(args: argparse.Namespace) -> int:
    from csr_ros.eval.report import markdown_table, plot_accuracy_vs_ttft, summarize
    from csr_ros.eval.run import MethodSpec, evaluate, records_as_dicts

    progress = None if args.quiet else _progress
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise ConfigError("--methods names no method")
    for m in methods:
        MethodSpec(m)                                  # validates the name
    matches = [m.strip() for m in args.match.split(",") if m.strip()]
    if not matches or any(m not in MATCHES for m in matches) or \
            ("none" in matches and len(matches) > 1):
        raise ConfigError(f"--match takes tokens, ttft, ttft,tokens or none; got {args.match!r}")
    if args.write_ama is not None:
        from csr_ros.eval.patrol_questions import write_patrol_ama

        n = write_patrol_ama(args.input, args.write_ama, duration_s=args.duration_s,
                             n_questions=args.n_questions, seed=args.seed, params=args.params)
        _say(progress, f"wrote {n} patrol episode(s) in AMA-Bench's format to {args.write_ama}")
        return 0
    judge_spec = check_judge(args)
    fmt, episodes = load_input(args)
    if args.max_questions is not None:
        for e in episodes:
            e.questions = sorted(e.questions, key=lambda q: q.t_s)[:args.max_questions]
    n_questions = sum(len(e.questions) for e in episodes)
    n_obs = sum(len(e.observations) for e in episodes)
    _say(progress, f"{fmt}: {len(episodes)} episode(s), {n_obs} observations, "
                   f"{n_questions} questions")
    resources = make_resources(args)
    started = time.monotonic()
    try:
        max_context = resources.max_context_tokens
        csr_specs = [MethodSpec("csr", csr_budget(args, tau, max_context))
                     for tau in _ints(args.tau_mem, default=[max_context // 2], what="--tau-mem")]
        kwargs = dict(max_new_tokens=args.max_new_tokens, choice_score=args.choice_score,
                      openai_choices=args.openai_choices, progress=progress)
        resources.warm_up()
        # Budgets are fixed before the run (so every method can be asked each question in
        # turn): CSR's history at each question is a deterministic fold of the chunks.
        csr_rows = [plan_csr(spec, episodes, resources) for spec in csr_specs]
        others = []
        for name in methods:
            if name == "csr":
                continue
            seen = []
            for match in matches:
                for budget, note in other_budgets(name, args, match, csr_rows, resources,
                                                  episodes, progress):
                    if budget not in seen:
                        seen.append(budget)
                        others.append(MethodSpec(name, budget, note))
        specs = (csr_specs if "csr" in methods else []) + others
        interleave = resources.kind == "local" and not args.sequential
        records, runs = evaluate(episodes, specs, resources, interleave=interleave,
                                 **kwargs)
        if args.sequential:
            for run_ in runs:
                run_["interleaved"] = False
    finally:
        resources.close()
    judge_name = None
    if judge_spec is not None and any(not r.choices for r in records):
        from csr_ros.eval.run import judge_records

        judge = make_judge(args, judge_spec)
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
    table = markdown_table(rows)
    if any(r["n_open"] for r in rows):
        table += ("\n\nOpen answers judged by " + judge_name if judge_name else
                  "\n\nNo judge ran (--judge-url or --judge-model): the judge column is empty")
    print(table)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table + "\n", encoding="utf-8")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"input": [str(p) for p in args.input], "format": fmt,
                "resource": args.resource, "urls": args.url, "model": args.model or "smollm2",
                "backend": resources.backend,
                "max_context_tokens": max_context, "match": args.match,
                "choice_score": args.choice_score, "judge": judge_name,
                "n_episodes": len(episodes),
                "n_questions": n_questions, "wall_s": time.monotonic() - started,
                "argv": sys.argv[1:]}
        args.json.write_text(json.dumps({"methods": rows, "meta": meta,
                                         "questions": records_as_dicts(records)}, indent=1),
                             encoding="utf-8")
        _say(progress, f"wrote {args.json}")
    if args.plot is not None:
        engine = args.resource if resources.backend is None else f"{resources.backend} local"
        title = (f"{fmt}: {n_questions} questions, {args.model or 'smollm2'} ({engine}), "
                 f"budgets matched by {' and '.join(matches)}")
        _say(progress, f"wrote {plot_accuracy_vs_ttft(rows, args.plot, title=title)}")
    return 0


# -- inputs -------------------------------------------------------------------------------------

def load_input(args) -> tuple[str, list]:
    from csr_ros.eval import episode as ep

    fmt = args.format
    first = args.input[0]
    if fmt == "auto":
        if args.questions is not None:
            fmt = "bag"
        elif first.suffix in (".jsonl", ".json"):
            fmt = "ama"
        elif (first / "ground_truth.json").exists():
            fmt = "patrol"
        else:
            raise ConfigError(f"cannot tell the format of {first}: pass --format, and "
                              "--questions for a bag")
    if fmt == "ama":
        if len(args.input) != 1:
            raise ConfigError("--format ama reads one file (JSONL, or a single-episode .json)")
        return fmt, ep.ama_episodes(first, limit=args.episodes, mcq=args.ama_mcq)
    if fmt == "bag":
        if args.questions is None:
            raise ConfigError("a bag needs --questions (JSONL with t_s, question, answer)")
        questions = ep.load_questions(args.questions)
        return fmt, [ep.bag_episode(list(args.input), questions, params=args.params,
                                    topics=args.topics)]
    from csr_ros.eval.patrol_questions import patrol_episode

    if len(args.input) != 1:
        raise ConfigError("--format patrol takes one directory")
    episode = patrol_episode(first, duration_s=args.duration_s, n_questions=args.n_questions,
                             seed=args.seed, params=args.params)
    if args.questions_out is not None:
        from csr_ros.eval.episode import write_questions

        write_questions(episode.questions, args.questions_out)
    return fmt, [episode]


def make_resources(args):
    from csr_ros.eval.run import EvalResources

    if args.resource == "local":
        if args.url:
            raise ConfigError("--url is for --resource openai")
        model = args.model or "smollm2"
        return EvalResources.local(model, max_context_tokens=args.max_context,
                                   threads=args.threads, backend=args.backend)
    if not args.url:
        raise ConfigError("--resource openai needs --url (once, or twice for R1 and R2)")
    options = {"max_context_tokens": args.max_context}
    if args.model:
        options["model"] = args.model
    return EvalResources.openai(args.url, **options)


# -- the judge ----------------------------------------------------------------------------------

def check_judge(args):
    """The judge, checked before the run: None, ('local', MODEL) (loaded after the run), or
    ('url', client) (connected now, so a wrong URL fails before a long run). Never the
    evaluated model itself (the same --url, the same served model name, the same local model)
    unless --judge-self."""
    if args.judge_url and args.judge_model:
        raise ConfigError("give --judge-url or --judge-model, not both")
    if args.judge_model_name and not args.judge_url:
        raise ConfigError("--judge-model-name names the model of a --judge-url server")
    if args.judge_url:
        same = [u for u in (args.url or []) if _same_url(u, args.judge_url)]
        if same and not args.judge_self:
            raise ConfigError(f"--judge-url {args.judge_url} is the server being evaluated; "
                              "judge with another model, or pass --judge-self to allow it")
        from csr_ros.eval.judge_clients import OpenAIJudgeClient

        client = OpenAIJudgeClient(args.judge_url, model=args.judge_model_name,
                                   max_tokens=args.judge_max_tokens)
        evaluated = args.model or ("smollm2" if args.resource == "local" else None)
        if evaluated and client.model == evaluated and not args.judge_self:
            client.close()
            raise ConfigError(f"--judge-url {args.judge_url} serves {client.model!r}, the "
                              "model being evaluated; judge with another model, or pass "
                              "--judge-self to allow it")
        return "url", client
    if args.judge_model:
        if args.resource == "local" and not args.judge_self:
            from csr_ros.model_store import resolve_model_dir

            judged = resolve_model_dir(args.model or "smollm2", weights=False).resolve()
            if resolve_model_dir(args.judge_model, weights=False).resolve() == judged:
                raise ConfigError(f"--judge-model {args.judge_model} is the model being "
                                  "evaluated; judge with another model, or pass --judge-self "
                                  "to allow it")
        return "local", args.judge_model
    if args.judge_self:
        raise ConfigError("--judge-self allows the evaluated model as the judge: name it with "
                          "--judge-url or --judge-model")
    return None


def _same_url(a: str, b: str) -> bool:
    def norm(u: str) -> str:
        u = u.strip().rstrip("/").removesuffix("/v1").replace("localhost", "127.0.0.1")
        return u.lower()
    return norm(a) == norm(b)


def make_judge(args, spec):
    from csr_ros.eval.judge import Judge
    from csr_ros.eval.judge_clients import LocalJudgeClient

    kind, where = spec
    if kind == "url":
        return Judge(where)
    return Judge(LocalJudgeClient(where, threads=args.judge_threads or args.threads,
                                  max_tokens=args.judge_max_tokens))


# -- budgets ------------------------------------------------------------------------------------

def csr_budget(args, tau_mem: int, max_context: int) -> dict:
    budget = {"tau_mem_tokens": tau_mem, "max_context_tokens": max_context,
              "eviction": args.eviction, "reserve_tokens": args.reserve_tokens,
              "n_catchup_tokens": args.n_catchup}
    if args.eviction == "oldest_fraction":
        budget["eviction_params"] = {"fraction": args.eviction_fraction}
    else:
        budget["eviction_params"] = {"keep_tokens": args.keep_tokens or tau_mem // 2}
    return budget


def other_budgets(name: str, args, match: str, csr_rows: list[dict], resources, episodes,
                  progress) -> list[tuple[dict, str]]:
    """The window's and BM25's budgets: as given, else matched to each CSR row; with a note
    saying which CSR row and how."""
    if name == "none":
        return [({}, "")]
    given = args.window_tokens if name == "window" else args.bm25_k
    what = "--window-tokens" if name == "window" else "--bm25-k"
    if given is not None:
        values = _ints(given, default=[], what=what)
        return [({"window_tokens": v} if name == "window" else {"k": v}, "given")
                for v in values]
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


def plan_csr(spec, episodes, resources) -> dict:
    """CSR's history at each question, folded from the chunks without a model: the same state,
    eviction policy and threshold as the run (a replay waits for each reconciliation, so no
    chunk arrives during one). Also a representative request for TTFT calibration."""
    from csr_ros.eval.episode import Observation
    from csr_ros.eval.run import clock_suffix, profile_text, task_text
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
            request = state.build_request(task=task_text(item), suffix=suffix)
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


def _ints(text: str | None, *, default: list[int], what: str) -> list[int]:
    if text is None:
        return default
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{what} takes comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise ConfigError(f"{what} takes non-negative integers, got {text!r}")
    return values


def _say(progress, message: str) -> None:
    if progress is not None:
        progress(message)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
