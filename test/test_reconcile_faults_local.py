"""The reconciler's driver under faults, on real engines in worker processes: a stalled worker,
a full chunk log, a restart from the capsule it saved at a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from csr_ros.chunklog import ChunkLog, read_from_checkpoint, rebuild_state, resume
from csr_ros.layout import Layout
from csr_ros.model_store import resolve_model_dir
from csr_ros.reconcile.driver import Reconciler
from csr_ros.reconcile.machine import ReconcileConfig
from csr_ros.state import CsrState
from csr_ros.tokenizer import HFTokenizer
from support.waiting import wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer():
    return HFTokenizer(resolve_model_dir(weights=False))


def empty_state(tokenizer) -> CsrState:
    return CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                    profile="You are the policy of a mobile robot.")


@pytest.fixture(scope="module")
def workers():
    from csr_ros.resources.process import start_side_by_side

    resources = start_side_by_side(["r1", "r2"], "local", threads=1, max_context_tokens=1024)
    yield resources
    for resource in resources:
        resource.close()


def in_thread(fn, bound_s: float = 300.0):
    """fn() on a thread; its result, or a failure if it never returns (a hang, not a speed)."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(value=fn()), daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), "the call never returned"
    return box["value"]


def test_a_query_on_a_stalled_worker_fails_at_the_query_timeout_and_the_secondary_takes_over(
        workers, tokenizer):
    for resource in workers:
        resource.revive()
    r1, _ = workers
    config = ReconcileConfig(tau_mem_tokens=700, max_context_tokens=1024, reserve_tokens=128,
                             query_timeout_s=8.0)
    with Reconciler(empty_state(tokenizer), workers, config) as rec:
        for i in range(6):
            rec.add_chunk(f"{i}s odom: at {i},2 moving", source="odom")
        rec.start(timeout_s=300)
        assert rec.query("Which action next?", max_new_tokens=2).ok
        os.kill(r1.pid, signal.SIGSTOP)             # a worker that no longer answers
        try:
            stalled = in_thread(lambda: rec.query("Which action next?", max_new_tokens=2))
        finally:
            try:
                os.kill(r1.pid, signal.SIGCONT)
            except (ProcessLookupError, TypeError):
                pass                                # killed at the deadline, as it should be
        assert not stalled.ok and "not answered within 8.0 s" in stalled.error
        assert rec.wait_idle(timeout_s=300)
        assert rec.machine.counters.failovers == 1 and rec.machine.primary == "r2"
        after = rec.query("Which action next?", max_new_tokens=2)
        assert after.ok and after.resource == "r2"
        assert rec.resources["r2"].committed_ids[:after.request.n_static] == \
            after.request.static_ids
    assert not r1.alive, "the worker that did not answer was killed"
    assert r1.revive() and r1.alive


def _swapped_once(rec: Reconciler) -> None:
    """Feed the patrol's kind of chunks until the first swap: the old primary keeps its state."""
    i = 0
    while rec.machine.counters.swaps == 0:
        rec.add_chunk(f"{i}s odom: at {i},2 moving towards the kitchen door", source="odom")
        i += 1
        if rec.machine.reconciling:
            assert rec.wait_idle(timeout_s=300)
    assert rec.wait_idle(timeout_s=300)


def test_a_stalled_primary_worker_is_hedged_on_the_idle_secondary_and_stays_suspect_until_it_answers(
        workers, tokenizer):
    for resource in workers:
        resource.revive()
    config = ReconcileConfig(tau_mem_tokens=300, max_context_tokens=1024, reserve_tokens=128,
                             n_catchup_tokens=1000, query_timeout_s=120.0, hedge_after_s=1.0)
    with Reconciler(empty_state(tokenizer), workers, config) as rec:
        rec.start(timeout_s=300)
        _swapped_once(rec)
        stalled, other = rec.machine.primary, rec.machine.secondary
        assert rec.query("Which action next?", max_new_tokens=2).resource == stalled
        rec.add_chunk("battery 81 percent", source="battery")
        os.kill(rec.resources[stalled].pid, signal.SIGSTOP)       # no longer answers
        try:
            hedged = in_thread(lambda: rec.query("Which action next?", max_new_tokens=2))
            straight = in_thread(lambda: rec.query("Which action next?", max_new_tokens=2))
            assert rec.machine.slots[stalled].suspect
        finally:
            os.kill(rec.resources[stalled].pid, signal.SIGCONT)
        assert hedged.ok and hedged.resource == other, hedged.error
        assert hedged.request.version < rec.machine.active.version, \
            "answered against the old version the secondary holds"
        assert hedged.request.static_ids[-1] == rec.machine.active.static_ids[-1], \
            "with every chunk that came after the swap"
        assert straight.ok and straight.resource == other, "a suspect primary is not waited for"
        wait_for(lambda: not rec.machine.slots[stalled].suspect, timeout_s=300,
                 what="the late query's answer, which clears the suspicion")
        assert rec.machine.counters.hedged_queries == 2 and rec.machine.counters.failovers == 0
        back = rec.query("Which action next?", max_new_tokens=2)
        assert back.ok and back.resource == stalled


