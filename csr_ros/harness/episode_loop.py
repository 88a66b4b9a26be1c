"""The synthetic robot episode driven through ASR over one or two resources, in this process.

    summary = run_demo(EpisodeSettings(cycles=3), DemoEngines(threads=2))   # starts, closes
    summary = run_episode(settings, resources)           # on resources the caller holds

The episode's chunks stream in at `chunk_rate_hz` (`_produce`, a thread); the policy asks for
the next action at `rate_hz` (`_decide`, this thread), and a late decision skips the ticks it
overran; when the static part reaches `tau_mem_tokens` the secondary is warmed with the
evicted state and swapped in (csr_ros.reconcile.driver). `_progress` prints the live line and
says at once when the policy or the reconciliation cannot keep up. The summary gives TTFT
inside and outside reconciliation windows, swaps, fallbacks, retries, and the chunks lost,
checked seq by seq against the active state and the evictions (csr_ros.episode_run).

Two local engines run in two worker processes: the one answering queries on `threads` CPU
threads (default: 2, or 1 on a one-core machine), the other, while it warms up or catches up,
on `background_threads` at a lower priority, so the two never oversubscribe a 2-core machine.

Decisions are typed actions (csr_ros.actions): the episode's vocabulary, with the objects filled
from the camera chunks seen so far. `actions="auto"` scores a short closed list in one forward
pass on local engines (a choice or grammar for servers) and decodes a longer one under its
grammar; `grammar`, `json` and `choice` force one; `free` lets the model write free text, parsed
afterwards. A decision's latency runs from the query's start to its last token.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from csr_ros.actions import Decision, SeenValues, Vocabulary
from csr_ros.chunklog import ChunkLog, read_log, rebuild_state
from csr_ros.demo_episode import Episode
from csr_ros.episode_run import (Answered, EpisodeSettings, Event, LocalFigures, RunSummary,
                                 Sample, decision_figures)
from csr_ros.errors import ConfigError
from csr_ros.eviction import make_policy
from csr_ros.layout import Layout
from csr_ros.model_store import resolve_model_dir
from csr_ros.node_logic.health import Announcer, QueryStats, keep_up_warning
from csr_ros.reconcile.driver import QueryOutcome, Reconciler
from csr_ros.reconcile.machine import Phase
from csr_ros.state import CsrState
from csr_ros.tokenizer import HFTokenizer

log = logging.getLogger(__name__)

END_GRACE_S = 10.0     # after the last cycle: at most this long for the closing decisions


@dataclass(frozen=True)
class DemoEngines:
    """Where the demo's resources run: local engines in worker processes, or two servers."""
    threads: int | None = None       # a local engine answering queries (None: min(2, cores))
    background_threads: int = 1      # ... while it warms up or catches up
    dtype: str = "auto"
    backend: str = "auto"            # auto | torch | llamacpp
    r1: str | None = None            # openai: the servers' URLs
    r2: str | None = None


def run_demo(settings: EpisodeSettings, engines: DemoEngines) -> RunSummary:
    """Start the resources (two for ASR, one for a baseline), run the episode, close them."""
    log_path = settings.chunk_log
    if log_path is not None and log_path.exists() and log_path.stat().st_size:
        raise ConfigError(f"{log_path} already holds a run; give a new path")
    resources = make_resources(settings, engines, 2 if settings.mode == "asr" else 1)
    try:
        return run_episode(settings, resources)
    finally:
        for resource in resources:
            resource.close()


