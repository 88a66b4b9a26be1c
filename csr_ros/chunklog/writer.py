"""`ChunkLog`: the one writer of a chunk log directory (the layout is in the package docstring).

    append_chunk / append_stream ─▶ the current segment (flushed at once, fsynced every
                                    fsync_interval_s; a new segment past max_segment_bytes)
    append_version ─▶ the current segment, fsynced ─▶ a new segment ─▶ CHECKPOINT (atomic)
                   ─▶ retention of old segments ─▶ `records` trimmed to what a restart reads

The contract of an append: it raises (`ChunkLogFullError` when the disk is full) if and only if
the record was not written, and then the log is exactly as before the call. A version record is
the exception: it reports a change that already happened, so a failed one is held, logged, and
written ahead of the next record (or at `close`); a crash before that restarts from the version
before it, with every chunk.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Callable

from csr_ros.chunklog.fold import save_capsule
from csr_ros.chunklog.logdir import (CAPSULE_PREFIX, CAPSULES, CHECKPOINT, CHECKPOINT_PREV, LOCK,
                                     LogImage, finish_migration, fsync_dir, list_segments,
                                     load_image, migrate_file, remove_leftovers, segment_name,
                                     write_checkpoint)
from csr_ros.chunklog.records import (MAGIC, ChunkRecord, Checkpoint, Record, StreamRecord,
                                      VersionRecord, encode_record, scan)
from csr_ros.chunklog.retention import Retention, SegmentFile, drop_segments, plan_retention
from csr_ros.errors import ChunkLogError, ChunkLogFullError, ConfigError
from csr_ros.state import Chunk, Seq, Version

log = logging.getLogger("csr_ros.chunklog")

DEFAULT_MAX_SEGMENT_BYTES = 16 * 1024 * 1024
MIN_SEGMENT_BYTES = 4096
_DISK_FULL = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
_WRITERS: "weakref.WeakValueDictionary[str, ChunkLog]" = weakref.WeakValueDictionary()
_WRITERS_LOCK = threading.Lock()


class ChunkLog:
    """Append-only writer. Opening repairs a torn last record and migrates a single-file log.

    `records`: what a restart folds (`rebuild_state`): from the newest checkpoint on (see
    `read_from_checkpoint`), kept so as records are appended, and cut back at each checkpoint,
    so it stays the size of the active state. A log without versions (an aggregator's) keeps
    every record of its retained segments. `segments_read`/`bytes_read`: what opening read.
    """

    def __init__(self, path: str | Path, *, fsync_interval_s: float = 1.0,
                 max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
                 retention: Retention | None = None, clock: Callable[[], float] = time.time):
        if fsync_interval_s < 0:
            raise ConfigError(f"fsync_interval_s must be >= 0, got {fsync_interval_s}")
        if max_segment_bytes < MIN_SEGMENT_BYTES:
            raise ConfigError(f"max_segment_bytes must be at least {MIN_SEGMENT_BYTES}, got "
                              f"{max_segment_bytes}")
        self.path = Path(path)
        self.fsync_interval_s = fsync_interval_s
        self.max_segment_bytes = max_segment_bytes
        self.retention = retention
        self.clock = clock
        self.write_failures = 0           # records not written (raised, or a version held)
        self.sync_s = 0.0                    # time spent in fsync of segments
        self._mutex = threading.RLock()   # the node and the driver's workers both append
        self._capsule_lock = threading.Lock()   # one capsule written at a time
        self._fd: int | None = None
        self._lock_fd: int | None = None
        try:
            self._prepare_directory()
            self._register()
            self._take_lock()
            remove_leftovers(self.path)
            self._start(load_image(self.path))
        except BaseException as exc:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._release_lock()
            self._unregister()
            if isinstance(exc, OSError):
                raise _os_error(exc, f"{self.path}: cannot open the chunk log") from None
            raise

    # -- opening -------------------------------------------------------------------------------

    def _prepare_directory(self) -> None:
        path = self.path
        finish_migration(path)
        if path.is_file():
            # The first format: one file. Repair its torn tail in place, so that corruption is
            # refused before anything moves, then it becomes segment 0 of a log directory.
            _, intact, torn = scan(path.read_bytes(), where=str(path))
            if torn:
                self._truncate_torn(path, torn, intact)
            migrate_file(path)
        elif not path.exists():
            path.mkdir(parents=True)
            fsync_dir(path.parent)
        elif not path.is_dir():
            raise ChunkLogError(f"{path} is neither a chunk log directory nor a chunk log file")

    def _register(self) -> None:
        """One writer per log within this process too (the file lock is per process)."""
        self._key = os.path.realpath(self.path)
        with _WRITERS_LOCK:
            other = _WRITERS.get(self._key)
            if other is not None and other._fd is not None:
                raise ChunkLogError(f"{self.path} is already open for writing in this process: "
                                    "a chunk log has one writer; close the other first")
            _WRITERS[self._key] = self

    def _unregister(self) -> None:
        with _WRITERS_LOCK:
            if _WRITERS.get(getattr(self, "_key", None)) is self:
                del _WRITERS[self._key]

    def _take_lock(self) -> None:
        """One writer per log: a second process that opens it is refused (the lock goes with
        the process, so a crashed writer leaves nothing to clean up)."""
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise ChunkLogError(f"{self.path} is open for writing in another process (pid "
                                f"{holder}): a chunk log has one writer; give each node its own "
                                "chunk_log") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _start(self, image: LogImage) -> None:
        self.records: list[Record] = image.records
        self.segments_read = tuple(image.segments_read)
        self.bytes_read = image.bytes_read
        self.checkpoint: Checkpoint | None = image.checkpoint   # the newest one on disk
        self._on_disk = dict(image.checkpoints)                 # file name → checkpoint
        self._latest = image.checkpoint     # of the newest version, even if its file failed
        self._chunk_seqs = image.chunk_seqs
        self._record_counts = image.record_counts
        self._last_chunk_segment = image.last_chunk_segment
        self._stream = image.stream
        self._version = image.version
        self._pending: list[tuple[VersionRecord, int | None]] = []
        self._dirty = False                 # bytes past _good_bytes that a failed write left
        self._last_sync_s = time.monotonic()
        self._remove_unreferenced_capsules()
        if image.last_segment is None:
            self._segment = 0
            self._fd = self._create_segment(0)
            self._good_bytes = len(MAGIC)
        else:
            self._segment = image.last_segment
            path = self._segment_path(self._segment)
            if image.torn:
                self._truncate_torn(path, image.torn, image.last_intact)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            self._good_bytes = image.last_intact
            if self._good_bytes < len(MAGIC):      # created, and cut before its magic
                os.ftruncate(self._fd, 0)
                self._write_bytes(MAGIC, "the segment header")
                self._good_bytes = len(MAGIC)
        if self._good_bytes == len(MAGIC) and self._stream and not image.last_has_records:
            self._write(StreamRecord(self._stream))   # every segment names its stream
        self._apply_retention()

    @staticmethod
    def _truncate_torn(path: Path, torn: str, intact: int) -> None:
        log.warning("%s: %s (a crash while appending); truncating it at byte %d", path, torn,
                    intact)
        with open(path, "r+b") as f:
            f.truncate(intact)
            os.fsync(f.fileno())

    # -- appending -----------------------------------------------------------------------------

    def append_chunk(self, chunk: Chunk) -> None:
        self._append(ChunkRecord(seq=chunk.seq, source=chunk.source, stamp_ns=chunk.stamp_ns,
                                 text=chunk.text))

    def append_stream(self, stream: str) -> None:
        self._append(StreamRecord(stream=stream))

    def append_version(self, version: int, first_seq: int, next_seq: int, reason: str, *,
                       n_static_tokens: int | None = None) -> None:
        """Log a committed version (the state is chunks [first_seq, next_seq)) and checkpoint
        it. `n_static_tokens`: the state's static token count, checked on restart."""
        record = VersionRecord(version=Version(version), first_seq=Seq(first_seq),
                               next_seq=Seq(next_seq), reason=reason)
        with self._mutex:
            self._check_open()
            self._pending.append((record, n_static_tokens))
            try:
                self._write_pending()
            except ChunkLogError as exc:
                log.error("%s; version record v%d is held and written ahead of the next record",
                          exc, version)

    def _append(self, record: ChunkRecord | StreamRecord) -> None:
        with self._mutex:
            self._check_open()
            try:
                self._write_pending()
            except ChunkLogError as exc:
                raise type(exc)(f"{_describe(record)} was not written, nor the version record "
                                f"ahead of it: {exc}") from None
            self._write(record)
            if time.monotonic() - self._last_sync_s >= self.fsync_interval_s:
                self._sync_quietly()

    def _check_open(self) -> None:
        if self._fd is None:
            raise ChunkLogError(f"{self.path}: the chunk log is closed")

    def _write_pending(self) -> None:
        while self._pending:
            record, n_static_tokens = self._pending[0]
            self._write(record)
            self._pending.pop(0)
            self._committed(record, n_static_tokens)

    def _write(self, record: ChunkRecord | StreamRecord | VersionRecord) -> None:
        data = encode_record(record)
        if self._good_bytes + len(data) > self.max_segment_bytes and \
                self._good_bytes > len(MAGIC) and self._rotate():
            self._apply_retention()
        self._write_bytes(data, _describe(record))
        self._good_bytes += len(data)
        self._note(record)

    def _write_bytes(self, data: bytes, what: str) -> None:
        """All of `data` at the end of the current segment, or nothing (then raises)."""
        if self._dirty:
            self._cut_back(what)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            self.write_failures += 1
            self._dirty = True
            try:
                self._cut_back(what)
            except ChunkLogError:
                pass                       # said below; the next append tries again
            raise self._write_error(exc, what) from None

    def _cut_back(self, what: str) -> None:
        """Remove what a failed write left past the last whole record."""
        try:
            os.ftruncate(self._fd, self._good_bytes)
        except OSError as exc:
            raise ChunkLogError(f"{self._segment_path(self._segment)}: {what} was not written: a "
                                f"failed write left a partial record that cannot be cut ({exc})"
                                ) from None
        self._dirty = False

    def _write_error(self, exc: OSError, what: str) -> ChunkLogError:
        return _os_error(exc, f"{self._segment_path(self._segment)}: {what} was not written",
                         "The log holds every record before it")

    def _note(self, record: Record) -> None:
        """Bookkeeping of a record now in the current segment."""
        self.records.append(record)
        if self._latest is None:          # `records` holds every record of its segments
            self._record_counts[self._segment] = self._record_counts.get(self._segment, 0) + 1
        if isinstance(record, ChunkRecord):
            self._chunk_seqs[self._segment] = max(self._chunk_seqs.get(self._segment, -1),
                                                  int(record.seq))
            self._last_chunk_segment = self._segment
        elif isinstance(record, StreamRecord):
            self._stream = record.stream
        elif isinstance(record, VersionRecord):
            self._version = record.version
            if record.reason == "stream":
                self._chunk_seqs.clear()

    # -- versions and checkpoints ---------------------------------------------------------------

    def _committed(self, record: VersionRecord, n_static_tokens: int | None) -> None:
        """After a version record: sync, a new segment, the checkpoint, retention."""
        try:
            self._sync()
        except ChunkLogError as exc:       # a checkpoint must never point past synced data
            log.error("%s; no checkpoint for v%d (a restart reads from the one before it)",
                      exc, record.version)
            return
        before = len(self.records)
        if self._rotate():
            tail_segment, tail_offset = self._segment, len(MAGIC)
        else:
            tail_segment, tail_offset = self._segment, self._good_bytes
        base = _state_chunks(self.records[:before], record)
        if base is None:
            log.warning("%s: version v%d covers chunks %d to %d, which this log does not hold "
                        "in order; no checkpoint for it (a restart reads from the one before)",
                        self.path, record.version, record.first_seq, record.next_seq - 1)
            return
        keep = min((n for n, top in self._chunk_seqs.items() if top >= record.first_seq),
                   default=tail_segment) if base else tail_segment
        checkpoint = Checkpoint(version=record.version, first_seq=record.first_seq,
                                next_seq=record.next_seq, n_static_tokens=n_static_tokens,
                                stream=self._stream, keep_segment=keep,
                                tail_segment=tail_segment, tail_offset=tail_offset,
                                written_unix_s=float(self.clock()))
        self.records = ([StreamRecord(self._stream)] if self._stream else []) + [checkpoint] + \
            base + _after_state(self.records[:before], record) + self.records[before:]
        self._chunk_seqs = {n: top for n, top in self._chunk_seqs.items() if n >= keep}
        self._latest = checkpoint
        self._record_counts.clear()
        if self._store_checkpoint(checkpoint):
            self._apply_retention()

    def _store_checkpoint(self, checkpoint: Checkpoint) -> bool:
        try:
            write_checkpoint(self.path, checkpoint)
        except OSError as exc:
            log.warning("%s: checkpoint v%d not written (%s); a restart reads from the one "
                        "before it, which takes longer and loses nothing", self.path,
                        checkpoint.version, exc)
            return False
        self._on_disk = {CHECKPOINT: checkpoint, **({CHECKPOINT_PREV: self._on_disk[CHECKPOINT]}
                                                    if CHECKPOINT in self._on_disk else {})}
        self.checkpoint = checkpoint
        self._remove_unreferenced_capsules()
        return True

    # -- segments ------------------------------------------------------------------------------

    def _segment_path(self, number: int) -> Path:
        return self.path / segment_name(number)

    def _create_segment(self, number: int) -> int:
        """A new segment holding its magic, durable, or an OSError and no file."""
        path = self._segment_path(number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            view = memoryview(MAGIC)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            fsync_dir(self.path)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return fd

    def _rotate(self) -> bool:
        """Go on in a new segment; False (logged) where it cannot be made, and the current
        segment goes on. The current one is whole and synced before a newer one exists: only
        the newest segment can ever end in a torn record."""
        try:
            if self._dirty:
                self._cut_back("a new segment")
            self._sync()
            fd = self._create_segment(self._segment + 1)
        except (OSError, ChunkLogError) as exc:
            log.warning("%s: no new segment after %s (%s); appending to it goes on",
                        self.path, segment_name(self._segment), exc)
            return False
        os.close(self._fd)
        self._fd, self._segment, self._good_bytes = fd, self._segment + 1, len(MAGIC)
        self._last_sync_s = time.monotonic()
        if self._stream:
            try:
                self._write(StreamRecord(self._stream))
            except ChunkLogError as exc:      # the checkpoint still names the stream
                log.warning("%s", exc)
        return True

    def _sync(self) -> None:
        started_s = time.monotonic()
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise ChunkLogError(f"{self._segment_path(self._segment)}: fsync failed ({exc}): "
                                "records since the last sync may not survive a power loss"
                                ) from None
        finally:
            self.sync_s += time.monotonic() - started_s
        self._last_sync_s = time.monotonic()

    def _sync_quietly(self) -> None:
        try:
            self._sync()
        except ChunkLogError as exc:
            log.error("%s; retried at the next append", exc)

    # -- retention -----------------------------------------------------------------------------

    def _protect_from(self) -> int:
        """The oldest segment retention must keep: the active one, the newest holding a chunk
        (a restarted aggregator goes on from its seq), and with `keep_state` every segment from
        the oldest that a checkpoint on disk needs (all of them while there is none)."""
        marks = [self._segment]
        if self._last_chunk_segment is not None:
            marks.append(self._last_chunk_segment)
        if self.retention.keep_state:
            if not self._on_disk:
                return 0
            marks += [c.keep_segment for c in self._on_disk.values()]
        return min(marks)

    def _apply_retention(self) -> None:
        if self.retention is None:
            return
        try:
            segments = []
            for number in list_segments(self.path):
                stat = self._segment_path(number).stat()
                segments.append(SegmentFile(number, stat.st_size, stat.st_mtime))
        except OSError as exc:
            log.warning("%s: retention could not list the segments (%s)", self.path, exc)
            return
        plan = plan_retention(segments, self._protect_from(), float(self.clock()),
                              self.retention)
        done = drop_segments(self.path, plan, self.retention) if plan else []
        for segment in done:
            self._chunk_seqs.pop(segment.number, None)
            if self._latest is None:          # `records` starts with the oldest segment's
                del self.records[:self._record_counts.pop(segment.number, 0)]
        if done:
            log.info("%s: retention %s segments %s to %s (%d bytes)", self.path,
                     "archived" if self.retention.action == "archive" else "deleted",
                     segment_name(done[0].number), segment_name(done[-1].number),
                     sum(s.n_bytes for s in done))

    # -- capsules ------------------------------------------------------------------------------

    @property
    def capsule_path(self) -> Path | None:
        """The capsule the newest checkpoint names, if it is there (see `resume`)."""
        if self.checkpoint is None or self.checkpoint.capsule is None:
            return None
        path = self.path / self.checkpoint.capsule
        return path if path.is_file() else None

    def save_capsule(self, resource, *, version: int | None = None) -> Path:
        """Save `resource`'s capsule at its committed boundary into the log and name it in the
        checkpoint of the current version, so that a restart resumes from it (`resume`).

        The resource should hold the current version (the primary); a capsule that is not a
        prefix of the rebuilt state only costs a full prefill on restart. `version`: the version
        the caller saw the resource hold; if the log is at another one, nothing is saved. The
        capsule is written outside the log's lock, so appends go on meanwhile; if a newer
        version is logged before it is done, it is dropped (ChunkLogError), as it would name
        a state that is no longer the checkpoint's.
        """
        with self._capsule_lock:
            with self._mutex:
                self._check_open()
                base = self._capsule_base()
                if version is not None and int(base.version) != int(version):
                    raise ChunkLogError(f"{self.path}: the log is at v{base.version}, not "
                                        f"v{version}: no capsule of v{version}")
                folder = self.path / CAPSULES
                folder.mkdir(exist_ok=True)
            tmp = folder / ".writing.tmp"
            try:
                n_tokens = save_capsule(resource, tmp)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise _os_error(exc, f"{self.path}: the capsule was not saved",
                                "A restart prefills the whole state") from None
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            with self._mutex:
                try:
                    self._check_open()
                    now = self._capsule_base()
                except ChunkLogError:
                    tmp.unlink(missing_ok=True)
                    raise
                if now.version != base.version or now.first_seq != base.first_seq:
                    tmp.unlink(missing_ok=True)
                    raise ChunkLogError(f"{self.path}: v{base.version} was superseded while its "
                                        "capsule was written; the capsule was dropped")
                name = f"{CAPSULES}/{CAPSULE_PREFIX}v{int(base.version):012d}-{n_tokens}.capsule"
                try:
                    os.replace(tmp, self.path / name)
                    fsync_dir(folder)
                except OSError as exc:
                    tmp.unlink(missing_ok=True)
                    raise _os_error(exc, f"{self.path}: the capsule was not saved",
                                    "A restart prefills the whole state") from None
                checkpoint = replace(now, capsule=name, capsule_tokens=n_tokens,
                                     written_unix_s=float(self.clock()))
                self._latest = checkpoint
                if not self._store_checkpoint(checkpoint):
                    raise ChunkLogError(f"{self.path}: the capsule {name} was saved but the "
                                        "checkpoint naming it was not written (see the warning)")
                return self.path / name

    def _capsule_base(self) -> Checkpoint:
        if self._pending:
            raise ChunkLogError(f"{self.path}: version record v{self._pending[0][0].version} is "
                                "not written yet (disk full?): no capsule until it is")
        if self._latest is not None and self._latest.version == self._version:
            return self._latest
        if self._version == 0 and (self.path / segment_name(0)).exists():
            # No version yet: the state is every chunk from the first one logged on.
            first = next((r.seq for r in self.records if isinstance(r, ChunkRecord)), Seq(0))
            return Checkpoint(version=Version(0), first_seq=first, next_seq=first,
                              n_static_tokens=None, stream="", keep_segment=0,
                              tail_segment=0, tail_offset=len(MAGIC))
        raise ChunkLogError(f"{self.path}: no checkpoint of v{self._version} to name a capsule "
                            "in (its file was not written); the next version writes one")

    def _remove_unreferenced_capsules(self) -> None:
        """Capsules no checkpoint on disk names (replaced ones, or one saved just before a
        crash): the folder holds a few files, so listing it costs nothing."""
        folder = self.path / CAPSULES
        if not folder.is_dir():
            return
        keep = {Path(c.capsule).name for c in self._on_disk.values() if c.capsule}
        try:
            for child in folder.iterdir():
                if child.name not in keep:
                    child.unlink(missing_ok=True)
        except OSError as exc:              # retried after the next checkpoint
            log.warning("%s: old capsules not removed (%s)", folder, exc)

    # -- closing -------------------------------------------------------------------------------

    @property
    def segment(self) -> int:
        """The number of the segment being appended to."""
        return self._segment

    @property
    def pending_versions(self) -> int:
        """Version records held because they could not be written yet."""
        return len(self._pending)

    def close(self) -> None:
        with self._mutex:
            if self._fd is None:
                return
            try:
                self._write_pending()
            except ChunkLogError as exc:
                log.error("%s; closing with %d version record(s) unwritten: a restart rebuilds "
                          "the state before them (no chunk is lost)", exc, len(self._pending))
            self._sync_quietly()
            os.close(self._fd)
            self._fd = None
            self._release_lock()
            self._unregister()

    def __enter__(self) -> "ChunkLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:     # interpreter shutdown: nothing left to report to
            pass


def _os_error(exc: OSError, what: str, state: str = "") -> ChunkLogError:
    """`what` failed because of `exc`: ChunkLogFullError where the disk is full."""
    state = f". {state}" if state else ""
    if exc.errno in _DISK_FULL:
        return ChunkLogFullError(f"{what}: {exc.strerror} "
                                 f"({errno.errorcode.get(exc.errno, exc.errno)}){state}; "
                                 "appending works again once space is freed")
    return ChunkLogError(f"{what}: {exc}{state}")


def _describe(record: Record) -> str:
    if isinstance(record, ChunkRecord):
        return f"chunk {record.seq}"
    if isinstance(record, VersionRecord):
        return f"version record v{record.version}"
    return f"stream record {getattr(record, 'stream', '')!r}"


def _after_state(records: list[Record], version: VersionRecord) -> list[ChunkRecord]:
    """Chunk records past `version`'s range that were logged before its record (what a restart
    from its checkpoint folds after the state's chunks, see logdir)."""
    ahead: list[ChunkRecord] = []
    for record in records:
        if isinstance(record, ChunkRecord) and record.seq >= version.next_seq:
            ahead.append(record)
        elif isinstance(record, VersionRecord) and record.reason == "stream":
            ahead.clear()
    return [r for i, r in enumerate(ahead) if r.seq == version.next_seq + i]


def _state_chunks(records: list[Record], version: VersionRecord) -> list[ChunkRecord] | None:
    """The chunk records of `version`'s state among `records` (the ones a restart would fold up
    to it), or None where they are not all there in order."""
    chunks: list[ChunkRecord] = []
    for record in records:
        if isinstance(record, ChunkRecord):
            if version.first_seq <= record.seq < version.next_seq:
                chunks.append(record)
        elif isinstance(record, VersionRecord) and record.reason == "stream":
            chunks.clear()
    seqs = [int(c.seq) for c in chunks]
    return chunks if seqs == list(range(version.first_seq, version.next_seq)) else None
