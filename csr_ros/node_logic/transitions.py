"""Where a managed (lifecycle) node stands, for /diagnostics: its state, and the transition that
failed last with the reason, until a later one succeeds.

    record = TransitionRecord()
    record.failed("configure", "unconfigured", "policy: rate_hz must be > 0, got 0.0")
    record.level_message()   # (ERROR, 'configure failed: policy: rate_hz must be > 0, got 0.0
                             #  (the node is unconfigured)')

Pure: no rclpy.
"""

from __future__ import annotations

from dataclasses import dataclass

from csr_ros.node_logic.health import ERROR, WARN

# what each state means for a monitor (the active node reports on its own work)
_IDLE = {"unconfigured": "unconfigured: waiting for a configure transition",
         "inactive": "inactive: configured, not working (activate it)",
         "finalized": "finalized: shut down, does nothing"}


@dataclass
class TransitionRecord:
    state: str = "unconfigured"
    failed_transition: str = ""
    reason: str = ""
    transitions: int = 0

    def succeeded(self, transition: str, state: str) -> None:
        self.state, self.transitions = state, self.transitions + 1
        self.failed_transition, self.reason = "", ""

    def failed(self, transition: str, state: str, reason: str) -> None:
        """`transition` did not complete; the node is now in `state`."""
        self.state, self.transitions = state, self.transitions + 1
        self.failed_transition, self.reason = transition, reason

    def level_message(self) -> tuple[int, str] | None:
        """ERROR with the reason while the last transition failed; WARN while the node is not
        active; None while it is active (its own status then says how it works)."""
        if self.failed_transition:
            return ERROR, (f"{self.failed_transition} failed: {self.reason} (the node is "
                           f"{self.state})")
        if self.state == "active":
            return None
        return WARN, _IDLE.get(self.state, self.state)

    def values(self) -> list[tuple[str, str]]:
        out = [("lifecycle_state", self.state)]
        if self.failed_transition:
            out += [("failed_transition", self.failed_transition),
                    ("failed_reason", self.reason)]
        return out

