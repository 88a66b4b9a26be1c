"""After a soak: every chunk the aggregator sent against every chunk record the reconciler's log
holds, archived segments included, seq by seq and text by text. Streams one segment at a time,
so a robot-day costs the memory of one segment.

A sent chunk is found (its text, as the state's chunk policy keeps it), refused (malformed
input a placeholder stands for, or truncated: expected only where malformed input was sent),
lost (a placeholder for a seq the aggregator no longer had, or no record at all), duplicated
(a seq logged twice), or out of order; a record whose text matches nothing sent is corrupt.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from csr_ros.chunklog import ChunkRecord, VersionRecord, scan
from csr_ros.chunklog.logdir import ARCHIVE, segment_files, segment_number
from csr_ros.soak.traffic import read_sent, text_crc

_REFUSED = re.compile(r"\[chunk \d+ refused\]$")
_LOST = re.compile(r"^\[chunk \d+ lost\]$")
_TRUNCATED = "…[truncated"


@dataclass
class Audit:
    sent: int = 0
    logged: int = 0                # chunk records in the log (archive included)
    found: int = 0
    refused: int = 0               # malformed input a placeholder (or a truncation) stands for
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    corrupt: int = 0
    unexpected_refusals: int = 0   # a placeholder where well-formed input was sent
    versions: int = 0
    versions_in_order: bool = True
    segments: int = 0
    archived_segments: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.reordered or self.corrupt
                    or self.unexpected_refusals) and self.versions_in_order

    def note(self, text: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(text)


def audit_log(log_path: Path, sent_path: Path) -> Audit:
    out = Audit()
    sent = read_sent(sent_path)
    expected = 0                   # the next seq the log should hold
    last_version = -1
    pending: tuple[int, int, bool] | None = None
    skipped: dict[int, tuple[int, bool]] = {}   # seq -> (crc, malformed) not logged in order
    for record in _all_records(log_path, out):
        if isinstance(record, VersionRecord):
            out.versions += 1
            if record.version <= last_version:
                out.versions_in_order = False
                out.note(f"version {record.version} after {last_version}")
            last_version = int(record.version)
            continue
        if not isinstance(record, ChunkRecord):
            continue
        out.logged += 1
        seq = int(record.seq)
        if seq < expected:
            if seq not in skipped:
                out.duplicated += 1
                out.note(f"seq {seq} logged again after {expected - 1}")
                continue
            out.reordered += 1         # missing until now: out of order, not lost
            out.lost -= 1
            out.note(f"seq {seq} logged after {expected - 1}")
            crc, malformed = skipped.pop(seq)
            _judge(out, seq, record.text, crc, malformed)
            continue
        while expected < seq:          # seqs that have not reached the log (yet)
            pending = next(sent, None)
            if pending is None:
                break
            out.sent += 1
            out.lost += 1
            skipped[expected] = pending[1:]
            out.note(f"seq {expected} missing before {seq}")
            expected += 1
        pending = next(sent, None)
        if pending is None:
            out.corrupt += 1
            out.note(f"seq {seq} logged but never sent")
            continue
        out.sent += 1
        _, crc, malformed = pending
        _judge(out, seq, record.text, crc, malformed)
        expected = seq + 1
    for _ in sent:                     # sent after the last logged one
        out.sent += 1
        out.lost += 1
        if out.lost <= 3:
            out.note(f"seq {expected} sent, never logged")
        expected += 1
    return out


def _judge(out: Audit, seq: int, text: str, crc: int, malformed: bool) -> None:
    if text_crc(text) == crc:
        out.found += 1
    elif _LOST.match(text.strip()):
        out.lost += 1
        out.note(f"seq {seq} lost: {text.strip()}")
    elif _REFUSED.search(text.strip()) or _TRUNCATED in text:
        out.refused += 1
        if not malformed:
            out.unexpected_refusals += 1
            out.note(f"seq {seq} refused though well formed: {text.strip()[:80]}")
    else:
        out.corrupt += 1
        out.note(f"seq {seq} text differs from what was sent: {text.strip()[:80]}")


def _all_records(log_path: Path, out: Audit) -> Iterator:
    """Archived segments, then the log's own, in segment order (a gap is a note, not an
    error: a segment that held no chunk may be missing from neither)."""
    archive = log_path / ARCHIVE
    files: list[tuple[int, Path]] = []
    if archive.is_dir():
        for path in archive.iterdir():
            number = segment_number(path.name[:-3] if path.name.endswith(".gz") else path.name)
            if number is not None:
                files.append((number, path))
    out.archived_segments = len(files)
    for path in segment_files(log_path):
        files.append((segment_number(path.name), path))
    files.sort()
    out.segments = len(files)
    for _, path in files:
        data = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") \
            else path.read_bytes()
        records, _, torn = scan(data, where=str(path))
        if torn:
            out.note(f"{path.name}: {torn}")
        yield from records
