"""The segmented chunk log: rotation, checkpoints, restart from the last one, retention,
damage in older segments, and logs of the first (single-file) format."""

from __future__ import annotations

import gzip
import json
import logging
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from csr_ros.chunklog import (MAGIC, ChunkLog, ChunkRecord, Retention, StreamRecord,
                              VersionRecord, read_from_checkpoint, read_log,
                              rebuild_state, scan, segment_files)
from csr_ros.bench.restart_bench import bench_restart, shaped, synthetic_records, write_synthetic_log
from csr_ros.errors import ChunkLogError, ConfigError
from csr_ros.state import Chunk, CsrState

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "You are a home robot on patrol. Answer with one action."


def new_state(tokenizer, layout, profile: str = PROFILE) -> CsrState:
    return CsrState(tokenizer=tokenizer, layout=layout, profile=profile)


def feed(chunk_log: ChunkLog, records) -> None:
    """Append records as a reconciler does (its chunks, stream and versions)."""
    for r in records:
        if isinstance(r, ChunkRecord):
            chunk_log.append_chunk(Chunk(seq=r.seq, source=r.source, stamp_ns=r.stamp_ns,
                                         text=r.text, token_ids=()))
        elif isinstance(r, StreamRecord):
            chunk_log.append_stream(r.stream)
        else:
            chunk_log.append_version(r.version, r.first_seq, r.next_seq, r.reason)


def write(path: Path, records, **kwargs) -> list:
    records = list(records)
    with ChunkLog(path, fsync_interval_s=60, **kwargs) as chunk_log:
        feed(chunk_log, records)
    return records


def segment_records(path: Path) -> list[list]:
    return [scan(p.read_bytes(), where=str(p))[0] for p in segment_files(path)]


def chunk(seq: int, text: str | None = None) -> ChunkRecord:
    return ChunkRecord(seq=seq, source="cam", stamp_ns=1_000 * seq,
                       text=text or f"{seq}s camera: mug_{seq % 5} at 1.{seq % 9}0,0.25\n")


def names(numbers) -> tuple[str, ...]:
    return tuple(f"{n:012d}.seg" for n in numbers)


# -- rotation ----------------------------------------------------------------------------------

def test_a_version_record_ends_its_segment_and_what_follows_goes_into_a_new_one(tmp_path):
    path = tmp_path / "log"
    write(path, [StreamRecord("s1"), *map(chunk, range(5)), VersionRecord(1, 2, 5, "swap"),
                 *map(chunk, range(5, 8))])
    first, second = segment_records(path)
    assert first[0] == StreamRecord("s1") and first[-1] == VersionRecord(1, 2, 5, "swap")
    assert [r.seq for r in first if isinstance(r, ChunkRecord)] == [0, 1, 2, 3, 4]
    assert second[0] == StreamRecord("s1"), "every segment names its stream"
    assert [r.seq for r in second[1:]] == [5, 6, 7]


def test_a_segment_that_would_pass_max_segment_bytes_is_rotated_first(tmp_path):
    path = tmp_path / "log"
    records = write(path, [StreamRecord("s1"), *map(chunk, range(200))],
                    max_segment_bytes=4096)
    files = segment_files(path)
    assert len(files) >= 4
    assert all(f.stat().st_size <= 4096 for f in files)
    assert all(segment[0] == StreamRecord("s1") for segment in segment_records(path))
    assert [r for r in read_log(path) if isinstance(r, ChunkRecord)] == records[1:]


def test_a_log_that_cannot_be_created_is_a_chunk_log_error_that_says_where(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    with pytest.raises(ChunkLogError, match="a_file/log: cannot open the chunk log: .*Not a "
                                            "directory"):
        ChunkLog(tmp_path / "a_file" / "log")


def test_max_segment_bytes_below_the_minimum_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="max_segment_bytes must be at least 4096"):
        ChunkLog(tmp_path / "log", max_segment_bytes=100)


# -- checkpoints and restart -----------------------------------------------------------------

