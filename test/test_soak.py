"""A short soak with every fault kind once (csr-ros soak, on the real engines in worker processes,
the real chunk log on its own small file system): nothing lost, every fault recovered, the
state equal to the one its chunk log rebuilds. No timing is asserted; docs/reliability.md has
the long runs and their figures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from csr_ros.errors import ConfigError
from csr_ros.soak import FAULT_KINDS, SoakSettings, parse_faults
from csr_ros.soak.audit import audit_log
from csr_ros.soak.faults import FaultPlan
from csr_ros.soak.state_host import AT_RISK_LAG_S, risk_tokens
from csr_ros.soak.summary import FaultRecord, ProcessSeries, kill_host_restarts
from csr_ros.soak.traffic import Aggregator, PatrolTraffic, read_sent, text_crc

ROOT = Path(__file__).resolve().parents[1]


def test_a_fault_plan_brings_every_kind_once_per_round_in_a_seeded_order():
    plan = FaultPlan(tuple(FAULT_KINDS), every_s=60.0, seed=3)
    first = [plan.next() for _ in range(len(FAULT_KINDS))]
    again = FaultPlan(tuple(FAULT_KINDS), every_s=60.0, seed=3)
    assert sorted(kind for _, kind in first) == sorted(FAULT_KINDS)
    assert [again.next() for _ in range(len(FAULT_KINDS))] == first
    times = [at for at, _ in first]
    assert times == sorted(times) and all(30.0 <= b - a <= 90.0 for a, b in
                                          zip([0.0] + times, times))


def test_a_soak_whose_next_fault_falls_after_its_end_closes_with_a_kill_host_once():
    plan = FaultPlan(tuple(FAULT_KINDS), every_s=60.0, seed=3)
    assert plan.closing(None) == "kill_host" and plan.closing("double") == "kill_host"
    assert plan.closing("kill_host") is None, "not two restarts in a row"
    assert FaultPlan(("stall", "double"), every_s=60.0, seed=3).closing("stall") is None


def test_the_last_kill_host_restart_is_given_against_the_first():
    def kill_host(at_h: float, restart_s: float | None) -> FaultRecord:
        return FaultRecord(kind="kill_host", at_s=at_h * 3600.0, wall_at_s=0.0,
                           extra={} if restart_s is None else {"restart_s": restart_s})

    faults = [kill_host(0.8, 4.0), FaultRecord(kind="double", at_s=9.0 * 3600, wall_at_s=0.0,
                                               extra={"restart_s": 9.0}),
              kill_host(12.0, None), kill_host(23.4, 5.0)]
    assert kill_host_restarts(faults) == {"kill_host": [[0.8, 4.0], [23.4, 5.0]],
                                          "last_over_first": 1.25}
    assert kill_host_restarts(faults[:1]) == {"kill_host": [[0.8, 4.0]],
                                              "last_over_first": None}


def test_fault_lists_and_settings_are_checked_with_clear_errors():
    assert parse_faults("all") == tuple(FAULT_KINDS) and parse_faults("none") == ()
    assert parse_faults("kill_host, disk_full") == ("kill_host", "disk_full")
    with pytest.raises(ConfigError, match="unknown fault kinds"):
        parse_faults("kill_host,meteor")
    with pytest.raises(ConfigError, match="give both --r1 and --r2"):
        SoakSettings(resource="openai", r1="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="exceed max_context_tokens"):
        SoakSettings(tau_mem_tokens=4000, max_context_tokens=4096, reserve_tokens=128)


def test_the_patrol_traffic_is_gap_free_and_every_chunk_sent_is_on_record(tmp_path):
    aggregator = Aggregator(PatrolTraffic(seed=1), ring_chunks=64, sent_path=tmp_path / "sent")
    events = aggregator.advance(900.0) + aggregator.malformed_burst()
    aggregator.close()
    assert [e.seq for e in events] == list(range(len(events)))
    assert {e.source for e in events} >= {"odom", "scan", "battery_state", "malformed"}
    sent = list(read_sent(tmp_path / "sent"))
    assert [(s, crc) for s, crc, _ in sent] == [(e.seq, text_crc(e.text)) for e in events]
    assert sum(m for _, _, m in sent) >= 7, "the burst is marked malformed"
    ring, first = aggregator.since(0)
    assert len(ring) == 64 and first == events[-64].seq, "the ring keeps the newest only"


def test_the_audit_finds_a_lost_a_duplicated_and_a_reordered_chunk(tmp_path):
    from csr_ros.chunklog import ChunkLog
    from csr_ros.state import Chunk

    aggregator = Aggregator(PatrolTraffic(seed=2), ring_chunks=64, sent_path=tmp_path / "sent")
    events = aggregator.advance(600.0)[:12]
    aggregator.close()
    order = [0, 1, 2, 4, 3, 5, 6, 6, 8, 9, 10, 11]          # 3/4 swapped, 6 twice, 7 missing
    with ChunkLog(tmp_path / "log") as chunk_log:
        for seq in order:
            e = events[seq]
            chunk_log.append_chunk(Chunk(seq=seq, source=e.source, stamp_ns=e.stamp_ns,
                                         text=e.text.strip() + "\n", token_ids=()))
    with open(tmp_path / "sent", "r+b") as f:             # only the first 12 were "sent"
        f.truncate(12 * 5)
    audit = audit_log(tmp_path / "log", tmp_path / "sent")
    assert (audit.sent, audit.lost, audit.duplicated, audit.reordered) == (12, 1, 1, 1)
    assert audit.found == 11 and not audit.ok


def test_memory_slope_is_taken_per_process_once_warm_and_weighted_by_its_life():
    series = ProcessSeries("state")
    for i in range(200):                     # 2 robot-hours growing 1 MB/h after a warm-up
        series.samples.append((i * 36.0, 100.0 + (50.0 if i > 10 else i * 5.0) + i * 0.01, 9,
                               4, 111))
    for i in range(100):                     # a restarted process, flat, that opens its
        series.samples.append((7200.0 + i * 36.0, 80.0, 7 if i < 3 else 9, 4, 222))  # pipes
    rss, fds = series.summary()
    assert rss["processes"] == 2 and fds == {"start": 9, "end": 9, "max": 9,
                                             "per_process_growth_max": 0}
    series.samples.append((7200.0 + 100 * 36.0, 80.0, 10, 4, 222))    # one more, late: a leak
    assert series.summary()[1]["per_process_growth_max"] == 1
    assert 0.3 < rss["slope_mb_per_robot_hour"] < 1.0


def test_robot_time_is_held_while_what_arrives_before_the_next_status_could_fill_the_context():
    assert risk_tokens(64, None) == 128                 # no rate measured yet: two chunks
    # at x20 the patrol arrives at about 140 tokens per wall second; what the supervisor
    # sends during the status lag counts too, rounded up
    assert risk_tokens(64, 140.0) == 128 + round(140.0 * AT_RISK_LAG_S)
    assert risk_tokens(64, 140.2) == 128 + int(140.2 * AT_RISK_LAG_S) + 1
    assert risk_tokens(256, 7.0) > risk_tokens(64, 7.0)  # a huge chunk seen raises it


@pytest.mark.slow
def test_a_short_soak_with_every_fault_kind_loses_nothing_and_recovers_from_each(tmp_path):
    out = tmp_path / "soak.json"
    argv = [sys.executable, "-m", "csr_ros.cli", "soak", "--faults", "all",
            "--max-faults", str(len(FAULT_KINDS)), "--fault-every-s", "15",
            "--robot-hours", "6", "--speedup", "5", "--seed", "1", "--threads", "1",
            "--tau-mem", "600", "--max-context-tokens", "1536", "--reserve-tokens", "128",
            "--query-timeout-s", "45", "--rate-hz", "1", "--quiet",
            "--workdir", str(tmp_path / "run"), "--json", str(out)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.exists(), done.stderr[-4000:]
    summary = json.loads(out.read_text())
    faults = summary["faults"]
    assert sorted(f["kind"] for f in faults) == sorted(FAULT_KINDS), "every kind once"
    not_recovered = [(f["kind"], f["why_not"]) for f in faults if not f["recovered"]]
    assert not_recovered == []
    assert all(f["state_equals_log"] for f in faults)
    assert summary["chunks_in"] > 0
    assert (summary["chunks_lost"], summary["chunks_duplicated"], summary["chunks_reordered"],
            summary["chunks_corrupt"]) == (0, 0, 0, 0)
    assert summary["chunks_refused"] > 0, "the malformed burst was refused, seq by seq"
    assert summary["state_equals_log"] is True and summary["host_exits_unexpected"] == 0
    assert done.returncode == 0, done.stdout[-3000:]
    for key in ("robot_hours", "wall_s", "cycles", "swaps", "fallbacks", "decisions",
                "valid_actions", "rss_mb", "open_fds", "log_bytes", "restart_s"):
        assert key in summary
    for role in ("supervisor", "state", "r1", "r2"):
        assert {"start", "end", "slope_mb_per_robot_hour"} <= set(summary["rss_mb"][role])
        assert {"start", "end"} <= set(summary["open_fds"][role])
    kill_host = next(f for f in faults if f["kind"] == "kill_host")
    assert kill_host["extra"]["orphan_workers"] == [], "the killed process's workers are gone"


_CLEAN_UP_AFTER_A_HOLDER = r"""
import json, subprocess, sys
from pathlib import Path
from csr_ros.soak.faults import LogFileSystem
from csr_ros.soak.supervisor import _clean_up

