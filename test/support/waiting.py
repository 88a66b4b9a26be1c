"""Waiting without fixed sleeps: a condition polled until it holds or a deadline passes."""

from __future__ import annotations

import time


def wait_for(condition, timeout_s: float = 30.0, what: str = "condition",
             every_s: float = 0.05):
    """The first truthy value of `condition()`, polled every `every_s`; an AssertionError
    naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
