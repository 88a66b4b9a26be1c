"""ASR end to end on two real local engines (SmolLM2 on CPU, one thread each)."""

from __future__ import annotations

import pytest

from csr_ros.chunklog import ChunkLog, read_log, rebuild_state
from csr_ros.reconcile.driver import Reconciler
from csr_ros.reconcile.machine import Phase, ReconcileConfig
from csr_ros.state import CsrState

pytestmark = pytest.mark.slow

PROFILE = "You are a home robot. Answer with one action: wait, look, go(room), pick(object)."
TASK = "Which action next? Answer with one action."


@pytest.fixture(scope="module")
def engines():
    from csr_ros.resources.local import LocalResource

    r1 = LocalResource(name="r1", threads=1, max_context_tokens=1024)
    r2 = LocalResource(name="r2", threads=1, max_context_tokens=1024)
    yield r1, r2
    r1.close()
    r2.close()


def observation(i: int) -> str:
    rooms = ["kitchen", "hall", "office", "bedroom"]
    return (f"t={i * 0.5:.1f}s robot in {rooms[i % 4]}; sees cup_{i % 7} at "
            f"({i % 5}.{i % 9}0, 0.{i % 3}5); Alice says: item {i} please")


def expected_static_ids(tokenizer, layout, texts_from_first: list[str]) -> list[int]:
    state = CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE)
    for text in texts_from_first:
        state.add(text)
    return state.static_ids


def test_each_swap_leaves_the_new_primary_holding_the_evicted_state_plus_caught_up_chunks(
        tokenizer, layout, engines, tmp_path):
    config = ReconcileConfig(tau_mem_tokens=320, max_context_tokens=1024, reserve_tokens=96,
                             n_catchup_tokens=0)
    state = CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE)
    texts: list[str] = []
    log_path = tmp_path / "chunks.log"
    with ChunkLog(log_path, fsync_interval_s=0) as chunk_log, \
            Reconciler(state, list(engines), config, chunk_log=chunk_log) as rec:
        rec.start(timeout_s=120)
        checked = 0
        i = 0
        while checked < 2:
            texts.append(observation(i))
            rec.add_chunk(texts[-1], source="episode", stamp_ns=i)
            i += 1
            if rec.machine.phase is Phase.WARM:
                # chunks that arrive during the warm-up must be caught up before the swap
                for _ in range(3):
                    texts.append(observation(i))
                    rec.add_chunk(texts[-1], source="episode", stamp_ns=i)
                    i += 1
                outcome = rec.query(TASK, max_new_tokens=3)
                assert outcome.ok and outcome.inside_window, "R1 serves during the warm-up"
                assert rec.wait_idle(timeout_s=120)
                swap = rec.swaps[-1]
                primary = rec.primary
                assert primary.name == swap.primary
                first = rec.machine.active.chunks[0].seq
                assert primary.committed_ids == swap.committed_ids, \
                    "the new primary holds exactly what the swap says"
                assert list(swap.committed_ids) == expected_static_ids(tokenizer, layout,
                                                                       texts[first:]), \
                    "X_E plus caught-up chunks, token for token"
                assert rec.machine.counters.catchup_steps >= checked + 1
                outcome = rec.query(TASK, max_new_tokens=3)
                assert outcome.ok and outcome.resource == swap.primary
                assert outcome.request.i_star == outcome.request.n_static, \
                    "the first query after the swap hits the whole static part in the cache"
                assert outcome.result.n_extended == 0
                checked += 1
            elif i % 3 == 0:
                assert rec.query(TASK, max_new_tokens=3).ok
        final_ids = rec.machine.active.static_ids
        counters = rec.machine.counters
    assert counters.swaps >= 2 and counters.fallbacks == 0
    assert counters.chunks_in == len(texts)

    rebuilt = rebuild_state(read_log(log_path),
                            CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE))
    assert rebuilt.static_ids == final_ids, "the chunk log rebuilds the same state"
