"""`Coalescer`: a per-key minimum period; a value inside the period is held and a newer one
replaces it (counted, never silently); the newest value goes out when the period elapses.

Pure: no rclpy, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from csr_ros.errors import ConfigError


# -- rate limiting ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Emission:
    key: str
    value: Any
    now_ns: int          # when it was let through
    n_coalesced: int     # older values it replaced while held (0: nothing was superseded)


@dataclass
class _Slot:
    period_ns: int
    last_emit_ns: int | None = None
    pending: Any = None
    has_pending: bool = False
    n_superseded: int = 0


class Coalescer:
    """Per-key minimum period; holds the newest value inside the period, emits it when due.

        e = c.offer("scan", msg, now_ns)   # Emission now, or None (held)
        for e in c.poll(now_ns): ...       # held values whose period has elapsed
    """

    def __init__(self, periods_s: Mapping[str, float] | None = None, default_period_s: float = 0.0):
        for key, period in {"default": default_period_s, **(periods_s or {})}.items():
            if not period >= 0:
                raise ConfigError(f"min period of {key!r} must be >= 0 s, got {period}")
        self._default_ns = int(default_period_s * 1e9)
        self._slots = {k: _Slot(int(p * 1e9)) for k, p in (periods_s or {}).items()}
        self.n_superseded_total = 0

    def _slot(self, key: str) -> _Slot:
        if key not in self._slots:
            self._slots[key] = _Slot(self._default_ns)
        return self._slots[key]

    def offer(self, key: str, value: Any, now_ns: int) -> Emission | None:
        slot = self._slot(key)
        if slot.last_emit_ns is None or now_ns - slot.last_emit_ns >= slot.period_ns:
            n = slot.n_superseded + (1 if slot.has_pending else 0)
            if slot.has_pending:
                self.n_superseded_total += 1
            return self._emit(key, slot, value, now_ns, n)
        if slot.has_pending:
            slot.n_superseded += 1
            self.n_superseded_total += 1
        slot.pending, slot.has_pending = value, True
        return None

    def poll(self, now_ns: int) -> list[Emission]:
        due = []
        for key, slot in self._slots.items():
            if slot.has_pending and now_ns - slot.last_emit_ns >= slot.period_ns:
                due.append(self._emit(key, slot, slot.pending, now_ns, slot.n_superseded))
        return due

    def flush(self, now_ns: int) -> list[Emission]:
        """Everything held, now (on shutdown)."""
        return [self._emit(key, slot, slot.pending, now_ns, slot.n_superseded)
                for key, slot in self._slots.items() if slot.has_pending]

    def next_due_ns(self) -> int | None:
        times = [s.last_emit_ns + s.period_ns for s in self._slots.values() if s.has_pending]
        return min(times) if times else None

    @property
    def n_pending(self) -> int:
        return sum(s.has_pending for s in self._slots.values())

    @staticmethod
    def _emit(key: str, slot: _Slot, value: Any, now_ns: int, n: int) -> Emission:
        slot.last_emit_ns, slot.pending = now_ns, None
        slot.has_pending, slot.n_superseded = False, 0
        return Emission(key=key, value=value, now_ns=now_ns, n_coalesced=n)

