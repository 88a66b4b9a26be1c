"""The reconciliation machine fed as a robot feeds it (chunks at a rate, loads measured at a
prefill speed): its capacity verdict, whether the resources can reconcile at the arrival rate
(eq. 54) and if not what to change, known from the start load on; and the starts with more or
other history than a context holds: a machine that joins after a long history evicts before it
loads, and a new chunk stream starts a version without the old chunks. The policy's side of
the verdict is in test/test_policy_core_keep_up.py."""

from __future__ import annotations

import pytest

from csr_ros.chunks import ChunkPolicy
from csr_ros.eviction import make_policy
from csr_ros.reconcile.machine import (ChunkArrived, Load, Notice, OpFinished, ReconcileConfig,
                                       Reconciliation, VersionChanged)
from csr_ros.state import CsrState

PROFILE = "You are the policy of a test robot."


def new_state(tokenizer, layout, **kw):
    return CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE,
                    policy=ChunkPolicy(oversize="truncate", max_chunk_tokens=64), **kw)


def config(**kw):
    base = dict(tau_mem_tokens=1500, max_context_tokens=2048, reserve_tokens=256,
                n_catchup_tokens=32)
    return ReconcileConfig(**{**base, **kw})


def started_machine(tokenizer, layout, *, load_tokens_per_s: float, cfg=None):
    machine = Reconciliation(new_state(tokenizer, layout), ["r1", "r2"], cfg or config())
    (load,) = [c for c in machine.start() if isinstance(c, Load)]
    seconds = len(load.ids) / load_tokens_per_s
    machine.handle(OpFinished(load.op_id, True, n_tokens=len(load.ids), seconds=seconds))
    return machine


def feed(machine, n_chunks: int, every_s: float, start_s: float = 0.0) -> float:
    """Chunks like a robot's, `every_s` apart; eager extends answered at once."""
    t = start_s
    for _ in range(n_chunks):
        state = machine.active
        [chunk] = state.make_chunks(f"odom: x_m={t:.2f} y_m=1.00 yaw=0.10 speech none",
                                    source="odom", stamp_ns=int(t * 1e9))
        for cmd in machine.handle(ChunkArrived(chunk, now_s=t)):
            if isinstance(cmd, Load) or type(cmd).__name__ == "Extend":
                machine.handle(OpFinished(cmd.op_id, True))
        t += every_s
    return t


# -- the capacity verdict ----------------------------------------------------------------------

def test_capacity_is_unknown_until_arrivals_and_a_prefill_were_measured(tokenizer, layout):
    machine = Reconciliation(new_state(tokenizer, layout), ["r1", "r2"], config())
    capacity = machine.capacity()
    assert capacity.viable is None
    assert "arrivals over 10 s" in capacity.message and "prefill measurement" in capacity.message


def test_a_burst_of_first_chunks_is_no_capacity_verdict(tokenizer, layout):
    machine = started_machine(tokenizer, layout, load_tokens_per_s=300.0)
    feed(machine, 8, every_s=0.001)               # every source's first message at once
    capacity = machine.capacity()
    assert capacity.viable is None and "seen 0.0 s" in capacity.message


def test_capacity_is_known_from_the_start_load_before_any_warm_up_finished(tokenizer, layout):
    machine = started_machine(tokenizer, layout, load_tokens_per_s=2000.0)
    feed(machine, 12, every_s=1.0)
    capacity = machine.capacity()
    assert capacity.viable is True and capacity.headroom_s > 0
    assert capacity.prefill_tokens_per_s == pytest.approx(2000.0, rel=0.01)
    assert machine.viability().headroom_s is not None      # no warm-up has finished yet
    assert "keeps up" in capacity.message


