"""The ASR machine under random interleavings of chunks, queries, warm-ups, catch-ups, faults,
timers and restarts (invariants 2, 3 and 4 of DESIGN.md).

The resources are simulated as first-in-first-out executors of the machine's commands that
track the token ids they have committed and the version those ids belong to; that is the
environment the pure machine is specified against.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from csr_ros.chunklog import ChunkRecord, VersionRecord, rebuild_state
from csr_ros.errors import ChunkOrderError, ConfigError
from csr_ros.layout import Layout
from csr_ros.model_store import resolve_model_dir
from csr_ros.reconcile.machine import (ChunkArrived, Extend, Load, Notice, OpFinished, Phase,
                                       QueryFinished, QueryStalled, QueryStarted,
                                       ReconcileConfig,
                                       Reconciliation, Route, StartTimer, TimerFired,
                                       VersionChanged)
from csr_ros.state import CsrState
from csr_ros.tokenizer import HFTokenizer

TOKENIZER = HFTokenizer(resolve_model_dir(weights=False))
LAYOUT = Layout.from_tokenizer(TOKENIZER)
PROFILE = "You are a mobile robot. Actions: wait, look, go(room), pick(object)."
WORDS = ["cup", "table", "kitchen", "x=1.25", "Alice", "says", "hello", "door", "open", "42"]
MAX_NEW_TOKENS = 4


def new_state(mode: str = "token") -> CsrState:
    return CsrState(tokenizer=TOKENIZER, layout=LAYOUT, profile=PROFILE, mode=mode)


@dataclass
class SimResource:
    """Executes commands in order; holds committed ids tagged with their version."""

    name: str
    max_context_tokens: int
    queue: deque = field(default_factory=deque)
    committed: list[int] = field(default_factory=list)
    tag: int | None = None
    alive: bool = True


class ReconcileMachineModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.machine: Reconciliation | None = None

    @initialize(mode=st.sampled_from(["asr", "asr", "asr", "sync", "unordered"]),
                tau=st.integers(min_value=60, max_value=240),
                n_catchup=st.sampled_from([0, 8, 40]),
                slack=st.integers(min_value=0, max_value=200), eager=st.booleans(),
                state_mode=st.sampled_from(["token", "token", "text"]))
    def setup(self, mode, tau, n_catchup, slack, eager, state_mode):
        self.state_mode = state_mode
        reserve = 48
        self.config = ReconcileConfig(tau_mem_tokens=tau, n_catchup_tokens=n_catchup,
                                      reserve_tokens=reserve, mode=mode, eager_extend=eager,
                                      max_context_tokens=tau + reserve + 40 + slack)
        names = ["r1", "r2"] if mode == "asr" else ["r1"]
        self.sims = {n: SimResource(n, self.config.max_context_tokens) for n in names}
        self.timers: set[int] = set()
        self.records: list = []
        self.sent_seqs: list[int] = []
        self.last_version = -1
        self.expect_i_star: int | None = None
        self.now_s = 0.0
        self.machine = Reconciliation(new_state(state_mode), names, self.config)
        self.run(self.machine.start())

    # -- plumbing ------------------------------------------------------------------------------

    def run(self, commands):
        for cmd in commands:
            if isinstance(cmd, (Load, Extend)):
                assert (cmd.text is not None) == (self.state_mode == "text")
                if isinstance(cmd, Extend) and cmd.text is not None:
                    assert TOKENIZER.encode_data(cmd.text) == list(cmd.ids), \
                        "text mode sends the same chunks as text"
                self.sims[cmd.resource].queue.append(cmd)
            elif isinstance(cmd, Route):
                if cmd.hedge:
                    event("hedged query")
                self.sims[cmd.resource].queue.append(cmd)
                if self.expect_i_star is not None:
                    assert cmd.request.i_star == self.expect_i_star, \
                        "the first query after a swap starts right after what the new primary holds"
                    self.expect_i_star = None
            elif isinstance(cmd, StartTimer):
                assert cmd.delay_s > 0
                event("retry timer")
                self.timers.add(cmd.timer_id)
            elif isinstance(cmd, VersionChanged):
                assert cmd.version > self.last_version, "versions only increase"
                self.last_version = cmd.version
                event(f"version change: {cmd.reason}")
                self.records.append(VersionRecord(cmd.version, cmd.first_seq, cmd.next_seq,
                                                  cmd.reason))
                self.expect_i_star = None
                if cmd.reason == "swap":
                    sim = self.sims[cmd.primary]
                    assert not sim.queue, "nothing is queued on the new primary at the swap"
                    assert tuple(sim.committed) == cmd.committed_ids, \
                        "the new primary holds exactly X_E plus the caught-up chunks"
                    assert sim.tag == cmd.version
                    self.expect_i_star = len(cmd.committed_ids)
            else:
                assert isinstance(cmd, Notice)

    def step(self, event):
        self.now_s += 0.1
        self.run(self.machine.handle(event))

    # -- rules ---------------------------------------------------------------------------------

    @rule(n_words=st.integers(min_value=4, max_value=24), pick=st.randoms(use_true_random=False))
    def chunk_arrives(self, n_words, pick):
        text = " ".join(pick.choice(WORDS) for _ in range(n_words))
        for chunk in self.machine.active.make_chunks(text, source="sim", stamp_ns=len(self.sent_seqs)):
            self.records.append(ChunkRecord(chunk.seq, chunk.source, chunk.stamp_ns, chunk.text))
            self.sent_seqs.append(chunk.seq)
            self.step(ChunkArrived(chunk, now_s=self.now_s))

    @rule()
    def query_starts(self):
        self.step(QueryStarted(task="Pick the next action.", max_new_tokens=MAX_NEW_TOKENS,
                               now_s=self.now_s))

    @precondition(lambda self: any(s.queue for s in self.sims.values()))
    @rule(which=st.integers(min_value=0, max_value=1), ok=st.sampled_from([True] * 12 + [False]))
    def resource_finishes_its_next_command(self, which, ok):
        busy = [s for s in self.sims.values() if s.queue]
        sim = busy[which % len(busy)]
        cmd = sim.queue.popleft()
        ok = ok and (sim.alive or isinstance(cmd, Load))
        if isinstance(cmd, Load):
            if ok:
                sim.committed, sim.tag, sim.alive = list(cmd.ids), cmd.version, True
                assert len(sim.committed) <= sim.max_context_tokens
            else:
                sim.committed, sim.tag, sim.alive = [], None, False
            self.step(OpFinished(cmd.op_id, ok, n_tokens=len(cmd.ids), seconds=1.0,
                                 now_s=self.now_s))
        elif isinstance(cmd, Extend):
            if ok:
                assert sim.tag == cmd.version, "catch-up extends the version it warmed"
                sim.committed.extend(cmd.ids)
                assert len(sim.committed) <= sim.max_context_tokens
            else:
                sim.committed, sim.tag, sim.alive = [], None, False
            self.step(OpFinished(cmd.op_id, ok, n_tokens=len(cmd.ids), seconds=0.5,
                                 now_s=self.now_s))
        else:
            request = cmd.request
            if ok:
                if cmd.cold:                 # the baseline reloads everything per query
                    sim.committed, sim.tag = [], request.version
                assert sim.tag == request.version, \
                    f"query of v{request.version} answered by {sim.name} holding v{sim.tag}"
                n = len(sim.committed)
                assert list(request.static_ids[:n]) == sim.committed, \
                    "the request extends exactly what the resource has committed"
                sim.committed = list(request.static_ids)
                assert len(request.ids) + MAX_NEW_TOKENS <= sim.max_context_tokens
            else:
                sim.committed, sim.tag, sim.alive = [], None, False
            self.step(QueryFinished(request.query_id, ok, now_s=self.now_s))

    @precondition(lambda self: any(isinstance(c, Route) and not c.hedge
                                   for s in self.sims.values() for c in s.queue))
    @rule(data=st.data())
    def a_query_is_late(self, data):
        late = [c for s in self.sims.values() for c in s.queue
                if isinstance(c, Route) and not c.hedge]
        route = data.draw(st.sampled_from(late))
        self.step(QueryStalled(route.request.query_id, task="Pick the next action.",
                               max_new_tokens=MAX_NEW_TOKENS, now_s=self.now_s))

    @precondition(lambda self: bool(self.timers))
    @rule(data=st.data())
    def timer_fires(self, data):
        timer_id = data.draw(st.sampled_from(sorted(self.timers)))
        self.timers.discard(timer_id)
        self.step(TimerFired(timer_id, now_s=self.now_s))

    @rule()
    def process_restarts_from_its_log(self):
        rebuilt = rebuild_state(self.records, new_state(self.state_mode))
        assert rebuilt.static_ids == self.machine.active.static_ids, \
            "the log rebuilds the active state token for token"
        assert rebuilt.version == self.machine.active.version
        names = list(self.sims)
        self.sims = {n: SimResource(n, self.config.max_context_tokens) for n in names}
        self.timers.clear()
        self.expect_i_star = None
        self.machine = Reconciliation(rebuilt, names, self.config)
        self.run(self.machine.start())

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def nothing_is_lost_duplicated_or_reordered(self):
        if self.machine is None:
            return
        active = [c.seq for c in self.machine.active.chunks]
        evicted = self._evicted_so_far()
        assert evicted == sorted(set(evicted)), "evictions are in order and never repeat"
        assert evicted + active == self.sent_seqs, "every chunk is active or evicted by policy"

    @invariant()
    def the_context_bound_holds(self):
        if self.machine is None:
            return
        cfg = self.config
        assert self.machine.active.n_static + cfg.reserve_tokens <= cfg.max_context_tokens
        if self.machine.pending is not None:
            assert self.machine.pending.n_static <= self.machine.active.n_static

    @invariant()
    def the_primary_holds_the_active_version(self):
        if self.machine is None:
            return
        m = self.machine
        assert m.slots[m.primary].holds == m.active.version
        if m.phase is Phase.IDLE:
            assert m.pending is None and not m.buffer

    @invariant()
    def a_hedge_state_is_what_the_idle_secondary_holds_and_every_chunk_since(self):
        if self.machine is None or self.machine.hedge_state is None:
            return
        m = self.machine
        held = m.hedge_state
        sim = self.sims[m.secondary]
        assert sim.tag == held.version
        if not sim.queue:
            assert list(held.static_ids[:len(sim.committed)]) == sim.committed, \
                "a hedged query extends exactly what the secondary has committed"
        assert held.next_seq == m.active.next_seq, "the hedge state has every chunk since"
        assert held.n_static + self.config.reserve_tokens <= self.config.max_context_tokens

    def _evicted_so_far(self) -> list[int]:
        first = min((c.seq for c in self.machine.active.chunks),
                    default=self.machine.active.next_seq)
        return [s for s in self.sent_seqs if s < first]


ReconcileMachineModel.TestCase.settings = settings(
    max_examples=200, stateful_step_count=100, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_reconcile_machine_keeps_every_invariant_under_random_interleavings = \
    ReconcileMachineModel.TestCase


def test_machine_evicted_seqs_match_what_left_the_active_state():
    config = ReconcileConfig(tau_mem_tokens=100, max_context_tokens=400, reserve_tokens=48,
                             n_catchup_tokens=0, mode="sync")
    machine = Reconciliation(new_state(), ["r1"], config)
    machine.start()
    seqs = []
    for i in range(40):
        for chunk in machine.active.make_chunks(f"camera sees cup {i} on table", source="c",
                                                stamp_ns=i):
            seqs.append(chunk.seq)
            machine.handle(ChunkArrived(chunk))
    active = [c.seq for c in machine.active.chunks]
    assert machine.counters.sync_evictions >= 2
    assert machine.evicted_seqs + active == seqs


def test_machine_keeps_the_evicted_seqs_of_many_cycles_as_one_run():
    config = ReconcileConfig(tau_mem_tokens=100, max_context_tokens=400, reserve_tokens=48,
                             n_catchup_tokens=0, mode="sync")
    machine = Reconciliation(new_state(), ["r1"], config)
    machine.start()
    for i in range(400):
        (chunk,) = machine.active.make_chunks(f"odom at {i},2 moving", source="o", stamp_ns=i)
        machine.handle(ChunkArrived(chunk))
    first = machine.active.chunks[0].seq
    assert machine.counters.sync_evictions >= 20
    assert machine.evicted.runs == [(0, first)], "a day of evictions costs one run, not a list"
    assert len(machine.evicted) == first and machine.evicted_seqs == list(range(first))


def test_machine_starts_the_next_cycle_when_the_threshold_was_crossed_during_a_reconciliation():
    config = ReconcileConfig(tau_mem_tokens=100, max_context_tokens=1000, reserve_tokens=48,
                             n_catchup_tokens=0)
    machine = Reconciliation(new_state(), ["r1", "r2"], config)
    (start,) = machine.start()
    machine.handle(OpFinished(start.op_id, True))
    commands = []
    while machine.phase is Phase.IDLE:
        (chunk,) = machine.active.make_chunks("lidar front 1.25 m left 0.75 m", source="l",
                                              stamp_ns=0)
        commands += machine.handle(ChunkArrived(chunk))
    (warm,) = [c for c in commands if isinstance(c, Load)]
    # While R2 warms, enough chunks arrive for the *next* threshold crossing as well.
    while machine.active.n_static < 2 * config.tau_mem_tokens:
        (chunk,) = machine.active.make_chunks("person Alice says: bring the cup", source="a",
                                              stamp_ns=0)
        commands = machine.handle(ChunkArrived(chunk))
        assert not [c for c in commands if isinstance(c, Load)], \
            "no second cycle while one is running"
    commands = machine.handle(OpFinished(warm.op_id, True, n_tokens=len(warm.ids), seconds=1.0))
    (extend,) = [c for c in commands if isinstance(c, Extend)]
    commands = machine.handle(OpFinished(extend.op_id, True, n_tokens=len(extend.ids),
                                         seconds=0.5))
    swaps = [c for c in commands if isinstance(c, VersionChanged)]
    assert [s.reason for s in swaps] == ["swap"]
    assert machine.active.n_static >= config.tau_mem_tokens
    assert machine.phase is Phase.WARM, "the crossing during the last cycle starts the next one"
    assert machine.counters.cycles_started == 2


def test_machine_rejects_a_chunk_out_of_order_and_changes_nothing():
    config = ReconcileConfig(tau_mem_tokens=100, max_context_tokens=400)
    machine = Reconciliation(new_state(), ["r1", "r2"], config)
    chunks = machine.active.make_chunks("a b c", source="s", stamp_ns=0)
    chunks = machine.active.make_chunks("d e f", source="s", stamp_ns=0)  # seq 0 again
    machine.handle(ChunkArrived(chunks[0]))
    with pytest.raises(ChunkOrderError, match="expected 1"):
        machine.handle(ChunkArrived(chunks[0]))
    assert [c.seq for c in machine.active.chunks] == [0]


def test_machine_config_refuses_a_threshold_that_cannot_fit_the_context():
    with pytest.raises(ConfigError, match="exceed max_context_tokens"):
        ReconcileConfig(tau_mem_tokens=4000, max_context_tokens=4096, reserve_tokens=256)


def _fill(machine: Reconciliation, text: str, until) -> list:
    commands = []
    while not until():
        (chunk,) = machine.active.make_chunks(text, source="s", stamp_ns=0)
        commands += machine.handle(ChunkArrived(chunk))
    return commands


def _started(config: ReconcileConfig) -> Reconciliation:
    """An ASR machine over r1 and r2 whose primary has loaded the prefix."""
    machine = Reconciliation(new_state(), ["r1", "r2"], config)
    (start,) = machine.start()
    machine.handle(OpFinished(start.op_id, True))
    return machine


def test_machine_falls_back_to_a_synchronous_eviction_when_the_warm_up_cannot_finish_in_time():
    config = ReconcileConfig(tau_mem_tokens=100, max_context_tokens=300, reserve_tokens=48,
                             eager_extend=False)
    machine = _started(config)
    sent = []
    commands = []
    while machine.counters.fallbacks == 0:       # the warm-up on r2 never finishes
        (chunk,) = machine.active.make_chunks("camera sees the red mug at 1.25 m", source="c",
                                              stamp_ns=0)
        sent.append(chunk.seq)
        commands += machine.handle(ChunkArrived(chunk))
        assert machine.active.n_static + config.reserve_tokens <= config.max_context_tokens
    reloads = [c for c in commands if isinstance(c, Load) and c.resource == "r1"]
    assert [c.purpose for c in reloads] == ["fallback"], "evicted on the primary"
    assert any(isinstance(c, Notice) and "fallback 1" in c.message for c in commands)
    assert machine.phase is Phase.IDLE or machine.pending.version > reloads[0].version, \
        "the abandoned reconciliation never comes back"
    assert machine.evicted_seqs + [c.seq for c in machine.active.chunks] == sent


def test_machine_fallback_version_holds_the_chunk_that_forced_it():
    machine = _started(ReconcileConfig(tau_mem_tokens=100, max_context_tokens=300,
                                       reserve_tokens=48, eager_extend=False))
    commands = []
    while machine.counters.fallbacks == 0:
        (chunk,) = machine.active.make_chunks("camera sees the red mug at 1.25 m", source="c",
                                              stamp_ns=0)
        commands = machine.handle(ChunkArrived(chunk))
    (change,) = [c for c in commands if isinstance(c, VersionChanged)]
    assert machine.active.chunks[-1].seq == chunk.seq
    assert (change.version, change.first_seq, change.next_seq) == \
        (machine.active.version, machine.active.chunks[0].seq, chunk.seq + 1), \
        "the version record covers every chunk of the state it names"


def test_machine_recovers_a_new_primary_that_fails_while_the_old_one_still_reloads():
    # A fallback reloads r1; before that ends, the next cycle warms r2 and swaps to it. When r2
    # then fails, the machine must recover r2's role, not wait for r1's old reload.
    machine = _started(ReconcileConfig(tau_mem_tokens=100, max_context_tokens=300,
                                       reserve_tokens=48, n_catchup_tokens=0,
                                       eager_extend=False))
    commands = _fill(machine, "camera sees the red mug at 1.25 m",
                     lambda: machine.counters.fallbacks == 1)
    (reload,) = [c for c in commands if isinstance(c, Load) and c.purpose == "fallback"]
    commands += _fill(machine, "lidar front 1.25 m left 0.75 m",
                      lambda: machine.phase is Phase.WARM)
    warm = [c for c in commands if isinstance(c, Load) and c.purpose == "warm"][-1]
    assert machine.primary_reloading and machine._warm_op == warm.op_id
    commands = machine.handle(OpFinished(warm.op_id, True, n_tokens=len(warm.ids), seconds=1.0))
    assert machine.primary == "r2" and machine.counters.swaps == 1, \
        "swapped while r1 still reloads"
    (route,) = [c for c in machine.handle(QueryStarted(task="next?")) if isinstance(c, Route)]
    assert route.resource == "r2"
    commands = machine.handle(QueryFinished(route.request.query_id, ok=False))
    loads = [c for c in commands if isinstance(c, Load)]
    assert machine.counters.failovers == 1 and machine.primary == "r1"
    assert [(c.resource, c.purpose) for c in loads] == [("r1", "failover")]
    assert machine.handle(OpFinished(reload.op_id, True)) == [] or machine.primary_reloading, \
        "the overtaken reload ends as a stale op"


def test_machine_context_room_is_exactly_what_a_chunk_may_take_without_a_fallback():
    config = ReconcileConfig(tau_mem_tokens=100, max_context_tokens=300, reserve_tokens=48,
                             eager_extend=False)
    machine = Reconciliation(new_state(), ["r1", "r2"], config)
    (start,) = machine.start()
    machine.handle(OpFinished(start.op_id, True))
    while True:                                   # the warm-up on r2 never finishes
        (chunk,) = machine.active.make_chunks("camera sees the red mug at 1.25 m", source="c",
                                              stamp_ns=0)
        room = machine.context_room_tokens
        assert room == 300 - 48 - machine.active.n_static
        machine.handle(ChunkArrived(chunk))
        if chunk.n_tokens > room:
            assert machine.counters.fallbacks == 1, "a chunk over the room falls back"
            break
        assert machine.counters.fallbacks == 0, "a chunk within the room never falls back"


def test_machine_fails_over_to_the_secondary_when_the_primary_fails_a_query():
    config = ReconcileConfig(tau_mem_tokens=400, max_context_tokens=1000, reserve_tokens=48)
    machine = Reconciliation(new_state(), ["r1", "r2"], config)
    (start,) = machine.start()
    machine.handle(OpFinished(start.op_id, True))
    _fill(machine, "odometry x=1.00 y=2.00", lambda: machine.active.n_static > 120)
    before = list(machine.active.static_ids)
    (route,) = [c for c in machine.handle(QueryStarted(task="next?", max_new_tokens=4))
                if isinstance(c, Route)]
    assert route.resource == "r1"
    commands = machine.handle(QueryFinished(route.request.query_id, ok=False))
    (load,) = [c for c in commands if isinstance(c, Load)]
    assert (load.resource, load.purpose) == ("r2", "failover")
    assert list(load.ids) == before, "the secondary is warmed with the current state"
    assert machine.primary == "r2" and machine.counters.failovers == 1
    assert load.version > route.request.version
    (route,) = [c for c in machine.handle(QueryStarted(task="next?", max_new_tokens=4))
                if isinstance(c, Route)]
    assert route.resource == "r2" and route.request.version == load.version


def _warming_r2() -> tuple[Reconciliation, list]:
    """A machine whose first reconciliation has just begun: the commands warm r2."""
    config = ReconcileConfig(tau_mem_tokens=100, max_context_tokens=2000, reserve_tokens=48,
                             retry_base_s=0.5)
    machine = Reconciliation(new_state(), ["r1", "r2"], config)
    (start,) = machine.start()
    machine.handle(OpFinished(start.op_id, True))
    return machine, _fill(machine, "speech Bob: where are my keys", lambda: machine.reconciling)


def test_machine_retries_a_failed_warm_up_with_growing_backoff_while_the_primary_serves():
    machine, commands = _warming_r2()
    delays = []
    for _ in range(3):
        (warm,) = [c for c in commands if isinstance(c, Load) and c.resource == "r2"]
        commands = machine.handle(OpFinished(warm.op_id, False))
        (timer,) = [c for c in commands if isinstance(c, StartTimer)]
        delays.append(timer.delay_s)
        (route,) = [c for c in machine.handle(QueryStarted(task="next?", max_new_tokens=4))
                    if isinstance(c, Route)]
        assert route.resource == "r1", "the primary keeps serving"
        machine.handle(QueryFinished(route.request.query_id, ok=True))
        commands = machine.handle(TimerFired(timer.timer_id))
    assert delays == [0.5, 1.0, 2.0]
    assert machine.counters.retries == 3 and machine.counters.fallbacks == 0


def test_a_warm_up_that_succeeds_on_a_retry_does_not_set_the_prefill_rate():
    """A server may finish an abandoned attempt's prefill and answer the retry from its cache
    at once: that retry's time would report a rate thousands of times too high."""
    machine, commands = _warming_r2()
    (warm,) = [c for c in commands if isinstance(c, Load) and c.resource == "r2"]
    commands = machine.handle(OpFinished(warm.op_id, False))
    (timer,) = [c for c in commands if isinstance(c, StartTimer)]
    commands = machine.handle(TimerFired(timer.timer_id))
    (warm,) = [c for c in commands if isinstance(c, Load) and c.resource == "r2"]
    machine.handle(OpFinished(warm.op_id, True, n_tokens=len(warm.ids), seconds=0.001))
    assert machine.prefill_tokens_per_s is None, "no rate from a retried warm-up"