def make_resources(settings: EpisodeSettings, engines: DemoEngines, n: int) -> list:
    names = ["r1", "r2"][:n]
    if settings.resource == "openai":
        from csr_ros.resources.factory import make_resource

        urls = [engines.r1, engines.r2][:n]
        if any(u is None for u in urls):
            raise ConfigError("--resource openai needs --r1 URL"
                              + (" and --r2 URL" if n > 1 else ""))
        return [make_resource("openai", url=url, name=name,
                              max_context_tokens=settings.max_context_tokens,
                              tau_mem_tokens=settings.tau_mem_tokens)
                for url, name in zip(urls, names)]
    from csr_ros.resources.process import start_side_by_side

    return start_side_by_side(names, "local", model=settings.model,
                              threads=engines.threads or min(2, _n_cpus()), dtype=engines.dtype,
                              backend=engines.backend,
                              background_threads=engines.background_threads,
                              max_context_tokens=settings.max_context_tokens)


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
    held_s: float = 0.0            # paced: how long chunks waited for reconciliations


def run_episode(settings: EpisodeSettings, resources: list) -> RunSummary:
    """The episode on `resources` (r1 and r2 for ASR), which the caller starts and closes."""
    if settings.resource == "openai":   # the servers' tokenizer; ids or text, as they accept
        tokenizer, state_mode = resources[0].tokenizer, resources[0].state_mode
    else:
        tokenizer = HFTokenizer(resolve_model_dir(settings.model, weights=False))
        state_mode = "token"
    layout = Layout.from_tokenizer(tokenizer)
    episode = Episode(settings.seed, chunk_rate_hz=settings.chunk_rate_hz,
                      detail=settings.detail)
    vocab = Vocabulary.parse(episode.action_specs)
    profile = episode.typed_profile(vocab.describe())

    def empty_state() -> CsrState:
        return CsrState(tokenizer=tokenizer, layout=layout, profile=profile, mode=state_mode)

    log_path = settings.chunk_log
    chunk_log = ChunkLog(log_path, fsync_interval_s=1.0) if log_path else None
    rec = Reconciler(empty_state(), resources, settings.reconcile_config(), chunk_log=chunk_log,
                     policy=make_policy("oldest_fraction", fraction=settings.eviction_fraction))
    r = _Run(seen=SeenValues(episode.seen_patterns))
    threads: list[threading.Thread] = []
    try:
        log.info("loading the prefix on %s", resources[0].name)
        rec.start(timeout_s=600)
        started_s = time.monotonic()
        threads.append(threading.Thread(target=_produce, name="episode", daemon=True,
                                        args=(rec, episode, r, started_s, settings.paced)))
        if settings.kill_warmup:
            threads.append(threading.Thread(target=_kill_during_warmup, name="fault",
                                            args=(rec, settings.kill_warmup, r), daemon=True))
        threads.append(threading.Thread(target=_progress, name="progress", daemon=True,
                                        args=(rec, r, started_s, settings.rate_hz,
                                              settings.live_line)))
        for thread in threads:
            thread.start()
        _decide(rec, episode, vocab, r, settings, started_s)
    finally:
        r.stop.set()
        for thread in threads:
            thread.join(10.0)
        if settings.live_line:
            print(file=sys.stderr)
        rec.wait_idle(timeout_s=120)
        rec.close()
        if chunk_log is not None:
            chunk_log.close()
    rebuilds = None
    if chunk_log is not None:
        rebuilt = rebuild_state(read_log(log_path), empty_state())
        rebuilds = tuple(rebuilt.static_ids) == rec.accounting().static_ids
    return _summarize(rec, r, settings, started_s, resources, rebuilds)


def _produce(rec: Reconciler, episode: Episode, r: _Run, started_s: float,
             paced: bool) -> None:
    """The robot side: episode chunks at their scheduled times. `paced`: a chunk that could fill
    the context during a reconciliation waits for the swap, and the schedule after it moves by
    the wait (the outcome no longer depends on the machine's speed)."""
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


