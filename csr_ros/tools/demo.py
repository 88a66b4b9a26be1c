"""`csr-ros demo`: a synthetic robot episode driven through ASR over two resources.

    csr-ros demo                                   # short run on the embedded SmolLM2
    csr-ros demo --cycles 10 --json d.json --plot d.png
    csr-ros demo --cycles 3 --baseline sync --json s.json
    csr-ros demo --cycles 3 --actions free          # free text, parsed afterwards

Two local engines run in two worker processes: the one answering queries on --threads CPU
threads (default: 2, or 1 on a one-core machine), the other, while it warms up or catches up,
on --background-threads (default 1) at a lower priority, so the two never oversubscribe a
2-core machine and the primary has both cores while its secondary idles. Chunks of the episode
stream in at --chunk-rate-hz; the policy asks for the next action at --rate-hz; when the static
part reaches --tau-mem tokens the secondary is warmed with the evicted state and swapped in.
The report gives TTFT inside and outside reconciliation windows, swaps, fallbacks, retries,
and the chunks lost, checked seq by seq against the active state and the evictions.

Decisions are typed actions (csr_ros.actions) by default: the episode's vocabulary, with the
objects filled from the camera chunks seen so far. `--actions auto` scores a short closed list
of actions in one forward pass on local engines (and sends it as a choice or grammar to
servers) and decodes a longer one under its grammar, as the episode's 23 actions are;
`grammar` decodes under the vocabulary's grammar; `json` under its JSON schema; `free` lets
the model write free text, parsed afterwards. `valid_actions` counts answers that parse into
an action of the vocabulary; `decision_latency` runs from the query's start to the last token
of the decision.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from csr_ros.actions import Decision, SeenValues, Vocabulary
from csr_ros.chunklog import ChunkLog, read_log, rebuild_state
from csr_ros.demo_episode import Episode
from csr_ros.errors import ConfigError
from csr_ros.eviction import make_policy
from csr_ros.layout import Layout
from csr_ros.model_store import DEFAULT_MODEL, resolve_model_dir
from csr_ros.node_logic.health import Announcer, QueryStats, keep_up_warning
from csr_ros.reconcile.driver import QueryOutcome, Reconciler
from csr_ros.reconcile.machine import Phase, ReconcileConfig
from csr_ros.state import CsrState
from csr_ros.stats import percentile
from csr_ros.tokenizer import HFTokenizer

log = logging.getLogger(__name__)

END_GRACE_S = 10.0     # after the last cycle: at most this long for the closing decisions
DEFAULTS = {
    "cycles": 3,
    "tau_mem": 1536,
    "chunk_rate_hz": 0.5,
    "rate_hz": 2.0,
    "max_context_tokens": 4096,
    "n_catchup": 64,
    "reserve_tokens": 128,
    "max_new_tokens": 24,
    "detail": 3,
}
ACTION_MODES = ("auto", "choice", "grammar", "json", "free")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    run = parser.add_argument_group("run")
    run.add_argument("--cycles", type=int, default=d["cycles"],
                     help=f"stop after N completed eviction cycles (default {d['cycles']})")
    run.add_argument("--duration-s", type=float, default=None,
                     help="stop after this many seconds (default: only --cycles stops the run)")
    run.add_argument("--seed", type=int, default=0, help="episode seed (default 0)")
    run.add_argument("--paced", action="store_true",
                     help="hold an episode chunk that could fill the context while a "
                          "reconciliation runs, and shift the schedule by the wait: every cycle "
                          "then ends in a swap on any machine (tests; a robot cannot wait)")
    run.add_argument("--baseline", choices=["none", "sync", "unordered"], default="none",
                     help="sync: evict synchronously on one resource; unordered: no prefix reuse")
    stream = parser.add_argument_group("stream and policy")
    stream.add_argument("--tau-mem", type=int, default=d["tau_mem"],
                        help=f"evict when the static part reaches this many tokens "
                             f"(default {d['tau_mem']})")
    stream.add_argument("--chunk-rate-hz", type=float, default=d["chunk_rate_hz"],
                        help=f"episode chunks per second (default {d['chunk_rate_hz']})")
    stream.add_argument("--detail", type=int, default=d["detail"],
                        help=f"detections per camera chunk, sets the chunk size "
                             f"(default {d['detail']})")
    stream.add_argument("--rate-hz", type=float, default=d["rate_hz"],
                        help=f"policy decisions per second (default {d['rate_hz']})")
    stream.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"],
                        help=f"decision token budget (default {d['max_new_tokens']}); an "
                             "action not complete within it counts as invalid")
    stream.add_argument("--actions", choices=ACTION_MODES, default="auto",
                        help="typed actions by closed choice (auto: when the list is closed), "
                             "grammar or JSON schema; or free text parsed afterwards")
    stream.add_argument("--eviction-fraction", type=float, default=0.5,
                        help="oldest fraction of chunks evicted per cycle (default 0.5)")
    stream.add_argument("--n-catchup", type=int, default=d["n_catchup"],
                        help=f"catch up while the buffer holds more tokens than this "
                             f"(default {d['n_catchup']})")
    stream.add_argument("--reserve-tokens", type=int, default=d["reserve_tokens"],
                        help="context kept free for the dynamic part and the answer")
    res = parser.add_argument_group("resources")
    res.add_argument("--resource", choices=["local", "openai"], default="local")
    res.add_argument("--model", default=DEFAULT_MODEL,
                     help="local: 'smollm2', a prepared catalog model (csr-ros model list) or "
                          "a model directory; openai: the tokenizer's model")
    res.add_argument("--threads", type=int, default=None,
                     help="CPU threads of a local engine answering queries (default: 2, or 1 "
                          "on a one-core machine; with --ros 1, the two engines sharing one "
                          "process)")
    res.add_argument("--background-threads", type=int, default=1,
                     help="CPU threads of a local engine while it warms up or catches up "
                          "(default 1)")
    res.add_argument("--dtype", default="auto",
                     help="local engine precision: auto (default: bf16 with int4 decode weights "
                          "where the CPU computes bf16 natively, else float32), float32, "
                          "bfloat16")
    res.add_argument("--backend", choices=["auto", "torch", "llamacpp"], default="auto",
                     help="local engine: auto (default: with --dtype auto, llama.cpp in process "
                          "on a CPU without native bf16, else torch), torch, llamacpp")
    res.add_argument("--max-context-tokens", type=int, default=d["max_context_tokens"])
    res.add_argument("--r1", help="openai: URL of the primary server")
    res.add_argument("--r2", help="openai: URL of the secondary server (the tokenizer and the "
                                  "prompt mode, ids or text, come from the servers)")
    res.add_argument("--warm-timeout-s", type=float, default=None,
                     help="kill and retry a warm-up or catch-up step that takes longer")
    graph = parser.add_argument_group("ROS 2 graph")
    graph.add_argument("--ros", action="store_true",
                       help="run the episode through real ROS 2 topics: an episode publisher, "
                            "the aggregator and all_in_one, each in its own process; the "
                            "report comes from what is observed on csr/decisions and csr/swaps")
    graph.add_argument("--ros-domain-id", type=int, default=None,
                       help="--ros: the ROS domain (default: a free random one, localhost only)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, help="write the summary as JSON")
    out.add_argument("--plot", type=Path, help="write TTFT over time and its distribution (PNG)")
    out.add_argument("--chunk-log", type=Path,
                     help="append the chunk stream to this crash-safe log and check at the end "
                          "that it rebuilds the same state")
    out.add_argument("--no-progress", action="store_true", help="no live line on stderr")
    out.add_argument("--inject-kill-warmup", type=int, default=None, metavar="N",
                     help="fault injection: kill the secondary's worker during warm-up N")


def run(args: argparse.Namespace) -> int:
    if args.ros:
        from csr_ros.harness.ros_demo import run_ros_demo  # needs rclpy and the interfaces

        summary = run_ros_demo(args)
    else:
        summary = run_demo(args)
    print(format_report(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"summary written to {args.json}")
    if args.plot:
        from csr_ros.plots import plot_run

        plot_run(summary, args.plot)
        print(f"plot written to {args.plot}")
    return 0 if summary["chunks_lost"] == 0 and summary["state_consistent"] else 1


# -- the run ----------------------------------------------------------------------------------

@dataclass
class _Run:
    outcomes: list[QueryOutcome] = field(default_factory=list)
    sent_seqs: list[int] = field(default_factory=list)
    inputs: int = 0
    skipped_ticks: int = 0
    kills: int = 0
    headrooms_s: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    decisions: list[Decision] = field(default_factory=list)      # one per answered query
    seen: SeenValues | None = None
    seen_lock: threading.Lock = field(default_factory=threading.Lock)
    stats: QueryStats = field(default_factory=QueryStats)        # what keep_up_warning reads
    behind: list[str] = field(default_factory=list)              # keep-up warnings, as logged
    held_s: float = 0.0            # --paced: how long chunks waited for reconciliations


def run_demo(args: argparse.Namespace) -> dict:
    mode = "asr" if args.baseline == "none" else args.baseline
    if args.cycles < 1 and args.duration_s is None:
        raise ConfigError("give --cycles >= 1 or --duration-s")
    if args.chunk_log is not None and args.chunk_log.exists() and args.chunk_log.stat().st_size:
        raise ConfigError(f"{args.chunk_log} already holds a run; give a new path")
    config = ReconcileConfig(tau_mem_tokens=args.tau_mem,
                             max_context_tokens=args.max_context_tokens,
                             reserve_tokens=args.reserve_tokens, n_catchup_tokens=args.n_catchup,
                             mode=mode, warm_timeout_s=args.warm_timeout_s)
    resources = _make_resources(args, 2 if mode == "asr" else 1)
    try:
        return _run_episode(args, mode, config, resources)
    finally:
        for resource in resources:
            resource.close()


def _run_episode(args: argparse.Namespace, mode: str, config: ReconcileConfig,
                 resources: list) -> dict:
    if args.resource == "openai":   # the servers' tokenizer; ids or text, as they accept
        tokenizer, state_mode = resources[0].tokenizer, resources[0].state_mode
    else:
        tokenizer, state_mode = HFTokenizer(resolve_model_dir(args.model, weights=False)), "token"
    layout = Layout.from_tokenizer(tokenizer)
    episode = Episode(args.seed, chunk_rate_hz=args.chunk_rate_hz, detail=args.detail)
    vocab = Vocabulary.parse(episode.action_specs)
    profile = episode.typed_profile(vocab.describe())

    def empty_state() -> CsrState:
        return CsrState(tokenizer=tokenizer, layout=layout, profile=profile, mode=state_mode)

    chunk_log = ChunkLog(args.chunk_log, fsync_interval_s=1.0) if args.chunk_log else None
    rec = Reconciler(empty_state(), resources, config, chunk_log=chunk_log,
                     policy=make_policy("oldest_fraction", fraction=args.eviction_fraction))
    r = _Run(seen=SeenValues(episode.seen_patterns))
    threads: list[threading.Thread] = []
    try:
        log.info("loading the prefix on %s", resources[0].name)
        rec.start(timeout_s=600)
        started_s = time.monotonic()
        threads.append(threading.Thread(target=_produce,
                                        args=(rec, episode, r, started_s, args.paced),
                                        name="episode", daemon=True))
        if args.inject_kill_warmup:
            threads.append(threading.Thread(target=_kill_during_warmup,
                                            args=(rec, args.inject_kill_warmup, r),
                                            name="fault", daemon=True))
        threads.append(threading.Thread(target=_progress, name="progress", daemon=True,
                                        args=(rec, r, started_s, args.rate_hz,
                                              not args.no_progress)))
        for thread in threads:
            thread.start()
        _decide(rec, episode, vocab, r, args, started_s)
    finally:
        r.stop.set()
        for thread in threads:
            thread.join(10.0)
        if not args.no_progress:
            print(file=sys.stderr)
        rec.wait_idle(timeout_s=120)
        rec.close()
        if chunk_log is not None:
            chunk_log.close()
    summary = _summarize(rec, r, args, mode, started_s, resources)
    if chunk_log is not None:
        rebuilt = rebuild_state(read_log(args.chunk_log), empty_state())
        summary["chunk_log_rebuilds_state"] = \
            tuple(rebuilt.static_ids) == rec.accounting().static_ids
    return summary


def _make_resources(args: argparse.Namespace, n: int) -> list:
    names = ["r1", "r2"][:n]
    if args.resource == "openai":
        from csr_ros.resources.factory import make_resource

        urls = [args.r1, args.r2][:n]
        if any(u is None for u in urls):
            raise ConfigError("--resource openai needs --r1 URL" + (" and --r2 URL" if n > 1 else ""))
        return [make_resource("openai", url=url, name=name,
                              max_context_tokens=args.max_context_tokens,
                              tau_mem_tokens=args.tau_mem)
                for url, name in zip(urls, names)]
    from csr_ros.resources.process import start_side_by_side

    return start_side_by_side(names, "local", model=args.model,
                              threads=args.threads or min(2, _n_cpus()), dtype=args.dtype,
                              backend=args.backend, background_threads=args.background_threads,
                              max_context_tokens=args.max_context_tokens)


def _produce(rec: Reconciler, episode: Episode, r: _Run, started_s: float,
             paced: bool) -> None:
    """The robot side: episode chunks at their scheduled times. `paced`: a chunk that could fill
    the context during a reconciliation waits for the swap, and the schedule after it moves by
    the wait (--paced: the outcome no longer depends on the machine's speed)."""
    held_s, largest = 0.0, 64
    for item in episode.stream():
        delay_s = started_s + held_s + item.t_s - time.monotonic()
        if r.stop.wait(max(0.0, delay_s)):
            return
        if paced:
            waited_s = time.monotonic()
            while rec.at_risk(2 * largest):
                if r.stop.wait(0.05):
                    return
            held_s += time.monotonic() - waited_s
            r.held_s = held_s
        chunks = rec.add_chunk(item.text, source=item.source, stamp_ns=time.time_ns())
        largest = max([largest] + [c.n_tokens for c in chunks])
        with r.seen_lock:
            r.seen.observe(item.text)
        r.inputs += 1
        r.sent_seqs.extend(c.seq for c in chunks)


def _decide(rec: Reconciler, episode: Episode, vocab: Vocabulary, r: _Run, args,
            started_s: float) -> None:
    """The policy loop: one decision per tick; a late decision skips the ticks it overran."""
    period_s = 1.0 / args.rate_hz
    tick = 0
    cycles_done_at: tuple[int, float] | None = None     # (outcomes, monotonic time)
    with r.seen_lock:
        r.stats.started_s = started_s
    while True:
        now_s = time.monotonic()
        elapsed_s = now_s - started_s
        if args.duration_s is not None and elapsed_s >= args.duration_s:
            return
        if rec.machine.counters.cycles >= args.cycles > 0:
            # --cycles counts every completed eviction, swapped or fallen back; then a few
            # decisions on the last version, or END_GRACE_S when decisions are slow
            cycles_done_at = (len(r.outcomes), now_s) if cycles_done_at is None \
                else cycles_done_at
            if len(r.outcomes) - cycles_done_at[0] >= 3 or \
                    now_s - cycles_done_at[1] >= END_GRACE_S:
                return
        with r.seen_lock:
            bound = vocab.bind(r.seen.values())
        constraint = None if args.actions == "free" else bound.constraint(args.actions)
        outcome = rec.query(episode.typed_task(), suffix=episode.suffix(elapsed_s),
                            max_new_tokens=args.max_new_tokens, constraint=constraint,
                            stop=("\n",) if constraint is None else ())
        r.outcomes.append(outcome)
        if outcome.ok:
            result = outcome.result
            with r.seen_lock:
                r.stats.record(result, 0, ttft_s=outcome.ttft_s, now_s=time.monotonic())
            r.decisions.append(bound.decide(result.text, constrained=result.constrained,
                                            finish_reason=result.finish_reason,
                                            max_new_tokens=args.max_new_tokens))
        headroom_s = rec.snapshot()["headroom_s"]
        if headroom_s is not None:
            r.headrooms_s.append(headroom_s)
        tick += 1
        next_s = started_s + tick * period_s
        late = time.monotonic() - next_s
        if late > 0:
            skipped = int(late // period_s) + 1
            r.skipped_ticks += skipped - 1
            tick += skipped - 1
            continue
        time.sleep(max(0.0, next_s - time.monotonic()))


def _kill_during_warmup(rec: Reconciler, n: int, r: _Run) -> None:
    """Fault injection: SIGKILL the secondary's worker while it loads X_E of cycle n."""
    while not r.stop.wait(0.02):
        m = rec.machine
        if m.phase is Phase.WARM and m.counters.cycles_started == n:
            victim = rec.resources[m.secondary]
            time.sleep(0.2)                      # well inside the multi-second warm-up
            if rec.machine.phase is Phase.WARM and hasattr(victim, "kill"):
                log.warning("fault injection: killing %s (pid %s) during warm-up %d",
                            victim.name, getattr(victim, "pid", None), n)
                victim.kill()
                r.kills += 1
                return


def _progress(rec: Reconciler, r: _Run, started_s: float, rate_hz: float,
              live_line: bool) -> None:
    """The live line (unless --no-progress), and on stderr a warning with the numbers and what
    to change as soon as the policy or the reconciliation cannot keep up
    (node_logic.health.keep_up_warning, as the policy node says it)."""
    tty = live_line and sys.stderr.isatty()
    last_print_s = 0.0
    announcer = Announcer()
    fallbacks_said = 0
    while not r.stop.wait(0.5):
        s = rec.snapshot()
        now_s = time.monotonic()
        capacity = rec.capacity()
        with r.seen_lock:
            behind = keep_up_warning(r.stats, rate_hz, now_s,
                                     capacity=capacity.as_dict() if capacity else None)
        said = announcer.update(behind, now_s)
        news = []
        if said is not None:
            news.append(f"{said[0]}: {said[1]}")
        if s["fallbacks"] > fallbacks_said:
            fallbacks_said = s["fallbacks"]
            news.append(f"warning: synchronous fallback {fallbacks_said} (the context filled "
                        "before the secondary was ready; the primary stalled while it "
                        f"re-prefilled); {capacity.message if capacity and capacity.viable is False else ''}"
                        .rstrip("; "))
        for text in news:
            if text.startswith("warning"):
                r.behind.append(text)
            print(("\n" if tty else "") + text, file=sys.stderr, flush=True)
        if not live_line:
            continue
        last = next((o for o in reversed(r.outcomes) if o.ttft_s is not None), None)
        headroom = "-" if s["headroom_s"] is None else f"{s['headroom_s']:.0f}s"
        line = (f"{time.monotonic() - started_s:6.1f}s chunks {s['chunks_in']:4d} static "
                f"{s['n_static_tokens']:5d} tok v{s['version']} {s['phase']:<7} ttft "
                f"{'-' if last is None else f'{last.ttft_s:.3f}s'} cycles {s['cycles']} "
                f"swaps {s['swaps']} fallbacks {s['fallbacks']} retries {s['retries']} "
                f"headroom {headroom}{'  BEHIND' if behind else ''}")
        if tty:
            print("\r" + line.ljust(120), end="", file=sys.stderr, flush=True)
        elif time.monotonic() - last_print_s >= 10.0:
            print(line, file=sys.stderr, flush=True)
            last_print_s = time.monotonic()


# -- the report -------------------------------------------------------------------------------

def _summarize(rec: Reconciler, r: _Run, args, mode: str, started_s: float,
               resources: list) -> dict:
    books = rec.accounting()
    counters, active_ids = books.counters, books.static_ids
    sent = r.sent_seqs
    check = books.check(sent)
    lost, duplicated, in_order = check["lost"], check["duplicated"], check["in_order"]
    committed = _committed_ids(rec.resources[books.primary])
    # A primary still re-prefilling the active state when the run ended (an overloaded run whose
    # grace ran out) holds the run it had until that load completes: stale by design, not a
    # diverged state, so only then may its committed run differ from the active one.
    reloading = bool(rec.machine.primary_reloading)
    consistent = (committed is None or active_ids[:len(committed)] == committed
                  or reloading) and in_order
    ok = [o for o in r.outcomes if o.ttft_s is not None]
    duration_s = time.monotonic() - started_s
    latencies_s = [o.ttft_s + o.result.decode_s for o in ok]
    n_generated = sum(o.result.n_generated for o in ok if o.result.choice_logprobs is None)
    mask_s = sum(o.result.mask_s for o in ok)
    errors: dict[str, int] = {}
    for d in r.decisions:
        if not d.valid:
            kind = "incomplete" if d.error.startswith("incomplete") else "unparsable"
            errors[kind] = errors.get(kind, 0) + 1
    viability = rec.snapshot()
    return {
        "mode": mode, "seed": args.seed, "model": args.model, "resource": args.resource,
        "precision": _precision(rec.resources[books.primary]),
        "tau_mem_tokens": args.tau_mem, "chunk_rate_hz": args.chunk_rate_hz,
        "rate_hz": args.rate_hz, "max_context_tokens": args.max_context_tokens,
        "n_catchup_tokens": args.n_catchup, "duration_s": round(duration_s, 3),
        "cycles": counters["cycles"], "swaps": counters["swaps"],
        "sync_evictions": counters["sync_evictions"], "fallbacks": counters["fallbacks"],
        "retries": counters["retries"], "failovers": counters["failovers"],
        "catchup_steps": counters["catchup_steps"],
        "worker_restarts": sum(getattr(x, "restarts", 0) for x in resources),
        "injected_kills": r.kills,
        "chunks_in": len(sent), "inputs": r.inputs, "chunks_lost": lost + duplicated,
        "chunks_duplicated": duplicated, "chunks_in_order": in_order,
        "chunks_active": len(books.active_seqs), "chunks_evicted": len(books.evicted_seqs),
        "final_static_tokens": len(active_ids), "final_version": books.version,
        "state_consistent": consistent,
        "primary_reloading_at_end": reloading,
        "queries": len(r.outcomes), "failed_queries": len(r.outcomes) - len(ok),
        "skipped_ticks": r.skipped_ticks,
        "valid_actions": sum(d.valid for d in r.decisions),
        "actions_mode": args.actions,
        "decisions": len(r.decisions),
        "invalid_actions": len(r.decisions) - sum(d.valid for d in r.decisions),
        "invalid_reasons": errors,
        "constrained_decisions": sum(d.constrained for d in r.decisions),
        "decisions_per_s": len(r.decisions) / duration_s if duration_s > 0 else None,
        "decision_latency": {"p50_s": percentile(latencies_s, 50),
                             "p99_s": percentile(latencies_s, 99),
                             "max_s": max(latencies_s) if latencies_s else None,
                             "mean_s": (sum(latencies_s) / len(latencies_s)
                                        if latencies_s else None)},
        "mask_s_per_token": mask_s / n_generated if n_generated and mask_s else None,
        "actions_chosen": _action_counts(r.decisions),
        "invalid_examples": [{"text": d.text, "error": d.error}
                             for d in r.decisions if not d.valid][:5],
        "ttft": _ttft_stats(ok),
        "viability": {k: viability[k] for k in ("headroom_s", "arrival_tokens_per_s",
                                                "warm_tokens_per_s", "catchup_tokens_per_s",
                                                "dt_warm_s", "dt_recon_s", "time_to_full_s")},
        "headroom_s": viability["headroom_s"],
        "headroom_min_s": min(r.headrooms_s) if r.headrooms_s else None,
        "keep_up_warnings": len(r.behind),
        "paced": args.paced, "held_s": round(r.held_s, 3),
        "keep_up_last_warning": r.behind[-1] if r.behind else None,
        "samples": [{"t_s": round(o.started_s - started_s, 4), "ttft_s": round(o.ttft_s, 5),
                     "inside": o.inside_window, "version": int(o.request.version),
                     "n_static": o.request.n_static, "resource": o.resource}
                    for o in ok],
        "windows": [[round(a - started_s, 3), None if b is None else round(b - started_s, 3)]
                    for a, b in rec.windows],
        "timeline": [{"t_s": round(e.t_s - started_s, 3), "kind": e.kind, "version": e.version,
                      "detail": e.detail} for e in rec.timeline if e.t_s >= started_s],
    }


def _action_counts(decisions: list[Decision]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in decisions:
        if d.valid:
            counts[d.action.name] = counts.get(d.action.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _n_cpus() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                     # not on Linux
        return os.cpu_count() or 1


def _precision(resource) -> str | None:
    """A local engine's precision (`LocalEngine.precision`); None for servers."""
    if not hasattr(resource, "call"):
        engine = getattr(resource, "engine", None)
        return None if engine is None else engine.precision
    try:
        return str(resource.call("engine.precision"))
    except Exception as exc:
        log.warning("cannot read the precision of %s: %s", resource.name, exc)
        return None


def _committed_ids(resource) -> tuple[int, ...] | None:
    try:
        return tuple(resource.committed_ids)
    except AttributeError:
        return None
    except Exception as exc:
        log.warning("cannot read what %s has committed: %s", resource.name, exc)
        return None




def _ttft_stats(outcomes: list[QueryOutcome]) -> dict:
    def stats(values: list[float], tag: str = "") -> dict:
        return {f"n{tag}": len(values),
                f"mean{tag}_s": sum(values) / len(values) if values else None,
                f"p50{tag}_s": percentile(values, 50), f"p99{tag}_s": percentile(values, 99),
                f"max{tag}_s": max(values) if values else None}

    every = [o.ttft_s for o in outcomes]
    inside = [o.ttft_s for o in outcomes if o.inside_window]
    outside = [o.ttft_s for o in outcomes if not o.inside_window]
    return {**stats(every), **stats(inside, "_inside"), **stats(outside, "_outside")}


def _num(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct(n: int, total: int) -> str:
    return "-" if not total else f"{100.0 * n / total:.1f}%"


def format_report(s: dict) -> str:
    t = s["ttft"]
    lat = s["decision_latency"]

    def ms(v):
        return "-" if v is None else f"{v * 1000:.0f} ms"

    lines = [
        f"csr-ros demo ({s['mode']}, {s['resource']} {s['model']}"
        f"{'' if not s.get('precision') else ' on ' + s['precision']}, seed {s['seed']}): "
        f"{s['duration_s']:.0f} s, tau_mem {s['tau_mem_tokens']} tokens",
        f"  cycles {s['cycles']}  swaps {s['swaps']}  sync evictions {s['sync_evictions']}  "
        f"fallbacks {s['fallbacks']}  retries {s['retries']}  failovers {s['failovers']}",
        f"  chunks in {s['chunks_in']}  lost {s['chunks_lost']}  active {s['chunks_active']}  "
        f"evicted {s['chunks_evicted']}  state consistent {s['state_consistent']}"
        f"{'  (the primary was still re-prefilling it)' if s.get('primary_reloading_at_end') else ''}",
        f"  queries {s['queries']}  failed {s['failed_queries']}  skipped ticks "
        f"{s['skipped_ticks']}  decisions/s {_num(s['decisions_per_s'])}",
        f"  actions ({s['actions_mode']}): valid {s['valid_actions']}/{s['decisions']} "
        f"({_pct(s['valid_actions'], s['decisions'])})  constrained "
        f"{s['constrained_decisions']}  invalid {s['invalid_reasons'] or 0}",
        f"  decision latency p50 {ms(lat['p50_s'])}  p99 {ms(lat['p99_s'])}  max "
        f"{ms(lat['max_s'])}" + ("" if s["mask_s_per_token"] is None else
                                 f"  (token mask {s['mask_s_per_token'] * 1000:.2f} ms/token)"),
        f"  TTFT all     n={t['n']:4d} mean {ms(t['mean_s'])}  p50 {ms(t['p50_s'])}  "
        f"p99 {ms(t['p99_s'])}  max {ms(t['max_s'])}",
        f"  TTFT inside  n={t['n_inside']:4d} mean {ms(t['mean_inside_s'])}  p50 "
        f"{ms(t['p50_inside_s'])}  p99 {ms(t['p99_inside_s'])}  max {ms(t['max_inside_s'])}",
        f"  TTFT outside n={t['n_outside']:4d} mean {ms(t['mean_outside_s'])}  p50 "
        f"{ms(t['p50_outside_s'])}  p99 {ms(t['p99_outside_s'])}  max {ms(t['max_outside_s'])}",
    ]
    if s.get("headroom_min_s") is not None:
        end = "-" if s["headroom_s"] is None else f"{s['headroom_s']:.1f} s"
        lines.append(f"  viability headroom {end} at the end, {s['headroom_min_s']:.1f} s at "
                     "worst (paper eq. 54)")
    if s.get("keep_up_warnings"):
        lines.append(f"  did not keep up ({s['keep_up_warnings']} warnings); the last: "
                     f"{s['keep_up_last_warning']}")
    if "chunk_log_rebuilds_state" in s:
        lines.append(f"  chunk log rebuilds the same state: {s['chunk_log_rebuilds_state']}")
    return "\n".join(lines)