def _past_a_swap(**overrides) -> Reconciliation:
    """An ASR machine whose first reconciliation swapped r2 in: r1 keeps the old version."""
    config = ReconcileConfig(**{"tau_mem_tokens": 100, "max_context_tokens": 400,
                                "reserve_tokens": 48, "n_catchup_tokens": 1000,
                                "eager_extend": False, **overrides})
    machine = _started(config)
    commands = _fill(machine, "odometry x=1.00 y=2.00", lambda: machine.reconciling)
    (warm,) = [c for c in commands if isinstance(c, Load) and c.purpose == "warm"]
    machine.handle(OpFinished(warm.op_id, True, n_tokens=len(warm.ids), seconds=1.0))
    assert machine.primary == "r2" and machine.counters.swaps == 1
    return machine


def _route(commands) -> Route:
    (route,) = [c for c in commands if isinstance(c, Route)]
    return route


def test_a_late_query_is_asked_again_on_the_secondary_against_the_old_version_and_every_chunk_since():
    machine = _past_a_swap()
    old = machine.previous
    old_ids = list(old.static_ids)                      # what r1 committed, at most
    (chunk,) = machine.active.make_chunks("battery 81 percent", source="b", stamp_ns=0)
    machine.handle(ChunkArrived(chunk))
    late = _route(machine.handle(QueryStarted(task="next?", max_new_tokens=4)))
    assert late.resource == "r2" and not late.hedge
    hedge = _route(machine.handle(QueryStalled(late.request.query_id, task="next?",
                                               max_new_tokens=4)))
    assert (hedge.resource, hedge.hedge, hedge.request.version) == ("r1", True, old.version)
    assert list(hedge.request.static_ids[:len(old_ids)]) == old_ids, \
        "the hedge extends what r1 holds"
    assert hedge.request.last_seq == chunk.seq, "and holds the chunk that came after the swap"
    assert machine.slots["r2"].suspect and machine.counters.hedged_queries == 1
    # while r2 is suspect, queries go straight to r1
    straight = _route(machine.handle(QueryStarted(task="next?", max_new_tokens=4)))
    assert (straight.resource, straight.hedge) == ("r1", True)
    machine.handle(QueryFinished(hedge.request.query_id, True))
    machine.handle(QueryFinished(straight.request.query_id, True))
    machine.handle(QueryFinished(late.request.query_id, True))      # r2 answers again
    assert not machine.slots["r2"].suspect
    back = _route(machine.handle(QueryStarted(task="next?", max_new_tokens=4)))
    assert (back.resource, back.hedge) == ("r2", False)
    assert machine.counters.failovers == 0


