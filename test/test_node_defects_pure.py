"""The pure halves of the node defects found on a real ROS 2 graph (issue: capacity, stream
restarts, late joiners, time jumps, parameters, launch arguments). The rclpy halves are in
test/ros/test_node_defects_ros.py."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from csr_ros.chunklog import ChunkLog, StreamRecord, last_stream, read_log, rebuild_state
from csr_ros.chunks import ChunkPolicy
from csr_ros.errors import ConfigError
from csr_ros.eviction import make_policy
from csr_ros.launch_args import bag_play_command, check_bag, check_params_file, given_overrides
from csr_ros.node_logic.health import QueryStats, diagnose
from csr_ros.node_logic.schedule import QueryScheduler
from csr_ros.node_logic.stream import ChunkEvent, StateFold, SwapEvent
from csr_ros.reconcile.machine import (ChunkArrived, Load, Notice, OpFinished, ReconcileConfig,
                                       Reconciliation, VersionChanged)
from csr_ros.resources.base import QueryResult
from csr_ros.ros_params import (POLICY, check_params_files, match_publishers, params_files_in_args,
                                type_problem, validate)
from csr_ros.state import CsrState

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "csr_ros.yaml"
PROFILE = "You are the policy of a test robot."


def new_state(tokenizer, layout, **kw):
    return CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE,
                    policy=ChunkPolicy(oversize="truncate", max_chunk_tokens=64), **kw)


def event(seq: int, stream: str = "", text: str | None = None) -> ChunkEvent:
    return ChunkEvent(seq=seq, source="odom", stamp_ns=1_000 + seq,
                      text=text or f"odom: x_m={seq * 0.5} y_m=1", stream=stream)


# -- 1. capacity ---------------------------------------------------------------------------------

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


def test_decisions_per_second_below_rate_hz_is_a_warning_with_ttft_and_what_to_change():
    scheduler = QueryScheduler(rate_hz=2.0)
    stats = QueryStats(started_s=0.0)
    result = QueryResult(text="go", token_ids=(1,), ttft_s=21.0, decode_s=0.5, n_prompt=100,
                         n_extended=0, cached_tokens=None, finish_reason="stop", resource="r1")
    for t in (21.0, 42.0, 63.0):
        stats.record(result, 0, now_s=t)
    d = diagnose({"version": 0}, scheduler, stats, now_s=66.0)
    values = dict(d.values)
    assert float(values["decisions_per_s"]) == pytest.approx(2 / 30, rel=0.01)
    assert values["rate_hz"] == "2" and values["ttft_p50_s"] == "21.000"
    assert d.level == 1 and "decisions/s against rate_hz 2" in d.message
    assert "TTFT 21.00 s + decoding 0.50 s" in d.message and "lower rate_hz to 0.037" in d.message


def test_a_rate_shortfall_from_decoding_blames_the_decoding_not_the_ttft():
    scheduler = QueryScheduler(rate_hz=2.0)
    stats = QueryStats(started_s=0.0)
    result = QueryResult(text="go", token_ids=(1,) * 48, ttft_s=0.7, decode_s=6.3, n_prompt=900,
                         n_extended=0, cached_tokens=800, finish_reason="length",
                         resource="r1")
    for t in range(7, 35, 7):
        stats.record(result, 0, now_s=float(t))
    d = diagnose({"version": 0}, scheduler, stats, now_s=35.0)
    assert "a decision takes 7.00 s (p50: TTFT 0.70 s + decoding 6.30 s)" in d.message
    assert "lower rate_hz to 0.11" in d.message and "the decoding dominates" in d.message


def test_invalid_actions_are_counted_and_a_recent_one_is_a_warning_with_its_reason():
    scheduler = QueryScheduler(rate_hz=2.0)
    stats = QueryStats(started_s=0.0)
    result = QueryResult(text="pick(", token_ids=(1,) * 4, ttft_s=0.1, decode_s=0.2,
                         n_prompt=900, n_extended=0, cached_tokens=None,
                         finish_reason="length", resource="r1")
    for _ in range(3):
        stats.record(result, 0, now_s=1.0)
        stats.record_action(True)
    assert diagnose({"version": 0}, scheduler, stats).level == 0
    stats.record_action(False, "incomplete: the budget of 4 tokens ended inside the action")
    d = diagnose({"version": 0}, scheduler, stats)
    values = dict(d.values)
    assert values["valid_actions"] == "3" and values["invalid_actions"] == "1"
    assert d.level == 1
    assert d.message == ("1 of the last 4 decisions were not valid actions (latest: incomplete: "
                         "the budget of 4 tokens ended inside the action)")
    for _ in range(20):                       # it leaves the window: ok again, still counted
        stats.record_action(True)
    d = diagnose({"version": 0}, scheduler, stats)
    assert d.level == 0 and dict(d.values)["invalid_actions"] == "1"


def test_a_capacity_verdict_that_cannot_keep_up_is_the_policy_diagnostics_message():
    scheduler = QueryScheduler(rate_hz=2.0)
    d = diagnose({"version": 0}, scheduler, QueryStats(started_s=0.0), now_s=1.0,
                 capacity={"viable": False, "message": "arrival exceeds ...", "headroom_s": -3})
    assert d.level == 1 and d.message == "arrival exceeds ..."
    assert ("capacity.headroom_s", "-3") in d.values


# -- 2. a restarted aggregator without a chunk log ----------------------------------------------

@pytest.fixture
def fold(tokenizer, layout):
    return StateFold(new_state(tokenizer, layout))


def test_a_new_stream_starts_a_new_version_instead_of_merging(fold):
    for seq in range(5):
        fold.on_chunk(event(seq, "a"))
    assert fold.on_chunk(event(0, "b", "speech: data=hello")) is None
    assert fold.version == 1 and fold.stream == "b"
    assert [c.text for c in fold.state.chunks] == ["speech: data=hello\n"]
    assert fold.counters.stream_restarts == 1 and fold.order.counters.duplicates == 0
    restart = fold.last_restart
    assert (restart.old_stream, restart.new_stream, restart.dropped_chunks) == ("a", "b", 5)
    assert "restarted without its chunk log" in restart.describe()


def test_late_chunks_of_a_retired_stream_are_dropped_and_counted(fold):
    fold.on_chunk(event(0, "a"))
    fold.on_chunk(event(0, "b"))
    fold.on_chunk(event(1, "a"))
    assert [c.seq for c in fold.state.chunks] == [0] and fold.counters.retired_chunks == 1


def test_a_swap_naming_a_new_stream_resets_before_its_first_chunk_arrives(fold):
    for seq in range(3):
        fold.on_chunk(event(seq, "a"))
    assert fold.on_swap(SwapEvent(version=4, primary="r2", reason="stream", stream="b"))
    assert fold.version == 4 and fold.state.chunks == [] and fold.next_seq == 0
    fold.on_chunk(event(0, "b"))
    assert [c.seq for c in fold.state.chunks] == [0]


def test_a_get_chunks_answer_from_a_new_stream_is_a_new_stream(fold):
    for seq in range(3):
        fold.on_chunk(event(seq, "a"))
    fold.on_fetched_all([event(0, "b"), event(1, "b")], 0, stream="b")
    assert fold.stream == "b" and [c.seq for c in fold.state.chunks] == [0, 1]


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


# -- 5. a node that joins after a long history ------------------------------------------------

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


# -- 11. a restarted reconciler ---------------------------------------------------------------

def test_a_start_event_with_the_version_the_policy_holds_is_adopted(fold):
    for seq in range(6):
        fold.on_chunk(event(seq))
    fold.on_swap(SwapEvent(version=2, primary="r2", evicted_before_seq=0, reason="start"))
    assert fold.on_swap(SwapEvent(version=2, primary="r1", evicted_before_seq=3,
                                  reason="start"))
    assert fold.primary == "r1" and [c.seq for c in fold.state.chunks] == [3, 4, 5]
    assert fold.counters.starts == 2


def test_a_start_event_that_keeps_chunks_the_policy_evicted_refetches_them(fold):
    for seq in range(6):
        fold.on_chunk(event(seq))
    fold.on_swap(SwapEvent(version=3, primary="r2", evicted_before_seq=4, reason="swap"))
    assert fold.on_swap(SwapEvent(version=3, primary="r1", evicted_before_seq=2,
                                  reason="start"))
    assert fold.needs_probe and fold.state.chunks == [] and fold.next_seq == 2
    request = fold.probe()
    assert (request.start_seq, request.end_seq) == (2, 0)
    fold.on_fetched_all([event(s) for s in range(2, 6)], 0)
    assert [c.seq for c in fold.state.chunks] == [2, 3, 4, 5] and fold.version == 3


# -- 4, 7, 12, 13. parameters and QoS -----------------------------------------------------------

def test_a_source_without_publishers_is_subscribed_reliably():
    assert match_publishers([]).reliable


def test_a_typo_in_a_parameter_name_is_refused_with_the_right_name():
    with pytest.raises(ConfigError, match=r"'rate_hzz' \(did you mean 'rate_hz'\?\)"):
        validate("policy", {"rate_hzz": 2.0})
    with pytest.raises(ConfigError, match=r"'max_new_token' \(did you mean 'max_new_tokens'"):
        validate("policy", {"max_new_token": 4})


def test_a_source_entry_not_listed_in_sources_is_refused():
    values = {"sources": ["speech"], "source.speech.topic": "/s",
              "source.speech.type": "std_msgs/msg/String", "source.odom.topic": "/odom"}
    with pytest.raises(ConfigError, match=r"source.odom.\* is described but 'odom' is not"):
        validate("aggregator", values)
    values = {"sources": ["speech"], "source.speech.topic": "/s",
              "source.speech.type": "std_msgs/msg/String", "source.speech.period": 1.0}
    with pytest.raises(ConfigError, match=r"did you mean 'source.speech.period_s'"):
        validate("aggregator", values)


def test_a_string_for_a_float_parameter_says_it_is_a_string():
    rate = next(s for s in POLICY if s.name == "rate_hz")
    problem = type_problem(rate, "fast")
    assert "'fast' is a string, not a number" in problem and "write 2.0" not in problem
    assert "write 2.0, not 2" in type_problem(rate, 2)
    assert "unquoted" in type_problem(rate, "2.0")
    assert type_problem(rate, 2.0) is None


def test_a_number_for_a_string_parameter_says_to_quote_it():
    task = next(s for s in POLICY if s.name == "task")
    assert 'quote it ("5")' in type_problem(task, 5)


def test_a_missing_params_file_on_the_command_line_is_a_clear_error(tmp_path):
    args = ["policy", "--ros-args", "--params-file", str(tmp_path / "nope.yaml"), "-r", "a:=b"]
    assert params_files_in_args(args) == [str(tmp_path / "nope.yaml")]
    with pytest.raises(ConfigError, match=r"parameters file .*nope.yaml does not exist"):
        check_params_files(args)
    check_params_files(["policy", "--ros-args", "--params-file", str(CONFIG)])


# -- 3, 12, 14. launch ------------------------------------------------------------------------

def test_launch_arguments_that_were_not_given_set_no_parameter():
    table = {"r1_url": ("resource.r1_url", str), "threads": ("resource.threads", int),
             "use_sim_time": ("use_sim_time", bool)}
    assert given_overrides({"r1_url": "", "threads": "", "use_sim_time": ""}, table) == {}
    assert given_overrides({"r1_url": "http://gpu:8001", "threads": "4",
                            "use_sim_time": "true"}, table) == {
        "resource.r1_url": "http://gpu:8001", "resource.threads": 4, "use_sim_time": True}
    with pytest.raises(ConfigError, match=r"threads:='four' must be an integer"):
        given_overrides({"threads": "four"}, table)


def test_every_launch_argument_that_sets_a_parameter_defaults_to_not_given():
    """The launch files route parameter arguments through given_overrides, declared with ''."""
    for path in sorted((ROOT / "launch").glob("*.launch.py")):
        tree = ast.parse(path.read_text())
        tables = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "OVERRIDES" for t in n.targets)]
        forwarded = set()
        for table in tables:
            forwarded |= {k.value for k in table.value.keys}
        if path.name == "replay.launch.py":
            forwarded = {"model", "threads"}
        defaults = {}
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == \
                    "DeclareLaunchArgument":
                name = call.args[0].value
                default = next((k.value for k in call.keywords if k.arg == "default_value"),
                               None)
                defaults[name] = default.value if isinstance(default, ast.Constant) else "expr"
        assert forwarded, path.name
        for name in forwarded:
            assert defaults.get(name) == "", f"{path.name}: {name} defaults to {defaults[name]}"
        assert "given_overrides" in path.read_text() or path.name == "replay.launch.py"


def test_a_missing_params_file_stops_the_launch_with_a_clear_message(tmp_path):
    with pytest.raises(ConfigError, match=r"params_file .*missing.yaml does not exist"):
        check_params_file(str(tmp_path / "missing.yaml"))
    assert check_params_file(str(CONFIG)) == str(CONFIG)


def test_the_replay_launch_passes_topics_offset_and_delay_to_bag_play():
    cmd = bag_play_command("/bags/patrol", rate="2.0", topics="/odom, /speech/text",
                           start_offset_s="120", delay_s="10")
    assert cmd == ["ros2", "bag", "play", "/bags/patrol", "--rate", "2.0", "--clock",
                   "--topics", "/odom", "/speech/text", "--start-offset", "120",
                   "--delay", "10"]
    assert "--topics" not in bag_play_command("/b")
    with pytest.raises(ConfigError, match=r"delay:='soon' must be a number"):
        bag_play_command("/b", delay_s="soon")


def test_the_bag_player_scales_bag_time_by_the_rate_after_the_start_offset():
    from csr_ros.nodes.player import schedule

    times = [10_000_000_000, 10_500_000_000, 12_000_000_000, 14_000_000_000]
    assert list(schedule(times, rate=2.0)) == [(0, 0.0), (1, 0.25), (2, 1.0), (3, 2.0)]
    assert list(schedule(times, rate=1.0, start_offset_s=1.5)) == [(2, 0.5), (3, 2.5)]
    with pytest.raises(ConfigError, match="--rate must be > 0"):
        list(schedule(times, rate=0.0))


# -- launch files and players, as run on launch/launch_ros/ros2cli (jazzy) ----------------------

def test_a_bad_bag_argument_is_refused_before_anything_is_launched(tmp_path, monkeypatch):
    """Every bag argument is checked by check_bag, which the replay launch calls before it
    describes any node (the rclpy half: test/ros/test_launch_files.py)."""
    import os
    import sys

    # csr-ros (the csr player) is installed next to this Python
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                os.environ.get("PATH", "")]))
    bag = tmp_path / "bag"
    bag.mkdir()
    good = {"bag": str(bag), "rate": "1.0", "topics": "", "start_offset": "", "delay": "",
            "loop": "false", "player": "csr"}
    assert check_bag(good, rosbag2=False)[:4] == ["csr-ros", "replay", str(bag), "--play"]
    for name, value, says in [("delay", "soon", r"delay:='soon' must be a number"),
                              ("start_offset", "-3", r"start_offset:='-3' must be >= 0"),
                              ("rate", "0", r"rate:='0' must be > 0"),
                              ("loop", "often", r"'often' is not a boolean"),
                              ("bag", str(tmp_path / "none"), r"bag:=.*none does not exist")]:
        with pytest.raises(ConfigError, match=says):
            check_bag({**good, name: value}, rosbag2=False)


def test_the_replay_launch_describes_its_nodes_only_after_checking_the_bag_arguments():
    """No node, include or process at the top level of replay.launch.py: they come from the
    OpaqueFunction that calls check_bag first, so a bad argument starts nothing."""
    tree = ast.parse((ROOT / "launch" / "replay.launch.py").read_text())
    generate = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                    and n.name == "generate_launch_description")
    top = {getattr(c.func, "id", "") for c in ast.walk(generate) if isinstance(c, ast.Call)}
    assert not top & {"IncludeLaunchDescription", "Node", "ExecuteProcess"}, top
    replay = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "replay")
    calls = [c for c in ast.walk(replay) if isinstance(c, ast.Call)]
    first_check = min(c.lineno for c in calls if getattr(c.func, "id", "") == "check_bag")
    starts = [c.lineno for c in calls if getattr(c.func, "id", "") in
              ("IncludeLaunchDescription", "ExecuteProcess")]
    assert starts and first_check < min(starts)


def test_the_csr_player_without_csr_ros_on_path_is_refused_before_anything_starts(tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"player:=csr needs the csr-ros command"):
        check_bag({"bag": str(tmp_path), "player": "auto"}, rosbag2=False)


def test_delay_zero_plays_at_once_instead_of_a_delay_rosbag2_refuses():
    """rosbag2's --delay takes only values above 0 (ros2bag's play verb, jazzy)."""
    assert "--delay" not in bag_play_command("/b", delay_s="0")
    assert "--delay" not in bag_play_command("/b", delay_s="0.0")
    assert bag_play_command("/b", delay_s="2.5")[-2:] == ["--delay", "2.5"]
    with pytest.raises(ConfigError, match=r"delay:='-1' must be >= 0"):
        bag_play_command("/b", delay_s="-1")


def test_player_auto_plays_with_csr_ros_where_ros2_bag_is_missing():
    from csr_ros.launch_args import choose_player

    assert choose_player("auto", rosbag2=False) == "csr"
    assert choose_player("auto", rosbag2=True) == "rosbag2"
    assert choose_player("csr", rosbag2=True) == "csr"
    with pytest.raises(ConfigError, match=r"player:=rosbag2, but `ros2 bag` is not installed.*"
                                          r"player:=csr"):
        choose_player("rosbag2", rosbag2=False)
    with pytest.raises(ConfigError, match=r"player:='vlc' must be one of auto, rosbag2, csr"):
        choose_player("vlc", rosbag2=True)


def test_the_csr_player_gets_the_options_rosbag2_gets():
    from csr_ros.launch_args import csr_play_command

    cmd = csr_play_command("/bags/patrol", rate="2.0", topics="/odom /speech/text",
                           start_offset_s="120", delay_s="0", loop=True)
    assert cmd == ["csr-ros", "replay", "/bags/patrol", "--play", "--rate", "2.0", "--clock",
                   "--topics", "/odom", "/speech/text", "--start-offset", "120", "--delay", "0",
                   "--loop"]
    from csr_ros.cli import parse_args

    args = parse_args(cmd[1:])            # what `csr-ros replay` parses
    assert (args.play, args.rate, args.clock, args.topics, args.start_offset, args.delay,
            args.loop) == (True, 2.0, True, ["/odom", "/speech/text"], 120.0, 0.0, True)


def test_a_player_that_fails_stops_the_launch_with_its_last_lines():
    from csr_ros.launch_args import player_exit_reason

    assert player_exit_reason(0, ["published 12 messages in 3.0 s"]) is None
    reason = player_exit_reason(2, ["", "csr-ros replay: error: bag /b does not exist"])
    assert reason == ("the bag player exited with code 2: csr-ros replay: error: bag /b does "
                      "not exist")
    assert player_exit_reason(-9, []) == "the bag player exited with code -9 (it printed nothing)"


def test_a_launch_argument_that_is_not_a_boolean_says_write_true_or_false():
    table = {"use_sim_time": ("use_sim_time", bool)}
    with pytest.raises(ConfigError, match=r"use_sim_time:='maybe'.*write true or false") as info:
        given_overrides({"use_sim_time": "maybe"}, table)
    assert "must be bool" not in str(info.value)


def test_the_csr_player_refuses_a_missing_bag_before_starting_ros(tmp_path):
    from csr_ros.nodes.player import PlayOptions, play

    with pytest.raises(ConfigError, match=r"bag .*nothing does not exist"):
        play([tmp_path / "nothing"], PlayOptions())
    with pytest.raises(ConfigError, match=r"--delay must be >= 0 seconds, got -1"):
        play([tmp_path], PlayOptions(delay_s=-1.0))


def test_the_ros_docs_say_what_launch_needs_and_nothing_stale():
    ros = (ROOT / "docs" / "ros.md").read_text()
    lack = ros[ros.index("**What the wheels lack**"):]
    lack = lack[:lack.index("\n- ")]
    for name in ("launch_ros", "ros2cli", "rosbag2", "composition_interfaces"):
        assert f"`{name}`" in lack, name
    assert "need `mode: text`" not in ros           # token mode sends text to llama.cpp
    assert "Launch files on the wheels" in ros


def test_each_shell_block_of_the_launch_steps_sets_the_variables_it_uses():
    """docs/ros.md, run as written: the shell that launches is a new one, so it must set $CSR,
    $VENV and $WS itself (they were set only in the build block), and the workspace is named
    one way ($WS), not four."""
    import re

    ros = (ROOT / "docs" / "ros.md").read_text()
    section = ros[ros.index("## Launch files on the wheels"):ros.index("## What runs where")]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the build block and the block of each shell"
    given = {"HOME", "PATH", "PYTHONPATH", "AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH"}
    for block in blocks:
        code = re.sub(r"<<'EOF'\n.*?\nEOF\n", "\n", block, flags=re.S)   # the CMake heredoc
        code = re.sub(r"#.*", "", code)
        defined = set(re.findall(r"^([A-Z_]+)=", code, re.M)) | given | {"repo"}
        used = set(re.findall(r"\$\{?([A-Za-z_]+)", code))
        assert used <= defined, (used - defined, block)
        assert "~/launch_ws" not in block and "$HOME/launch_ws/" not in block, block
