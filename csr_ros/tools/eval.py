"""`csr-ros eval`: memory recall against decision latency, CSR against the usual alternatives.

    csr-ros eval run1/ --questions q.jsonl --methods csr,window,bm25,none --json e.json --plot e.png
    csr-ros eval episodes.jsonl --format ama --tau-mem 2048 --match tokens
    csr-ros eval patrol_out/ --format patrol --duration-s 600 --n-questions 60
    csr-ros eval task_alfworld_1.json --judge-url http://127.0.0.1:8080   # an AMA episode
    csr-ros eval patrol_out/ --format patrol --choice-scoring label,pmi,mean  # a row per rule
    csr-ros eval run1/ --questions q.jsonl --resource openai \
        --url http://gpu:8001 --url http://gpu:8002

How the methods run, their budgets are matched and answers judged: csr_ros.bench.eval.study. Progress
goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from csr_ros.bench.eval.study import FORMATS, EvalSettings
from csr_ros.tools.options import add_engine_options, from_args, ints, words


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path, nargs="+",
                        help="bag (rosbag2 directory/file or ROS 1 .bag; several for a split "
                             "bag), AMA-Bench JSONL or single-episode .json, or a patrol "
                             "directory (written if absent)")
    parser.add_argument("--questions", type=Path, default=None,
                        help="questions JSONL (t_s, question, answer, choices?) for a bag")
    parser.add_argument("--format", choices=FORMATS, default="auto",
                        help="input format (auto: .jsonl and .json are ama, --questions: bag)")
    parser.add_argument("--methods", default="csr,window,bm25,none", help="comma-separated")
    res = parser.add_argument_group("resource")
    res.add_argument("--resource", choices=("local", "openai"), default="local")
    res.add_argument("--url", action="append", default=None,
                     help="OpenAI-compatible server; twice for CSR's R1 and R2 on two servers")
    add_engine_options(res, "model", "threads", "backend", model=None, helps={
        "model": "local: 'smollm2' (default), a prepared catalog model (csr-ros model list) or "
                 "a model dir; openai: the served model id",
        "threads": "local engine CPU threads",
        "backend": "local engine (llamacpp: the GGUF in process, fast for a 1.5B model)"})
    res.add_argument("--max-context", type=int, default=None, help="context tokens")
    budget = parser.add_argument_group("budgets (comma-separated lists run each value)")
    budget.add_argument("--tau-mem", default=None, help="CSR: evict at this many static tokens")
    budget.add_argument("--eviction", default="oldest_fraction",
                        choices=("oldest_fraction", "keep_recent_tokens"))
    budget.add_argument("--eviction-fraction", type=float, default=0.5, help="per cycle")
    budget.add_argument("--keep-tokens", type=int, default=None,
                        help="keep_recent_tokens: chunk tokens kept (default tau_mem / 2)")
    budget.add_argument("--reserve-tokens", type=int, default=256)
    budget.add_argument("--n-catchup", type=int, default=64)
    budget.add_argument("--window-tokens", default=None, help="window: history tokens K")
    budget.add_argument("--window-chunks", default="1",
                        help="window: also a window of the latest N chunks (default 1: what "
                             "the robot's current state answers; 'none': no such row)")
    budget.add_argument("--bm25-k", default=None, help="bm25: chunks retrieved k")
    budget.add_argument("--match", default="tokens",
                        help="budgets not given are matched to CSR's: tokens (default), ttft, "
                             "both (ttft,tokens), or none")
    ask = parser.add_argument_group("asking")
    ask.add_argument("--max-new-tokens", type=int, default=16, help="greedy answers")
    ask.add_argument("--choice-scoring", default="label",
                     help="rules for questions with choices, a row each: label (default: "
                          "lettered options, the letters' log-probabilities), pmi (minus a "
                          "content-free prompt's), mean (per token: LENGTH-BIASED, kept for "
                          "comparison), sum (biased to short options)")
    ask.add_argument("--shuffle-seed", type=int, default=0,
                     help="options shuffled per question from this seed (default 0)")
    ask.add_argument("--no-shuffle", action="store_true",
                     help="show the options in their given order")
    ask.add_argument("--openai-choices", choices=("auto", "logprobs", "generate"),
                     default="auto", help="mean/sum over HTTP (auto: logprobs on vLLM/SGLang)")
    judge = parser.add_argument_group("judge (open answers, AMA-Bench's protocol)")
    judge.add_argument("--judge-url", default=None,
                       help="an OpenAI-compatible server that judges open answers")
    judge.add_argument("--judge-model-name", default=None,
                       help="--judge-url: the served model's id, if the server needs one")
    judge.add_argument("--judge-model", default=None,
                       help="judge on the local engine: a model name or directory it loads")
    judge.add_argument("--judge-threads", type=int, default=None,
                       help="--judge-model: CPU threads (default: --threads)")
    judge.add_argument("--judge-max-tokens", type=int, default=16, help="a verdict's tokens")
    judge.add_argument("--judge-self", action="store_true",
                       help="allow the evaluated model (same --model, or a --url) as the judge")
    src = parser.add_argument_group("input")
    src.add_argument("--params", type=Path, default=None,
                     help="bag: parameters file with the aggregator's sources")
    src.add_argument("--topics", nargs="+", default=None, help="bag: only these topics")
    src.add_argument("--episodes", type=int, default=None, help="ama: the first N episodes")
    src.add_argument("--ama-mcq", choices=("text", "label"), default="text",
                     help="ama: choices are the options' texts (default) or their labels")
    src.add_argument("--max-questions", type=int, default=None,
                     help="ask only the first N questions (in time order) of each episode")
    src.add_argument("--duration-s", type=float, default=600.0,
                     help="patrol: robot time generated when INPUT does not exist (default 600)")
    src.add_argument("--n-questions", type=int, default=60, help="patrol: questions generated")
    src.add_argument("--seed", type=int, default=0, help="patrol: generator seed")
    src.add_argument("--questions-out", type=Path, default=None,
                     help="patrol: also write the generated questions as JSONL")
    src.add_argument("--write-ama", type=Path, default=None,
                     help="patrol: write the patrols as AMA-Bench JSONL, and stop")
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, default=None, help="write rows and answers as JSON")
    out.add_argument("--markdown", type=Path, default=None, help="write the table as markdown")
    out.add_argument("--plot", type=Path, default=None, help="PNG: accuracy against TTFT")
    out.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    out.add_argument("--sequential", action="store_true",
                     help="local: the methods one after another, not each question in turn")


def run(args: argparse.Namespace) -> int:
    from csr_ros.bench.eval.run import stderr_progress
    from csr_ros.bench.eval.study import run_study

    progress = None if args.quiet else stderr_progress
    say = progress or (lambda message: None)
    window_chunks = (() if args.window_chunks.strip().lower() == "none"
                     else ints(args.window_chunks, "--window-chunks", minimum=1))
    settings = from_args(EvalSettings, args, input=tuple(args.input), methods=words(args.methods),
                         match=words(args.match), tau_mem=ints(args.tau_mem, "--tau-mem"),
                         window_tokens=ints(args.window_tokens, "--window-tokens"),
                         window_chunks=window_chunks, bm25_k=ints(args.bm25_k, "--bm25-k"),
                         choice_scoring=words(args.choice_scoring),
                         shuffle_seed=None if args.no_shuffle else args.shuffle_seed)
    if args.write_ama is not None:
        from csr_ros.bench.eval.patrol_questions import write_patrol_ama

        n = write_patrol_ama(args.input, args.write_ama, duration_s=args.duration_s,
                             n_questions=args.n_questions, seed=args.seed, params=args.params)
        say(f"wrote {n} patrol episode(s) in AMA-Bench's format to {args.write_ama}")
        return 0
    result = run_study(settings, progress)
    print(result.table)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(result.table + "\n", encoding="utf-8")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.as_json(sys.argv[1:]), indent=1), encoding="utf-8")
        say(f"wrote {args.json}")
    if args.plot is not None:
        from csr_ros.bench.eval.report import plot_accuracy_vs_ttft

        say(f"wrote {plot_accuracy_vs_ttft(result.rows, args.plot, title=result.plot_title)}")
    return 0
