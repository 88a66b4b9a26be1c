"""The log directory: file names, checkpoint files, migration, and reading what a restart needs.

See the package docstring for the layout. Everything that touches more than one file of the
log lives here, except appending (`writer`) and dropping old segments (`retention`).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from csr_ros.chunklog.records import (MAGIC, ChunkRecord, Checkpoint, Record, StreamRecord,
                                      VersionRecord, scan)
from csr_ros.errors import ChunkLogError
from csr_ros.state import Version

log = logging.getLogger("csr_ros.chunklog")

SEGMENT_SUFFIX = ".seg"
CHECKPOINT = "CHECKPOINT"
CHECKPOINT_PREV = "CHECKPOINT.prev"
LOCK = "LOCK"
ARCHIVE = "archive"
CAPSULES = "capsules"
CAPSULE_PREFIX = "capsule-"
ARCHIVE_TMP = ".writing.tmp"
MIGRATING_SUFFIX = ".migrating"
CHECKPOINT_FORMAT = "csr-chunklog-checkpoint/1"
TMP_SUFFIX = ".tmp"


def segment_name(number: int) -> str:
    return f"{number:012d}{SEGMENT_SUFFIX}"


def segment_number(name: str) -> int | None:
    stem = name[:-len(SEGMENT_SUFFIX)] if name.endswith(SEGMENT_SUFFIX) else ""
    return int(stem) if stem.isdigit() else None


def list_segments(directory: Path) -> list[int]:
    """The segment numbers in `directory`, oldest first (one directory listing)."""
    numbers = []
    with os.scandir(directory) as entries:
        for entry in entries:
            number = segment_number(entry.name)
            if number is not None:
                numbers.append(number)
    return sorted(numbers)


def segment_files(path: str | Path) -> list[Path]:
    """The segment files of the log at `path`, oldest first (a single-file log: the file)."""
    path = readable_path(Path(path))
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"no chunk log at {path}")
    return [path / segment_name(n) for n in list_segments(path)]


def readable_path(path: Path) -> Path:
    """`path`, or the directory of a migration a crash interrupted (see `migrate_file`)."""
    migrating = path.with_name(path.name + MIGRATING_SUFFIX)
    if not path.exists() and migrating.is_dir():
        return migrating
    return path


# -- durable file operations --------------------------------------------------------------------

def fsync_dir(directory: Path) -> None:
    """Make renames, creations and removals in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- checkpoint files -----------------------------------------------------------------------------

def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    body = {"format": CHECKPOINT_FORMAT, **asdict(checkpoint)}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"crc32": zlib.crc32(text.encode("utf-8")), "body": body},
                      sort_keys=True, indent=1).encode("utf-8") + b"\n"


def decode_checkpoint(data: bytes, where: str) -> Checkpoint:
    try:
        outer = json.loads(data.decode("utf-8"))
        body = outer["body"]
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if zlib.crc32(text.encode("utf-8")) != outer["crc32"]:
            raise ChunkLogError(f"{where} fails its checksum")
        if body.pop("format") != CHECKPOINT_FORMAT:
            raise ChunkLogError(f"{where} is not a chunk log checkpoint")
        checkpoint = Checkpoint(**body)
    except ChunkLogError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ChunkLogError(f"{where} is not a valid checkpoint: {exc}") from None
    if not (0 <= checkpoint.first_seq <= checkpoint.next_seq and
            0 <= checkpoint.keep_segment <= checkpoint.tail_segment and
            checkpoint.tail_offset >= len(MAGIC)):
        raise ChunkLogError(f"{where} is not a valid checkpoint: inconsistent {checkpoint}")
    return checkpoint


def load_checkpoints(directory: Path) -> dict[str, Checkpoint]:
    """The usable checkpoints by file name, newest first: CHECKPOINT, then CHECKPOINT.prev.

    A damaged one is skipped with a warning (the other, or a full read, still gives the state);
    a missing CHECKPOINT next to a CHECKPOINT.prev is a crash between the two renames.
    """
    found = {}
    for name in (CHECKPOINT, CHECKPOINT_PREV):
        path = directory / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        try:
            found[name] = decode_checkpoint(data, str(path))
        except ChunkLogError as exc:
            log.warning("%s; the restart uses the checkpoint before it or reads more segments",
                        exc)
    return found


def write_checkpoint(directory: Path, checkpoint: Checkpoint) -> None:
    """CHECKPOINT becomes `checkpoint`, the one it replaces CHECKPOINT.prev (each step atomic)."""
    data = encode_checkpoint(checkpoint)
    tmp = directory / (CHECKPOINT + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if (directory / CHECKPOINT).exists():
            os.replace(directory / CHECKPOINT, directory / CHECKPOINT_PREV)
        os.replace(tmp, directory / CHECKPOINT)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)