def test_a_restart_reads_only_the_segments_from_the_last_checkpoint_on(tmp_path):
    path = tmp_path / "log"
    write(path, synthetic_records(shaped(3000)))
    n_segments = len(segment_files(path))
    with ChunkLog(path) as chunk_log:
        checkpoint = chunk_log.checkpoint
        read = chunk_log.segments_read
        total = sum(p.stat().st_size for p in segment_files(path))
    assert n_segments == checkpoint.tail_segment + 1 > 15
    assert read == names(range(checkpoint.keep_segment, checkpoint.tail_segment + 1))
    assert len(read) == 2 and chunk_log.bytes_read < total / 5


def test_a_restart_from_the_checkpoint_rebuilds_the_state_of_the_whole_log(tmp_path, tokenizer,
                                                                          layout):
    path = tmp_path / "log"
    write(path, synthetic_records(shaped(1500)))
    whole = rebuild_state(read_log(path), new_state(tokenizer, layout))
    restarted = rebuild_state(ChunkLog(path).records, new_state(tokenizer, layout))
    assert restarted.static_ids == whole.static_ids
    assert (restarted.version, restarted.next_seq) == (whole.version, whole.next_seq)
    assert restarted.chunks == whole.chunks


def test_the_records_in_memory_are_what_a_restart_reads_and_stay_the_size_of_the_state(tmp_path):
    path = tmp_path / "log"
    with ChunkLog(path, fsync_interval_s=60) as chunk_log:
        sizes = []
        for record in synthetic_records(shaped(3000)):
            feed(chunk_log, [record])
            sizes.append(len(chunk_log.records))
        in_memory = list(chunk_log.records)
    assert in_memory == read_from_checkpoint(path)
    assert max(sizes) < 330, "trimmed at every checkpoint, never the whole history"


def test_a_chunk_logged_before_a_version_record_that_ends_below_it_stays_in_the_restart(
        tmp_path, tokenizer, layout):
    # A fallback used to log the chunk that forced it, then a version ending before that chunk
    # (the state of the version held it all the same). Such logs must still restart whole.
    path = tmp_path / "log"
    records = [chunk(s) for s in range(10)] + [VersionRecord(1, 5, 9, "fallback")] + \
        [chunk(s) for s in range(10, 13)]
    with ChunkLog(path, fsync_interval_s=60) as chunk_log:
        feed(chunk_log, records)
        in_memory = list(chunk_log.records)
    assert in_memory == read_from_checkpoint(path)
    restarted = rebuild_state(read_from_checkpoint(path), new_state(tokenizer, layout))
    whole = rebuild_state(read_log(path), new_state(tokenizer, layout))
    assert [c.seq for c in restarted.chunks] == list(range(5, 13)) == \
        [c.seq for c in whole.chunks]
    assert restarted.static_ids == whole.static_ids and restarted.version == 1


def test_records_that_begin_after_chunk_0_rebuild_a_state_that_starts_there_with_a_warning(
        tmp_path, tokenizer, layout, caplog):
    path = tmp_path / "log"
    write(path, [StreamRecord("s"), *map(chunk, range(40, 45))])
    with caplog.at_level(logging.WARNING, logger="csr_ros.chunklog"):
        state = rebuild_state(ChunkLog(path).records, new_state(tokenizer, layout))
    assert [c.seq for c in state.chunks] == [40, 41, 42, 43, 44] and state.next_seq == 45
    assert "the records begin at chunk 40, not 0" in caplog.text


def test_the_checkpoint_names_the_static_token_count_and_a_different_profile_is_warned_about(
        tmp_path, tokenizer, layout, caplog):
    path = tmp_path / "log"
    state = new_state(tokenizer, layout)
    with ChunkLog(path) as chunk_log:
        for i in range(6):
            for c in state.add(f"camera sees mug_{i}", source="cam", stamp_ns=i):
                chunk_log.append_chunk(c)
        state = state.evicted(2)
        chunk_log.append_version(state.version, state.chunks[0].seq, state.next_seq, "swap",
                                 n_static_tokens=state.n_static)
    assert ChunkLog(path).checkpoint.n_static_tokens == state.n_static
    with caplog.at_level(logging.WARNING, logger="csr_ros.chunklog"):
        same = rebuild_state(read_from_checkpoint(path), new_state(tokenizer, layout))
        assert "static tokens" not in caplog.text
        other = rebuild_state(read_from_checkpoint(path),
                              new_state(tokenizer, layout, "You are a different robot."))
    assert same.static_ids == state.static_ids
    assert f"has {other.n_static} static tokens, the log's writer had {state.n_static}" in \
        caplog.text