def _decide(rec: Reconciler, episode: Episode, vocab: Vocabulary, r: _Run,
            settings: EpisodeSettings, started_s: float) -> None:
    """The policy loop: one decision per tick; a late decision skips the ticks it overran."""
    period_s = 1.0 / settings.rate_hz
    tick = 0
    cycles_done_at: tuple[int, float] | None = None     # (outcomes, monotonic time)
    with r.seen_lock:
        r.stats.started_s = started_s
    while True:
        now_s = time.monotonic()
        elapsed_s = now_s - started_s
        if settings.duration_s is not None and elapsed_s >= settings.duration_s:
            return
        if rec.machine.counters.cycles >= settings.cycles > 0:
            # cycles counts every completed eviction, swapped or fallen back; then a few
            # decisions on the last version, or END_GRACE_S when decisions are slow
            cycles_done_at = (len(r.outcomes), now_s) if cycles_done_at is None \
                else cycles_done_at
            if len(r.outcomes) - cycles_done_at[0] >= 3 or \
                    now_s - cycles_done_at[1] >= END_GRACE_S:
                return
        with r.seen_lock:
            bound = vocab.bind(r.seen.values())
        constraint = None if settings.actions == "free" else bound.constraint(settings.actions)
        outcome = rec.query(episode.typed_task(), suffix=episode.suffix(elapsed_s),
                            max_new_tokens=settings.max_new_tokens, constraint=constraint,
                            stop=("\n",) if constraint is None else ())
        r.outcomes.append(outcome)
        if outcome.ok:
            result = outcome.result
            with r.seen_lock:
                r.stats.record(result, 0, ttft_s=outcome.ttft_s, now_s=time.monotonic())
            r.decisions.append(bound.decide(result.text, constrained=result.constrained,
                                            finish_reason=result.finish_reason,
                                            max_new_tokens=settings.max_new_tokens))
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
            if rec.machine.phase is Phase.WARM and victim.capabilities.worker:
                log.warning("fault injection: killing %s (pid %s) during warm-up %d",
                            victim.name, victim.pid, n)
                victim.kill()
                r.kills += 1
                return


def _progress(rec: Reconciler, r: _Run, started_s: float, rate_hz: float,
              live_line: bool) -> None:
    """The live line (unless `live_line` is off), and on stderr a warning with the numbers and
    what to change as soon as the policy or the reconciliation cannot keep up
    (node_logic.health.keep_up_warning, as the policy node says it)."""
    live = LiveLine(width=120)
    tty = live_line and live.tty
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
            why = capacity.message if capacity and capacity.viable is False else ""
            news.append(f"warning: synchronous fallback {fallbacks_said} (the context filled "
                        "before the secondary was ready; the primary stalled while it "
                        f"re-prefilled); {why}".rstrip("; "))
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
        live.show(line)


class LiveLine:
    """A progress line on stderr: rewritten in place on a terminal, else printed every 10 s."""

    def __init__(self, width: int):
        self.tty, self.width, self.printed_s = sys.stderr.isatty(), width, 0.0

    def show(self, line: str) -> None:
        if self.tty:
            print("\r" + line.ljust(self.width), end="", file=sys.stderr, flush=True)
        elif time.monotonic() - self.printed_s >= 10.0:
            print(line, file=sys.stderr, flush=True)
            self.printed_s = time.monotonic()


