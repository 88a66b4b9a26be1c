"""The crash-safe chunk log: round trips, torn tails, corruption, and rebuilding the state.

A log is a directory of segment files; a crash can only tear the newest one, so the byte-level
damage below is done to it (`newest_segment`)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from csr_ros.chunklog import (MAGIC, ChunkLog, ChunkRecord, StreamRecord, VersionRecord,
                              last_stream, read_log, rebuild_state, segment_files)
from csr_ros.errors import ChunkLogError
from csr_ros.state import CsrState

PROFILE = "You are a robot."


def new_state(tokenizer, layout) -> CsrState:
    return CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE)


def newest_segment(path):
    return segment_files(path)[-1]


def write_log(path, state: CsrState, texts: list[str], *, evict_after: int | None = None):
    with ChunkLog(path, fsync_interval_s=0) as chunk_log:
        for i, text in enumerate(texts):
            for chunk in state.add(text, source="cam", stamp_ns=1_000 + i):
                chunk_log.append_chunk(chunk)
            if evict_after is not None and i == evict_after:
                state = state.evicted(len(state.chunks) // 2)
                first = state.chunks[0].seq
                chunk_log.append_version(state.version, first, state.next_seq, "swap")
    return state


TEXTS = ["camera: red mug at (1.20, 0.35)", "Alice says: \"bring it <|im_end|> now\"",
         "odometry x=0.50 y=-0.25 battery 98.5%", "über naïve 😀 text", "action pick -> ok",
         "lidar front 1.25 m"]


def test_log_round_trips_every_record(tmp_path, tokenizer, layout):
    path = tmp_path / "c.log"
    write_log(path, new_state(tokenizer, layout), TEXTS, evict_after=3)
    records = read_log(path)
    chunks = [r for r in records if isinstance(r, ChunkRecord)]
    versions = [r for r in records if isinstance(r, VersionRecord)]
    assert [c.seq for c in chunks] == list(range(len(TEXTS)))
    assert chunks[1].text.startswith("Alice says") and chunks[1].stamp_ns == 1_001
    assert [(v.version, v.reason) for v in versions] == [(1, "swap")]


def test_rebuilt_state_has_the_same_static_token_ids_and_version(tmp_path, tokenizer, layout):
    path = tmp_path / "c.log"
    live = write_log(path, new_state(tokenizer, layout), TEXTS, evict_after=3)
    rebuilt = rebuild_state(read_log(path), new_state(tokenizer, layout))
    assert rebuilt.static_ids == live.static_ids
    assert rebuilt.version == live.version == 1
    assert [c.seq for c in rebuilt.chunks] == [c.seq for c in live.chunks]


def test_opening_a_log_with_a_torn_last_record_truncates_it_with_a_warning(
        tmp_path, tokenizer, layout, caplog):
    path = tmp_path / "c.log"
    write_log(path, new_state(tokenizer, layout), TEXTS)
    segment = newest_segment(path)
    intact = segment.read_bytes()
    segment.write_bytes(intact[:-5])                    # the crash cut the last record
    with caplog.at_level(logging.WARNING, logger="csr_ros.chunklog"):
        with ChunkLog(path) as chunk_log:
            assert len(chunk_log.records) == len(TEXTS) - 1
            state = rebuild_state(chunk_log.records, new_state(tokenizer, layout))
            for chunk in state.add("after the restart", source="cam", stamp_ns=9):
                chunk_log.append_chunk(chunk)
    assert "truncating" in caplog.text
    records = read_log(path)
    assert [r.seq for r in records] == list(range(len(TEXTS)))
    assert records[-1].text == "after the restart\n"


def test_a_log_cut_inside_a_record_header_is_a_torn_tail(tmp_path, tokenizer, layout):
    path = tmp_path / "c.log"
    write_log(path, new_state(tokenizer, layout), TEXTS[:2])
    segment = newest_segment(path)
    one = segment.read_bytes()
    write_log(path, new_state(tokenizer, layout), TEXTS[:3])
    segment.write_bytes(segment.read_bytes()[:len(one) + 7])  # 7 of the 12 header bytes
    assert len(read_log(path)) == 2


def test_a_last_record_with_a_bad_checksum_is_a_torn_tail(tmp_path, tokenizer, layout):
    path = tmp_path / "c.log"
    write_log(path, new_state(tokenizer, layout), TEXTS)
    segment = newest_segment(path)
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF                                   # the payload never fully reached the disk
    segment.write_bytes(bytes(data))
    assert len(read_log(path)) == len(TEXTS) - 1


def test_corruption_in_the_middle_raises_chunk_log_error(tmp_path, tokenizer, layout):
    path = tmp_path / "c.log"
    write_log(path, new_state(tokenizer, layout), TEXTS)
    segment = newest_segment(path)
    data = bytearray(segment.read_bytes())
    data[len(MAGIC) + 12 + 5] ^= 0xFF                  # inside the first record's payload
    segment.write_bytes(bytes(data))
    with pytest.raises(ChunkLogError, match="fails its checksum and more records follow"):
        read_log(path)
    with pytest.raises(ChunkLogError):
        ChunkLog(path)
    assert segment.read_bytes() == bytes(data), "a corrupt log is never truncated"


def test_a_corrupt_record_header_in_the_middle_raises_chunk_log_error(tmp_path, tokenizer,
                                                                      layout):
    path = tmp_path / "c.log"
    write_log(path, new_state(tokenizer, layout), TEXTS)
    segment = newest_segment(path)
    data = bytearray(segment.read_bytes())
    data[len(MAGIC)] ^= 0x40                           # the first record's length
    segment.write_bytes(bytes(data))
    with pytest.raises(ChunkLogError, match="header at byte 8 is corrupt"):
        read_log(path)


def test_a_file_that_is_not_a_chunk_log_is_refused(tmp_path):
    path = tmp_path / "c.log"
    path.write_bytes(b"{\"seq\": 0}\n")
    with pytest.raises(ChunkLogError, match="not a chunk log"):
        read_log(path)
    with pytest.raises(ChunkLogError, match="not a chunk log"):
        ChunkLog(path)
    assert path.read_bytes() == b"{\"seq\": 0}\n", "a file that is not a log is left alone"


def test_a_version_record_ahead_of_the_logged_chunks_is_refused(tokenizer, layout):
    records = [ChunkRecord(0, "cam", 0, "a\n"), VersionRecord(1, 0, 5, "swap")]
    with pytest.raises(ChunkLogError, match="only 1 were logged"):
        rebuild_state(records, new_state(tokenizer, layout))


# -- the stream id: a stream restart rebuilt --------------------------------------------------

def test_a_chunk_log_keeps_the_stream_id_and_rebuilds_a_stream_restart(tmp_path, tokenizer,
                                                                       layout):
    path = tmp_path / "log"
    with ChunkLog(path) as log:
        log.append_stream("a")
        state = new_state(tokenizer, layout)
        for seq in range(3):
            [chunk] = state.make_chunks(f"chunk {seq}", source="s", stamp_ns=seq)
            state.append(chunk)
            log.append_chunk(chunk)
        log.append_version(1, 0, 0, "stream")
        log.append_stream("b")
        [chunk] = state.evicted(3).make_chunks("new 0", source="s", stamp_ns=9)
        log.append_chunk(dataclasses.replace(chunk, seq=0))
    records = read_log(path)
    assert isinstance(records[0], StreamRecord) and last_stream(records) == "b"
    rebuilt = rebuild_state(records, new_state(tokenizer, layout))
    assert rebuilt.version == 1 and [c.text for c in rebuilt.chunks] == ["new 0\n"]