def test_a_query_that_failed_on_the_primary_is_asked_on_the_secondary_before_its_failover_load():
    machine = _past_a_swap()
    late = _route(machine.handle(QueryStarted(task="next?", max_new_tokens=4)))
    hedge = _route(machine.handle(QueryStalled(late.request.query_id, task="next?",
                                               max_new_tokens=4)))
    commands = machine.handle(QueryFinished(late.request.query_id, False))
    (load,) = [c for c in commands if isinstance(c, Load)]
    assert hedge.resource == load.resource == "r1" and load.purpose == "failover", \
        "r1 answers the hedge first (its commands run in order), then loads the current state"
    assert machine.primary == "r1" and machine.hedge_state is None


def test_nothing_is_hedged_while_the_secondary_warms_or_before_any_swap():
    machine = _started(ReconcileConfig(tau_mem_tokens=100, max_context_tokens=400,
                                       reserve_tokens=48, eager_extend=False))
    first = _route(machine.handle(QueryStarted(task="next?", max_new_tokens=4)))
    assert machine.handle(QueryStalled(first.request.query_id, task="next?")) == []
    machine.handle(QueryFinished(first.request.query_id, True))
    machine = _past_a_swap()
    _fill(machine, "odometry x=1.00 y=2.00", lambda: machine.reconciling)   # r1 warms X_E
    late = _route(machine.handle(QueryStarted(task="next?", max_new_tokens=4)))
    assert machine.hedge_state is None and machine.previous is None
    assert machine.handle(QueryStalled(late.request.query_id, task="next?")) == []
    assert machine.slots["r2"].suspect, "suspect all the same: it is late"


