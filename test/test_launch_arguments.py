"""The launch files' arguments and the replay launch's bag player, without ROS
(csr_ros/launch_args.py, csr_ros/nodes/player.py, and the launch files read as source): an
argument not given sets no parameter, a bad value stops the launch saying why before anything
starts, and the csr player takes the options rosbag2 takes. The launch files under `ros2
launch` are in test/ros/test_launch_files.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from csr_ros.errors import ConfigError
from csr_ros.launch_args import (SHARED_ARGUMENTS, aggregator_parameters, bag_play_command,
                                check_bag, check_params_file, given_overrides)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "csr_ros.yaml"


# -- arguments that set parameters -------------------------------------------------------------

def test_launch_arguments_that_were_not_given_set_no_parameter():
    table = {"r1_url": ("resource.r1_url", str), "threads": ("resource.threads", int),
             "use_sim_time": ("use_sim_time", bool)}
    assert given_overrides({"r1_url": "", "threads": "", "use_sim_time": ""}, table) == {}
    assert given_overrides({"r1_url": "http://gpu:8001", "threads": "4",
                            "use_sim_time": "true"}, table) == {
        "resource.r1_url": "http://gpu:8001", "resource.threads": 4, "use_sim_time": True}
    with pytest.raises(ConfigError, match=r"threads:='four' must be an integer"):
        given_overrides({"threads": "four"}, table)


def test_detections_type_retypes_the_aggregators_detections_source_only_when_given():
    from csr_ros.ros_params import load_params_file, validate

    assert aggregator_parameters({"detections_type": ""}) == aggregator_parameters({}) == {}
    given = aggregator_parameters({"detections_type": "std_msgs/String"})
    assert given == {"source.detections.type": "std_msgs/msg/String"}
    values = load_params_file(CONFIG)["aggregator"]
    sources = {s.name: s for s in validate("aggregator", values | given)["sources"]}
    assert sources["detections"].type_name == "std_msgs/msg/String"
    assert sources["detections"].topic == "/detections"          # the rest of it as in the file
    assert sources["speech"].type_name == "std_msgs/msg/String"
    with pytest.raises(ConfigError, match=r"detections_type:='Detection2DArray'.*package/msg/"):
        aggregator_parameters({"detections_type": "Detection2DArray"})


def test_every_launch_file_with_an_aggregator_takes_detections_type():
    for path in sorted((ROOT / "launch").glob("*.launch.py")):
        text = path.read_text()
        if '"aggregator"' in text or path.name == "replay.launch.py":
            assert "aggregator_parameters(args)" in text and '"detections_type"' in text, \
                path.name


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
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "declare":
                for arg in call.args:          # the shared ones: launch_args.SHARED_ARGUMENTS
                    defaults[arg.value] = SHARED_ARGUMENTS[arg.value][0]
        assert forwarded, path.name
        for name in forwarded:
            assert defaults.get(name) == "", f"{path.name}: {name} defaults to {defaults[name]}"
        assert "given_overrides" in path.read_text() or path.name == "replay.launch.py"


def test_a_missing_params_file_stops_the_launch_with_a_clear_message(tmp_path):
    with pytest.raises(ConfigError, match=r"params_file .*missing.yaml does not exist"):
        check_params_file(str(tmp_path / "missing.yaml"))
    assert check_params_file(str(CONFIG)) == str(CONFIG)


# -- the replay launch and its bag players -----------------------------------------------------

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
