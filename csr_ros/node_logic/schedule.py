"""When the policy queries: periodic ticks at rate_hz and on-demand queries (the Query
service, the Decide action) share one slot; a query never starts while one runs, skipped ticks
are counted, and neither kind starves the other. Pure: times come in."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from csr_ros.errors import ConfigError


PERIODIC = "periodic"        # what `QueryScheduler.grant` returns for an owed periodic query
MAX_WAITING_QUERIES = 32     # on-demand queries that may wait at once; more are refused


@dataclass
class QueryScheduler:
    """Periodic queries at `rate_hz` and on-demand ones (the Query service, the Decide action)
    through one slot: a query never starts while another runs.

    - A tick while a periodic query runs is skipped and counted (`skipped`).
    - On-demand queries wait in arrival order (`enqueue`) and take the free slot (`grant`)
      when no periodic query is owed.
    - A tick while an on-demand query runs is owed (`deferred`): when that query ends, the
      periodic one goes first. On-demand queries coming back to back so take at most every
      other turn and the periodic decisions go on, and a periodic query that is always due
      still lets the waiting ones in after it: neither starves the other.
    """

    rate_hz: float
    running: bool = False
    ticks: int = 0
    started: int = 0
    skipped: int = 0
    deferred: int = 0            # ticks owed to the end of an on-demand query
    finished: int = 0
    failed: int = 0
    owed: bool = False           # a periodic query goes next
    running_key: int | None = None   # the on-demand query that runs (None: a periodic one)
    waiting: deque = field(default_factory=deque)   # keys of on-demand queries, oldest first
    _next_key: int = 0

    def __post_init__(self):
        if not self.rate_hz > 0:
            raise ConfigError(f"rate_hz must be > 0, got {self.rate_hz}")

    @property
    def period_s(self) -> float:
        return 1.0 / self.rate_hz

    def tick(self) -> bool:
        """A timer tick: True if a periodic query starts now."""
        self.ticks += 1
        if self.running:
            if self.running_key is not None and not self.owed:
                self.owed = True
                self.deferred += 1
            else:
                self.skipped += 1
            return False
        return self.try_start()

    def try_start(self) -> bool:
        """Take the free slot for a periodic query."""
        if self.running:
            return False
        self.running, self.running_key = True, None
        self.started += 1
        return True

    @property
    def full(self) -> bool:
        """As many on-demand queries wait as may: refuse the next one."""
        return len(self.waiting) >= MAX_WAITING_QUERIES

    def enqueue(self) -> int:
        """An on-demand query arrives: its key, to wait for `grant` to return it."""
        assert not self.full, "enqueue() on a full queue"
        key = self._next_key
        self._next_key += 1
        self.waiting.append(key)
        return key

    def withdraw(self, key: int) -> bool:
        """A waiting on-demand query gives up (cancelled, timed out); False if not waiting."""
        if key not in self.waiting:
            return False
        self.waiting.remove(key)
        return True

    def ahead_of(self, key: int) -> int:
        """Queries that start before the waiting query `key` (the running one included)."""
        return int(self.running) + int(self.owed) + list(self.waiting).index(key)

    def grant(self) -> int | str | None:
        """Who takes the slot now that it may be free: PERIODIC (an owed tick), the key of the
        oldest waiting on-demand query, or None (the slot is busy, or nothing waits)."""
        if self.running:
            return None
        if self.owed:
            self.owed = False
            self.try_start()
            return PERIODIC
        if self.waiting:
            self.running, self.running_key = True, self.waiting.popleft()
            self.started += 1
            return self.running_key
        return None

    def finish(self, *, ok: bool) -> None:
        assert self.running, "finish() without a running query"
        self.running, self.running_key = False, None
        self.finished += 1
        self.failed += not ok
