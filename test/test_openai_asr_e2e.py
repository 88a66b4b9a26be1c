"""ASR end to end over HTTP: two real llama.cpp servers as R1 and R2, text-mode prompts."""

from __future__ import annotations

import pytest

from csr_ros.layout import Layout
from csr_ros.reconcile.driver import Reconciler
from csr_ros.reconcile.machine import Phase, ReconcileConfig
from csr_ros.resources.openai import OpenAIOptions, OpenAIResource
from csr_ros.state import CsrState

pytestmark = [pytest.mark.server, pytest.mark.slow]

PROFILE = "You are a home robot. Answer with one action: wait, look, go(room), pick(object)."
TASK = "Which action next? Answer with one action."


def observation(i: int) -> str:
    rooms = ["kitchen", "hall", "office", "bedroom"]
    return (f"t={i * 0.5:.1f}s in the {rooms[i % 4]}: cup_{i % 7} at ({i % 5}.{i % 9}0 m, "
            f"0.{i % 3}5 m); Alice: item {i} please")


def test_two_eviction_cycles_over_two_servers_lose_no_chunk(llama_server_pair):
    r1, r2 = (OpenAIResource(OpenAIOptions(server.url, name=name, tau_mem_tokens=400))
              for server, name in zip(llama_server_pair, ("r1", "r2")))
    tokenizer = r1.tokenizer
    state = CsrState(tokenizer, Layout.from_tokenizer(tokenizer), PROFILE, mode=r1.state_mode)
    config = ReconcileConfig(tau_mem_tokens=400, max_context_tokens=2048, reserve_tokens=128,
                             n_catchup_tokens=0)
    texts: list[str] = []
    with Reconciler(state, [r1, r2], config) as rec:
        rec.start(timeout_s=120)
        i = 0
        while rec.machine.counters.swaps < 2 and i < 400:
            texts.append(observation(i))
            rec.add_chunk(texts[-1], source="episode", stamp_ns=i)
            i += 1
            if rec.machine.phase is Phase.WARM:
                outcome = rec.query(TASK, max_new_tokens=3)
                assert outcome.ok and outcome.inside_window, "R1 answers during the warm-up"
                assert rec.wait_idle(timeout_s=120)
                swap = rec.swaps[-1]
                assert rec.primary.name == swap.primary
                assert rec.primary.committed_ids == swap.committed_ids
                after = rec.query(TASK, max_new_tokens=3)
                assert after.ok and after.resource == swap.primary
                assert after.result.n_extended == 0, "the new primary holds the whole static part"
        counters = rec.machine.counters
        active = rec.machine.active
    assert counters.swaps >= 2 and counters.fallbacks == 0
    assert counters.chunks_in == len(texts)
    # nothing lost: the active chunks are exactly the newest inputs, in order, gap-free
    kept = [c.text.rstrip("\n") for c in active.chunks]
    assert kept == texts[len(texts) - len(kept):]
    assert [c.seq for c in active.chunks] == list(range(active.chunks[0].seq, active.next_seq))
    r1.close()
    r2.close()


def test_a_stalled_primary_server_is_hedged_on_the_other_server_against_the_state_it_holds(
        llama_server_pair):
    import os
    import signal

    from support.waiting import wait_for

    servers = dict(zip(("r1", "r2"), llama_server_pair))
    r1, r2 = (OpenAIResource(OpenAIOptions(server.url, name=name, tau_mem_tokens=400))
              for name, server in servers.items())
    tokenizer = r1.tokenizer
    state = CsrState(tokenizer, Layout.from_tokenizer(tokenizer), PROFILE, mode=r1.state_mode)
    config = ReconcileConfig(tau_mem_tokens=400, max_context_tokens=2048, reserve_tokens=128,
                             n_catchup_tokens=1000, query_timeout_s=120.0, hedge_after_s=1.0)
    with Reconciler(state, [r1, r2], config) as rec:
        rec.start(timeout_s=120)
        i = 0
        while rec.machine.counters.swaps < 1 and i < 400:
            rec.add_chunk(observation(i), source="episode", stamp_ns=i)
            i += 1
            if rec.machine.reconciling:
                assert rec.wait_idle(timeout_s=120)
        assert rec.wait_idle(timeout_s=120) and rec.machine.counters.swaps == 1
        stalled, other = rec.machine.primary, rec.machine.secondary
        rec.add_chunk(observation(i), source="episode", stamp_ns=i)
        os.kill(servers[stalled].pid, signal.SIGSTOP)          # the server stops answering
        try:
            hedged = rec.query(TASK, max_new_tokens=3)
        finally:
            os.kill(servers[stalled].pid, signal.SIGCONT)
        assert hedged.ok and hedged.resource == other, hedged.error
        assert hedged.request.version < rec.machine.active.version
        assert hedged.request.static_text.endswith(rec.machine.active.chunks[-1].text), \
            "the old version with every chunk since the swap"
        wait_for(lambda: not rec.machine.slots[stalled].suspect, timeout_s=180,
                 what="the stalled server's late answer")
        assert rec.machine.counters.hedged_queries == 1
        back = rec.query(TASK, max_new_tokens=3)
        assert back.ok and back.resource == rec.machine.primary
    r1.close()
    r2.close()