def _summarize(rec: Reconciler, r: _Run, settings: EpisodeSettings, started_s: float,
               resources: list, chunk_log_rebuilds_state: bool | None) -> RunSummary:
    books = rec.accounting()
    counters, active_ids = books.counters, books.static_ids
    check = books.check(r.sent_seqs)
    lost, duplicated, in_order = check["lost"], check["duplicated"], check["in_order"]
    committed = _committed_ids(rec.resources[books.primary])
    # A primary still re-prefilling the active state when the run ended (an overloaded run whose
    # grace ran out) holds the run it had until that load completes: stale by design, not a
    # diverged state, so only then may its committed run differ from the active one.
    reloading = bool(rec.machine.primary_reloading)
    consistent = (committed is None or active_ids[:len(committed)] == committed
                  or reloading) and in_order
    ok = [o for o in r.outcomes if o.ok]
    duration_s = time.monotonic() - started_s
    n_generated = sum(o.result.n_generated for o in ok if o.result.choice_logprobs is None)
    mask_s = sum(o.result.mask_s for o in ok)
    answered = [Answered(Sample(o.started_s - started_s, o.ttft_s, o.inside_window,
                                int(o.request.version), o.request.n_static, o.resource),
                         latency_s=o.ttft_s + o.result.decode_s, valid=d.valid,
                         constrained=d.constrained, action=d.action.name if d.valid else "",
                         error=d.error)
                for o, d in zip(ok, r.decisions)]
    viability = rec.snapshot()
    local = LocalFigures(
        precision=_precision(rec.resources[books.primary]),
        engine_choice=_read(rec.resources[books.primary], "engine_choice"),
        catchup_steps=counters["catchup_steps"],
        worker_restarts=sum(x.restarts for x in resources if x.capabilities.worker),
        injected_kills=r.kills, inputs=r.inputs, chunks_in_order=in_order,
        final_static_tokens=len(active_ids), primary_reloading_at_end=reloading,
        invalid_examples=[{"text": d.text, "error": d.error}
                          for d in r.decisions if not d.valid][:5],
        viability={k: viability[k] for k in ("headroom_s", "arrival_tokens_per_s",
                                             "warm_tokens_per_s", "catchup_tokens_per_s",
                                             "dt_warm_s", "dt_recon_s", "time_to_full_s")},
        headroom_s=viability["headroom_s"],
        headroom_min_s=min(r.headrooms_s) if r.headrooms_s else None,
        keep_up_warnings=len(r.behind), held_s=round(r.held_s, 3),
        keep_up_last_warning=r.behind[-1] if r.behind else None)
    return RunSummary(
        settings=settings, mode=settings.mode, resource=settings.resource,
        duration_s=round(duration_s, 3), cycles=counters["cycles"], swaps=counters["swaps"],
        sync_evictions=counters["sync_evictions"], fallbacks=counters["fallbacks"],
        retries=counters["retries"], failovers=counters["failovers"],
        chunks_in=len(r.sent_seqs), chunks_lost=lost + duplicated,
        chunks_duplicated=duplicated, chunks_active=len(books.active_seqs),
        chunks_evicted=len(books.evicted_seqs), final_version=books.version,
        state_consistent=consistent, queries=len(r.outcomes),
        failed_queries=len(r.outcomes) - len(ok), skipped_ticks=r.skipped_ticks,
        mask_s_per_token=mask_s / n_generated if n_generated and mask_s else None,
        windows=[(round(a - started_s, 3), None if b is None else round(b - started_s, 3))
                 for a, b in rec.windows],
        timeline=[Event(round(e.t_s - started_s, 3), e.kind, e.version, e.detail)
                  for e in rec.timeline if e.t_s >= started_s],
        **decision_figures(answered, duration_s), local=local,
        chunk_log_rebuilds_state=chunk_log_rebuilds_state)


def _n_cpus() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                     # not on Linux
        return os.cpu_count() or 1


def _precision(resource) -> str | None:
    """A local engine's precision (`Engine.precision`); None for servers."""
    value = _read(resource, "engine.precision")
    return None if value is None else str(value)


def _read(resource, path: str):
    """`path` of a local resource, in this process or its worker's; None for servers."""
    if not resource.capabilities.worker:
        if not resource.capabilities.capsules:
            return None
        for name in path.split("."):
            resource = getattr(resource, name)
        return resource
    try:
        return resource.call(path)
    except Exception as exc:
        log.warning("cannot read %s of %s: %s", path, resource.name, exc)
        return None


def _committed_ids(resource) -> tuple[int, ...] | None:
    try:
        return tuple(resource.committed_ids)
    except Exception as exc:
        log.warning("cannot read what %s has committed: %s", resource.name, exc)
        return None
