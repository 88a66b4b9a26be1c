"""`run_soak(settings) -> SoakSummary`: compressed robot-days through the real parts, with
faults at seeded times, each one recovered and checked.

    this process (the robot side)                   the state's process (state_host)
    ┌──────────────────────────────────┐  events   ┌────────────────────────────────────┐
    │ patrol → emitter → seqs, ring    │──────────▶│ orderer → driver.add_chunk → log   │
    │ robot clock (x speedup, held     │  decide   │ machine + driver over r1, r2       │
    │   where the state falls behind)  │──────────▶│ (workers or servers); decisions    │
    │ policy ticks (rate_hz), safe     │◀──────────│ status, log check                  │
    │   action on a missed tick        │           └────────────────────────────────────┘
    │ faults (seeded), recovery checks │   SIGKILL / SIGSTOP: the state's process, its workers,
    │ probes: RSS, fds, threads        │   the servers; the log's tmpfs filled; clock offset
    └──────────────────────────────────┘

The robot clock starts when the state's process is first ready and then runs `speedup` times
faster than wall time, except while the state cannot keep up (a chunk could fill the context
during a reconciliation, the primary has work queued, or a decision takes longer than
`keep_up_s`: the primary lags behind the stream): then it is held, and the time held and the
robot-time spans that ran slow are reported. It does not stop while the
state's process is down: the aggregator keeps rendering into its ring and resends what a new
process has not got, as on a robot.

Each fault is injected, then waited for until everything is back: the component restarted, a
decision answered after the cause was removed, no chunk held, no version record pending, and
the state equal, token for token, to the state rebuilt from the chunk log on disk. What the
robot saw meanwhile (policy ticks without a decision, when the safe action holds) is counted.
At the end the whole chunk log, archive included, is audited against every chunk sent.

Samples (RSS, fds, threads per process, log size) and decisions go to JSON-lines files in the
run directory as they come, so the soak's own memory stays flat over a day.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from csr_ros.engine.calibration import describe as describe_choice
from csr_ros.errors import ConfigError
from csr_ros.soak.audit import audit_log
from csr_ros.soak.faults import CLOSING_LEAD, FaultPlan, LogFileSystem, unmount
from csr_ros.soak.probes import alive, log_sizes, start_ticks, tree_usage, usage
from csr_ros.soak.settings import SoakSettings
from csr_ros.soak.state_host import HostConfig, start_host
from csr_ros.soak.summary import (FaultRecord, ProcessSeries, SoakSummary, kill_host_restarts,
                                  ttft_figures)
from csr_ros.soak.traffic import Aggregator, PatrolTraffic
from csr_ros.waiting import wait_until

log = logging.getLogger("csr_ros.soak")

SAFE_ACTION = "wait()"
COUNTERS = ("cycles", "swaps", "fallbacks", "failovers", "retries", "failed_queries",
            "sync_evictions", "hedged_queries")
COSTS = ("log_sync_s", "cpu_s")     # seconds, summed over the state's processes
# Why robot time was held, first match wins: a fault is being recovered; the secondary warms
# or catches up (a chunk could fill the context meanwhile, or its prefill takes the cores);
# a decision takes longer than keep_up_s; the primary has calls queued.
HELD_CAUSES = ("fault_recovery", "warm_up", "decisions", "primary_queue")
STATUS_EVERY_S = 0.5
TICK_S = 0.05
CLOCK_JUMP_S = 25 * 3600.0       # forwards past a day (the log's age-based retention), then back
BURST_ROOM_CHUNKS = 4            # a malformed burst waits for the room of this many big chunks
BURST_WAIT_MAX_S = 120.0         # ... at most this long
BEHIND_BACKLOG = 3               # primary calls queued: the state cannot keep up
HOST_START_TIMEOUT_S = 900.0


def run_soak(settings: SoakSettings, *, plot: Path | None = None,
             json_path: Path | None = None) -> SoakSummary:
    """Run the soak. Its summary goes to `json_path` and its plot to `plot` as soon as it is
    made, before anything is cleaned up; then the log's file system is unmounted and the run
    directory (samples, decisions, the state's log) removed, unless it is `settings.workdir`.
    A clean-up that fails is a warning naming what is left, never an exception."""
    if settings.workdir is not None:
        run_dir = Path(settings.workdir)
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(f"{run_dir} already holds a run; give a new directory")
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="csr-soak-"))
    try:
        summary = Soak(settings, run_dir).run()
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(summary.as_json(), indent=1) + "\n")
        if plot is not None:
            from csr_ros.plots import plot_soak

            plot_soak(run_dir / "samples.jsonl", run_dir / "decisions.jsonl",
                      summary.as_json(), plot)
        return summary
    finally:
        for problem in _clean_up(run_dir, keep=settings.workdir is not None):
            log.warning("soak clean-up: %s", problem)


def _clean_up(run_dir: Path, *, keep: bool) -> list[str]:
    """Unmount the log's tmpfs once no process holds it (a kept run gets the log copied out
    first), then remove a run directory that is not kept; what could not be done."""
    problems = []
    fs_root, kept = run_dir / "logfs", run_dir / "chunklog.kept"
    try:
        if os.path.ismount(fs_root):
            if keep and (fs_root / "chunklog").is_dir():   # the tmpfs goes with the soak
                shutil.copytree(fs_root / "chunklog", kept)
            why = unmount(fs_root)
            if why:
                problems.append(why)
            if kept.is_dir():
                kept.rename(fs_root / "chunklog")
        if not keep:
            shutil.rmtree(run_dir)
    except OSError as exc:
        problems.append(f"could not remove {exc.filename or run_dir}: {exc.strerror or exc}")
    return problems


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class HostDown(Exception):
    """The state's process is not there to answer."""


