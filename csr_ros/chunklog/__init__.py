"""Crash-safe memory: the chunk stream and its version changes, on disk, bounded, and read back
in seconds however old the robot is.

The CSR state is a deterministic fold of chunks and version changes, so logging both rebuilds
it token for token after a restart; the log is segmented and checkpointed like a database's
write-ahead log, so a restart reads the last checkpoint and the segments from its oldest chunk
on, never the whole history (`ChunkLog(PATH).records`, or `read_from_checkpoint(PATH)`, then
`rebuild_state`). Its layout on disk, its guarantees under faults, retention, capsules and the
first format: docs/chunklog.md.
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
