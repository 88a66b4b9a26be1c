"""Restart from the chunk log on a real local engine: same committed token ids, and a capsule
saved at a committed boundary spares the full prefill."""

from __future__ import annotations

import shutil

import pytest

from csr_ros.chunklog import (ChunkLog, read_log, rebuild_state, resume, save_capsule,
                              segment_files)
from csr_ros.reconcile.driver import Reconciler
from csr_ros.reconcile.machine import ReconcileConfig
from csr_ros.state import CsrState

pytestmark = pytest.mark.slow

PROFILE = "You are a home robot. Answer with one action."


def observation(i: int) -> str:
    return f"t={i}s camera sees mug_{i % 5} at ({i % 4}.25, 0.{i % 9}0); Bob says: step {i}"


@pytest.fixture(scope="module")
def crashed_run(tokenizer, layout, tmp_path_factory):
    """A run with two evictions, a capsule at a committed boundary, then chunks after it."""
    from csr_ros.resources.local import LocalResource

    work = tmp_path_factory.mktemp("restart")
    log_path, capsule_path = work / "chunks.log", work / "primary.capsule"
    config = ReconcileConfig(tau_mem_tokens=260, max_context_tokens=1024, reserve_tokens=96,
                             mode="sync")
    resource = LocalResource(name="r1", threads=1, max_context_tokens=1024)
    state = CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE)
    with ChunkLog(log_path, fsync_interval_s=0) as chunk_log, \
            Reconciler(state, [resource], config, chunk_log=chunk_log) as rec:
        rec.start(timeout_s=120)
        i = 0
        while rec.machine.counters.sync_evictions < 2:
            rec.add_chunk(observation(i), source="cam", stamp_ns=i)
            i += 1
            assert rec.query("Next action?", max_new_tokens=2).ok
        assert rec.wait_idle(timeout_s=120)
        n_capsule = save_capsule(resource, capsule_path)
        chunk_log.save_capsule(resource)                # the same, named by the checkpoint
        for _ in range(3):                      # logged after the capsule, before the "crash"
            rec.add_chunk(observation(i), source="cam", stamp_ns=i)
            i += 1
        assert rec.wait_idle(timeout_s=120)
        committed = resource.committed_ids
        assert committed == tuple(rec.machine.active.static_ids)
    resource.close()
    return log_path, capsule_path, n_capsule, committed


def test_restart_from_the_log_reproduces_the_same_committed_token_ids(
        tokenizer, layout, crashed_run):
    from csr_ros.resources.local import LocalResource

    log_path, _, _, committed = crashed_run
    state = rebuild_state(read_log(log_path),
                          CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE))
    assert tuple(state.static_ids) == committed
    fresh = LocalResource(name="r1", threads=1, max_context_tokens=1024)
    try:
        resumed = resume(fresh, state, None)
        assert resumed.n_from_capsule == 0 and resumed.n_prefilled == len(committed)
        assert fresh.committed_ids == committed
    finally:
        fresh.close()


def test_restart_resumes_from_the_capsule_and_prefills_only_what_came_after_it(
        tokenizer, layout, crashed_run):
    from csr_ros.resources.local import LocalResource

    log_path, capsule_path, n_capsule, committed = crashed_run
    state = rebuild_state(read_log(log_path),
                          CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE))
    fresh = LocalResource(name="r1", threads=1, max_context_tokens=1024)
    try:
        resumed = resume(fresh, state, capsule_path)
        assert resumed.n_from_capsule == n_capsule > 0
        assert resumed.n_prefilled == len(committed) - n_capsule, "no full re-prefill"
        assert fresh.committed_ids == committed
        config = ReconcileConfig(tau_mem_tokens=260, max_context_tokens=1024,
                                 reserve_tokens=96, mode="sync")
        with Reconciler(state, [fresh], config) as rec:
            rec.start(preloaded=True)
            outcome = rec.query("Next action?", max_new_tokens=2)
        assert outcome.ok and outcome.result.n_extended == 0, \
            "the first query after the restart finds the whole static part cached"
    finally:
        fresh.close()


def test_restart_from_the_last_checkpoint_resumes_from_the_capsule_it_names(
        tokenizer, layout, crashed_run):
    from csr_ros.resources.local import LocalResource

    log_path, _, n_capsule, committed = crashed_run
    with ChunkLog(log_path) as chunk_log:
        assert chunk_log.checkpoint.capsule_tokens == n_capsule
        assert chunk_log.checkpoint.n_static_tokens is not None
        assert len(chunk_log.segments_read) < len(segment_files(log_path)), \
            "only the segments from the checkpoint on"
        state = rebuild_state(chunk_log.records,
                              CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE))
        capsule = chunk_log.capsule_path
    assert tuple(state.static_ids) == committed
    fresh = LocalResource(name="r1", threads=1, max_context_tokens=1024)
    try:
        resumed = resume(fresh, state, capsule)
        assert resumed.n_from_capsule == n_capsule > 0
        assert resumed.n_prefilled == len(committed) - n_capsule
        assert fresh.committed_ids == committed
    finally:
        fresh.close()


def test_a_capsule_goes_once_no_checkpoint_names_it(crashed_run, tmp_path):
    log_path = shutil.copytree(crashed_run[0], tmp_path / "log")
    with ChunkLog(log_path) as chunk_log:
        capsule = chunk_log.capsule_path
        version, next_seq = chunk_log.checkpoint.version, chunk_log.records[-1].seq + 1
        chunk_log.append_version(version + 1, next_seq, next_seq, "sync")
        assert capsule.exists(), "CHECKPOINT.prev still names it"
        chunk_log.append_version(version + 2, next_seq, next_seq, "sync")
        assert not capsule.exists() and not any(capsule.parent.iterdir())