def test_a_query_late_through_a_swap_is_asked_again_on_the_new_primary():
    machine = _past_a_swap()
    commands = _fill(machine, "odometry x=1.00 y=2.00", lambda: machine.reconciling)  # r1 warms
    (warm,) = [c for c in commands if isinstance(c, Load) and c.purpose == "warm"]
    late = _route(machine.handle(QueryStarted(task="next?", max_new_tokens=4)))
    assert late.resource == "r2"
    assert machine.handle(QueryStalled(late.request.query_id, task="next?")) == [], \
        "nowhere to ask while r1 warms"
    machine.handle(OpFinished(warm.op_id, True, n_tokens=len(warm.ids), seconds=1.0))
    assert machine.primary == "r1", "the warm-up swapped r1 in, r2's query still runs"
    again = _route(machine.handle(QueryStalled(late.request.query_id, task="next?")))
    assert again.resource == "r1" and again.request.version == machine.active.version
    assert machine.slots["r2"].suspect and machine.counters.hedged_queries == 1


def _chunk_in(machine: Reconciliation, text: str = "imu yaw 0.25 rad") -> list:
    (chunk,) = machine.active.make_chunks(text, source="s", stamp_ns=0)
    return machine.handle(ChunkArrived(chunk))


def test_chunks_that_arrive_while_the_primary_extends_go_in_one_next_extend():
    config = ReconcileConfig(tau_mem_tokens=1000, max_context_tokens=2000, reserve_tokens=48)
    machine = _started(config)
    (first,) = [c for c in _chunk_in(machine) if isinstance(c, Extend)]
    n_static_before = machine.active.n_static
    for _ in range(5):
        assert not [c for c in _chunk_in(machine) if isinstance(c, Extend)], \
            "no second extend queued behind the running one"
    (batch,) = [c for c in machine.handle(OpFinished(first.op_id, True)) if isinstance(c, Extend)]
    assert batch.resource == "r1" and batch.last_seq - batch.first_seq == 4
    assert len(batch.ids) == machine.active.n_static - n_static_before, \
        "the five chunks that came meanwhile, in one call"
    assert machine.handle(OpFinished(batch.op_id, True)) == [], "nothing is left to extend"