def test_arrival_faster_than_reconciliation_is_said_with_numbers_and_what_to_change(tokenizer,
                                                                                     layout):
    # a slow CPU resource, chunks arriving every 0.2 s
    machine = started_machine(tokenizer, layout, load_tokens_per_s=300.0)
    feed(machine, 60, every_s=0.2)
    capacity = machine.capacity()
    assert capacity.viable is False and capacity.headroom_s < 0
    assert capacity.max_arrival_tokens_per_s < capacity.arrival_tokens_per_s
    assert capacity.max_tau_mem_tokens < 1500
    message = capacity.message
    assert "arrival exceeds what the resources can reconcile" in message
    assert f"arrival {capacity.arrival_tokens_per_s:.1f} tokens/s" in message
    assert f"at {capacity.prefill_tokens_per_s:.0f} tokens/s" in message
    assert f"<= {capacity.max_arrival_tokens_per_s:.1f} tokens/s" in message and \
        "period_s" in message
    assert f"tau_mem_tokens to <= {capacity.max_tau_mem_tokens}" in message
    assert "synchronous fallback" in message


def test_arrival_faster_than_any_prefill_suggests_no_tau_mem(tokenizer, layout):
    machine = started_machine(tokenizer, layout, load_tokens_per_s=60.0)
    feed(machine, 60, every_s=0.2)
    capacity = machine.capacity()
    assert capacity.viable is False and capacity.max_tau_mem_tokens is None
    assert "tau_mem_tokens" not in capacity.message and "faster resources" in capacity.message


def test_the_suggested_arrival_limit_is_viable_by_eq_54(tokenizer, layout):
    machine = started_machine(tokenizer, layout, load_tokens_per_s=60.0)
    feed(machine, 60, every_s=0.2)
    c = machine.capacity()
    limit = 2048 - 256
    a = c.max_arrival_tokens_per_s * 0.999
    assert (limit - 1500) / a >= c.evicted_tokens / (c.prefill_tokens_per_s - a)


# -- joining after a long history, and a new chunk stream -------------------------------------

def test_a_machine_joining_after_a_long_history_evicts_before_it_loads(tokenizer, layout):
    state = new_state(tokenizer, layout)
    for seq in range(400):
        [chunk] = state.make_chunks(f"odom: x_m={seq * 0.5:.2f} y_m=1.00 battery 87 percent",
                                    source="odom", stamp_ns=seq)
        state.append(chunk)
    assert state.n_static > 6 * 1500
    machine = Reconciliation(state, ["r1", "r2"], config(),
                             policy=make_policy("oldest_fraction", fraction=0.5))
    cmds = machine.start()
    (changed,) = [c for c in cmds if isinstance(c, VersionChanged)]
    (load,) = [c for c in cmds if isinstance(c, Load)]
    assert changed.reason == "join" and changed.version == 1
    assert len(load.ids) < 1500 and load.version == 1
    assert machine.active.chunks[-1].seq == 399                 # the newest chunks are kept
    assert machine.active.next_seq == 400


def test_a_join_with_keep_recent_tokens_is_one_round(tokenizer, layout):
    state = new_state(tokenizer, layout)
    for seq in range(300):
        [chunk] = state.make_chunks(f"speech: data=utterance number {seq}", source="speech",
                                    stamp_ns=seq)
        state.append(chunk)
    machine = Reconciliation(state, ["r1", "r2"], config(),
                             policy=make_policy("keep_recent_tokens", keep_tokens=600))
    cmds = machine.start()
    assert any(isinstance(c, Notice) and "in 1 rounds" in c.message for c in cmds)
    assert sum(machine.active.chunk_tokens) <= 600


def test_the_machine_starts_a_stream_version_without_the_old_chunks(tokenizer, layout):
    machine = started_machine(tokenizer, layout, load_tokens_per_s=1000.0)
    feed(machine, 4, every_s=1.0)
    cmds = machine.new_stream()
    (changed,) = [c for c in cmds if isinstance(c, VersionChanged)]
    assert changed.reason == "stream" and (changed.first_seq, changed.next_seq) == (0, 0)
    (load,) = [c for c in cmds if isinstance(c, Load)]
    assert list(load.ids) == list(machine.active.prefix_ids)
    assert machine.active.chunks == [] and machine.active.next_seq == 0
    assert any(isinstance(c, Notice) and "none of the 4 chunks" in c.message for c in cmds)
