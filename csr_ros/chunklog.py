"""Crash-safe memory: an append-only on-disk log of the chunk stream and of version changes.

The CSR state is a deterministic fold of two event streams, chunks and version changes
(swaps, synchronous evictions, failovers), so logging both is enough to rebuild the exact
same state, token for token, after a restart.

File format (little-endian):

    magic   b"CSRLOG1\\n"
    record  u32 length | u32 crc32(length bytes) | u32 crc32(payload) | payload (length bytes)

The payload is compact JSON: ``{"k": "chunk", "seq", "source", "stamp_ns", "text"}``,
``{"k": "version", "version", "first_seq", "next_seq", "reason"}`` or ``{"k": "stream", "id"}``
(the aggregator stream whose chunks follow: a restarted aggregator keeps its stream id through
its log; a version record with reason "stream" starts a new stream at seq 0 with no chunks).

A crash can leave the last record torn (the file ends inside it, or its payload was never
written and reads back wrong): opening the log detects that, warns, and truncates it. Damage
anywhere else raises `ChunkLogError`: a record that is followed by more data must be intact.
Records are flushed at once and fsync'ed every `fsync_interval_s` (0: after every record).

Restart: `rebuild_state(read_log(path), empty_state)` gives the same static token ids; where a
capsule was saved at a committed boundary (`save_capsule`), `resume` restores it and prefills
only what came after, instead of the whole state.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Union

from csr_ros.errors import ChunkLogError
from csr_ros.state import Chunk, CsrState, Seq, Version

log = logging.getLogger(__name__)

MAGIC = b"CSRLOG1\n"
_HEADER = struct.Struct("<III")


@dataclass(frozen=True)
class ChunkRecord:
    seq: Seq
    source: str
    stamp_ns: int
    text: str


@dataclass(frozen=True)
class VersionRecord:
    version: Version
    first_seq: Seq          # chunks before this one were evicted by policy
    next_seq: Seq
    reason: str


@dataclass(frozen=True)
class StreamRecord:
    stream: str             # id of the chunk stream the following chunk records belong to


Record = Union[ChunkRecord, VersionRecord, StreamRecord]


def last_stream(records: Iterable[Record]) -> str:
    """The stream id of the newest StreamRecord ('' if none)."""
    found = ""
    for record in records:
        if isinstance(record, StreamRecord):
            found = record.stream
    return found


def encode_record(record: Record) -> bytes:
    if isinstance(record, ChunkRecord):
        body = {"k": "chunk", "seq": int(record.seq), "source": record.source,
                "stamp_ns": int(record.stamp_ns), "text": record.text}
    elif isinstance(record, StreamRecord):
        body = {"k": "stream", "id": record.stream}
    else:
        body = {"k": "version", "version": int(record.version),
                "first_seq": int(record.first_seq), "next_seq": int(record.next_seq),
                "reason": record.reason}
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    length = struct.pack("<I", len(payload))
    return _HEADER.pack(len(payload), zlib.crc32(length), zlib.crc32(payload)) + payload


def scan(data: bytes, *, where: str = "chunk log") -> tuple[list[Record], int, str | None]:
    """Parse a whole log image. Returns (records, length of the intact part, why the tail is torn).

    Raises `ChunkLogError` on damage that a crash while appending cannot explain.
    """
    if len(data) < len(MAGIC):
        if MAGIC.startswith(data):
            return [], 0, "the file header is incomplete" if data else None
        raise ChunkLogError(f"{where} is not a chunk log (bad magic)")
    if data[:len(MAGIC)] != MAGIC:
        raise ChunkLogError(f"{where} is not a chunk log (bad magic {data[:8]!r})")
    records: list[Record] = []
    pos = len(MAGIC)
    while pos < len(data):
        if len(data) - pos < _HEADER.size:
            return records, pos, f"the last record header is cut at byte {pos}"
        length, length_crc, payload_crc = _HEADER.unpack_from(data, pos)
        if zlib.crc32(data[pos:pos + 4]) != length_crc:
            raise ChunkLogError(f"{where}: record header at byte {pos} is corrupt")
        end = pos + _HEADER.size + length
        if end > len(data):
            return records, pos, f"the last record (byte {pos}) is cut: {len(data) - pos} of " \
                                 f"{_HEADER.size + length} bytes"
        payload = data[pos + _HEADER.size:end]
        if zlib.crc32(payload) != payload_crc:
            if end == len(data):
                return records, pos, f"the last record (byte {pos}) fails its checksum"
            raise ChunkLogError(f"{where}: record at byte {pos} fails its checksum and more "
                                "records follow it (corruption, not a torn write)")
        records.append(_decode(payload, where, pos))
        pos = end
    return records, pos, None


def read_log(path: str | Path) -> list[Record]:
    """All intact records of the log at `path` (a torn last record is skipped with a warning)."""
    path = Path(path)
    records, _, torn = scan(path.read_bytes(), where=str(path))
    if torn:
        log.warning("%s: %s; ignoring it", path, torn)
    return records


class ChunkLog:
    """Append-only writer. Opening an existing log repairs a torn last record."""

    def __init__(self, path: str | Path, *, fsync_interval_s: float = 1.0):
        self.path = Path(path)
        self.fsync_interval_s = fsync_interval_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[Record] = []
        if self.path.exists():
            records, intact, torn = scan(self.path.read_bytes(), where=str(self.path))
            if torn:
                log.warning("%s: %s (a crash while appending); truncating it at byte %d",
                            self.path, torn, intact)
                with self.path.open("r+b") as f:
                    f.truncate(intact)
                    os.fsync(f.fileno())
            self.records = records
        self._file = self.path.open("ab")
        if self._file.tell() == 0:
            self._file.write(MAGIC)
            self._sync()
        self._last_sync_s = time.monotonic()

    def append_chunk(self, chunk: Chunk) -> None:
        self._append(ChunkRecord(seq=chunk.seq, source=chunk.source, stamp_ns=chunk.stamp_ns,
                                 text=chunk.text))

    def append_version(self, version: int, first_seq: int, next_seq: int, reason: str) -> None:
        self._append(VersionRecord(version=Version(version), first_seq=Seq(first_seq),
                                   next_seq=Seq(next_seq), reason=reason))

    def append_stream(self, stream: str) -> None:
        self._append(StreamRecord(stream=stream))

    def _append(self, record: Record) -> None:
        self._file.write(encode_record(record))
        self._file.flush()
        self.records.append(record)
        if time.monotonic() - self._last_sync_s >= self.fsync_interval_s:
            self._sync()

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._last_sync_s = time.monotonic()

    def close(self) -> None:
        if not self._file.closed:
            self._sync()
            self._file.close()

    def __enter__(self) -> "ChunkLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def rebuild_state(records: Iterable[Record], initial: CsrState) -> CsrState:
    """Fold `records` into `initial` (an empty state with the same tokenizer/layout/profile).

    Every chunk is re-tokenized from its logged text, as it was when it first arrived, so the
    rebuilt static token ids equal the original ones.
    """
    assert not initial.chunks and initial.next_seq == 0, "rebuild from an empty state"
    state = initial
    for record in records:
        if isinstance(record, ChunkRecord):
            ids = tuple(state.tokenizer.encode_data(record.text))
            state.append(Chunk(seq=record.seq, source=record.source, stamp_ns=record.stamp_ns,
                               text=record.text, token_ids=ids))
            continue
        if isinstance(record, StreamRecord):
            continue
        if record.reason == "stream":      # the chunk stream began again at seq 0
            state = state.evicted(len(state.chunks))
            state.next_seq = Seq(0)
            state.version = record.version
            continue
        if record.next_seq > state.next_seq:
            msg = (f"version record v{record.version} covers chunks up to {record.next_seq} but "
                   f"only {state.next_seq} were logged before it")
            raise ChunkLogError(msg)
        n_drop = sum(1 for c in state.chunks if c.seq < record.first_seq)
        state = state.evicted(n_drop)
        state.version = record.version
    return state


# -- capsules at a committed boundary ------------------------------------------------------------

@dataclass(frozen=True)
class Resumed:
    n_from_capsule: int      # tokens restored from the capsule (0: no usable capsule)
    n_prefilled: int         # tokens prefilled after it (the whole run without a capsule)
    n_committed: int


def save_capsule(resource, path: str | Path) -> int:
    """Save the capsule of a local resource at its committed boundary (atomically).

    Works in-process and through a `ProcessResource` (the capsule is written by the worker).
    Returns the number of committed tokens the capsule holds.
    """
    return _on_resource(resource, _save_capsule_here, str(path))


def resume(resource, state: CsrState, capsule_path: str | Path | None) -> Resumed:
    """Make `resource` hold exactly `state`'s static run, restoring a capsule where it can.

    The capsule is used when its token ids are a prefix of the run (it was saved at an earlier
    committed boundary of the same version); then only the rest is prefilled. Otherwise, or
    without a capsule, the whole run is loaded.
    """
    path = None if capsule_path is None or not Path(capsule_path).exists() else str(capsule_path)
    return _on_resource(resource, _resume_here, tuple(state.static_ids), path)


def _on_resource(resource, func, *args):
    if hasattr(resource, "apply"):        # a ProcessResource: run it next to the engine
        return resource.apply(func, *args)
    return func(resource, *args)


def _save_capsule_here(resource, path: str) -> int:
    engine = resource.engine
    capsule = engine.snapshot()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    written = Path(engine.save_capsule(capsule, tmp))
    os.replace(written, target)
    return capsule.n_tokens


def _resume_here(resource, static_ids: tuple[int, ...], path: str | None) -> Resumed:
    engine = resource.engine
    if path is not None:
        try:
            capsule = engine.load_capsule(path)
        except Exception as exc:      # a stale or foreign capsule only costs a full prefill
            log.warning("capsule %s not usable (%s); prefilling the whole state", path, exc)
        else:
            n = capsule.n_tokens
            if 0 < n <= len(static_ids) and tuple(capsule.token_ids) == static_ids[:n]:
                engine.restore(capsule)
                if n < len(static_ids):
                    resource.extend(static_ids[n:])
                return Resumed(n_from_capsule=n, n_prefilled=len(static_ids) - n,
                               n_committed=resource.n_committed)
            log.warning("capsule %s (%d tokens) is not a prefix of the rebuilt state; "
                        "prefilling the whole state", path, n)
    resource.load(static_ids)
    return Resumed(n_from_capsule=0, n_prefilled=len(static_ids),
                   n_committed=resource.n_committed)


def _decode(payload: bytes, where: str, pos: int) -> Record:
    try:
        body = json.loads(payload.decode("utf-8"))
        if body["k"] == "chunk":
            return ChunkRecord(seq=Seq(body["seq"]), source=body["source"],
                               stamp_ns=int(body["stamp_ns"]), text=body["text"])
        if body["k"] == "stream":
            return StreamRecord(stream=str(body["id"]))
        if body["k"] == "version":
            return VersionRecord(version=Version(body["version"]),
                                 first_seq=Seq(body["first_seq"]),
                                 next_seq=Seq(body["next_seq"]), reason=body["reason"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ChunkLogError(f"{where}: record at byte {pos} is not a valid record: {exc}") from None
    raise ChunkLogError(f"{where}: record at byte {pos} has unknown kind {body.get('k')!r}")