def test_a_catch_up_that_no_longer_shrinks_the_buffer_swaps_with_what_arrived_during_one_step():
    config = ReconcileConfig(tau_mem_tokens=100, max_context_tokens=2000, reserve_tokens=48,
                             n_catchup_tokens=0, eager_extend=False)
    machine = _started(config)
    commands = _fill(machine, "odometry x=1.00 y=2.00", lambda: machine.reconciling)
    (warm,) = [c for c in commands if isinstance(c, Load) and c.purpose == "warm"]
    for _ in range(3):
        _chunk_in(machine)
    commands = machine.handle(OpFinished(warm.op_id, True, n_tokens=len(warm.ids), seconds=1.0))
    (step,) = [c for c in commands if isinstance(c, Extend)]
    for _ in range(3):                 # as much arrives during the step as the step took
        _chunk_in(machine)
    assert machine.buffer_tokens == len(step.ids)
    commands = machine.handle(OpFinished(step.op_id, True, n_tokens=len(step.ids), seconds=1.0))
    assert [c.reason for c in commands if isinstance(c, VersionChanged)] == ["swap"]
    assert machine.counters.catchup_cut_short == 1 and machine.counters.fallbacks == 0
    assert machine.primary == "r2"
    # what the step did not catch up is in the new state, for its first query's prefill
    assert [c.seq for c in machine.active.chunks][-3:] == list(
        range(int(machine.active.next_seq) - 3, int(machine.active.next_seq)))


