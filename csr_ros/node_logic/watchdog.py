"""The policy's decision watchdog: when the controller must be told to hold a safe action.

A controller that keeps executing the last action cannot tell on its own that the policy has
stopped deciding (the server died or stalls, every answer is invalid or over the token budget,
the context is full, an operator deactivated the node). The watchdog watches the decisions and
says when to publish the configured safe action (e.g. `wait()`), once, with the cause:

    INACTIVE ──Activated──▶ WATCHING ──Tick: no valid decision for stale_after_s──▶ SAFE
        ▲                      ▲  │                  Failed(overflow): at once ─────▶ SAFE
        │                      │  └─Decided(valid)─┐                                  │
        │                      └───────────────────┴────────Decided(valid)────────────┘
        └──Deactivated (from WATCHING or SAFE): the safe action at once, unless it holds already

- The stale clock runs from the latest valid decision, or from the activation if none came
  since. It is checked at every tick (the node ticks at rate_hz), so the safe action comes at
  the first tick past stale_after_s: its cause says the age at that tick and at the one
  before, which was still under stale_after_s. A decision that is not a valid action (unparsable, incomplete within the budget,
  expired before it was made) and a failed query do not reset it; they are counted and the
  latest is named as the cause.
- The safe action is published once per episode: while it holds (nothing valid was published
  after it), going stale again, a context overflow or a deactivation only update the cause.
- A valid decision ends the episode: the status clears and the node says so once.
- Without a safe action configured the watchdog still says when decisions went stale (log and
  /diagnostics); it only has nothing to publish.

    machine = DecisionWatchdog(WatchdogConfig(stale_after_s=3.0, safe_action="wait()"))
    commands = machine.handle(Activated(now_s=0.0))
    commands = machine.handle(Tick(now_s=3.5))   # → [GoSafe(cause='no valid decision ...')]

Pure: no rclpy, no clocks (times arrive in events as `now_s`, monotonic seconds).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from csr_ros.errors import ConfigError


@dataclass(frozen=True)
class WatchdogConfig:
    stale_after_s: float
    safe_action: str = ""          # '' = none: the watchdog only reports

    def __post_init__(self):
        if not self.stale_after_s > 0:
            raise ConfigError(f"stale_after_s must be > 0, got {self.stale_after_s}")


class Mode(enum.Enum):
    INACTIVE = "inactive"
    WATCHING = "watching"
    SAFE = "safe"


# -- events -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Activated:
    now_s: float


@dataclass(frozen=True)
class Deactivated:
    now_s: float


@dataclass(frozen=True)
class Decided:
    """A decision was made: `valid` when its action was published for the controller."""

    now_s: float
    valid: bool
    error: str = ""                # why not valid


@dataclass(frozen=True)
class Failed:
    """A query failed; `overflow`: the context would overflow (no later query can fit)."""

    now_s: float
    error: str
    overflow: bool = False


@dataclass(frozen=True)
class Tick:
    """Time passes. `waiting`: what the node knows about why nothing finished, e.g. 'a query
    has run for 4.1 s' or 'the reconciler is loading its models' ('' = nothing)."""

    now_s: float
    waiting: str = ""


Event = Union[Activated, Deactivated, Decided, Failed, Tick]


# -- commands ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class GoSafe:
    """Publish the safe action now (when one is configured) and warn with `cause`."""

    cause: str


@dataclass(frozen=True)
class Resumed:
    """Valid decisions came back after `after_s` in safe mode: say it once (info)."""

    after_s: float


Command = Union[GoSafe, Resumed]


@dataclass(frozen=True)
class WatchdogStatus:
    stale: bool                    # no valid decision for stale_after_s (or overflow, inactive)
    message: str                   # for /diagnostics ('' when all is well)
    values: tuple[tuple[str, str], ...]