class _Host:
    """This side of one state's process: its pipe, the answers it owes, its decisions."""

    def __init__(self, soak: "Soak", generation: int):
        self.soak = soak
        self.generation = generation
        self.started_wall = time.monotonic()
        self.process, self.conn = start_host(soak.host_config)
        self.pid = self.process.pid
        self.ready: dict | None = None
        self.error: str | None = None
        self.resent = False
        self._send_lock = threading.Lock()
        self._answers: dict[str, Future] = {}
        self._answers_lock = threading.Lock()
        self._ids = 0
        self.receiver = threading.Thread(target=self._receive, name=f"host-{generation}",
                                         daemon=True)
        self.receiver.start()

    @property
    def running(self) -> bool:
        try:
            return self.process.is_alive()
        except ValueError:                 # closed: it exited
            return False

    @property
    def live(self) -> bool:
        return self.ready is not None and self.resent and self.running

    def send(self, message) -> bool:
        with self._send_lock:
            try:
                self.conn.send(message)
                return True
            except (OSError, ValueError, EOFError):
                return False

    def ask(self, what: str, arg=None, *, timeout_s: float = 60.0):
        future = self.ask_later(what, arg)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            raise HostDown(f"the state's process did not answer {what!r} in "
                           f"{timeout_s:.0f} s") from None

    def ask_later(self, what: str, arg=None) -> Future:
        future: Future = Future()
        with self._answers_lock:
            self._ids += 1
            request_id = f"{what}-{self._ids}"
            self._answers[request_id] = future
        if not self.send(("ask", request_id, what, arg)):
            self._fail(request_id, HostDown("the state's process is gone"))
        return future

    def _fail(self, request_id: str, exc: Exception) -> None:
        with self._answers_lock:
            future = self._answers.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(exc)

    def _receive(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "ready":       # with the seconds from its spawn: imports included
                self.ready = {**message[1],
                              "since_spawn_s": time.monotonic() - self.started_wall}
            elif kind == "decision":
                self.soak.on_decision(self, message[1], message[2])
            elif kind == "answer":
                with self._answers_lock:
                    future = self._answers.pop(message[1], None)
                if future is not None:
                    future.set_result(message[2])
            elif kind == "error":
                self.error = message[1]
        with self._answers_lock:
            pending, self._answers = self._answers, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(HostDown("the state's process is gone"))

    def kill(self) -> None:
        if self.running:
            os.kill(self.pid, signal.SIGKILL)
        self.process.join(10.0)

    def close(self) -> None:
        """After its exit: its pipe and process handle go (a day of restarts leaks no fd)."""
        self.process.join(5.0)
        self.conn.close()
        self.receiver.join(5.0)
        if not self.process.is_alive():
            self.process.close()

    def stop(self, timeout_s: float) -> dict | None:
        """Ask it to finish its work and exit; its last status."""
        future: Future = Future()
        with self._answers_lock:
            self._answers["stop"] = future
        final = None
        if self.send(("stop",)):
            try:
                final = future.result(timeout=timeout_s)
            except Exception:
                final = None
        self.process.join(30.0)
        if self.process.is_alive():
            self.kill()
        self.close()
        return final


def _engine_of(choice: dict) -> str:
    """The engine an engine choice (LocalResource.engine_choice) names."""
    return choice.get("chosen") or choice.get("backend")


def _workers_alive(status: dict) -> bool:
    """Every worker process the state's process reports runs."""
    return all(p is not None and alive(p) for p in status.get("worker_pids", {}).values())


class Soak:
    def __init__(self, settings: SoakSettings, run_dir: Path):
        self.s = settings
        self.run_dir = run_dir
        self.fs = LogFileSystem.mount(run_dir / "logfs", size_mb=settings.log_fs_mb)
        self.log_path = self.fs.root / "chunklog"
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.started_wall = time.monotonic()
        self.robot_started_wall: float | None = None
        self.robot_s = 0.0
        self.clock_offset_s = 0.0
        self.held_wall_s = 0.0
        self.outage_wall_s = 0.0               # the state's process was down (robot time 1x)
        self.host: _Host | None = None
        self.generation = 0
        self.host_exits_expected = 0         # kills the faults made
        self.host_exits_unexpected = 0
        self.ended_early = ""             # why the run ended before robot_hours, if it did
        self.host_restarts: list[dict] = []  # the "ready" of every process after the first
        self.first_ready: dict = {}
        self.status: dict = {}
        self.engine_choices: dict[str, dict] = {}   # each worker's, as its last start chose
        self.past_counters = dict.fromkeys(COUNTERS + COSTS, 0)   # of killed state processes
        self.held_by_cause = dict.fromkeys(HELD_CAUSES, 0.0)     # wall seconds
        self.status_future: Future | None = None
        self.status_s = 0.0
        self.servers: dict = {}
        self.faults: list[FaultRecord] = []
        self.burst: dict | None = None       # a malformed burst asked for by the fault thread
        self.notes: list[str] = []
        # the policy, as the robot sees it
        self.ticks = 0
        self.skipped_ticks = 0
        self.decisions = 0
        self.valid = 0
        self.failed = 0
        self.outstanding: tuple[int, int] | None = None    # (host generation, tick)
        self.decided_since_tick = False
        self.ticks_without_run = 0           # policy ticks in a row without an answer
        self.longest_run = 0                 # ... the longest since the fault began
        self.outstanding_since = 0.0
        self.last_latency_s = 0.0            # the newest decision's, asked to answered
        self.last_ok_wall = 0.0
        self.slow_windows: list[dict] = []
        self.load_samples: list[float] = []
        self._decisions_file = open(run_dir / "decisions.jsonl", "a", buffering=1)
        self._samples_file = open(run_dir / "samples.jsonl", "a", buffering=1)
        self.aggregator = Aggregator(PatrolTraffic(settings.seed),
                                     ring_chunks=settings.ring_chunks,
                                     sent_path=run_dir / "sent.bin")

    # -- the run -------------------------------------------------------------------------------

    def _end_early(self, signum, frame) -> None:
        """The first Ctrl-C or SIGTERM ends the robot's day where it is, with its summary
        (the last fault recovers first); a second one stops at once, as Ctrl-C does."""
        if self.ended_early:
            _interrupt(signum, frame)
        self.ended_early = (f"{signal.Signals(signum).name} at robot-hour "
                            f"{self.robot_s / 3600.0:.2f} of {self.s.robot_hours:g}")
        # os.write, not print: a handler may run inside a print of the main thread
        os.write(2, f"ending early ({self.ended_early}); again to stop at once\n".encode())

    def run(self) -> SoakSummary:
        previous = {sig: signal.signal(sig, self._end_early)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._start_servers()
            self.host_config = self._host_config()
            self._start_host()
            self._wait_first_ready()
            threads = [threading.Thread(target=self._policy_loop, name="policy", daemon=True),
                       threading.Thread(target=self._fault_loop, name="faults", daemon=True)]
            for thread in threads:
                thread.start()
            self._main_loop()
            self.stop.set()
            for thread in threads:
                thread.join(self.s.recovery_timeout_s + 60)
            final, check = self._drain_and_stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop.set()
            if self.host is not None and self.host.running:
                self.host.kill()
            for server in self.servers.values():
                server.stop()
            self.aggregator.close()
            self._decisions_file.close()
            self._samples_file.close()
        return self._summarize(final, check)

    def _start_servers(self) -> None:
        if not self.s.starts_servers:
            return
        from csr_ros.servers import free_port, llamacpp_servers, start_all

        ports = [free_port(), free_port()]       # they end with the soak, however it ends
        servers = llamacpp_servers(ports, model=self.s.model, n_ctx=self.s.max_context_tokens,
                                   threads=self.s.server_threads, log_dir=self.run_dir)
        self._say(f"starting two llama.cpp servers on ports {ports}")
        start_all(servers, timeout_s=600)
        self.servers = dict(zip(("r1", "r2"), servers))

    def _host_config(self) -> HostConfig:
        s = self.s
        if s.resource == "openai":
            urls = (s.r1, s.r2) if s.r1 else tuple(v.url for v in self.servers.values())
        else:
            urls = ()
        return HostConfig.from_settings(
            s, log_path=str(self.log_path), host_log=str(self.run_dir / "state.log"), urls=urls,
            threads=s.threads or min(2, len(os.sched_getaffinity(0))),
            hedge_after_s=s.hedge_after_s or None)

    def _start_host(self) -> None:
        self.generation += 1
        self.host = _Host(self, self.generation)

    def _wait_first_ready(self) -> None:
        self._say("starting the state's process (models load, the prefix is prefilled)")

        def ready() -> bool:
            if not self.host.running and self.host.ready is None:
                self.host.receiver.join(5.0)
                raise ConfigError(f"the state's process did not start: {self.host.error}; "
                                  f"see {self.run_dir / 'state.log'}")
            return self.host.ready is not None
        wait_until(ready, HOST_START_TIMEOUT_S, timeout_error=ConfigError(
            f"the state's process did not get ready in {HOST_START_TIMEOUT_S:.0f} s"))
        self._resend(self.host)
        self.first_ready = dict(self.host.ready)
        self.robot_started_wall = time.monotonic()
        self._say(f"ready in {self.host.ready['restart_s']:.1f} s; the robot's clock starts")

    def _main_loop(self) -> None:
        """Robot time, chunk events to the state, status, probes and progress."""
        last_wall = time.monotonic()
        next_probe = next_progress = last_wall
        window = (last_wall, self.robot_s)
        while (self.robot_s < self.s.robot_s and not self._faults_done() and
               not self.ended_early) or self._fault_running():
            now = time.monotonic()
            dt = now - last_wall
            last_wall = now
            self._watch_host()
            self._poll_status(now)
            with self.lock:
                behind = bool(self.status.get("at_risk")) or \
                    self.status.get("primary_backlog", 0) >= BEHIND_BACKLOG or \
                    self.last_latency_s > self.s.keep_up_s or \
                    (self.outstanding is not None and
                     now - self.outstanding_since > self.s.keep_up_s)
                live = self.host is not None and self.host.live
                if self.robot_s >= self.s.robot_s:
                    pass                             # the end: the last fault recovers
                elif behind and live:
                    self.held_wall_s += dt
                    self.held_by_cause[self._held_cause(now)] += dt
                else:
                    # While the state's process restarts, robot time runs as a robot's would
                    # in that wall time: an outage is real time, not compressed time.
                    speed = self.s.speedup if live else 1.0
                    self.robot_s = min(self.s.robot_s, self.robot_s + dt * speed)
                    if not live:
                        self.outage_wall_s += dt
                events = self.aggregator.advance(self.robot_s, self.clock_offset_s)
                if self.burst is not None and self.burst.get("events") is None and \
                        self._burst_may_come(now, behind and live):
                    self.burst["events"] = self.aggregator.malformed_burst(self.clock_offset_s)
                    events += self.burst["events"]
                host = self.host
            if events and host is not None and host.live:
                if not host.send(("events", events)):
                    pass                             # it died: the ring resends to the next
            if now >= next_probe:
                self._probe()
                next_probe = now + self.s.probe_every_s
            if now >= next_progress:
                self._progress(window, now)
                window = (now, self.robot_s)
                next_progress = now + self.s.progress_every_s
            time.sleep(TICK_S)

    def _held_cause(self, now: float) -> str:
        """Under the lock: why robot time is held now (HELD_CAUSES)."""
        if self._fault_running():
            return "fault_recovery"
        if self.status.get("at_risk"):
            return "warm_up"                 # R2's reconciliation would not end before the limit
        if self.last_latency_s > self.s.keep_up_s or (
                self.outstanding is not None and now - self.outstanding_since > self.s.keep_up_s):
            return "decisions"
        return "primary_queue"               # calls queued on the primary: its extends

    def _burst_may_come(self, now: float, held: bool) -> bool:
        """Under the lock: a malformed burst (two oversized inputs among others, up to
        max_chunk_tokens each) comes once the context has room for BURST_ROOM_CHUNKS of the
        largest chunks, not in the last few chunks' room a warm-up leaves (at x20 a burst there
        forced a synchronous eviction, which a robot's real time never makes). It is
        robot-side traffic: not while robot time is held. After BURST_WAIT_MAX_S it comes
        anyway."""
        if now - self.burst.setdefault("asked_s", now) > BURST_WAIT_MAX_S:
            return True
        n_static = self.status.get("n_static_tokens")
        if held or n_static is None:
            return False
        room = self.s.max_context_tokens - self.s.reserve_tokens - int(n_static)
        return room >= BURST_ROOM_CHUNKS * self.s.max_chunk_tokens

    def _faults_done(self) -> bool:
        """`max_faults` faults were injected and each is behind (recovered or given up)."""
        return self.s.max_faults is not None and len(self.faults) >= self.s.max_faults and \
            not self._fault_running()

    def _fault_running(self) -> bool:
        return any(f.recovery_s is None and not f.why_not for f in self.faults)

    # -- the state's process ---------------------------------------------------------------------

    def _watch_host(self) -> None:
        """A dead state's process is started again; a ready one gets what it has not got."""
        host = self.host
        if host is None:
            return
        if not host.running and host.ready is not None or \
                not host.running and time.monotonic() - host.started_wall > 5.0:
            with self.lock:
                expected = self.host_exits_expected > 0
                if expected:
                    self.host_exits_expected -= 1
                else:
                    self.host_exits_unexpected += 1
                    self.notes.append(f"the state's process {host.pid} exited by itself "
                                      f"(exit code {host.process.exitcode}): {host.error}")
                    self._say(f"warning: the state's process exited by itself: {host.error}")
                self.outstanding = None
                if host.ready is not None:     # its counters, as last seen, go on in the run's
                    for key in COUNTERS + COSTS:
                        self.past_counters[key] += self.status.get(key, 0)
                    self.status = {}
            host.close()
            self._start_host()
            return
        if host.ready is not None and not host.resent:
            self._resend(host)
            if host.generation > 1:
                with self.lock:
                    self.host_restarts.append({**host.ready,
                                               "at_robot_h": round(self.robot_s / 3600.0, 3)})

    def _resend(self, host: _Host) -> None:
        """What the new process lacks, from the ring (GetChunks, as the reconciler node asks the
        aggregator); seqs the ring no longer holds are given up as lost."""
        with self.lock:
            events, first = self.aggregator.since(host.ready["next_seq"])
            if host.ready["next_seq"] < first:
                host.send(("lost", host.ready["next_seq"], first))
            if events:
                host.send(("events", events))
            host.send(("ask", "clock-resend", "clock", self.clock_offset_s))
            host.resent = True

    def _poll_status(self, now: float) -> None:
        host = self.host
        if host is None or not host.live:
            return
        future = self.status_future
        if future is not None and future.done():
            try:
                status = future.result()
                with self.lock:
                    self.status = status
                self._note_engines(status)
            except Exception:
                pass
            self.status_future = None
        if self.status_future is None and now - self.status_s >= STATUS_EVERY_S:
            self.status_s = now
            self.status_future = host.ask_later("status")

    def fresh_status(self, timeout_s: float = 30.0) -> dict:
        host = self.host
        if host is None or not host.live:
            raise HostDown("the state's process is not ready")
        status = host.ask("status", timeout_s=timeout_s)
        with self.lock:
            self.status = status
        self._note_engines(status)
        return status

    def _note_engines(self, status: dict) -> None:
        """Keep each worker's engine choice; a restart that chose another engine is a note
        (the run's speed is then not one engine's)."""
        for name, choice in status.get("engines", {}).items():
            before = self.engine_choices.get(name)
            if before is not None and _engine_of(before) != _engine_of(choice):
                self.notes.append(f"worker {name} changed engine at robot-hour "
                                  f"{self.robot_s / 3600:.2f}: {_engine_of(before)} -> "
                                  f"{_engine_of(choice)}")
            self.engine_choices[name] = choice

    # -- the policy ------------------------------------------------------------------------------

    def _policy_loop(self) -> None:
        period_s = 1.0 / self.s.rate_hz
        next_s = time.monotonic()
        while not self.stop.is_set():
            next_s += period_s
            delay_s = next_s - time.monotonic()
            if delay_s > 0:
                self.stop.wait(delay_s)
            else:
                next_s = time.monotonic()
            with self.lock:
                self.ticks += 1
                self.ticks_without_run = 0 if self.decided_since_tick else \
                    self.ticks_without_run + 1
                self.decided_since_tick = False
                self.longest_run = max(self.longest_run, self.ticks_without_run)
                host = self.host
                if self.outstanding is not None or host is None or not host.live:
                    self.skipped_ticks += 1         # the robot holds its safe action
                    continue
                self.outstanding = (host.generation, self.ticks)
                self.outstanding_since = time.monotonic()
                suffix = f"Time now: t={self.robot_s:.0f}s."
            if not host.send(("decide", self.ticks, suffix)):
                with self.lock:
                    self.outstanding = None

    def on_decision(self, host: _Host, tick: int, out: dict) -> None:
        now = time.monotonic()
        with self.lock:
            if self.outstanding == (host.generation, tick):
                self.outstanding = None
                self.last_latency_s = now - self.outstanding_since
            self.decisions += 1
            if out.get("ok"):
                self.last_ok_wall = now
                self.decided_since_tick = True
                self.valid += bool(out.get("valid"))
            else:
                self.failed += 1
            robot_s = self.robot_s
        self._decisions_file.write(json.dumps({
            "t_s": round(now - self.started_wall, 3), "robot_s": round(robot_s, 1),
            "ok": bool(out.get("ok")), "ttft_s": out.get("ttft_s"),
            "latency_s": out.get("latency_s"), "valid": out.get("valid"),
            "action": out.get("action"), "version": out.get("version"),
            "inside": out.get("inside"), "error": (out.get("error") or "")[:200]}) + "\n")

    # -- faults ----------------------------------------------------------------------------------

    def _fault_loop(self) -> None:
        plan = FaultPlan(self.s.faults, every_s=self.s.fault_every_s, seed=self.s.seed)
        # the last fault must leave time to recover before the robot-time ends
        while not self.stop.is_set():
            step = plan.next()
            if step is None or self.s.max_faults is not None and \
                    len(self.faults) >= self.s.max_faults:
                return
            at_s, kind = step            # wall seconds from the start of the robot's clock
            # the planned one would come after the end: the closing fault instead, if any
            closing = None
            if self._robot_s_at(at_s) > self.s.robot_s - self._fault_margin_s():
                closing = plan.closing(self.faults[-1].kind if self.faults else None)
                kind = closing or kind
            while not self.stop.is_set() and (
                    self._robot_left_s() > CLOSING_LEAD * self._fault_margin_s() if closing
                    else time.monotonic() - self.robot_started_wall < at_s):
                self.stop.wait(0.2)
            if self.stop.is_set() or self._robot_left_s() < self._fault_margin_s():
                return
            if not self._wait_live(self.s.recovery_timeout_s):
                continue
            record = FaultRecord(kind=kind, at_s=self.robot_s,
                                 wall_at_s=time.monotonic() - self.started_wall)
            if closing:
                record.extra["closing"] = True
            with self.lock:
                self.faults.append(record)
            self._say(f"fault {len(self.faults)}: {kind} at {self.robot_s / 3600:.2f} "
                      "robot-hours")
            try:
                getattr(self, f"_fault_{kind}")(record, plan)
            except Exception as exc:
                log.exception("fault %s", kind)
                record.why_not = f"the injection failed: {type(exc).__name__}: {exc}"
                record.recovery_s = None
            self._say(f"fault {len(self.faults)}: {kind} "
                      + (f"recovered in {record.recovery_s:.1f} s; {record.robot_saw}"
                         if record.recovered else f"NOT RECOVERED: {record.why_not}"))
            plan.after(time.monotonic() - self.robot_started_wall)

    def _robot_left_s(self) -> float:
        return self.s.robot_s - self.robot_s

    def _robot_s_at(self, at_s: float) -> float:
        """The robot time at `at_s` wall seconds from the start of the robot's clock, if
        nothing holds it until then."""
        wall_left_s = at_s - (time.monotonic() - self.robot_started_wall)
        return self.robot_s + max(0.0, wall_left_s) * self.s.speedup

    def _fault_margin_s(self) -> float:
        """Robot time a fault needs before the end: about a minute of wall time."""
        return 60.0 * self.s.speedup

    def _wait_live(self, timeout_s: float) -> bool:
        return bool(wait_until(lambda: (host := self.host) is not None and host.live,
                               timeout_s, interval_s=0.2, stop=self.stop))

    def _policy_counts(self) -> tuple[int, int]:
        with self.lock:
            return self.skipped_ticks, self.failed

    def _recover(self, record: FaultRecord, t0: float, cleared: float, *,
                 ready=lambda status: True, words=lambda: "") -> None:
        """Wait until the fault is behind: `ready(status)`, a decision answered after
        `cleared`, nothing held, and the state equal to the one its log rebuilds."""
        skipped0, failed0 = record.extra.pop("_counts")
        why = "the state's process is not back"

        def equal_check() -> dict | None:
            nonlocal why
            host = self.host
            if host is None or not host.live:
                why = "the state's process is not back"
                return None
            try:
                status = self.fresh_status()
            except HostDown as exc:
                why = str(exc)
                return None
            if not ready(status):
                why = record.extra.get("_why", "the component is not back")
                return None
            if self.last_ok_wall <= cleared:
                why = "no decision answered since"
                return None
            if status.get("held_chunks") or status.get("pending_versions") or \
                    status.get("phase") == "retry" or status.get("primary_reloading"):
                why = (f"{status.get('held_chunks')} chunks held, "
                       f"{status.get('pending_versions')} version records pending, phase "
                       f"{status.get('phase')}")
                return None
            try:
                check = host.ask("check", timeout_s=60)
            except HostDown as exc:
                why = str(exc)
                return None
            if not check["equal"]:
                why = f"the state differs from its log: {check}"
                return None
            return check
        check = wait_until(equal_check, t0 + self.s.recovery_timeout_s - time.monotonic(),
                           interval_s=0.5)
        if check is not None:
            record.recovered = True
            record.recovery_s = time.monotonic() - t0
            record.state_equals_log = True
            record.extra["check"] = {k: check[k] for k in ("version", "seqs", "log_seqs",
                                                           "n_static_tokens")}
        else:
            record.why_not = why
            record.state_equals_log = False
        skipped, failed = self._policy_counts()
        record.decisions_skipped = skipped - skipped0 + failed - failed0
        record.decisions_failed = failed - failed0
        with self.lock:
            record.ticks_without_decision = self.longest_run
        said = ", ".join(w for w in words().split(", ") if w)
        record.robot_saw = (f"{record.decisions_skipped} policy ticks without a decision "
                            f"({record.decisions_failed} failed), safe action {SAFE_ACTION} "
                            f"held meanwhile" + (f"; {said}" if said else ""))
        record.extra = {k: v for k, v in record.extra.items() if not k.startswith("_")}

    def _begin(self, record: FaultRecord) -> float:
        record.extra["_counts"] = self._policy_counts()
        with self.lock:
            self.longest_run = self.ticks_without_run
        return time.monotonic()

    def _worker_or_server(self, name: str, status: dict) -> tuple[str, int | None]:
        if self.servers:
            server = self.servers[name]
            return f"server {name}", server.pid if server.running else None
        return f"worker {name}", status.get("worker_pids", {}).get(name)

    def _kill_resource(self, name: str, status: dict) -> str:
        what, pid = self._worker_or_server(name, status)
        if pid is None:
            return f"{what} was already down"
        if self.servers:
            self.servers[name].kill()
            self.servers[name].launch()
            self.servers[name].wait(timeout_s=600)
            return f"{what} (pid {pid}) killed and started again"
        os.kill(pid, signal.SIGKILL)
        return f"{what} (pid {pid}) killed"

    def _resource_back(self, name: str, old_pid: int | None):
        def ready(status: dict) -> bool:
            if self.servers:
                return self.servers[name].running
            pid = status.get("worker_pids", {}).get(name)
            return pid is not None and pid != old_pid and alive(pid)
        return ready

    def _fault_kill_primary(self, record: FaultRecord, plan: FaultPlan) -> None:
        self._kill_one(record, "primary")

    def _fault_kill_secondary(self, record: FaultRecord, plan: FaultPlan) -> None:
        self._kill_one(record, "secondary")

    def _kill_one(self, record: FaultRecord, role: str) -> None:
        status = self.fresh_status()
        name = status["primary"] if role == "primary" else \
            ("r2" if status["primary"] == "r1" else "r1")
        _, old_pid = self._worker_or_server(name, status)
        before = status
        t0 = self._begin(record)
        record.detail = self._kill_resource(name, status) + f" (the {role})"
        cleared = time.monotonic()
        record.extra["_why"] = f"{name} is not running again"
        self._recover(record, t0, cleared, ready=self._resource_back(name, old_pid),
                      words=lambda: self._counter_words(before))

    def _fault_stall(self, record: FaultRecord, plan: FaultPlan) -> None:
        status = self.fresh_status()
        name = status["primary"]
        what, pid = self._worker_or_server(name, status)
        stall_s = self.s.query_timeout_s + 10.0
        t0 = self._begin(record)
        if pid is None:
            record.detail = f"{what} was down"
        else:
            ticks = start_ticks(pid)
            self._signal(pid, signal.SIGSTOP)
            self.stop.wait(stall_s)
            gone = not alive(pid, ticks)
            if not gone:
                self._signal(pid, signal.SIGCONT)
            record.detail = (f"{what} (pid {pid}) stopped for {stall_s:.0f} s (query timeout "
                             f"{self.s.query_timeout_s:.0f} s); "
                             + ("killed at the timeout, started again" if gone
                                else "then continued"))
        cleared = time.monotonic()
        self._recover(record, t0, cleared,
                      ready=lambda st: self.servers[name].running if self.servers else
                      _workers_alive(st),
                      words=lambda: self._counter_words(status))

    def _signal(self, pid: int, sig: int) -> None:
        try:
            if self.servers:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def _fault_kill_host(self, record: FaultRecord, plan: FaultPlan) -> None:
        self._kill_host(record)

    def _kill_host(self, record: FaultRecord, detail: str = "") -> None:
        host = self.host
        workers = [p for p in self.status.get("worker_pids", {}).values() if p]
        t0 = self._begin(record)
        with self.lock:
            self.host_exits_expected += 1
        os.kill(host.pid, signal.SIGKILL)
        record.detail = f"the state's process (pid {host.pid}) killed{detail}"
        cleared = time.monotonic()

        def ready(status: dict) -> bool:
            if self.host is host:
                return False
            record.extra["_why"] = "the new process has not caught up"
            if status.get("next_seq", 0) < self.aggregator.next_seq - 64:
                return False
            # the new process starts its secondary's worker after it serves: redundant again
            # only once that runs
            record.extra["_why"] = "the new process's workers are not all running"
            return bool(self.servers) or _workers_alive(status)
        self._recover(record, t0, cleared, ready=ready)
        new = self.host
        if new is not None and new.ready is not None and new is not host:
            r = new.ready
            orphans = [p for p in workers if alive(p)]
            record.extra.update(restart_s=round(r["restart_s"], 3),
                                since_spawn_s=round(r["since_spawn_s"], 3),
                                primary_wait_s=round(r["primary_wait_s"], 3),
                                rebuild_s=round(r["rebuild_s"], 3),
                                resume_s=round(r["resume_s"], 3),
                                n_from_capsule=r["n_from_capsule"],
                                resumed_at_seq=r["next_seq"], orphan_workers=orphans)
            record.robot_saw += (f"; restarted in {r['restart_s']:.1f} s, "
                                 f"{r['since_spawn_s']:.1f} s from its spawn (the state rebuilt "
                                 f"in {r['rebuild_s']:.2f} s, {r['n_from_capsule']} tokens "
                                 "from the capsule)")
            if orphans:
                record.recovered = False
                record.why_not = f"worker processes {orphans} of the killed process still run"

    def _fault_disk_full(self, record: FaultRecord, plan: FaultPlan) -> None:
        hold_s = plan.uniform(15.0, 45.0)
        status = self.fresh_status()
        t0 = self._begin(record)
        self.fs.fill(self.host.pid, self.log_path)
        held_max, pending_max = 0, 0

        def watch() -> bool:         # never true: the figures are watched for `hold_s`
            nonlocal held_max, pending_max
            try:
                st = self.fresh_status(timeout_s=10)
            except HostDown:
                return False
            held_max = max(held_max, st.get("held_chunks", 0))
            pending_max = max(pending_max, st.get("pending_versions", 0))
            return False
        wait_until(watch, hold_s, interval_s=0.5, stop=self.stop)
        self.fs.free()
        cleared = time.monotonic()
        record.detail = (f"{self.fs.describe}, for {hold_s:.0f} s; up to {held_max} chunks "
                         f"held, {pending_max} version records pending")
        record.extra.update(held_max=held_max, pending_versions_max=pending_max)
        self._recover(record, t0, cleared,
                      words=lambda: f"decisions went on without the {held_max} newest chunks "
                      "while they were held, " + self._counter_words(status))

    def _fault_clock_jump(self, record: FaultRecord, plan: FaultPlan) -> None:
        hold_s = plan.uniform(10.0, 30.0)
        seq0 = self.aggregator.next_seq
        jumps0 = self.aggregator.time_jumps
        t0 = self._begin(record)
        self._set_clock(CLOCK_JUMP_S)
        self.stop.wait(hold_s)
        wait_until(lambda: self.aggregator.next_seq >= seq0 + 3,   # some chunks under the
                   self.s.recovery_timeout_s / 2, interval_s=0.5,  # jumped clock first
                   stop=self.stop)
        self._set_clock(0.0)
        cleared = time.monotonic()
        seq_back = self.aggregator.next_seq
        record.detail = (f"simulated: the wall clock read by the aggregator's emitter and by "
                         f"the chunk log jumped {CLOCK_JUMP_S / 3600:+.0f} h for {hold_s:.0f} s, "
                         "then back")

        def ready(status: dict) -> bool:
            record.extra["_why"] = "no chunk after the clock came back"
            return status.get("next_seq", 0) > seq_back
        self._recover(record, t0, cleared, ready=ready)
        record.extra.update(chunks_during=seq_back - seq0,
                            sources_reset=self.aggregator.time_jumps - jumps0)
        record.robot_saw += (f"; {seq_back - seq0} chunks while the clock was ahead "
                             "(keep-alives fired), the emitter reset "
                             f"{self.aggregator.time_jumps - jumps0} sources when it went back")

    def _set_clock(self, offset_s: float) -> None:
        with self.lock:
            self.clock_offset_s = offset_s
        host = self.host
        if host is not None and host.live:
            host.ask("clock", offset_s, timeout_s=30)

    def _fault_malformed(self, record: FaultRecord, plan: FaultPlan) -> None:
        status = self.fresh_status()
        refused0 = status.get("refused", 0)
        t0 = self._begin(record)
        with self.lock:
            self.burst = {}
        while not self.stop.is_set():
            with self.lock:
                if self.burst.get("events") is not None:
                    events, self.burst = self.burst["events"], None
                    break
            time.sleep(0.05)
        else:
            return
        last = events[-1].seq
        cleared = time.monotonic()
        pid = self.host.pid
        record.detail = (f"{len(events)} malformed chunk events, seqs {events[0].seq}..{last}: "
                         "sensor messages (empty, oversized, NaN, a lone surrogate) through the "
                         "emitter, payloads (non-UTF-8, empty, oversized, NaN) straight to the "
                         "reconciler")

        def ready(st: dict) -> bool:
            record.extra["_why"] = "the burst is not in the state yet"
            return st.get("next_seq", 0) > last and st.get("pid") == pid
        self._recover(record, t0, cleared, ready=ready)
        try:
            refused = self.fresh_status().get("refused", 0) - refused0
        except HostDown:
            refused = None
        record.extra.update(events=len(events), refused=refused)
        record.robot_saw += f"; {refused} refused, placeholders kept their seqs"

    def _fault_double(self, record: FaultRecord, plan: FaultPlan) -> None:
        variant = plan.choice(["both_resources", "state_process"])

        def running_phase() -> str | None:
            try:
                phase = self.fresh_status(timeout_s=10).get("phase")
            except HostDown:
                return None
            return phase if phase in ("warm", "catchup") else None
        phase = wait_until(running_phase, 300.0, stop=self.stop)
        during = f"during a running reconciliation ({phase})" if phase in ("warm", "catchup") \
            else "(no reconciliation started within 300 s)"
        if variant == "state_process":
            self._kill_host(record, f", {during}")
            return
        status = self.fresh_status()
        olds = {n: self._worker_or_server(n, status)[1] for n in ("r1", "r2")}
        t0 = self._begin(record)
        done = [self._kill_resource(n, status) for n in (status["primary"],
                                                          "r2" if status["primary"] == "r1"
                                                          else "r1")]
        record.detail = "; ".join(done) + f", {during}"
        cleared = time.monotonic()
        backs = [self._resource_back(n, olds[n]) for n in ("r1", "r2")]
        record.extra["_why"] = "both resources are not running again"
        self._recover(record, t0, cleared, ready=lambda st: all(b(st) for b in backs),
                      words=lambda: self._counter_words(status))

    def _counter_words(self, before: dict) -> str:
        try:
            after = self.fresh_status(timeout_s=10)
        except HostDown:
            return ""
        if after.get("pid") != before.get("pid"):
            return ""
        parts = [f"{k} +{after.get(k, 0) - before.get(k, 0)}"
                 for k in ("failovers", "fallbacks", "retries", "failed_queries")
                 if after.get(k, 0) != before.get(k, 0)]
        return ", ".join(parts)

    # -- probes and progress ---------------------------------------------------------------------

    def _probe(self) -> None:
        pids: dict[str, int | None] = {"supervisor": os.getpid()}
        host = self.host
        pids["state"] = host.pid if host is not None and host.running else None
        if self.servers:
            for name, server in self.servers.items():
                pids[name] = server.pid if server.running else None
        else:
            for name, pid in self.status.get("worker_pids", {}).items():
                pids[name] = pid
        sample = {"t_s": round(time.monotonic() - self.started_wall, 2),
                  "robot_s": round(self.robot_s, 1)}
        for role, pid in pids.items():
            if pid is None:
                continue
            u = tree_usage(pid) if self.servers and role in self.servers else usage(pid)
            if u is not None:
                sample[role] = [round(u.rss_mb, 2), u.fds, u.threads, u.pid]
        sample.update(log_sizes(self.log_path))
        sample["log_segments"] = self.status.get("log_segment")
        sample["load1"] = os.getloadavg()[0]
        self._samples_file.write(json.dumps(sample) + "\n")
        self.load_samples.append(sample["load1"])
        if len(self.load_samples) > 4096:             # a running summary, not a day of them
            self.load_samples = self.load_samples[::2]

    def _progress(self, window: tuple[float, float], now: float) -> None:
        wall_dt = now - window[0]
        robot_dt = self.robot_s - window[1]
        achieved = robot_dt / wall_dt if wall_dt > 0 else 0.0
        if wall_dt > 0 and achieved < 0.9 * self.s.speedup and self.robot_s < self.s.robot_s:
            if self.slow_windows and abs(self.slow_windows[-1]["to_robot_s"] - window[1]) < 1:
                w = self.slow_windows[-1]
                w["speedup"] = round((w["speedup"] * w["wall_s"] + achieved * wall_dt)
                                     / (w["wall_s"] + wall_dt), 2)
                w["to_robot_s"], w["wall_s"] = round(self.robot_s, 1), round(w["wall_s"]
                                                                             + wall_dt, 1)
            else:
                self.slow_windows.append({"from_robot_s": round(window[1], 1),
                                          "to_robot_s": round(self.robot_s, 1),
                                          "wall_s": round(wall_dt, 1),
                                          "speedup": round(achieved, 2)})
        if not self.s.live_line:
            return
        st = self.status
        host = self.host
        rss = []
        for role, pid in (("state", host.pid if host else None),
                          *((n, p) for n, p in st.get("worker_pids", {}).items())):
            u = usage(pid) if pid else None
            if u is not None:
                rss.append(f"{role} {u.rss_mb:.0f}")
        me = usage(os.getpid())
        recovered = sum(f.recovered for f in self.faults)
        line = (f"robot {self.robot_s / 3600:6.2f}/{self.s.robot_hours:g} h  x{achieved:4.1f} "
                f"(of {self.s.speedup:g})  chunks {self.aggregator.next_seq}  v{st.get('version')}"
                f" {st.get('phase', '-')}  cycles {st.get('cycles', 0)}  decisions "
                f"{self.decisions} (skipped {self.skipped_ticks})  faults {recovered}/"
                f"{len(self.faults)}  RSS MB sup {me.rss_mb:.0f} {' '.join(rss)}"
                f"{'  HELD' if st.get('held_chunks') else ''}"
                f"{'' if host is not None and host.live else '  (state restarting)'}")
        print(line, file=sys.stderr, flush=True)

    def _say(self, text: str) -> None:
        if self.s.live_line:
            print(text, file=sys.stderr, flush=True)
        else:
            log.info("%s", text)

    # -- the end ---------------------------------------------------------------------------------

    def _drain_and_stop(self) -> tuple[dict | None, dict | None]:
        """Every chunk sent is in the state (or the log, held ones too), then a last check,
        then the state's process stops and the servers with it."""

        def last_check() -> dict | None:
            self._watch_host()
            host = self.host
            if host is None or not host.live:
                return None
            try:
                status = self.fresh_status()
            except HostDown:
                return None
            if status["next_seq"] >= self.aggregator.next_seq and not status["held_chunks"] \
                    and not status["pending_versions"] and status["primary_backlog"] == 0:
                return host.ask("check", timeout_s=120)
            return None
        check = wait_until(last_check, self.s.recovery_timeout_s, interval_s=0.5)
        final = self.host.stop(self.s.op_timeout_s) if self.host is not None else None
        return final, check

    def _summarize(self, final: dict | None, check: dict | None) -> SoakSummary:
        wall_s = time.monotonic() - self.started_wall
        robot_wall_s = time.monotonic() - (self.robot_started_wall or self.started_wall)
        audit = audit_log(self.log_path, self.run_dir / "sent.bin")
        series: dict[str, ProcessSeries] = {}
        sizes: list[tuple[int, int, int]] = []
        load: list[float] = []
        with open(self.run_dir / "samples.jsonl") as f:
            for line in f:
                sample = json.loads(line)
                for role, value in sample.items():
                    if isinstance(value, list):
                        series.setdefault(role, ProcessSeries(role)).samples.append(
                            (sample["robot_s"], value[0], value[1], value[2], value[3]))
                sizes.append((sample["log_bytes"], sample.get("capsule_bytes", 0),
                              sample.get("archive_bytes", 0)))
                load.append(sample["load1"])
        rss, fds = {}, {}
        for role, s in series.items():
            rss[role], fds[role] = s.summary()
        ttfts = []
        with open(self.run_dir / "decisions.jsonl") as f:
            for line in f:
                d = json.loads(line)
                if d["ok"] and d["ttft_s"] is not None:
                    ttfts.append(d["ttft_s"])
        restarts = sorted(r["restart_s"] for r in self.host_restarts)
        spawned = sorted(round(r["since_spawn_s"], 2) for r in self.host_restarts)
        final = final or self.status
        total = {k: self.past_counters[k] + final.get(k, 0) for k in COUNTERS + COSTS}
        tokens = None
        if self.robot_s > 0 and final.get("chunks_added"):
            tokens = round(self.aggregator.next_seq / self.robot_s * final["tokens_added"]
                           / final["chunks_added"], 2)
        end = log_sizes(self.log_path)
        notes = list(self.notes)
        if self.fs.mode != "tmpfs":
            notes.append(f"disk full simulated: {self.fs.describe}")
        summary = SoakSummary(
            settings=self.s.as_json(), robot_hours=round(self.robot_s / 3600.0, 3),
            wall_s=round(wall_s, 1), speedup_target=self.s.speedup,
            speedup_achieved=round(self.robot_s / robot_wall_s, 2) if robot_wall_s else 0.0,
            held_wall_s=round(self.held_wall_s, 1), outage_wall_s=round(self.outage_wall_s, 1),
            slow_windows=self.slow_windows,
            cycles=total["cycles"], swaps=total["swaps"], fallbacks=total["fallbacks"],
            failovers=total["failovers"], retries=total["retries"], decisions=self.decisions,
            valid_actions=self.valid, failed_decisions=self.failed,
            skipped_ticks=self.skipped_ticks, safe_action=SAFE_ACTION,
            chunks_in=audit.sent, chunks_lost=audit.lost, chunks_duplicated=audit.duplicated,
            chunks_reordered=audit.reordered, chunks_refused=audit.refused,
            chunks_corrupt=audit.corrupt + audit.unexpected_refusals,
            faults=self.faults, rss_mb=rss, open_fds=fds,
            log_bytes={"end": end["log_bytes"],
                       "max": max((x[0] for x in sizes), default=end["log_bytes"]),
                       "capsules_max": max((x[1] for x in sizes), default=0),
                       "archive_end": end["archive_bytes"],
                       "segments_audited": audit.segments,
                       "archived_segments": audit.archived_segments},
            restart_s={"n": len(restarts),
                       "median_s": restarts[len(restarts) // 2] if restarts else None,
                       "max_s": restarts[-1] if restarts else None,
                       "rebuild_s_max": max((r["rebuild_s"] for r in self.host_restarts),
                                            default=None),
                       "since_spawn_median_s": spawned[len(spawned) // 2] if spawned else None,
                       "first_start_s": round(self.first_ready.get("restart_s", 0.0), 2),
                       "at_robot_h": [[r["at_robot_h"], round(r["restart_s"], 2)]
                                      for r in self.host_restarts],
                       **kill_host_restarts(self.faults)},
            hedged_queries=int(total["hedged_queries"]),
            engines={name: {"engine": _engine_of(choice), "precision": choice.get("precision"),
                            "how": choice.get("how"), "choice": describe_choice(choice)}
                     for name, choice in self.engine_choices.items()},
            held_by_cause={k: round(v, 1) for k, v in self.held_by_cause.items()},
            costs_s={"state_log_sync": round(total["log_sync_s"], 2),
                     "state_cpu": round(total["cpu_s"], 1),
                     "supervisor_cpu": round(time.process_time(), 1)},
            ttft=ttft_figures(ttfts), state_equals_log=None if check is None else check["equal"],
            host_exits_unexpected=self.host_exits_unexpected, ended_early=self.ended_early,
            audit_examples=audit.examples,
            tokens_per_robot_s=tokens, log_fs=self.fs.describe,
            load_average={"mean": round(sum(load) / len(load), 2) if load else None,
                          "max": round(max(load), 2) if load else None},
            notes=notes)
        if not audit.versions_in_order:
            summary.notes.append("version records out of order in the chunk log")
        return summary