def test_a_warm_up_timeout_follows_the_measured_prefill_rate_and_doubles_after_each_failure():
    config = ReconcileConfig(tau_mem_tokens=100, max_context_tokens=2000, reserve_tokens=48,
                             warm_timeout_s=30.0, eager_extend=False)
    machine = Reconciliation(new_state(), ["r1", "r2"], config)
    (start,) = machine.start()
    assert start.timeout_s == 30.0, "no rate measured yet: the configured timeout"
    # a slow server: the prefix took 20 s, so a warm-up of ~100 tokens takes longer than 30 s
    machine.handle(OpFinished(start.op_id, True, n_tokens=len(start.ids), seconds=20.0))
    rate = len(start.ids) / 20.0
    commands = _fill(machine, "speech Bob: where are my keys", lambda: machine.reconciling)
    (warm,) = [c for c in commands if isinstance(c, Load) and c.purpose == "warm"]
    assert warm.timeout_s == pytest.approx(3.0 * len(warm.ids) / rate)
    assert warm.timeout_s > 30.0
    commands = machine.handle(OpFinished(warm.op_id, False))
    (timer,) = [c for c in commands if isinstance(c, StartTimer)]
    (retry,) = [c for c in machine.handle(TimerFired(timer.timer_id)) if isinstance(c, Load)]
    assert retry.timeout_s == pytest.approx(2 * warm.timeout_s), \
        "a server that dropped the first try's work gets twice as long"