def test_the_driver_saves_a_capsule_at_a_checkpoint_and_a_restart_resumes_from_it(
        workers, tokenizer, tmp_path):
    for resource in workers:
        resource.revive()
    config = ReconcileConfig(tau_mem_tokens=300, max_context_tokens=1024, reserve_tokens=128,
                             n_catchup_tokens=0)
    chunk_log = ChunkLog(tmp_path / "log", fsync_interval_s=0)
    with Reconciler(empty_state(tokenizer), workers, config, chunk_log=chunk_log,
                    capsule_every_s=0.0) as rec:
        rec.start(timeout_s=300)
        i = 0
        while rec.machine.counters.swaps < 1:
            rec.add_chunk(f"{i}s scan: nearest {i % 7}.5m front-left", source="scan")
            i += 1
            assert rec.wait_idle(timeout_s=300)
        assert rec.wait_idle(timeout_s=300)
        version = rec.machine.active.version
        primary = rec.resources[rec.machine.primary]
        held = tuple(rec.machine.active.static_ids)
    assert rec.capsules_saved >= 1
    assert chunk_log.checkpoint.version == version and chunk_log.capsule_path is not None
    assert f"v{version:012d}" in chunk_log.capsule_path.name
    chunk_log.close()
    rebuilt = rebuild_state(read_from_checkpoint(tmp_path / "log"), empty_state(tokenizer))
    assert tuple(rebuilt.static_ids) == held and rebuilt.version == version
    with ChunkLog(tmp_path / "log") as reopened:
        primary.load(())                            # as after a restart: it holds nothing
        resumed = resume(primary, rebuilt, reopened.capsule_path)
    assert resumed.n_from_capsule > 0 and resumed.n_committed == len(held)
    assert primary.committed_ids == held


def test_a_burst_that_forces_fallbacks_in_a_row_reloads_the_primary_once_not_per_fallback(
        workers, tokenizer):
    for resource in workers:
        resource.revive()
    config = ReconcileConfig(tau_mem_tokens=300, max_context_tokens=640, reserve_tokens=64,
                             n_catchup_tokens=0)
    with Reconciler(empty_state(tokenizer), workers, config) as rec:
        rec.start(timeout_s=300)
        sent = []
        for i in range(120):                     # a GetChunks answer after an outage
            sent += [c.seq for c in rec.add_chunk(f"{i}s scan: nearest {i % 7}.5m front-left, "
                                                  f"blocked ahead {i % 3}.2m", source="scan")]
        assert rec.wait_idle(timeout_s=600)
        books = rec.accounting()
        assert rec.machine.counters.fallbacks >= 2
        assert rec.superseded_ops >= 1, "queued reloads of the same primary were skipped"
        assert books.check(sent) == {"lost": 0, "duplicated": 0, "in_order": True}
        answer = rec.query("Which action next?", max_new_tokens=2)
        assert answer.ok
        held = rec.resources[answer.resource].committed_ids
        assert held[:answer.request.n_static] == answer.request.static_ids


HOLD = r"""
import json, resource, signal, sys, time
from pathlib import Path
from csr_ros.chunklog import ChunkLog, read_log, rebuild_state
from csr_ros.layout import Layout
from csr_ros.model_store import resolve_model_dir
from csr_ros.reconcile.driver import Reconciler
from csr_ros.reconcile.machine import ReconcileConfig
from csr_ros.resources.factory import make_resource
from csr_ros.state import CsrState
from csr_ros.tokenizer import HFTokenizer

path = Path(sys.argv[1])
tokenizer = HFTokenizer(resolve_model_dir(weights=False))
empty = lambda: CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                         profile="A robot.")
config = ReconcileConfig(tau_mem_tokens=700, max_context_tokens=1024, reserve_tokens=128,
                         mode="sync")
chunk_log = ChunkLog(path, fsync_interval_s=0)
rec = Reconciler(empty(), [make_resource("local", threads=1, max_context_tokens=1024)], config,
                 chunk_log=chunk_log)
rec.start(timeout_s=300)
out = {"seqs": []}
for i in range(4):
    out["seqs"] += [c.seq for c in rec.add_chunk(f"{i}s odom: at {i},1 moving")]
segment = path / sorted(p.name for p in path.glob("*.seg"))[-1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (segment.stat().st_size, hard))   # no more room
for i in range(4, 9):
    out["seqs"] += [c.seq for c in rec.add_chunk(f"{i}s odom: at {i},1 moving")]
out["held"] = rec.held_chunks
out["in_state_while_full"] = [c.seq for c in rec.machine.active.chunks]
out["decided_while_full"] = rec.query("Which action next?", max_new_tokens=2).ok
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))                      # space again
for _ in range(300):                                 # the retry timer appends them
    if rec.held_chunks == 0:
        break
    time.sleep(0.1)
out["held_after"] = rec.held_chunks
out["in_state"] = [c.seq for c in rec.machine.active.chunks]
out["logged"] = [r.seq for r in read_log(path) if type(r).__name__ == "ChunkRecord"]
rebuilt = rebuild_state(read_log(path), empty())
out["rebuilt_equal"] = tuple(rebuilt.static_ids) == tuple(rec.machine.active.static_ids)
rec.close()
chunk_log.close()
print(json.dumps(out))
"""


def test_chunks_are_held_in_order_while_the_chunk_log_is_full_and_join_the_state_once_it_has_room(
        tmp_path):
    done = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path / "log")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["seqs"] == list(range(9)), "every chunk got its seq, held or not"
    assert out["held"] == 5 and out["in_state_while_full"] == [0, 1, 2, 3]
    assert out["decided_while_full"], "decisions go on with the state the log holds"
    assert "chunk 4 and the ones after it are held" in done.stderr
    assert out["held_after"] == 0 and out["in_state"] == list(range(9))
    assert out["logged"] == list(range(9)) and out["rebuilt_equal"]
    assert "the chunk log takes records again" in done.stderr
