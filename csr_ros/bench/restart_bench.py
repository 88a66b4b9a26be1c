"""Restart time against the robot's age, on synthetic chunk logs.

A synthetic log is what a reconciler writes over a robot's life at the measured history growth:
chunks of patrol-like text, and at `tau_mem` a version that evicts the oldest half (a segment
and a checkpoint each). Its segments are written in bulk (no fsync per record: a year of them
is 13 million records) by `write_synthetic_log`, byte for byte what `ChunkLog` writes for the
same records (a test holds it to that). A restart is `ChunkLog(path)` and `rebuild_state` with
the real tokenizer: the first run of each log is a warm-up, left out of the figures.

Figures behind the defaults:
- 8 tokens per robot-second: the history growth measured with `csr-ros replay --stats` on patrol
  bags (docs/fleet_at_scale.md);
- 19.2 tokens per chunk: the same replay of a 600-s patrol with config/csr_ros.yaml, 4359 tokens
  in 227 chunks; so 0.42 chunks per robot-second, 36,000 a day, 13.1 million a year;
- tau_mem 6144 tokens (the shipped default): 320 chunks, a version every 160.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

from csr_ros.chunklog.fold import rebuild_state
from csr_ros.chunklog.logdir import CHECKPOINT, segment_name, write_checkpoint
from csr_ros.chunklog.records import (MAGIC, Checkpoint, ChunkRecord, StreamRecord,
                                      VersionRecord, encode_record)
from csr_ros.chunklog.writer import DEFAULT_MAX_SEGMENT_BYTES, ChunkLog
from csr_ros.errors import ConfigError
from csr_ros.state import Seq, Version

TOKENS_PER_S = 8.0
TOKENS_PER_CHUNK = 19.2
TAU_MEM_TOKENS = 6144
STATE_CHUNKS = round(TAU_MEM_TOKENS / TOKENS_PER_CHUNK)     # 320: the state at tau_mem
EVICT_CHUNKS = STATE_CHUNKS // 2                            # the oldest half goes
TAIL_CHUNKS = EVICT_CHUNKS // 2                             # logged after the last version
DAY_S = 86_400
YEAR_S = 365 * DAY_S
STREAM = "synthetic"
BYTES_PER_CHUNK_BOUND = 160        # a record is about 100 bytes; the rest is headroom
_PLACES = ("kitchen", "bathroom", "hall", "bedroom", "office", "dock")


def chunks_in(robot_s: float) -> int:
    """Chunks a robot logs in `robot_s` seconds at the measured growth."""
    return int(robot_s * TOKENS_PER_S / TOKENS_PER_CHUNK)


def shaped(n_chunks: int) -> int:
    """The run length nearest `n_chunks` that ends TAIL_CHUNKS after a version, so that logs of
    every age end in the same state: STATE_CHUNKS + k * EVICT_CHUNKS + TAIL_CHUNKS."""
    k = max(0, round((n_chunks - STATE_CHUNKS - TAIL_CHUNKS) / EVICT_CHUNKS))
    return STATE_CHUNKS + k * EVICT_CHUNKS + TAIL_CHUNKS


def chunk_text(seq: int) -> str:
    """Patrol-like chunk text, about TOKENS_PER_CHUNK tokens, different for every seq.

    Every number is cyclic or of fixed width, the episode time too (10,000 s + its remainder
    modulo 90,000 s), so that a log of any age ends in a state of the same token count. A real
    robot's episode times grow a digit each tenfold age: that costs in proportion to the state
    a restart folds, never to the history behind it, which is what is measured here.
    """
    t_s = 10_000 + int(seq * TOKENS_PER_CHUNK / TOKENS_PER_S) % 90_000
    x, y = (seq * 37 % 211) / 10 - 10, (seq * 53 % 197) / 10 - 9
    place = _PLACES[seq % len(_PLACES)]
    bodies = (f"odom: at {x:.1f},{y:.1f} heading {seq * 29 % 360 - 180} moving",
              f"scan: nearest {seq % 30 / 10 + 0.2:.1f}m front-left, blocked ahead 0.9m",
              f"battery: {100 - seq % 97}% discharging",
              f"detections: cup 0.{seq % 90 + 10} at {x:.1f},{y:.1f}, person 0.{seq % 70 + 20}",
              f"speech: alice: please bring me the towel from the {place}",
              f"nav_status: {seq % 65536:04x} succeeded",
              f"actions: navigate_to_pose({place}): succeeded")
    body = bodies[seq % len(bodies)]
    return f"{t_s}s {body}\n"


def synthetic_records(n_chunks: int) -> Iterator[ChunkRecord | VersionRecord | StreamRecord]:
    """A reconciler's records over `n_chunks` chunks: its stream, the chunks, and a swap that
    evicts the oldest half each time the state reaches STATE_CHUNKS."""
    yield StreamRecord(STREAM)
    first, version = 0, 0
    for seq in range(n_chunks):
        yield ChunkRecord(seq=Seq(seq), source="patrol",
                          stamp_ns=int(seq * TOKENS_PER_CHUNK / TOKENS_PER_S * 1e9),
                          text=chunk_text(seq))
        if seq + 1 - first >= STATE_CHUNKS:
            first, version = first + EVICT_CHUNKS, version + 1
            yield VersionRecord(version=Version(version), first_seq=Seq(first),
                                next_seq=Seq(seq + 1), reason="swap")


def write_synthetic_log(path: Path, records: Iterator, *,
                        max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES) -> dict:
    """Write `records` as `ChunkLog` would (segments, rotation, the last two checkpoints), in
    bulk: one write per segment, no fsync. For benchmarks and tests, never for a robot."""
    path.mkdir(parents=True)
    segment, buffer, stream = 0, bytearray(MAGIC), ""
    chunk_seqs: dict[int, int] = {}
    checkpoints: list[Checkpoint] = []
    n_bytes = n_chunks = n_versions = 0

    def rotate() -> None:
        nonlocal segment, buffer, n_bytes
        (path / segment_name(segment)).write_bytes(buffer)
        n_bytes += len(buffer)
        segment += 1
        buffer = bytearray(MAGIC)
        if stream:
            buffer += encode_record(StreamRecord(stream))

    for record in records:
        data = encode_record(record)
        if len(buffer) + len(data) > max_segment_bytes and len(buffer) > len(MAGIC):
            rotate()
        buffer += data
        if isinstance(record, ChunkRecord):
            chunk_seqs[segment] = max(chunk_seqs.get(segment, -1), int(record.seq))
            n_chunks += 1
        elif isinstance(record, StreamRecord):
            stream = record.stream
        else:
            n_versions += 1
            if record.reason == "stream":
                chunk_seqs.clear()
            rotate()
            keep = min((n for n, top in chunk_seqs.items() if top >= record.first_seq),
                       default=segment) if record.first_seq < record.next_seq else segment
            chunk_seqs = {n: top for n, top in chunk_seqs.items() if n >= keep}
            checkpoints = checkpoints[-1:] + [Checkpoint(
                version=record.version, first_seq=record.first_seq, next_seq=record.next_seq,
                n_static_tokens=None, stream=stream, keep_segment=keep, tail_segment=segment,
                tail_offset=len(MAGIC))]
    (path / segment_name(segment)).write_bytes(buffer)
    n_bytes += len(buffer)
    for checkpoint in checkpoints:
        write_checkpoint(path, replace(checkpoint, written_unix_s=time.time()))
    return {"chunks": n_chunks, "versions": n_versions, "segments": segment + 1,
            "log_bytes": n_bytes}


def restart_once(path: Path, empty_state: Callable | None) -> dict:
    """Open the log as a restart does and fold what it reads into a state."""
    started = time.perf_counter()
    with ChunkLog(path) as chunk_log:
        opened = time.perf_counter()
        state = rebuild_state(chunk_log.records, empty_state()) if empty_state else None
        folded = time.perf_counter()
        return {"restart_s": folded - started, "open_s": opened - started,
                "rebuild_s": folded - opened, "segments_read": len(chunk_log.segments_read),
                "bytes_read": chunk_log.bytes_read, "records_folded": len(chunk_log.records),
                "state_chunks": len(state.chunks) if state else None,
                "static_tokens": state.n_static if state else None}


def bench_restart(work_dir: str | Path, *, behind: tuple[int, ...] = (1_000, 1_000_000),
                  ages_s: tuple[float, ...] = (DAY_S, YEAR_S), repeats: int = 5,
                  model: str | None = "smollm2", keep: bool = False,
                  progress: Callable[[str], None] | None = None) -> dict:
    """Restart time of synthetic logs with `behind` chunks before their last checkpoint, and
    of logs of robots `ages_s` seconds old. Every log ends in the same state (TAIL_CHUNKS
    after a version), so what differs is the history behind it.

    All logs are written first; then one warm-up restart of each, left out, and `repeats`
    rounds that restart each log once in turn, so that the load of a shared machine falls on
    every log alike. `model`: whose tokenizer rebuilds the state (None: the log is only opened
    and read). Logs are written under `work_dir` and removed afterwards unless `keep`.
    """
    say = progress or (lambda line: None)
    empty_state = _empty_state_factory(model) if model else None
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    cases = [(f"behind_{n}", shaped(n + TAIL_CHUNKS)) for n in behind] + \
        [(f"age_{_age_name(s)}", shaped(chunks_in(s))) for s in ages_s]
    report: dict = {"tokens_per_robot_s": TOKENS_PER_S, "tokens_per_chunk": TOKENS_PER_CHUNK,
                    "chunks_per_robot_day": chunks_in(DAY_S),
                    "chunks_per_robot_year": chunks_in(YEAR_S),
                    "tau_mem_tokens": TAU_MEM_TOKENS, "state_chunks_at_tau_mem": STATE_CHUNKS,
                    "repeats": repeats, "tokenizer": model, "cases": {}}
    try:
        for name, n_chunks in cases:
            report["cases"][name] = _build(work_dir / name, n_chunks, say)
        samples: dict[str, list[dict]] = {name: [] for name, _ in cases}
        for round_ in range(repeats + 1):
            say(f"restart round {round_ + 1} of {repeats + 1}" + (" (warm-up)" if not round_
                                                                  else ""))
            order = [name for name, _ in cases]
            for name in order[round_ % len(order):] + order[:round_ % len(order)]:
                run = restart_once(work_dir / name, empty_state)
                if round_:
                    samples[name].append(run)
        for name, runs in samples.items():
            report["cases"][name].update(_summary(runs))
    finally:
        if not keep:
            for name, _ in cases:
                shutil.rmtree(work_dir / name, ignore_errors=True)
    report["ratios"] = _ratios(report["cases"])
    return report


def _build(path: Path, n_chunks: int, say: Callable[[str], None]) -> dict:
    if path.exists():
        shutil.rmtree(path)
    need = n_chunks * BYTES_PER_CHUNK_BOUND
    if disk_free_bytes(path.parent) < need:
        raise ConfigError(f"{path.parent}: {path.name} needs about {need / 1e9:.1f} GB of disk "
                          f"({n_chunks:,} chunks), {disk_free_bytes(path.parent) / 1e9:.1f} GB "
                          "free: give another directory or leave that case out")
    say(f"{path.name}: writing {n_chunks:,} chunks")
    started = time.perf_counter()
    built = write_synthetic_log(path, synthetic_records(n_chunks))
    built["build_s"] = time.perf_counter() - started
    built["chunks_behind_checkpoint"] = json.loads((path / CHECKPOINT).read_text())["body"][
        "next_seq"]
    say(f"{path.name}: {built['log_bytes'] / 1e6:,.1f} MB in {built['segments']:,} segments "
        f"({built['build_s']:.1f} s)")
    return built


def _summary(runs: list[dict]) -> dict:
    restart = [r["restart_s"] for r in runs]
    last = runs[-1]
    return {"restart_s": {"median": statistics.median(restart), "min": min(restart),
                          "max": max(restart)},
            "open_s": statistics.median(r["open_s"] for r in runs),
            "rebuild_s": statistics.median(r["rebuild_s"] for r in runs),
            **{k: last[k] for k in ("segments_read", "bytes_read", "records_folded",
                                    "state_chunks", "static_tokens")}}


def _ratios(cases: dict) -> dict:
    names = list(cases)
    behind = [n for n in names if n.startswith("behind_")]
    ages = [n for n in names if n.startswith("age_")]
    out = {}
    for group in (behind, ages):
        if len(group) >= 2:
            small, large = group[0], group[-1]
            out[f"{large}_over_{small}"] = {
                stat: cases[large]["restart_s"][stat] / cases[small]["restart_s"][stat]
                for stat in ("median", "min")}
    return out


def _age_name(seconds: float) -> str:
    if seconds % YEAR_S == 0:
        return f"{int(seconds // YEAR_S)}y"
    if seconds % DAY_S == 0:
        return f"{int(seconds // DAY_S)}d"
    return f"{int(seconds)}s"


def _empty_state_factory(model: str) -> Callable:
    from csr_ros.layout import Layout
    from csr_ros.model_store import resolve_model_dir
    from csr_ros.state import CsrState
    from csr_ros.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(resolve_model_dir(model, weights=False))
    layout = Layout.from_tokenizer(tokenizer)
    profile = "You are a home robot on patrol. Answer with one action."
    return lambda: CsrState(tokenizer=tokenizer, layout=layout, profile=profile)


def disk_free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize
