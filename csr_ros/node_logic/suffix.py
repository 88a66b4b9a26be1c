"""The dynamic suffix X_suffix: the current time and the latest 'instant' value of each
source with its age. Pure: the time comes in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping


@dataclass(frozen=True)
class InstantValue:
    source: str
    text: str            # rendered, e.g. "goal: data=kitchen"
    stamp_ns: int        # when it was received


def build_suffix(instant: Mapping[str, InstantValue], now_ns: int, *, stale_s: float,
                 origin_ns: int | None = None) -> str:
    """X_suffix: the current time, then each fresh instant value with its age, by source name.

    With the episode's origin known (the time the chunks count their seconds from), the time
    is said as the chunks say it (`now: 125s`), so "how long ago" is a subtraction the model
    can read off the prompt; otherwise as UTC. Never as a nanosecond integer."""
    if origin_ns is not None:
        lines = [f"now: {max(0, (now_ns - origin_ns) // 1_000_000_000)}s"]
    else:
        now = datetime.fromtimestamp(now_ns / 1e9, tz=timezone.utc)
        lines = [f"now: utc={now.strftime('%Y-%m-%dT%H:%M:%S')}Z"]
    for source in sorted(instant):
        value = instant[source]
        age_s = (now_ns - value.stamp_ns) / 1e9
        if age_s <= stale_s:
            lines.append(f"{value.text.strip()} age_s={max(0.0, age_s):.1f}")
    return "\n".join(lines)
