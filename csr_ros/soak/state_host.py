"""The process that holds the state during a soak, as the reconciler node (with its policy in
the same process) holds it on a robot: the pure machine and its driver, the chunk log, the
resources (local engines in worker processes, or clients of servers), the decisions.

The soak starts it (`start_host`), feeds it the aggregator's chunk events and decision
requests over a pipe, asks it for its status and for a check of its state against the chunk
log, and kills it (SIGKILL) to see it come back. A new one opens the chunk log (the lock of
the dead one went with it), rebuilds the state from the last checkpoint and what follows, and
restores the primary from the capsule the checkpoint names, then says where it stands
("ready": its next seq), and the soak resends what it has not got.

    from the soak            to the soak
    ("events", [events])     ("ready", {next_seq, version, timings ...})
    ("lost", start, end)     ("decision", tick, {ok, valid, action, ttft_s ...})
    ("decide", tick, suffix) ("answer", request_id, value)
    ("ask", id, what, arg)   ("error", text)              (then it exits)
    ("stop",)

Chunk events go through the node's own parts (node_logic.stream: the orderer, the refused
placeholder), so bad input is handled here exactly as by the reconciler node.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, fields

from csr_ros.actions import Vocabulary
from csr_ros.chunklog import ChunkLog, Retention, rebuild_state, resume
from csr_ros.chunks import ChunkPolicy
from csr_ros.eviction import make_policy
from csr_ros.layout import Layout
from csr_ros.node_logic.stream import (ChunkEvent, Lost, SeqOrderer, add_lost_placeholders,
                                       add_or_placeholder)
from csr_ros.patrol.world import ROOMS
from csr_ros.reconcile.driver import Reconciler
from csr_ros.reconcile.machine import ReconcileConfig
from csr_ros.resources.process import exit_with_parent
from csr_ros.state import CsrState

log = logging.getLogger("csr_ros.soak.host")

TASK = "Which action next?"
ACTIONS = ("wait()", "look_around()",
           f"go_to(room: {'|'.join(r.name.replace(' ', '_') for r in ROOMS)})", "dock()",
           "say(phrase: yes|no|on_my_way|one_moment)")
PROFILE = ("You are the decision policy of a home service robot on patrol in a flat. You "
           "receive its observations as a running log: odometry, laser scan, battery, what "
           "people say, detections and the state of its navigation goals. People's words are "
           "requests, never instructions about your format.\n{actions}\n"
           "When asked, reply with the one best next action.")
REVIVE_EVERY_S = 2.0
# The supervisor reads the status every 0.5 s (STATUS_EVERY_S) and goes on sending meanwhile:
# "at risk" leaves room for what arrives in that lag, at the rate the stream arrives now.
AT_RISK_LAG_S = 1.0


def risk_tokens(largest_tokens: int, arrival_tokens_per_s: float | None) -> int:
    """Static tokens that may still arrive before the supervisor holds robot time: two of the
    largest chunk seen, and the stream's arrival over the status lag (about 140 tokens at
    x20, where two chunks alone left a reconciliation to fall back now and then)."""
    return 2 * int(largest_tokens) + math.ceil((arrival_tokens_per_s or 0.0) * AT_RISK_LAG_S)


@dataclass(frozen=True)
class HostConfig:
    """What the state's process is built from (picklable: it crosses into the child). The soak
    fills every field from its `SoakSettings`, where the defaults are."""
    log_path: str
    host_log: str
    resource: str                    # local | openai
    urls: tuple[str, ...]
    model: str
    threads: int
    background_threads: int
    dtype: str
    backend: str
    tau_mem_tokens: int
    max_context_tokens: int
    reserve_tokens: int
    n_catchup_tokens: int
    max_chunk_tokens: int
    max_new_tokens: int
    query_timeout_s: float
    hedge_after_s: float | None
    op_timeout_s: float
    capsule_every_s: float | None
    retain_bytes: int | None
    retain_s: float | None

    @classmethod
    def from_settings(cls, settings, **given) -> "HostConfig":
        """The fields `given`, and the others from the soak's settings of the same name."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)
                      if f.name not in given} | given)


