"""Crash-safe memory: the chunk stream and its version changes, on disk, bounded, and read back
in seconds however old the robot is.

The CSR state is a deterministic fold of two event streams, chunks and version changes
(swaps, synchronous evictions, failovers), so logging both is enough to rebuild the exact same
state, token for token, after a restart. The log is segmented and checkpointed the way a
database's write-ahead log is: a restart reads the last checkpoint and only the segments from
the one holding the oldest chunk of its state on, never the whole history.

Layout of a chunk log at PATH (a directory):

    PATH/000000000000.seg   segments, numbered from 0, each in the record format of `records`
    PATH/000000000001.seg   (magic, then CRC-checked records); a new one starts after every
    ...                     version record and when the current one would pass
                            `max_segment_bytes`; each new one opens with a stream record naming
                            the current stream
    PATH/CHECKPOINT         the newest committed version: its chunk range (first kept seq, next
    PATH/CHECKPOINT.prev    seq), static token count, stream, the segment holding its oldest
                            chunk, where the records after it begin, and its capsule if one
                            was saved; JSON with a CRC, written to a temporary file, fsynced,
                            renamed, directory fsynced. The previous one is kept as a fallback.
    PATH/capsules/          the capsule a checkpoint names (`ChunkLog.save_capsule`); the
                            others are removed
    PATH/archive/           segments that retention moved out (`Retention(action="archive")`,
                            optionally gzip-compressed)
    PATH/LOCK               held by the one writing process (fcntl; released when it exits)

Guarantees:

- Restart (`ChunkLog(PATH).records`, or `read_from_checkpoint(PATH)`, then `rebuild_state`)
  reads the newest usable checkpoint and the segments from its `keep_segment` on: time flat in
  the robot's age (`bench_restart` measures it). Without a checkpoint it reads every segment.
- A crash can leave only the newest segment's last record torn; opening the log detects that,
  warns, and truncates it. A bad record anywhere else raises `ChunkLogError` naming the file
  and the byte (corruption, never skipped). A damaged CHECKPOINT falls back to CHECKPOINT.prev,
  then to reading every segment, with a warning.
- Retention (`Retention`: `retain_bytes`, `retain_s`, archive or delete) drops whole segments,
  oldest first, and never one that the state of a checkpoint on disk needs, the segment being
  written, or the newest one holding a chunk.
- Disk full: an append raises `ChunkLogFullError` and leaves no partial record; appending works
  again once space is freed (a version record is held and written first, see `writer`).
- A single-file log of the first format (one file, the same record format) is read as it is by
  `read_log`/`read_from_checkpoint`; opening it with `ChunkLog` turns it into a log directory
  at the same path whose segment 0 is the file, byte for byte (two durable renames; a crash
  between them is finished on the next open).

Restart with a capsule: where one was saved at a committed boundary (`ChunkLog.save_capsule`),
`resume(resource, state, chunk_log.capsule_path)` restores it and prefills only what came after,
instead of the whole state.
"""

from csr_ros.chunklog.fold import Resumed, rebuild_state, resume, save_capsule
from csr_ros.chunklog.logdir import read_from_checkpoint, read_log, segment_files
from csr_ros.chunklog.records import (MAGIC, Checkpoint, ChunkRecord, Record, StreamRecord,
                                      VersionRecord, encode_record, last_stream, scan)
from csr_ros.chunklog.retention import Retention
from csr_ros.chunklog.writer import DEFAULT_MAX_SEGMENT_BYTES, ChunkLog

__all__ = ["MAGIC", "Checkpoint", "ChunkLog", "ChunkRecord", "DEFAULT_MAX_SEGMENT_BYTES",
           "Record", "Resumed", "Retention", "StreamRecord", "VersionRecord",
           "encode_record", "last_stream", "read_from_checkpoint", "read_log", "rebuild_state",
           "resume", "save_capsule", "scan", "segment_files"]