def test_a_damaged_checkpoint_falls_back_to_the_previous_one_then_to_every_segment(
        tmp_path, tokenizer, layout, caplog):
    path = tmp_path / "log"
    write(path, synthetic_records(shaped(1200)))
    expected = rebuild_state(read_log(path), new_state(tokenizer, layout)).static_ids
    newest = ChunkLog(path).checkpoint
    damaged = (path / "CHECKPOINT").read_bytes().replace(b'"next_seq', b'"nExt_seq')
    (path / "CHECKPOINT").write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="csr_ros.chunklog"):
        with ChunkLog(path) as chunk_log:
            assert chunk_log.checkpoint.version == newest.version - 1
            assert rebuild_state(chunk_log.records, new_state(tokenizer, layout)).static_ids \
                == expected
    assert "CHECKPOINT fails its checksum" in caplog.text
    for name in ("CHECKPOINT", "CHECKPOINT.prev"):
        (path / name).write_bytes(b"{")
    with ChunkLog(path) as chunk_log:
        assert chunk_log.checkpoint is None
        assert len(chunk_log.segments_read) == len(segment_files(path))
        assert rebuild_state(chunk_log.records, new_state(tokenizer, layout)).static_ids == \
            expected


def test_a_segment_the_checkpoint_needs_that_is_missing_is_a_clear_error(tmp_path):
    path = tmp_path / "log"
    write(path, synthetic_records(shaped(1200)))
    keep = ChunkLog(path).checkpoint.keep_segment
    (path / names([keep])[0]).unlink()
    with pytest.raises(ChunkLogError, match=f"{names([keep])[0]} is missing: checkpoint v"):
        ChunkLog(path)


# -- damage ------------------------------------------------------------------------------------

def test_a_torn_write_in_the_last_segment_is_truncated_after_rotations(tmp_path, caplog):
    path = tmp_path / "log"
    records = write(path, synthetic_records(shaped(1200)))
    last = segment_files(path)[-1]
    last.write_bytes(last.read_bytes()[:-4])
    with caplog.at_level(logging.WARNING, logger="csr_ros.chunklog"):
        with ChunkLog(path) as chunk_log:
            chunk_log.append_chunk(Chunk(seq=records[-1].seq, source="cam", stamp_ns=0,
                                         text="again\n", token_ids=()))
    assert "a crash while appending" in caplog.text and "truncating" in caplog.text
    chunks = [r for r in read_log(path) if isinstance(r, ChunkRecord)]
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert chunks[-1].text == "again\n"


def test_zeros_at_the_end_of_the_last_segment_are_a_torn_tail_not_corruption(tmp_path, caplog):
    path = tmp_path / "log"
    records = write(path, [StreamRecord("s"), *map(chunk, range(30))])
    last = segment_files(path)[-1]
    intact = last.read_bytes()
    last.write_bytes(intact + bytes(300))        # grown by a crash, its data never written
    with caplog.at_level(logging.WARNING, logger="csr_ros.chunklog"):
        with ChunkLog(path) as chunk_log:
            assert chunk_log.records == records
    assert f"ends in 300 zero bytes from byte {len(intact)}" in caplog.text
    assert last.read_bytes() == intact


def test_a_crc_mismatch_in_an_older_segment_is_a_chunk_log_error_naming_it(tmp_path):
    path = tmp_path / "log"
    write(path, [StreamRecord("s"), *map(chunk, range(300))], max_segment_bytes=4096)
    older = segment_files(path)[1]
    data = bytearray(older.read_bytes())
    data[len(MAGIC) + 12 + 3] ^= 0x01                  # one bit of its first record
    older.write_bytes(bytes(data))
    for read in (read_log, ChunkLog):
        with pytest.raises(ChunkLogError, match=f"{older.name}: record at byte 8 fails its "
                                                "checksum and more records follow"):
            read(path)
    assert older.read_bytes() == bytes(data), "nothing is truncated or skipped"


