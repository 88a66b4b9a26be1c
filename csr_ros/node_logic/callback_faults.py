"""Exceptions caught in a node's callbacks: what to log, and what /diagnostics says.

A timer, subscription or service callback that raises would end rclpy's spin, and with it the
process, usually without a word a robot's operator sees. The nodes catch it where they can go
on (`csr_ros.nodes.managed.GuardedCallbacks`) and hand it here:

    CallbackFaults.record(where, error, now_s) → 'traceback' (the first of its kind: log it in
                                                 full), 'line' (a one-line reminder with the
                                                 count, at most every THROTTLE_S) or None
    CallbackFaults.status(now_s)               → the ERROR message of /diagnostics, with the
                                                 exception, while the latest one is younger
                                                 than HOLD_S

Pure: no rclpy, no clocks (times come in).
"""

from __future__ import annotations

from dataclasses import dataclass

THROTTLE_S = 10.0      # a repeating fault is logged at most this often after its traceback
HOLD_S = 30.0          # /diagnostics stays ERROR this long after the latest fault


@dataclass
class Fault:
    """One callback's faults of one exception type."""

    where: str                 # the callback, e.g. 'tick_callback'
    error: str                 # the latest exception, 'ValueError: ...'
    count: int = 0
    last_s: float = 0.0
    said_s: float = float("-inf")     # when it was last logged


class CallbackFaults:
    """Every exception a node's callbacks raised, by callback and exception type."""

    def __init__(self, *, throttle_s: float = THROTTLE_S, hold_s: float = HOLD_S):
        self.throttle_s = throttle_s
        self.hold_s = hold_s
        self.faults: dict[tuple[str, str], Fault] = {}
        self.latest: Fault | None = None

    @property
    def total(self) -> int:
        return sum(f.count for f in self.faults.values())

    def record(self, where: str, error: str, now_s: float) -> str | None:
        """A callback raised `error` ('Type: message'): 'traceback' when this callback has not
        raised this type before, 'line' when a reminder is due, else None."""
        kind = error.split(":", 1)[0]
        fault = self.faults.get((where, kind))
        first = fault is None
        if first:
            fault = self.faults[(where, kind)] = Fault(where, error)
        fault.error, fault.count, fault.last_s = error, fault.count + 1, now_s
        self.latest = fault
        if first:
            fault.said_s = now_s
            return "traceback"
        if now_s - fault.said_s >= self.throttle_s:
            fault.said_s = now_s
            return "line"
        return None

    def line(self, where: str, error: str) -> str:
        """The reminder of a repeating fault, with its count."""
        fault = self.faults[(where, error.split(":", 1)[0])]
        return f"{where} raised again ({fault.count} times so far): {fault.error}"

    def status(self, now_s: float) -> str | None:
        """The ERROR message for /diagnostics while the latest fault is younger than
        `hold_s`; else None (the counts stay in `values` whatever the age)."""
        if self.latest is None or now_s - self.latest.last_s > self.hold_s:
            return None
        ago_s = now_s - self.latest.last_s
        return (f"{self.latest.where} raised {self.latest.error} ({self.latest.count} times, "
                f"the latest {ago_s:.0f} s ago); the node goes on")

    def values(self) -> list[tuple[str, str]]:
        if not self.faults:
            return []
        out = [("callback_errors", str(self.total))]
        if self.latest is not None:
            out.append(("last_callback_error", f"{self.latest.where}: {self.latest.error}"))
        return out
