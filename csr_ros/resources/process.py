"""`ProcessResource`: any resource, run in a worker process and called over a pipe.

    ProcessResource("local", name="r1", model="smollm2", threads=1)

The child is started with multiprocessing's 'spawn' method and builds the resource with
`make_resource(kind, **options)`; every call is forwarded as (attribute path, args, kwargs) and
answered with the result or the exception. Two local engines in two processes compute truly in
parallel, each on its own core, and one that crashes takes nothing else with it.

`set_background(True)` lowers the child's CPU priority (`background_nice`, default 10) while it
does background work (a warm-up or catch-up) so that the primary's queries win the CPU when the
machine is oversubscribed; `set_background(False)` restores it (raising priority back needs
the right to do so; without it the child stays low and a warning says so once). With
`background_threads` (and `threads`), background work also runs on that many compute threads
and foreground work on `threads`: on 2 cores, `threads=2, background_threads=1` gives the
primary both cores while its secondary idles, without 4 threads fighting over 2 cores while
both compute.

A query given `on_text` is followed as the child decodes it: the child sends the answer's
text so far after each token, the parent hands it to `on_text`, and what `on_text` raises is
sent back as a cancel that the child's decode obeys between two tokens (its state rolls back
as in process); the call then raises what `on_text` raised.

A dead child raises `ResourceUnavailableError` (its committed state is gone). `load()` replaces
the whole committed run anyway, so it starts a fresh child first: a warm-up retry after a crash
recovers by itself; `revive()` starts one at once, so that the next load does not wait for the
model to load. `start_in_turn` starts the first of several resources alone and the others
later (at their first `load` or `revive`): a restarted primary is then ready without sharing
the cores with its secondary's start. `wait=False` returns while a worker starts: its first
call waits for it, and the caller's own start-up (a chunk log, a tokenizer) runs beside it. A
call given `timeout_s` that does not answer in time kills the child and raises
`ResourceTimeoutError`. A child whose parent died (killed, say) exits within a second, even in
the middle of a computation: nothing is left running for a person to clean up.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import threading
import time
from typing import Any, Callable, Sequence

from csr_ros.errors import (ConfigError, QueryCancelledError, ResourceError,
                             ResourceTimeoutError, ResourceUnavailableError)
from csr_ros.resources.base import Capabilities, PrefillResult, QueryResult
from csr_ros.state import Request

log = logging.getLogger(__name__)

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_STREAM = "__csr_stream_text__"     # in a call's kwargs: the child sends on_text's texts back
_CANCEL = "__csr_cancel__"          # parent → child during a streamed call: stop the decode


class ProcessResource:
    # The child's own capabilities stay in the child: reach them with `call` or `apply`.
    capabilities = Capabilities(background=True, timeout=True, worker=True)

    def __init__(self, kind: str, *, name: str | None = None, start_timeout_s: float = 600.0,
                 background_nice: int = 10, background_threads: int | None = None,
                 start: bool = True, wait: bool = True, **options: Any):
        """`start=False`: no worker process yet; the first `load` or `revive` starts it.
        `wait=False`: the worker process starts now and this returns at once; the first call
        (or `wait_started`) waits until it is ready, and raises what its start raised. What the
        caller does meanwhile runs beside the worker's imports and weights."""
        self.kind = kind
        self.name = name or options.get("name") or kind
        self.options = {**options, "name": self.name}
        self.start_timeout_s = start_timeout_s
        self.background_nice = background_nice
        if background_threads is not None and int(background_threads) < 1:
            raise ConfigError(f"background_threads must be >= 1, got {background_threads}")
        self.background_threads = background_threads
        self.restarts = 0
        #: how the worker's engine was chosen (LocalResource.engine_choice; None for servers),
        #: as its last start reported it
        self.engine_choice: dict | None = None
        self._reported: dict | None = None  # what the worker's start said of its resource
        self._reported_by: ProcessResource | None = None   # a sibling's, until its own starts
        self._start_deadline: float | None = None   # set while a start is not waited for yet
        self._wanted = (False, False)       # (background, few_threads), kept across restarts
        self._background = False
        self._threads_background = False
        self._priority_warned = False
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn = None
        self.started = False
        if start:
            self._spawn(wait=wait)

    def sibling(self, name: str) -> "ProcessResource":
        """A resource of this one's kind and options that starts later (`start=False`), at low
        CPU priority beside this one, until the caller sets its priority."""
        options = {k: v for k, v in self.options.items() if k != "name"}
        other = ProcessResource(self.kind, name=name, start_timeout_s=self.start_timeout_s,
                                background_nice=self.background_nice,
                                background_threads=self.background_threads, start=False,
                                **options)
        # the same kind and options report the same (until its own start reports), also
        # while this one's start is still under way
        other._reported_by = self
        other._wanted = (True, True)
        return other

    # -- the Resource interface ------------------------------------------------------------

    @property
    def n_committed(self) -> int:
        return self.call("n_committed")

    @property
    def committed_ids(self) -> tuple[int, ...]:
        return tuple(self.call("committed_ids"))

    @property
    def state_mode(self) -> str:
        return self._facts()["state_mode"]

    @property
    def max_context_tokens(self) -> int:
        return self._facts()["max_context_tokens"]

    def _facts(self) -> dict:
        if self._reported is None and self._reported_by is not None:
            return self._reported_by._facts()
        if self._reported is None:
            self.wait_started()
        if self._reported is None:
            raise ResourceUnavailableError(f"resource {self.name!r}: its worker process has "
                                           "not started yet")
        return self._reported

    def wait_started(self) -> None:
        """Wait for a start that `wait=False` did not wait for (at once otherwise)."""
        with self._lock:
            self._finish_start_locked()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def load(self, ids: Sequence[int], text: str | None = None, *, version: int | None = None,
             timeout_s: float | None = None) -> PrefillResult:
        with self._busy():
            self._revive_locked()
            return self._call_locked("load", (tuple(ids), text), {"version": version},
                                     timeout_s)

    def extend(self, ids: Sequence[int], text: str | None = None, *, version: int | None = None,
               timeout_s: float | None = None) -> PrefillResult:
        return self.call("extend", tuple(ids), text, version=version, timeout_s=timeout_s)

    def query(self, request: Request, *, max_new_tokens: int, stop: Sequence[str] = (),
              constraint=None, on_token: Callable[[int], None] | None = None,
              on_text: Callable[[str], None] | None = None,
              timeout_s: float | None = None) -> QueryResult:
        """`on_token` stays in this process: it is called once, with the answer's tokens,
        when the answer is back (as for a closed choice). `on_text` follows the decode in the
        child token by token, and what it raises stops it (the module docstring)."""
        kwargs = {"max_new_tokens": max_new_tokens, "stop": tuple(stop),
                  "constraint": constraint}
        if on_text is None:
            result = self.call("query", request, timeout_s=timeout_s, **kwargs)
        else:
            with self._busy():
                result = self._call_locked("query", (request,), {**kwargs, "on_text": _STREAM},
                                           timeout_s, on_text=on_text)
        if on_token is not None:
            on_token(result.n_generated)
        return result

    def call(self, path: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """Call (or read) `path` on the child's resource, e.g. `call("engine.snapshot")`."""
        with self._busy():
            return self._call_locked(path, args, kwargs, timeout_s)

    @contextlib.contextmanager
    def _busy(self):
        """The lock for one call; then the threads set_background asked for meanwhile."""
        with self._lock:
            try:
                yield
            finally:
                if self.alive:
                    self._threads_as_wanted_locked()

    def _threads_as_wanted_locked(self) -> None:
        """The threads set_background last asked for; a child that died meanwhile gets them
        at its next start."""
        try:
            self._set_threads_locked(self._wanted[1])
        except ResourceUnavailableError:
            pass

    def set_background(self, background: bool, *, few_threads: bool | None = None) -> None:
        """Run the child at low CPU priority (background work) or normal priority, and with
        `background_threads` compute threads or its own `threads` (when both are set).

        `few_threads` (default: `background`) sets the threads apart from the priority: a
        reconciliation that must finish in time gets its priority back but keeps its few
        threads, so that it and the primary never oversubscribe the CPU. A worker started
        again after a crash starts in the state last asked for."""
        few = background if few_threads is None else few_threads
        self._wanted = (background, few)
        if not self.alive:
            return
        # Never waits for the lock: a busy child holds it for its whole call (a stopped one for
        # its timeout), and the caller may hold its own lock. A busy child gets its threads
        # set right after its call (_busy), a dead one at its next start.
        if self._threads_differ(few) and self._lock.acquire(blocking=False):
            try:
                self._threads_as_wanted_locked()
            finally:
                self._lock.release()
        self._set_priority(background)

    def _set_priority(self, background: bool) -> None:
        if background == self._background:
            return
        nice = self.background_nice if background else 0
        try:
            for tid in _thread_ids(self._process.pid):
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except PermissionError:
            if not self._priority_warned:
                log.warning("resource %s: not allowed to raise the worker's priority back; it "
                            "stays at nice %d", self.name, self.background_nice)
                self._priority_warned = True
            return
        except (OSError, AttributeError):
            return                          # the child just exited, or no setpriority here
        self._background = background

    def _set_threads_locked(self, background: bool) -> None:
        """Background work on `background_threads`, foreground on `threads`: a primary may use
        every core while its secondary idles, without the two oversubscribing the CPU when
        both compute (each thread of one would wait at every op for threads of the other)."""
        if not self._threads_differ(background):
            return
        threads = self.background_threads if background else int(self.options["threads"])
        self._call_locked("set_threads", (threads,), {}, None)
        self._threads_background = background

    def _threads_differ(self, background: bool) -> bool:
        return (self.background_threads is not None and bool(self.options.get("threads"))
                and background != self._threads_background)

    def _restore_wanted_locked(self) -> None:
        """A new child computes as its predecessor was last asked to: a secondary restarted
        during a warm-up must not take every core from the primary."""
        background, few = self._wanted
        self._set_threads_locked(few)
        self._set_priority(background)

    def apply(self, func: Callable[..., Any], *args: Any, timeout_s: float | None = None,
              **kwargs: Any) -> Any:
        """Run `func(resource, *args, **kwargs)` in the child (`func` must be importable)."""
        with self._busy():
            return self._call_locked(func, args, kwargs, timeout_s)

    def revive(self) -> bool:
        """Start a new worker process if the current one is dead (True if one was started).
        It holds nothing yet; the next `load` fills it. Waits for a call in progress."""
        with self._lock:
            return self._revive_locked()

    def _revive_locked(self) -> bool:
        if self.alive:
            return False
        again = self.started
        if again:
            log.warning("resource %s: worker process is gone; starting a new one", self.name)
        else:
            log.info("resource %s: starting its worker process", self.name)
        self._spawn_locked()
        self.restarts += again
        return True

    def kill(self) -> None:
        """Kill the worker process now (fault injection, or a hung child)."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(5.0)

    def close(self) -> None:
        with self._lock:
            if self._process is None:
                return
            if self._start_deadline is not None:    # still starting: nothing to finish
                self._start_deadline = None
            elif self._process.is_alive():
                try:
                    self._conn.send(None)
                    self._process.join(10.0)
                except (OSError, EOFError):
                    pass
            self.kill()
            self._conn.close()
            self._process = None

    # -- the pipe --------------------------------------------------------------------------

    def _spawn(self, *, wait: bool = True) -> None:
        with self._lock:
            self._spawn_locked(wait=wait)

    def _spawn_locked(self, *, wait: bool = True) -> None:
        self.kill()
        if self._conn is not None:
            self._conn.close()
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(target=_child_main, args=(child, self.kind, self.options),
                                  name=f"csr-{self.name}", daemon=True)
        process.start()
        child.close()
        self._process, self._conn = process, parent
        self.started = True
        self._background = False
        self._threads_background = False
        if self._wanted[0]:
            try:        # its start (imports, weights) yields too; its threads inherit this
                os.setpriority(os.PRIO_PROCESS, process.pid, self.background_nice)
            except OSError:
                pass
        self._start_deadline = time.monotonic() + self.start_timeout_s
        if wait:
            self._finish_start_locked()

    def _finish_start_locked(self) -> None:
        """The worker's "ready", once per start: its facts, then the threads and priority
        asked for meanwhile."""
        if self._start_deadline is None:
            return
        deadline, self._start_deadline = self._start_deadline, None
        status, payload = self._receive(deadline, self.start_timeout_s, "start")
        if status != "ready":
            self.kill()
            raise _as_exception(payload)
        self._reported = {"max_context_tokens": payload["max_context_tokens"],
                          "state_mode": payload["state_mode"]}
        self.engine_choice = payload["engine_choice"]
        log.info("resource %s (%s) ready in worker process %d", self.name, self.kind,
                 self._process.pid)
        self._restore_wanted_locked()

    def _call_locked(self, path: str | Callable, args: tuple, kwargs: dict,
                     timeout_s: float | None, *,
                     on_text: Callable[[str], None] | None = None) -> Any:
        what = path if isinstance(path, str) else getattr(path, "__name__", "apply")
        self._finish_start_locked()
        if not self.alive:
            raise ResourceUnavailableError(self._dead_message(what))
        try:
            self._conn.send((path, args, kwargs))
        except (OSError, EOFError):
            raise ResourceUnavailableError(self._dead_message(what)) from None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stopped: BaseException | None = None        # what on_text raised
        while True:
            status, payload = self._receive(deadline, timeout_s, what)
            if status != "text":
                break
            if stopped is None:
                try:
                    on_text(payload)
                except BaseException as exc:
                    stopped = exc
                    try:
                        self._conn.send(_CANCEL)
                    except (OSError, EOFError):
                        pass            # a dead child: the next receive says so
        if stopped is not None:
            # the child stopped (QueryCancelledError), or finished before it read the cancel
            raise stopped
        if status == "ok":
            return payload
        raise _as_exception(payload)

    def _receive(self, deadline: float | None, timeout_s: float | None,
                 what: str) -> tuple[str, Any]:
        while True:
            wait_s = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
            try:
                if self._conn.poll(wait_s):
                    return self._conn.recv()
            except (OSError, EOFError):
                raise ResourceUnavailableError(self._dead_message(what)) from None
            if not self._process.is_alive() and not self._conn.poll(0):
                raise ResourceUnavailableError(self._dead_message(what))
            if deadline is not None and time.monotonic() >= deadline:
                self.kill()
                msg = (f"resource {self.name!r}: {what} did not answer within {timeout_s:.1f} s; "
                       "its worker process was killed")
                raise ResourceTimeoutError(msg)

    def _dead_message(self, what: str) -> str:
        if not self.started:
            return (f"resource {self.name!r}: its worker process has not started yet "
                    f"(during {what}); load() or revive() starts it")
        code = None if self._process is None else self._process.exitcode
        return (f"resource {self.name!r}: worker process "
                f"{None if self._process is None else self._process.pid} is not running "
                f"(exit code {code}) during {what}; load() starts a new one")

    def __repr__(self) -> str:
        return f"ProcessResource({self.kind!r}, name={self.name!r}, pid={self.pid})"


def start_side_by_side(names: Sequence[str], kind: str = "local",
                       **options) -> list[ProcessResource]:
    """One ProcessResource per name, started at once (their models load side by side); if one
    fails, the others are closed and its error is raised."""
    made: dict[str, ProcessResource] = {}
    errors: list[BaseException] = []

    def start(name: str) -> None:
        try:
            made[name] = ProcessResource(kind, name=name, **options)
        except BaseException as exc:
            errors.append(exc)

    starters = [threading.Thread(target=start, args=(name,)) for name in names]
    for thread in starters:
        thread.start()
    for thread in starters:
        thread.join()
    if errors:
        for resource in made.values():
            resource.close()
        raise errors[0]
    return [made[name] for name in names]


def start_in_turn(names: Sequence[str], kind: str = "local", *, wait: bool = True,
                  **options) -> list[ProcessResource]:
    """One ProcessResource per name: the first started (ready when this returns; with
    `wait=False` at its first call or `wait_started`), the others its `sibling`s, started by
    their first `load` or `revive`. A primary restored after a crash then starts alone: two
    model loads side by side on a small machine make both slower, and the robot waits for the
    first."""
    first = ProcessResource(kind, name=names[0], wait=wait, **options)
    return [first] + [first.sibling(name) for name in names[1:]]


def _child_main(conn, kind: str, options: dict) -> None:
    exit_with_parent()
    # A worker's output joins its parent's (a soak's live line, a node's log): a weight-loading
    # bar at every start and restart of a worker is noise there. Read when transformers loads.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    threads = options.get("threads")
    if threads:
        for variable in _THREAD_VARIABLES:
            os.environ[variable] = str(threads)
    try:
        from csr_ros.resources.factory import make_resource

        resource = make_resource(kind, **options)
        conn.send(("ready", {"max_context_tokens": resource.max_context_tokens,
                             "state_mode": resource.state_mode,
                             "engine_choice": getattr(resource, "engine_choice", None)}))
    except BaseException as exc:
        conn.send(("error", _portable(exc)))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        if message is None:
            break
        if message == _CANCEL:
            continue                    # it came after the streamed call it meant had ended
        path, args, kwargs = message
        if kwargs.get("on_text") == _STREAM:
            kwargs = {**kwargs, "on_text": _text_sender(conn)}
        try:
            if callable(path):
                result = path(resource, *args, **kwargs)
            else:
                target = resource
                for part in path.split("."):
                    target = getattr(target, part)
                result = target(*args, **kwargs) if callable(target) else target
        except BaseException as exc:
            result, exc_out = None, _portable(exc)
        else:
            exc_out = None
        if not _reply(conn, path, result, exc_out):
            break                       # the parent is gone: nobody waits for the answer
    try:
        resource.close()
    except Exception:
        pass


def _reply(conn, path, result: Any, exc: BaseException | None) -> bool:
    """Send a call's result (or its error) to the parent; False once the pipe is broken (the
    parent died while the call ran: its end is no error of this worker's)."""
    try:
        conn.send(("ok", result) if exc is None else ("error", exc))
    except (BrokenPipeError, ConnectionResetError):
        return False
    except Exception as pickling:   # pickling failed before anything was written
        return _reply(conn, path, None,
                      ResourceError(f"the result of {path} cannot be sent: {pickling}"))
    return True


def exit_with_parent(poll_s: float = 1.0) -> None:
    """A thread that ends this process once its parent is gone (a worker's end-of-file on its
    pipe would only be seen after the current computation, which may be a long prefill)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="csr-parent-watch", daemon=True).start()


def _text_sender(conn) -> Callable[[str], None]:
    """In the child: send each text so far to the parent; a cancel from it stops the decode."""
    def on_text(text: str) -> None:
        if conn.poll(0) and conn.recv() == _CANCEL:
            raise QueryCancelledError("the caller stopped following the answer")
        conn.send(("text", text))
    return on_text


def _thread_ids(pid: int) -> list[int]:
    """Every thread of process `pid` (on Linux niceness is per thread)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def _portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a ResourceError that describes it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return ResourceError(f"{type(exc).__name__}: {exc}")


def _as_exception(payload: Any) -> BaseException:
    return payload if isinstance(payload, BaseException) else ResourceError(str(payload))