def test_a_bad_last_record_of_an_older_segment_is_corruption_not_a_torn_write(tmp_path):
    path = tmp_path / "log"
    write(path, [StreamRecord("s"), *map(chunk, range(300))], max_segment_bytes=4096)
    older = segment_files(path)[-2]
    data = bytearray(older.read_bytes())
    data[-2] ^= 0x01
    older.write_bytes(bytes(data))
    with pytest.raises(ChunkLogError, match="only the newest segment can end in one"):
        ChunkLog(path)


# -- retention ---------------------------------------------------------------------------------

def test_retention_by_size_archives_the_oldest_segments_a_checkpoint_no_longer_needs(
        tmp_path, tokenizer, layout):
    path, twin = tmp_path / "log", tmp_path / "twin"
    records = list(synthetic_records(shaped(2000)))
    write(twin, records)
    write(path, records, retention=Retention(retain_bytes=0))
    checkpoints = [read_from_checkpoint(path)[1]]
    prev = json.loads((path / "CHECKPOINT.prev").read_text())["body"]
    kept = [p.name for p in segment_files(path)]
    assert kept == list(names(range(prev["keep_segment"], checkpoints[0].tail_segment + 1)))
    archived = sorted(p.name for p in (path / "archive").iterdir())
    assert archived == list(names(range(prev["keep_segment"])))
    for name in archived:
        assert (path / "archive" / name).read_bytes() == (twin / name).read_bytes()
    assert rebuild_state(ChunkLog(path).records, new_state(tokenizer, layout)).static_ids == \
        rebuild_state(read_log(twin), new_state(tokenizer, layout)).static_ids


def test_retention_by_age_deletes_segments_older_than_retain_s_by_the_clock_given(tmp_path):
    path = tmp_path / "log"
    write(path, synthetic_records(shaped(2000)))
    n_segments = len(segment_files(path))
    now_s = time.time()
    for f in segment_files(path)[:4]:
        os.utime(f, (now_s - 10 * 86_400, now_s - 10 * 86_400))
    later = Retention(retain_s=86_400, action="delete")
    with ChunkLog(path, retention=later, clock=lambda: now_s):
        pass
    assert [p.name for p in segment_files(path)] == list(names(range(4, n_segments)))
    assert not (path / "archive").exists()
    prev = json.loads((path / "CHECKPOINT.prev").read_text())["body"]
    with ChunkLog(path, retention=later, clock=lambda: now_s + 2 * 86_400):
        pass
    assert [p.name for p in segment_files(path)] == \
        list(names(range(prev["keep_segment"], n_segments))), "all but what the checkpoints need"


def test_retention_never_drops_a_segment_that_holds_chunks_of_the_active_state(
        tmp_path, tokenizer, layout):
    path = tmp_path / "log"
    records = [StreamRecord("s"), *map(chunk, range(300)), VersionRecord(1, 10, 300, "swap"),
               *map(chunk, range(300, 310))]
    write(path, records, max_segment_bytes=4096, retention=Retention(retain_bytes=0))
    holds_10 = next(p for p in segment_files(tmp_path / "log")
                    if any(getattr(r, "seq", None) == 10 for r in scan(p.read_bytes())[0]))
    assert holds_10.name == names([ChunkLog(path).checkpoint.keep_segment])[0]
    assert segment_files(path)[0] == holds_10, "everything before it went, nothing after"
    state = rebuild_state(ChunkLog(path).records, new_state(tokenizer, layout))
    assert [c.seq for c in state.chunks] == list(range(10, 310))


def test_retention_drops_nothing_of_a_log_that_keeps_state_before_its_first_checkpoint(tmp_path):
    path = tmp_path / "log"
    write(path, [StreamRecord("s"), *map(chunk, range(300))], max_segment_bytes=4096,
          retention=Retention(retain_bytes=0))
    assert segment_files(path)[0].name == names([0])[0]