def remove_leftovers(directory: Path) -> None:
    """Temporary files of an interrupted write (fixed names: no directory listing needed; the
    capsules' folder is cleaned by the writer)."""
    for name in (CHECKPOINT + TMP_SUFFIX, f"{ARCHIVE}/{ARCHIVE_TMP}"):
        (directory / name).unlink(missing_ok=True)


# -- an old single-file log becomes segment 0 -----------------------------------------------------

def migrate_file(path: Path) -> None:
    """Turn the single-file log at `path` into a log directory at `path` whose segment 0 is the
    file, byte for byte. Two renames, each durable; a crash between them leaves
    `<path>.migrating`, which `finish_migration` (and every reader) picks up."""
    migrating = path.with_name(path.name + MIGRATING_SUFFIX)
    if migrating.exists():            # an attempt that stopped before moving the file
        for child in migrating.iterdir():
            child.unlink()
        migrating.rmdir()
    migrating.mkdir()
    os.rename(path, migrating / segment_name(0))
    fsync_dir(migrating)
    fsync_dir(path.parent)
    os.rename(migrating, path)
    fsync_dir(path.parent)
    log.info("%s: migrated the single-file chunk log to a log directory (the file is its "
             "segment %s)", path, segment_name(0))


def finish_migration(path: Path) -> None:
    migrating = path.with_name(path.name + MIGRATING_SUFFIX)
    if not path.exists() and migrating.is_dir():
        os.rename(migrating, path)
        fsync_dir(path.parent)
        log.info("%s: finished a migration to a log directory that a crash interrupted", path)


# -- reading --------------------------------------------------------------------------------------

@dataclass
class LogImage:
    """What a restart reads: the records it folds and where the writer goes on."""

    records: list[Record] = field(default_factory=list)
    checkpoint: Checkpoint | None = None       # the one the records start from
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)   # usable on disk by file
                                                                       # name, newest first
    segments_read: list[str] = field(default_factory=list)
    bytes_read: int = 0
    last_segment: int | None = None            # None: no segment yet
    last_intact: int = 0                       # intact bytes of the last segment
    last_has_records: bool = False
    torn: str | None = None                    # why the last segment's tail is torn
    chunk_seqs: dict[int, int] = field(default_factory=dict)   # segment → highest chunk seq of
                                                               # the current stream in it
    record_counts: dict[int, int] = field(default_factory=dict)   # segment → records in
                                                                  # `records` (no checkpoint)
    last_chunk_segment: int | None = None
    stream: str = ""
    version: Version = Version(0)


class _Folder:
    """Tracks, while segments are read in order, what the writer needs to go on."""

    def __init__(self, image: LogImage):
        self.image = image

    def see(self, number: int, record: Record) -> None:
        image = self.image
        if isinstance(record, ChunkRecord):
            image.chunk_seqs[number] = max(image.chunk_seqs.get(number, -1), int(record.seq))
            image.last_chunk_segment = number
        elif isinstance(record, StreamRecord):
            image.stream = record.stream
        elif isinstance(record, VersionRecord):
            image.version = record.version
            if record.reason == "stream":          # seqs begin again: older chunks are no state
                image.chunk_seqs.clear()


def load_image(path: Path) -> LogImage:
    """Read the log at `path` as a restart does: from the newest usable checkpoint on, or every
    segment where there is none. Raises `ChunkLogError` on damage a crash cannot explain."""
    path = readable_path(path)
    if path.is_file():
        return _image_of_file(path)
    if not path.exists():
        return LogImage()
    checkpoints = load_checkpoints(path)
    if checkpoints:
        return _image_from_checkpoint(path, next(iter(checkpoints.values())), checkpoints)
    return _image_of_all(path)


def _image_of_file(path: Path) -> LogImage:
    data = path.read_bytes()
    image = LogImage(segments_read=[path.name], bytes_read=len(data))
    records, intact, torn = scan(data, where=str(path))
    folder = _Folder(image)
    for record in records:
        folder.see(0, record)
    image.records, image.last_segment, image.last_intact, image.torn = records, 0, intact, torn
    image.last_has_records = bool(records)
    return image


def _image_of_all(directory: Path) -> LogImage:
    numbers = list_segments(directory)
    image = LogImage()
    if not numbers:
        return image
    expected = list(range(numbers[0], numbers[-1] + 1))
    if numbers != expected:
        missing = sorted(set(expected) - set(numbers))
        raise ChunkLogError(f"{directory}: segments {_ranges(missing)} are missing between "
                            f"{segment_name(numbers[0])} and {segment_name(numbers[-1])}")
    folder = _Folder(image)
    for number in numbers:
        path, data = _read_segment(directory, number, image)
        records = _scan_part(path, data, image, number, start=None,
                             last=number == numbers[-1])
        image.record_counts[number] = len(records)
        for record in records:
            folder.see(number, record)
        image.records.extend(records)
    return image


