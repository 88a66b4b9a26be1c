"""The records of a chunk log and the byte format of one segment file.

A segment file (and a single-file log of the first format, which is the same thing):

    magic   b"CSRLOG1\\n"
    record  u32 length | u32 crc32(length bytes) | u32 crc32(payload) | payload (length bytes)

The payload is compact JSON: ``{"k": "chunk", "seq", "source", "stamp_ns", "text"}``,
``{"k": "version", "version", "first_seq", "next_seq", "reason"}`` or ``{"k": "stream", "id"}``
(the aggregator stream whose chunks follow: a restarted aggregator keeps its stream id through
its log; a version record with reason "stream" starts a new stream at seq 0 with no chunks).

`Checkpoint` is never written into a segment: it lives in its own file (see `logdir`) and opens
the record list a restart folds (`rebuild_state`), standing for every record before it.

Pure: bytes in, records out.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Iterable, Union

from csr_ros.errors import ChunkLogError
from csr_ros.state import Seq, Version

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


@dataclass(frozen=True)
class Checkpoint:
    """A committed version and where its state lies in the segments.

    The state of `version` is the chunks [first_seq, next_seq) of the current stream; the oldest
    of them is in segment `keep_segment` or later, and the records logged after the version
    begin at byte `tail_offset` of segment `tail_segment`. A restart reads those segments only.
    """

    version: Version
    first_seq: Seq
    next_seq: Seq
    n_static_tokens: int | None   # of the state (prefix included); None: not given by the writer
    stream: str                   # the stream the state's chunks belong to ('' if none named)
    keep_segment: int
    tail_segment: int
    tail_offset: int
    capsule: str | None = None    # a capsule file in the log directory, saved at this version
    capsule_tokens: int | None = None
    written_unix_s: float = 0.0


Record = Union[ChunkRecord, VersionRecord, StreamRecord, Checkpoint]


def last_stream(records: Iterable[Record]) -> str:
    """The stream id of the newest StreamRecord ('' if none)."""
    found = ""
    for record in records:
        if isinstance(record, StreamRecord):
            found = record.stream
    return found


def encode_record(record: ChunkRecord | VersionRecord | StreamRecord) -> bytes:
    if isinstance(record, ChunkRecord):
        body = {"k": "chunk", "seq": int(record.seq), "source": record.source,
                "stamp_ns": int(record.stamp_ns), "text": record.text}
    elif isinstance(record, StreamRecord):
        body = {"k": "stream", "id": record.stream}
    elif isinstance(record, VersionRecord):
        body = {"k": "version", "version": int(record.version),
                "first_seq": int(record.first_seq), "next_seq": int(record.next_seq),
                "reason": record.reason}
    else:
        raise AssertionError(f"{type(record).__name__} is not written into a segment")
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    length = struct.pack("<I", len(payload))
    return _HEADER.pack(len(payload), zlib.crc32(length), zlib.crc32(payload)) + payload


def scan(data: bytes, *, where: str = "chunk log",
         start: int | None = None) -> tuple[list[Record], int, str | None]:
    """Parse a segment image from `start` (default: just after the magic).

    Returns (records, length of the intact part, why the tail is torn or None). A torn tail is
    a record cut short, a last payload that fails its checksum, or zeros to the end (a crash
    after the file grew and before its data was written back). Raises `ChunkLogError` on
    damage that a crash while appending cannot explain: a bad magic, a bad record header, or a
    bad payload with more records after it.
    """
    if len(data) < len(MAGIC):
        if MAGIC.startswith(data):
            return [], 0, "the file header is incomplete" if data else None
        raise ChunkLogError(f"{where} is not a chunk log (bad magic)")
    if data[:len(MAGIC)] != MAGIC:
        raise ChunkLogError(f"{where} is not a chunk log (bad magic {data[:8]!r})")
    records: list[Record] = []
    pos = len(MAGIC) if start is None else start
    while pos < len(data):
        if len(data) - pos < _HEADER.size:
            return records, pos, f"the last record header is cut at byte {pos}"
        length, length_crc, payload_crc = _HEADER.unpack_from(data, pos)
        if zlib.crc32(data[pos:pos + 4]) != length_crc:
            if not any(data[pos:]):        # the file's new size reached the disk, its data not
                return records, pos, f"the file ends in {len(data) - pos} zero bytes from " \
                                     f"byte {pos}"
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