def test_a_history_only_log_drops_old_segments_and_a_restart_goes_on_with_its_seq_and_stream(
        tmp_path):
    path = tmp_path / "log"
    history = Retention(retain_bytes=9000, action="delete", keep_state=False)
    with ChunkLog(path, max_segment_bytes=4096, retention=history) as chunk_log:
        feed(chunk_log, [StreamRecord("agg1"), *map(chunk, range(400))])
        in_memory = [r.seq for r in chunk_log.records if isinstance(r, ChunkRecord)]
    files = segment_files(path)
    assert files[0].name != names([0])[0] and sum(f.stat().st_size for f in files) <= 9000 + 4096
    on_disk = [r.seq for r in read_log(path) if isinstance(r, ChunkRecord)]
    assert in_memory == on_disk == list(range(on_disk[0], 400)), "memory trimmed with the disk"
    with ChunkLog(path, max_segment_bytes=4096, retention=history) as chunk_log:
        records = chunk_log.records
        assert [r.stream for r in records if isinstance(r, StreamRecord)][-1] == "agg1"
        assert [r.seq for r in records if isinstance(r, ChunkRecord)][-1] == 399


def test_compressed_archives_read_back_to_the_segments_bytes(tmp_path):
    path, twin = tmp_path / "log", tmp_path / "twin"
    records = [StreamRecord("s"), *map(chunk, range(300)), VersionRecord(1, 290, 300, "swap")]
    write(twin, records, max_segment_bytes=4096)
    write(path, records, max_segment_bytes=4096,
          retention=Retention(retain_bytes=0, compress=True))
    archived = sorted((path / "archive").iterdir())
    assert archived and all(p.suffix == ".gz" for p in archived)
    for p in archived:
        assert gzip.decompress(p.read_bytes()) == (twin / p.stem).read_bytes()


def test_bad_retention_parameters_are_config_errors():
    with pytest.raises(ConfigError, match="retain_bytes must be >= 0"):
        Retention(retain_bytes=-1)
    with pytest.raises(ConfigError, match="action must be one of"):
        Retention(action="shred")
    with pytest.raises(ConfigError, match="compress applies to archived"):
        Retention(action="delete", compress=True)


# -- logs of the first format -------------------------------------------------------------------

def old_format_log(path: Path, bodies: list[dict]) -> bytes:
    """A log file byte for byte as the single-file writer (before segments) wrote it."""
    out = bytearray(b"CSRLOG1\n")
    for body in bodies:
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        length = struct.pack("<I", len(payload))
        out += length + struct.pack("<II", zlib.crc32(length), zlib.crc32(payload)) + payload
    path.write_bytes(bytes(out))
    return bytes(out)


OLD_BODIES = [{"k": "stream", "id": "old"}] + \
    [{"k": "chunk", "seq": i, "source": "cam", "stamp_ns": i, "text": f"t={i}s mug_{i} ü\n"}
     for i in range(6)] + \
    [{"k": "version", "version": 1, "first_seq": 3, "next_seq": 6, "reason": "swap"},
     {"k": "chunk", "seq": 6, "source": "cam", "stamp_ns": 6, "text": "t=6s after\n"}]


def test_an_old_single_file_log_is_read_in_place_and_left_as_it_is(tmp_path, tokenizer, layout):
    path = tmp_path / "chunks.log"
    data = old_format_log(path, OLD_BODIES)
    records = read_log(path)
    assert records[0] == StreamRecord("old") and records[7] == VersionRecord(1, 3, 6, "swap")
    assert read_from_checkpoint(path) == records
    state = rebuild_state(records, new_state(tokenizer, layout))
    assert [c.seq for c in state.chunks] == [3, 4, 5, 6] and state.version == 1
    assert path.read_bytes() == data


def test_an_old_single_file_log_becomes_segment_0_when_opened_for_appending(tmp_path, tokenizer,
                                                                            layout):
    path = tmp_path / "chunks.log"
    data = old_format_log(path, OLD_BODIES)
    old_records = read_log(path)
    with ChunkLog(path) as chunk_log:
        assert chunk_log.records == old_records
        chunk_log.append_chunk(Chunk(seq=7, source="cam", stamp_ns=7, text="t=7s new\n",
                                     token_ids=()))
        chunk_log.append_version(2, 5, 8, "swap")
    assert path.is_dir()
    assert (path / names([0])[0]).read_bytes()[:len(data)] == data, "the file, byte for byte"
    state = rebuild_state(ChunkLog(path).records, new_state(tokenizer, layout))
    assert [c.text for c in state.chunks] == ["t=5s mug_5 ü\n", "t=6s after\n", "t=7s new\n"]
    assert state.version == 2


