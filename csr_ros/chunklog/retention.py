"""Retention: which old segments leave a chunk log, and moving them out (archive or delete).

The choice is pure (`plan_retention`): a run of the oldest segments, each below the protected
segment and over the size budget or the age limit. A segment is never dropped from the middle,
so what is left is always one unbroken stretch of the history.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from csr_ros.chunklog.logdir import ARCHIVE, ARCHIVE_TMP, fsync_dir, segment_name
from csr_ros.errors import ConfigError

log = logging.getLogger("csr_ros.chunklog")

ACTIONS = ("archive", "delete")


@dataclass(frozen=True)
class Retention:
    """How much history a chunk log keeps on disk.

    `retain_bytes`: the segments' total size to stay under; `retain_s`: drop segments last
    written longer ago than this (by the log's clock, wall time). Either may be None (no limit).
    `action`: "archive" moves a dropped segment into `<log>/archive/` (gzip-compressed with
    `compress`, level 1: a size-rotated segment of 16 MiB takes a fraction of a second, inside
    the append that rotated), "delete" removes it. `keep_state`: never drop a segment that the
    state folded from this log still needs (a reconciler's log); False for a log that is only
    history and writes no versions (the aggregator's: late joiners get what is left).
    """

    retain_bytes: int | None = None
    retain_s: float | None = None
    action: str = "archive"
    compress: bool = False
    keep_state: bool = True

    def __post_init__(self):
        if self.retain_bytes is not None and self.retain_bytes < 0:
            raise ConfigError(f"retain_bytes must be >= 0 or None, got {self.retain_bytes}")
        if self.retain_s is not None and self.retain_s < 0:
            raise ConfigError(f"retain_s must be >= 0 or None, got {self.retain_s}")
        if self.action not in ACTIONS:
            raise ConfigError(f"retention action must be one of {ACTIONS}, got {self.action!r}")
        if self.compress and self.action != "archive":
            raise ConfigError("compress applies to archived segments: set action='archive'")


@dataclass(frozen=True)
class SegmentFile:
    number: int
    n_bytes: int
    mtime_s: float             # last written (wall clock)


def plan_retention(segments: list[SegmentFile], protect_from: int, now_s: float,
                   retention: Retention) -> list[SegmentFile]:
    """The oldest segments to drop: from the oldest on, each numbered below `protect_from` and
    either past the size budget (counting every segment) or older than `retain_s`."""
    total = sum(s.n_bytes for s in segments)
    drop = []
    for segment in sorted(segments, key=lambda s: s.number):
        if segment.number >= protect_from:
            break
        over_size = retention.retain_bytes is not None and total > retention.retain_bytes
        too_old = retention.retain_s is not None and now_s - segment.mtime_s > retention.retain_s
        if not (over_size or too_old):
            break
        drop.append(segment)
        total -= segment.n_bytes
    return drop


def drop_segments(directory: Path, segments: list[SegmentFile],
                  retention: Retention) -> list[SegmentFile]:
    """Archive or delete `segments` in order; returns those done. Stops at the first that
    fails (logged: retried at the next rotation); a segment is never half gone: an archived copy
    is complete and durable before the segment is removed."""
    done = []
    for segment in segments:
        source = directory / segment_name(segment.number)
        try:
            if retention.action == "archive":
                _archive(directory, source, compress=retention.compress)
            else:
                source.unlink()
        except OSError as exc:
            log.warning("%s: retention could not %s it (%s); it stays and is retried at the "
                        "next rotation", source, retention.action, exc)
            break
        done.append(segment)
    if done:
        fsync_dir(directory)
    return done


def _archive(directory: Path, source: Path, *, compress: bool) -> None:
    """Move `source` into the archive: a rename, or a compressed copy made durable before the
    segment is removed (a crash in between leaves both; the next run archives it again)."""
    archive = directory / ARCHIVE
    archive.mkdir(exist_ok=True)
    if not compress:
        os.replace(source, archive / source.name)
        fsync_dir(archive)
        return
    target = archive / (source.name + ".gz")
    tmp = archive / ARCHIVE_TMP
    try:
        with open(source, "rb") as src, gzip.open(tmp, "wb", compresslevel=1) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(archive)
    source.unlink()