def _image_from_checkpoint(directory: Path, checkpoint: Checkpoint,
                           checkpoints: dict[str, Checkpoint]) -> LogImage:
    image = LogImage(checkpoint=checkpoint, checkpoints=checkpoints)
    folder = _Folder(image)
    base: list[ChunkRecord] = []
    ahead: list[ChunkRecord] = []      # after the state's chunks, logged before its version
    tail: list[Record] = []
    number = checkpoint.keep_segment
    while True:
        if not (directory / segment_name(number)).exists():
            if number <= checkpoint.tail_segment:
                raise ChunkLogError(
                    f"{directory / segment_name(number)} is missing: checkpoint "
                    f"v{checkpoint.version} needs segments {checkpoint.keep_segment} to "
                    f"{checkpoint.tail_segment} and every later one (removed by hand, or "
                    "restored incompletely from a backup?)")
            break
        last = not (directory / segment_name(number + 1)).exists()
        path, data = _read_segment(directory, number, image)
        if number <= checkpoint.tail_segment:
            split = checkpoint.tail_offset if number == checkpoint.tail_segment else len(data)
            if len(data) < split:
                raise ChunkLogError(f"{path} ends at byte {len(data)}, before byte {split} that "
                                    "the checkpoint says was written and synced (the file was "
                                    "cut)")
            for record in _scan_part(path, data[:split], image, number, start=None, last=False):
                if isinstance(record, ChunkRecord):
                    if checkpoint.first_seq <= record.seq < checkpoint.next_seq:
                        base.append(record)
                    elif record.seq >= checkpoint.next_seq:
                        ahead.append(record)
                elif isinstance(record, VersionRecord) and record.reason == "stream":
                    base.clear()
                    ahead.clear()
                folder.see(number, record)
            image.stream, image.version = checkpoint.stream, checkpoint.version
        if number >= checkpoint.tail_segment:
            start = checkpoint.tail_offset if number == checkpoint.tail_segment else None
            for record in _scan_part(path, data, image, number, start=start, last=last):
                tail.append(record)
                folder.see(number, record)
        number += 1
    seqs = [int(r.seq) for r in base]
    if seqs != list(range(checkpoint.first_seq, checkpoint.next_seq)):
        raise ChunkLogError(
            f"{directory}: checkpoint v{checkpoint.version} holds chunks {checkpoint.first_seq} "
            f"to {checkpoint.next_seq - 1}, but segments {checkpoint.keep_segment} to "
            f"{checkpoint.tail_segment} have {_ranges(seqs) or 'none of them'}")
    # A chunk logged before the version record but not in its range (the chunk that forced a
    # fallback, as writers before 2026-12 logged it) still belongs to the state after it.
    ahead = [r for i, r in enumerate(ahead) if r.seq == checkpoint.next_seq + i]
    image.records = ([StreamRecord(checkpoint.stream)] if checkpoint.stream else []) + \
        [checkpoint] + base + ahead + tail
    return image


def _read_segment(directory: Path, number: int, image: LogImage) -> tuple[Path, bytes]:
    path = directory / segment_name(number)
    data = path.read_bytes()
    image.segments_read.append(path.name)
    image.bytes_read += len(data)
    return path, data


def _scan_part(path: Path, data: bytes, image: LogImage, number: int, *, start: int | None,
               last: bool) -> list[Record]:
    """The records of one segment image from `start` (default: the first).

    Only the newest segment may end in a torn record (a crash while appending); anywhere else a
    bad record is corruption.
    """
    records, intact, torn = scan(data, where=str(path), start=start)
    if torn and not last:
        raise ChunkLogError(f"{path}: {torn}, but the log goes on after it (corruption, not a "
                            "torn write: only the newest segment can end in one)")
    if last:
        image.last_segment, image.last_intact, image.torn = number, intact, torn
        image.last_has_records = intact > len(MAGIC)
    return records


def _ranges(numbers: list[int]) -> str:
    """1, 2, 3, 7 → '1-3, 7'."""
    out: list[str] = []
    for n in numbers:
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def read_log(path: str | Path) -> list[Record]:
    """Every record the log at `path` still holds, oldest first (a torn last record is skipped
    with a warning). A log directory without old segments dropped by retention folds into the
    same state as `read_from_checkpoint`; that one is what a restart should read."""
    path = readable_path(Path(path))
    if path.is_file():
        image = _image_of_file(path)
    elif path.is_dir():
        image = _image_of_all(path)
    else:
        raise FileNotFoundError(f"no chunk log at {path}")
    if image.torn:
        log.warning("%s: %s; ignoring it", path, image.torn)
    return image.records


def read_from_checkpoint(path: str | Path) -> list[Record]:
    """The records a restart folds: the newest checkpoint (as a `Checkpoint` record, after a
    `StreamRecord` of its stream), the chunks of its state, then every record logged after it.
    Without a checkpoint, every record. Reads only the segments from the checkpoint's on."""
    path = Path(path)
    if not readable_path(path).exists():
        raise FileNotFoundError(f"no chunk log at {path}")
    image = load_image(path)
    if image.torn:
        log.warning("%s: %s; ignoring it", path, image.torn)
    return image.records