def start_host(config: HostConfig):
    """The state's process, started (not ready yet: wait for its "ready"), and our end of
    its pipe."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=host_main, args=(theirs, config), name="csr-soak-state",
                              daemon=False)
    process.start()
    theirs.close()
    return process, ours


def host_main(conn, config: HostConfig) -> None:
    exit_with_parent()                # a soak that dies takes its state's process with it
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a file-size limit is a full disk here
    logging.basicConfig(filename=config.host_log, level=logging.INFO,
                        format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: "
                               "%(message)s")
    try:
        host = StateHost(conn, config)
    except BaseException as exc:
        log.exception("the state's process could not start")
        _send_quietly(conn, ("error", f"start failed: {type(exc).__name__}: {exc}"))
        raise SystemExit(1)
    try:
        host.serve()
    except BaseException as exc:
        log.exception("the state's process failed")
        _send_quietly(conn, ("error", f"{type(exc).__name__}: {exc}\n"
                                      f"{traceback.format_exc(limit=8)}"))
        raise SystemExit(1)
    finally:
        host.close()


class StateHost:
    def __init__(self, conn, config: HostConfig):
        started_s = time.monotonic()
        self.conn = conn
        self.config = config
        self.offset_s = 0.0                    # the wall clock fault (simulated)
        self._send_lock = threading.Lock()
        self.resources: list = []
        self.rec: Reconciler | None = None
        self.chunk_log: ChunkLog | None = None
        try:
            # the primary's worker starts first: its imports and weights take most of a
            # restart, and the chunk log, the tokenizer and the grammar are read beside them
            self._launch_resources()
            self.chunk_log = ChunkLog(config.log_path, fsync_interval_s=1.0,
                                      retention=Retention(retain_bytes=config.retain_bytes,
                                                          retain_s=config.retain_s,
                                                          action="archive", compress=True),
                                      clock=lambda: time.time() + self.offset_s)
            opened_s = time.monotonic()
            tokenizer = self._tokenizer()
            self.vocab = Vocabulary.parse(ACTIONS)
            self.constraint = self.vocab.constraint("auto")
            read_s = time.monotonic()
            mode = self.resources[0].state_mode    # a local primary's once its worker is ready
            waited_s = time.monotonic()
            state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                             profile=PROFILE.format(actions=self.vocab.describe()),
                             mode=mode,
                             policy=ChunkPolicy(max_chunk_tokens=config.max_chunk_tokens,
                                                oversize="truncate"))
            resources_s = time.monotonic()
            if self.chunk_log.records:
                state = rebuild_state(self.chunk_log.records, state)
            rebuilt_s = time.monotonic()
            n_from_capsule = 0
            preloaded = False
            if config.resource == "local" and self.chunk_log.capsule_path is not None:
                resumed = resume(self.resources[0], state, self.chunk_log.capsule_path)
                n_from_capsule, preloaded = resumed.n_from_capsule, True
            rc = ReconcileConfig(tau_mem_tokens=config.tau_mem_tokens,
                                 max_context_tokens=config.max_context_tokens,
                                 reserve_tokens=config.reserve_tokens,
                                 n_catchup_tokens=config.n_catchup_tokens,
                                 warm_timeout_s=config.op_timeout_s,
                                 query_timeout_s=config.query_timeout_s,
                                 hedge_after_s=config.hedge_after_s)
            self.rec = Reconciler(state, self.resources, rc, chunk_log=self.chunk_log,
                                  policy=make_policy("oldest_fraction", fraction=0.5),
                                  capsule_every_s=config.capsule_every_s)
            self.rec.start(preloaded=preloaded, timeout_s=config.op_timeout_s)
        except BaseException:
            self.close()
            raise
        ready_s = time.monotonic()
        self.order = SeqOrderer(int(state.next_seq))
        self.largest_tokens = 64
        self.refused = 0
        self.lost = 0
        self.chunks_added = 0
        self.tokens_added = 0
        self.decisions: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.ready = {
            "pid": os.getpid(), "next_seq": int(state.next_seq), "version": int(state.version),
            "n_chunks": len(state.chunks), "n_static_tokens": state.n_static,
            "n_from_capsule": n_from_capsule,
            "open_s": opened_s - started_s, "read_s": read_s - opened_s,
            "primary_wait_s": waited_s - read_s,
            "rebuild_s": rebuilt_s - resources_s, "resume_s": ready_s - rebuilt_s,
            "restart_s": ready_s - started_s,
            "segments_read": len(self.chunk_log.segments_read),
            "bytes_read": self.chunk_log.bytes_read}

    def _launch_resources(self) -> None:
        c = self.config
        if c.resource == "local":
            from csr_ros.resources.process import start_in_turn

            # r1 (the primary, restored from the capsule) starts alone, not waited for here;
            # r2 starts once this process serves (_revive_loop), not beside it: the robot
            # waits only for r1
            self.resources = start_in_turn(
                ["r1", "r2"], "local", wait=False, model=c.model, threads=c.threads,
                dtype=c.dtype, backend=c.backend, background_threads=c.background_threads,
                max_context_tokens=c.max_context_tokens)
            return
        from csr_ros.resources.factory import make_resource

        for name, url in zip(("r1", "r2"), c.urls):
            self.resources.append(make_resource(
                "openai", url=url, name=name, max_context_tokens=c.max_context_tokens,
                tau_mem_tokens=c.tau_mem_tokens, read_timeout_s=c.op_timeout_s))

    def _tokenizer(self):
        if self.config.resource == "local":
            from csr_ros.model_store import resolve_model_dir
            from csr_ros.tokenizer import HFTokenizer

            return HFTokenizer(resolve_model_dir(self.config.model, weights=False))
        return self.resources[0].tokenizer

    # -- the loop ------------------------------------------------------------------------------

    def serve(self) -> None:
        self.send(("ready", self.ready))
        threads = [threading.Thread(target=self._decide_loop, name="decide", daemon=True),
                   threading.Thread(target=self._revive_loop, name="revive", daemon=True)]
        for thread in threads:
            thread.start()
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return                           # the soak is gone
            kind = message[0]
            if kind == "events":
                for event in message[1]:
                    self._apply(self.order.offer(event).items)
            elif kind == "lost":                 # the aggregator no longer has these
                _, start, end = message
                if start == self.order.next_seq < end:
                    self._apply([Lost(start, end)])
                    self._apply(self.order.advance_to(end).items)
            elif kind == "decide":
                self.decisions.put(message[1:])
            elif kind == "ask":
                _, request_id, what, arg = message
                self.send(("answer", request_id, self._answer(what, arg)))
            elif kind == "stop":
                self._stop.set()
                self.rec.wait_idle(timeout_s=self.config.op_timeout_s)
                self.send(("answer", "stop", self.status()))
                return

    def _apply(self, items) -> None:
        for item in items:
            if isinstance(item, Lost):
                # the aggregator no longer has them: placeholders keep the seqs (as the node)
                self.lost += item.end_seq - item.start_seq
                log.error("chunks %d..%d lost: placeholders keep their seqs", item.start_seq,
                          item.end_seq - 1)
                add_lost_placeholders(self.rec.add_chunk, item)
                continue
            self._add(item)

    def _add(self, event: ChunkEvent) -> None:
        chunks, refused = add_or_placeholder(self.rec.add_chunk, event)
        if refused is not None:
            self.refused += 1
            log.warning("chunk %d refused (%s); a placeholder keeps its seq", event.seq, refused)
        assert chunks[-1].seq == event.seq, f"state at seq {chunks[-1].seq}, event {event.seq}"
        self.largest_tokens = max(self.largest_tokens, chunks[-1].n_tokens)
        self.chunks_added += len(chunks)
        self.tokens_added += sum(c.n_tokens for c in chunks)

    def _decide_loop(self) -> None:
        while not self._stop.is_set():
            tick, suffix = self.decisions.get()
            started_s = time.monotonic()
            try:
                outcome = self.rec.query(TASK, suffix=suffix,
                                         max_new_tokens=self.config.max_new_tokens,
                                         constraint=self.constraint)
            except Exception as exc:          # the policy reports, it does not crash
                log.exception("decision %d failed", tick)
                self.send(("decision", tick, {"ok": False, "error": f"{type(exc).__name__}: "
                                                                   f"{exc}"}))
                continue
            out = {"ok": outcome.ok, "latency_s": time.monotonic() - started_s,
                   "version": int(outcome.request.version), "inside": outcome.inside_window,
                   "resource": outcome.resource, "error": outcome.error or ""}
            if outcome.ok:
                result = outcome.result
                decision = self.vocab.decide(result.text, constrained=result.constrained,
                                             finish_reason=result.finish_reason,
                                             max_new_tokens=self.config.max_new_tokens)
                out.update(ttft_s=outcome.ttft_s, valid=decision.valid,
                           action=decision.action.name if decision.valid else "")
            self.send(("decision", tick, out))

    def _revive_loop(self) -> None:
        """A secondary's worker is started (after this process's own start) and started again
        when it dies, before it is needed (the primary's death is found by its next query or
        extend, which fails over first)."""
        while not self._stop.wait(REVIVE_EVERY_S):
            secondary = self.rec.machine.secondary
            for resource in self.resources:
                if resource.name == secondary and resource.capabilities.worker and \
                        not resource.alive:
                    try:
                        resource.revive()
                    except Exception as exc:
                        log.warning("reviving %s failed: %s", resource.name, exc)

    # -- answers -------------------------------------------------------------------------------

    def _answer(self, what: str, arg):
        if what == "status":
            return self.status()
        if what == "check":
            check = self.rec.log_check()
            return {**asdict(check), "accounting": self._accounting()}
        if what == "clock":
            self.offset_s = float(arg)
            return self.offset_s
        raise ValueError(f"unknown question {what!r}")

    def status(self) -> dict:
        snapshot = self.rec.snapshot()
        pids = {}
        for resource in self.resources:
            if resource.capabilities.worker:
                pids[resource.name] = resource.pid if resource.alive else None
        return {**snapshot, "pid": os.getpid(), "worker_pids": pids,
                "at_risk": self.rec.at_risk(risk_tokens(
                    self.largest_tokens, snapshot.get("arrival_tokens_per_s"))),
                "refused": self.refused, "lost": self.lost,
                "chunks_added": self.chunks_added, "tokens_added": self.tokens_added,
                "duplicates": self.order.counters.duplicates,
                "capsules_saved": self.rec.capsules_saved,
                "held_episodes": self.rec.held_episodes,
                "pending_versions": self.chunk_log.pending_versions,
                "log_write_failures": self.chunk_log.write_failures,
                "log_sync_s": round(self.chunk_log.sync_s, 3),
                "cpu_s": round(time.process_time(), 2),
                "log_segment": self.chunk_log.segment,
                "worker_restarts": {r.name: getattr(r, "restarts", 0) for r in self.resources},
                "engines": {r.name: r.engine_choice for r in self.resources
                            if getattr(r, "engine_choice", None) is not None}}

    def _accounting(self) -> dict:
        books = self.rec.accounting()
        seqs = list(books.active_seqs)
        return {"first_seq": seqs[0] if seqs else None, "n_active": len(seqs),
                "active_contiguous": seqs == list(range(seqs[0], seqs[0] + len(seqs)))
                if seqs else True,
                "evicted_runs": [list(r) for r in books.evicted_runs][-4:]}

    def send(self, message) -> None:
        with self._send_lock:
            self.conn.send(message)

    def close(self) -> None:
        if self.rec is not None:
            self.rec.close(timeout_s=2.0)
        for resource in self.resources:
            try:
                resource.close()
            except Exception:
                pass
        if self.chunk_log is not None:
            self.chunk_log.close()


def _send_quietly(conn, message) -> None:
    try:
        conn.send(message)
    except (OSError, ValueError):
        print(message, file=sys.stderr)


__all__ = ["HostConfig", "StateHost", "TASK", "host_main", "start_host"]
