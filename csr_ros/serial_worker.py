"""One thread that runs submitted calls one at a time, in order, each behind a Future."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable


class SerialWorker:
    """Runs submitted calls one at a time, in order, on a daemon thread: a process that is
    stopped does not wait for a call to finish (a ThreadPoolExecutor's threads are joined at
    exit)."""

    def __init__(self, thread_name: str):
        self._queue: queue.Queue = queue.Queue()
        self._busy = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], object]) -> Future:
        """Queue `fn`; a future cancelled before it starts is skipped."""
        future: Future = Future()
        with self._lock:
            self._busy += 1
        self._queue.put((fn, future))
        return future

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._busy == 0

    @property
    def backlog(self) -> int:
        """Calls queued or running."""
        with self._lock:
            return self._busy

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:   # delivered to whoever waits on the future
                        future.set_exception(exc)
            finally:
                with self._lock:
                    self._busy -= 1

    def stop(self, *, cancel_queued: bool = False, timeout_s: float = 0.0) -> None:
        """No calls after those queued (`cancel_queued`: after the running one); the thread is
        waited for up to `timeout_s`, and left to finish its call on its own after that."""
        while cancel_queued:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1].cancel()
                with self._lock:
                    self._busy -= 1
        self._queue.put(None)
        if timeout_s > 0:
            self._thread.join(timeout_s)