def test_an_old_log_with_a_torn_tail_is_repaired_before_it_becomes_segment_0(tmp_path, caplog):
    path = tmp_path / "chunks.log"
    data = old_format_log(path, OLD_BODIES)
    path.write_bytes(data[:-3])
    with caplog.at_level(logging.WARNING, logger="csr_ros.chunklog"):
        with ChunkLog(path) as chunk_log:
            assert len(chunk_log.records) == len(OLD_BODIES) - 1
    assert "a crash while appending" in caplog.text
    assert len(read_log(path)) == len(OLD_BODIES) - 1


def test_a_migration_cut_between_its_two_renames_is_finished_on_the_next_open(tmp_path):
    path = tmp_path / "chunks.log"
    migrating = tmp_path / "chunks.log.migrating"
    migrating.mkdir()
    data = old_format_log(migrating / names([0])[0], OLD_BODIES)
    assert len(read_log(path)) == len(OLD_BODIES), "readers find it in the meantime"
    with ChunkLog(path) as chunk_log:
        assert len(chunk_log.records) == len(OLD_BODIES)
    assert not migrating.exists() and (path / names([0])[0]).read_bytes() == data


# -- one writer ---------------------------------------------------------------------------------

HOLD_OPEN = """
import sys, time
from csr_ros.chunklog import ChunkLog
log = ChunkLog(sys.argv[1])
print("open", flush=True)
time.sleep(600)
"""


def test_a_second_process_cannot_write_the_log_and_a_killed_writer_leaves_nothing_to_clean(
        tmp_path):
    path = tmp_path / "log"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, str(path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(ChunkLogError, match=rf"open for writing in another process \(pid "
                                                rf"{holder.pid}\)"):
            ChunkLog(path)
    finally:
        holder.kill()
        holder.wait()
    with ChunkLog(path) as chunk_log:
        chunk_log.append_stream("after the kill")
    assert read_log(path) == [StreamRecord("after the kill")]


def test_a_second_writer_in_the_same_process_is_refused_until_the_first_is_closed(tmp_path):
    path = tmp_path / "log"
    first = ChunkLog(path)
    with pytest.raises(ChunkLogError, match="already open for writing in this process"):
        ChunkLog(path)
    first.close()
    with ChunkLog(path) as second:
        second.append_stream("s")
    assert read_log(path) == [StreamRecord("s")]


# -- the restart benchmark ----------------------------------------------------------------------

def test_the_bulk_synthetic_log_is_byte_for_byte_what_the_writer_writes(tmp_path):
    records = list(synthetic_records(shaped(1500)))
    write(tmp_path / "writer", records)
    write_synthetic_log(tmp_path / "bulk", iter(records))
    writer, bulk = segment_files(tmp_path / "writer"), segment_files(tmp_path / "bulk")
    assert [p.name for p in writer] == [p.name for p in bulk]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(writer, bulk))
    for name in ("CHECKPOINT", "CHECKPOINT.prev"):
        a, b = (json.loads((tmp_path / d / name).read_text())["body"] for d in ("writer", "bulk"))
        a.pop("written_unix_s"), b.pop("written_unix_s")
        assert a == b


def test_bench_restart_reads_as_many_segments_for_a_long_history_as_for_a_short_one(tmp_path):
    report = bench_restart(tmp_path, behind=(1_000, 20_000), ages_s=(3_600, 86_400),
                           repeats=1, model=None)
    cases = report["cases"]
    assert set(cases) == {"behind_1000", "behind_20000", "age_3600s", "age_1d"}
    assert cases["behind_20000"]["chunks_behind_checkpoint"] >= 20_000
    assert cases["age_1d"]["chunks"] > 35_000 and report["chunks_per_robot_year"] > 13e6
    assert len({c["segments_read"] for c in cases.values()}) == 1
    read = [c["bytes_read"] for c in cases.values()]
    assert max(read) < 1.05 * min(read), "the same state read, whatever lies behind it"
    assert set(report["ratios"]) == {"behind_20000_over_behind_1000", "age_1d_over_age_3600s"}
    assert all(set(r) == {"median", "min"} for r in report["ratios"].values())
    assert not any((tmp_path / name).exists() for name in cases), "removed unless kept"
    json.dumps(report)
