"""The one deadline poll: ask a condition until it holds or the time is up."""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float | None, *,
               interval_s: float = 0.1, stop: threading.Event | None = None,
               timeout_error: Exception | None = None,
               sleep: Callable[[float], object] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> T | None:
    """`condition()`'s first truthy value, asked at once and then every `interval_s`.

    The time is up after `timeout_s` (None: never) or when `stop` is set: then None, or
    `timeout_error` raised when one is given. The condition is always asked once more at the
    deadline, and may raise to end the wait early (a process that died). `sleep` and `clock`
    are for a caller that waits on its own condition variable or clock."""
    deadline = None if timeout_s is None else clock() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        left_s = None if deadline is None else deadline - clock()
        if (left_s is not None and left_s <= 0) or (stop is not None and stop.is_set()):
            if timeout_error is not None:
                raise timeout_error
            return None
        pause_s = interval_s if left_s is None else min(interval_s, left_s)
        if stop is not None:
            stop.wait(pause_s)
        else:
            sleep(pause_s)