def test_a_failover_during_a_warm_up_loads_the_version_being_warmed_and_every_chunk_since():
    machine, commands = _warming_r2()
    (warm,) = [c for c in commands if isinstance(c, Load) and c.resource == "r2"]
    kept = machine.pending.chunks[0].seq
    old_seqs = [c.seq for c in machine.active.chunks]
    (chunk,) = machine.active.make_chunks("speech Bob: found them", source="s", stamp_ns=0)
    machine.handle(ChunkArrived(chunk))
    route = _route(machine.handle(QueryStarted(task="next?", max_new_tokens=4)))
    assert route.resource == "r1"
    commands = machine.handle(QueryFinished(route.request.query_id, ok=False))
    (load,) = [c for c in commands if isinstance(c, Load)]
    (changed,) = [c for c in commands if isinstance(c, VersionChanged)]
    assert (load.resource, load.purpose, machine.primary) == ("r2", "failover", "r2")
    assert list(load.ids[:len(warm.ids)]) == list(warm.ids), \
        "it begins with what r2 was warming"
    assert [c.seq for c in machine.active.chunks] == [s for s in old_seqs if s >= kept] + \
        [chunk.seq], "the evicted chunks go, the chunk that came meanwhile stays"
    assert changed.first_seq == kept and machine.evicted_seqs == [s for s in old_seqs
                                                                  if s < kept]
    assert machine.counters.failovers == 1 and not machine.reconciling
    # the abandoned warm-up's end changes nothing; a query after the load is on r2's version
    machine.handle(OpFinished(warm.op_id, True, n_tokens=len(warm.ids), seconds=1.0))
    machine.handle(OpFinished(load.op_id, True, n_tokens=len(load.ids), seconds=1.0))
    after = _route(machine.handle(QueryStarted(task="next?", max_new_tokens=4)))
    assert (after.resource, after.request.version) == ("r2", load.version)