run_dir, keep = Path(sys.argv[1]), sys.argv[2] == "keep"
fs = LogFileSystem.mount(run_dir / "logfs", size_mb=4)
(run_dir / "logfs" / "chunklog").mkdir()
(run_dir / "logfs" / "chunklog" / "000000000000.seg").write_bytes(b"records")
# a state's process killed a moment ago: it still holds the file system for a second
holder = subprocess.Popen(["sleep", "1"], cwd=run_dir / "logfs")
problems = _clean_up(run_dir, keep=keep)
holder.wait()
print(json.dumps({"mode": fs.mode, "problems": problems, "exists": run_dir.exists(),
                  "kept": sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.seg"))
                  if run_dir.exists() else []}))
"""


@pytest.mark.slow
def test_a_soak_too_short_for_its_first_planned_fault_still_closes_with_a_restart(tmp_path):
    """A tenth of a robot-hour at x5 is 72 s of wall time, and the first kill_host is planned 300
    to 900 s in: the plan's faults would all fall after the end, so the soak restarts the state's
    process once before it, and the summary gives that restart. (A closing fault comes within
    two fault margins, 120 s of wall time, of the end, and needs one, 60 s, to recover; x5
    keeps the warm-ups from holding robot time on a slow machine.)"""
    out = tmp_path / "soak.json"
    argv = [sys.executable, "-m", "csr_ros.cli", "soak", "--faults", "kill_host",
            "--fault-every-s", "600", "--robot-hours", "0.1", "--speedup", "5", "--seed", "4",
            "--threads", "1", "--rate-hz", "1", "--quiet", "--workdir", str(tmp_path / "run"),
            "--json", str(out)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.exists(), done.stderr[-4000:]
    summary = json.loads(out.read_text())
    assert [(f["kind"], f["extra"].get("closing"), f["recovered"]) for f in summary["faults"]] \
        == [("kill_host", True, True)], summary["faults"]
    (at_h, restart_s), = summary["restart_s"]["kill_host"]
    assert 0.0 <= at_h < 0.1 and restart_s > 0
    # where the restart went: from the spawn (imports included), and waiting for the primary
    extra = summary["faults"][0]["extra"]
    assert extra["since_spawn_s"] >= extra["restart_s"] >= extra["primary_wait_s"] >= 0.0
    assert summary["restart_s"]["since_spawn_median_s"] == pytest.approx(
        extra["since_spawn_s"], abs=0.01)
    assert summary["restart_s"]["last_over_first"] is None, "one restart has nothing to compare"
    assert (summary["chunks_lost"], summary["chunks_duplicated"], summary["chunks_reordered"],
            summary["chunks_corrupt"]) == (0, 0, 0, 0)
    assert summary["state_equals_log"] is True and done.returncode == 0, done.stdout[-3000:]
    # each worker's engine is on record, with how it was chosen (measured: `auto`)
    from csr_ros.engine.calibration import LLAMACPP, TORCH_BF16, TORCH_FP32
    assert set(summary["engines"]) == {"r1", "r2"}, summary["engines"]
    for engine in summary["engines"].values():
        assert engine["how"] == "calibrated", engine
        assert engine["engine"] in {c.name for c in (TORCH_BF16, TORCH_FP32, LLAMACPP)}, engine
        assert f": {engine['engine']}; decision at" in engine["choice"], engine


@pytest.mark.parametrize("keep", [False, True])
def test_the_soak_cleans_up_its_tmpfs_once_the_last_holder_is_gone(tmp_path, keep):
    """The end of a soak after kill_host or disk_full: a process that still holds the log's
    file system for a moment does not make the clean-up fail (EBUSY); a kept run keeps the
    log's files in its directory once the tmpfs is gone. In a subprocess: mounting unshares
    the mount namespace of the process that does it."""
    if os.geteuid() != 0:
        pytest.skip("a private tmpfs needs root; the soak then uses a plain directory")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done = subprocess.run([sys.executable, "-c", _CLEAN_UP_AFTER_A_HOLDER, str(run_dir),
                           "keep" if keep else "remove"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["mode"] == "tmpfs" and out["problems"] == []
    if keep:
        assert out["kept"] == ["logfs/chunklog/000000000000.seg"]
        assert not os.path.ismount(run_dir / "logfs")
    else:
        assert out["exists"] is False


@pytest.mark.slow
def test_a_soak_stopped_by_ctrl_c_ends_its_day_early_and_still_writes_its_summary(tmp_path):
    import signal

    out = tmp_path / "soak.json"
    argv = [sys.executable, "-m", "csr_ros.cli", "soak", "--faults", "none",
            "--robot-hours", "24", "--speedup", "5", "--seed", "2", "--threads", "1",
            "--rate-hz", "1", "--json", str(out)]
    soak = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        seen = []
        for line in soak.stderr:
            seen.append(line)
            counted = re.search(r"decisions (\d+) ", line)
            if counted and int(counted.group(1)) >= 3:
                break
        else:
            raise AssertionError("".join(seen[-40:]))
        soak.send_signal(signal.SIGINT)
        report, rest = soak.communicate(timeout=300)
        assert soak.returncode in (0, 1), rest[-3000:]
    finally:
        if soak.poll() is None:
            soak.kill()
    summary = json.loads(out.read_text())
    assert summary["ended_early"].startswith("SIGINT at robot-hour"), summary["ended_early"]
    assert 0 < summary["robot_hours"] < 24 and summary["decisions"] >= 3
    assert summary["chunks_lost"] == 0 and summary["state_equals_log"] is True
    assert "ENDED EARLY" in report and "Traceback" not in rest