class DecisionWatchdog:
    """Events in (`handle`), commands out; `status()` for /diagnostics."""

    def __init__(self, config: WatchdogConfig):
        self.config = config
        self.mode = Mode.INACTIVE
        self.holding = False            # the safe action is the last thing on csr/actions
        self.since_s = 0.0              # start of the stale clock
        self.checked_s: float | None = None   # the latest tick while watching
        self.safe_since_s: float | None = None
        self.cause = ""
        self.failed = 0                 # since the latest valid decision
        self.invalid = 0
        self.last_problem = ""
        self.episodes = 0               # times the safe action was called for
        self.published = 0              # ... and published

    def reconfigure(self, config: WatchdogConfig) -> None:
        """New stale_after_s or safe_action (a parameter set at run time): from the next tick."""
        self.config = config

    def handle(self, event: Event) -> list[Command]:
        if isinstance(event, Activated):
            self.mode, self.since_s = Mode.WATCHING, event.now_s
            self._reset_counts()
            return []
        if isinstance(event, Deactivated):
            was_active = self.mode is not Mode.INACTIVE
            self.mode = Mode.INACTIVE
            if not was_active:
                return []
            return self._go_safe(event.now_s, "the policy was deactivated: it decides nothing "
                                 "until it is activated again")
        if isinstance(event, Decided):
            if self.mode is Mode.INACTIVE:
                return []                    # an answer that arrived after deactivation
            if not event.valid:
                self.invalid += 1
                self.last_problem = f"not a valid action: {event.error}"
                return []
            return self._valid(event.now_s)
        if isinstance(event, Failed):
            if self.mode is Mode.INACTIVE:
                return []
            self.failed += 1
            self.last_problem = f"query failed: {event.error}"
            if event.overflow:
                return self._go_safe(event.now_s, f"the context would overflow: {event.error}")
            return []
        if isinstance(event, Tick):
            if self.mode is not Mode.WATCHING:
                return []
            before_s = None if self.checked_s is None or self.checked_s < self.since_s else \
                self.checked_s - self.since_s
            self.checked_s = event.now_s
            stale_s = event.now_s - self.since_s
            if stale_s < self.config.stale_after_s:
                return []
            return self._go_safe(event.now_s, self._stale_cause(stale_s, before_s,
                                                                event.waiting))
        raise AssertionError(f"unknown watchdog event {event!r}")

    def status(self, now_s: float) -> WatchdogStatus:
        values = (("stale_after_s", f"{self.config.stale_after_s:g}"),
                  ("safe_action", self.config.safe_action or "-"),
                  ("safe_action_holds", str(self.holding).lower()),
                  ("safe_actions_published", str(self.published)),
                  ("stale_episodes", str(self.episodes)))
        if self.safe_since_s is None:      # no episode: all is well, or never activated
            return WatchdogStatus(self.mode is Mode.INACTIVE, "", values)
        if self.mode is Mode.WATCHING and not self.holding:
            return WatchdogStatus(False, "", values)
        what = (f"safe action {self.config.safe_action} holds" if self.holding else
                "no safe_action is set: nothing was published" if not self.config.safe_action
                else f"safe action {self.config.safe_action} was published")
        ago_s = now_s - (self.safe_since_s if self.safe_since_s is not None else now_s)
        return WatchdogStatus(True, f"{what} since {ago_s:.1f} s: {self.cause}", values)

    # -- transitions ------------------------------------------------------------------------

    def _valid(self, now_s: float) -> list[Command]:
        was_safe = self.mode is Mode.SAFE or self.holding
        after_s = now_s - self.safe_since_s if self.safe_since_s is not None else 0.0
        self.mode, self.since_s, self.holding = Mode.WATCHING, now_s, False
        self.safe_since_s, self.cause = None, ""
        self._reset_counts()
        return [Resumed(after_s=after_s)] if was_safe else []

    def _go_safe(self, now_s: float, cause: str) -> list[Command]:
        if self.mode is not Mode.INACTIVE:
            self.mode = Mode.SAFE
        self.cause = cause
        if self.holding:
            return []                        # said once per episode; the cause is updated
        self.episodes += 1
        self.safe_since_s = now_s
        self.holding = bool(self.config.safe_action)
        self.published += self.holding
        return [GoSafe(cause=cause)]

    def _stale_cause(self, stale_s: float, before_s: float | None, waiting: str) -> str:
        checked = "" if before_s is None else f"; {before_s:.2f} s at the check before"
        msg = (f"no valid decision for {stale_s:.2f} s (stale_after_s "
               f"{self.config.stale_after_s:g}{checked})")
        counts = []
        if self.failed:
            counts.append(f"{self.failed} failed " + ("query" if self.failed == 1 else "queries"))
        if self.invalid:
            counts.append(f"{self.invalid} " + ("answer that was not a valid action"
                                                if self.invalid == 1 else
                                                "answers that were not valid actions"))
        if counts:
            return f"{msg}: {' and '.join(counts)}, the latest {self.last_problem}"
        return f"{msg}: no decision finished" + (f" ({waiting})" if waiting else "")

    def _reset_counts(self) -> None:
        self.failed, self.invalid, self.last_problem = 0, 0, ""
