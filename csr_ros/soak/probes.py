"""What a process holds, read from /proc: resident memory, open file descriptors, threads; and
the straight line through a series (memory growth per robot-hour). Linux only."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class Usage:
    pid: int
    rss_mb: float
    fds: int
    threads: int


def usage(pid: int) -> Usage | None:
    """`pid`'s resident memory, open fds and threads; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rss_kb = threads = 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return Usage(pid=pid, rss_mb=rss_kb / 1024.0, fds=fds, threads=threads)


def tree_usage(pid: int) -> Usage | None:
    """`usage` of a process with its descendants summed (a server that forks workers)."""
    top = usage(pid)
    if top is None:
        return None
    rss_mb, fds, threads = top.rss_mb, top.fds, top.threads
    for child in _descendants(pid):
        u = usage(child)
        if u is not None:
            rss_mb, fds, threads = rss_mb + u.rss_mb, fds + u.fds, threads + u.threads
    return Usage(pid=pid, rss_mb=rss_mb, fds=fds, threads=threads)


def alive(pid: int | None, started: float | None = None) -> bool:
    """`pid` runs (and, given its start time in clock ticks, is still that process)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return False
    return started is None or float(fields[19]) == started


def start_ticks(pid: int) -> float | None:
    """When `pid` started, in clock ticks since boot (tells a process from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return float(stat[stat.rindex(")") + 2:].split()[19])


def log_sizes(path: Path) -> dict[str, int]:
    """A chunk log's bytes on disk: its segments and checkpoints (what retention bounds), its
    capsules, its archive."""
    out = {"log_bytes": 0, "capsule_bytes": 0, "archive_bytes": 0}
    key = {"capsules": "capsule_bytes", "archive": "archive_bytes"}
    try:
        entries = list(os.scandir(path))
    except OSError:
        return out
    for entry in entries:
        try:
            if entry.is_dir():
                for dirpath, _, files in os.walk(entry.path):
                    for name in files:
                        out[key.get(entry.name, "log_bytes")] += \
                            os.stat(os.path.join(dirpath, name)).st_size
            else:
                out["log_bytes"] += entry.stat().st_size
        except OSError:
            pass                 # removed while we looked
    return out


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys against xs; None for fewer than 3 points or no spread."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo += children.get(child, [])
    return out
