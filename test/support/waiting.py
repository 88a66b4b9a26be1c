"""Waiting without fixed sleeps: a condition polled until it holds or a deadline passes."""

from __future__ import annotations

import time


def wait_for(condition, timeout_s: float = 30.0, what: str = "condition",
             every_s: float = 0.05, context=None):
    """The first truthy value of `condition()`, polled every `every_s`; an AssertionError
    naming `what` after `timeout_s`, followed by `context()` where given (the end of the log
    of the process that did not answer, so a failure in CI shows its side too)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    message = f"timed out after {timeout_s} s waiting for {what}"
    if context is not None:
        message += f"\n{context()}"
    raise AssertionError(message)
