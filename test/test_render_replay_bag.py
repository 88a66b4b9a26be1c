"""`csr-ros replay`: a real rosbag2 written with rosbags renders into the aggregator's chunks."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from rosbags.rosbag2 import Writer
from rosbags.typesys import Stores, get_typestore

from csr_ros.bag_replay import make_emitter, replay_chunks
from csr_ros.bag_sources import read_bag, sources_for
from csr_ros.chunklog import ChunkRecord, read_log
from csr_ros.cli import main

S = 1_000_000_000
PARAMS = """
aggregator:
  ros__parameters:
    sources: [scan, speech, goal]
    source:
      scan: {topic: /scan, type: sensor_msgs/msg/LaserScan, period_s: 0.25, deadband_m: 0.05}
      speech: {topic: /speech, type: std_msgs/msg/String, event: true}
      goal: {topic: /goal, type: std_msgs/msg/String, instant: true}
"""


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    """1 s of a robot: scans at 10 Hz, one utterance, one goal."""
    store = get_typestore(Stores.ROS2_JAZZY)
    t = store.types
    path = tmp_path_factory.mktemp("bags") / "run1"
    with Writer(path, version=8) as writer:
        scan_c = writer.add_connection("/scan", "sensor_msgs/msg/LaserScan", typestore=store)
        speech_c = writer.add_connection("/speech", "std_msgs/msg/String", typestore=store)
        goal_c = writer.add_connection("/goal", "std_msgs/msg/String", typestore=store)
        for i in range(10):
            stamp = t["builtin_interfaces/msg/Time"](sec=100, nanosec=i * 100_000_000)
            scan = t["sensor_msgs/msg/LaserScan"](
                header=t["std_msgs/msg/Header"](stamp=stamp, frame_id="laser"),
                angle_min=-math.pi / 2, angle_max=math.pi / 2, angle_increment=math.pi / 2,
                time_increment=0.0, scan_time=0.1, range_min=0.1, range_max=10.0,
                ranges=np.array([3.0, 2.0 - i * 0.1, 4.0], dtype=np.float32),
                intensities=np.array([], dtype=np.float32))
            writer.write(scan_c, 100 * S + i * S // 10,
                         store.serialize_cdr(scan, "sensor_msgs/msg/LaserScan"))
            if i == 3:
                msg = t["std_msgs/msg/String"](data="bring me the cup")
                writer.write(speech_c, 100 * S + i * S // 10 + 1,
                             store.serialize_cdr(msg, "std_msgs/msg/String"))
                goal = t["std_msgs/msg/String"](data="kitchen")
                writer.write(goal_c, 100 * S + i * S // 10 + 2,
                             store.serialize_cdr(goal, "std_msgs/msg/String"))
    return path


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS)
    return path


def test_replay_rate_limits_then_applies_the_deadband_on_the_bag_clock(bag, params):
    sources = sources_for([bag], params, None)
    chunks = list(replay_chunks(read_bag([bag], sources), sources))
    history = [c for c in chunks if not c.instant]
    assert [c.seq for c in history] == list(range(len(history)))
    scans = [c for c in history if c.source == "scan"]
    # 10 scans over 0.9 s, the obstacle ahead closing in by 0.1 m a scan; minimum period
    # 0.25 s: the newest held scan goes on once the period has elapsed (0.2 s at 0.3 s, ...;
    # the ones it replaced are counted) and the last one is flushed; each changed by more than
    # the deadband (0.05 m, relative beyond 1 m: 0.1 m at 2 m)
    assert [(c.t_ns - 100 * S) // (S // 10) for c in scans] == [0, 2, 5, 8, 9]
    assert [c.coalesced for c in scans] == [0, 1, 2, 2, 0]
    assert [c.text for c in scans] == [f"0s scan: nearest {r}m ahead"
                                       for r in ("2", "1.8", "1.5", "1.2", "1.1")]
    assert [(c.text, c.reason) for c in history if c.source == "speech"] == \
        [("0s speech: bring me the cup", "event")]
    assert [(c.text, c.seq) for c in chunks if c.instant] == [("0s goal: kitchen", -1)]


def test_a_wider_deadband_suppresses_the_small_changes_and_counts_them(bag, params, tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text(params.read_text().replace("deadband_m: 0.05", "deadband_m: 0.5"))
    sources = sources_for([bag], path, None)
    emitter = make_emitter(sources)
    scans = [c for c in replay_chunks(read_bag([bag], sources), sources, emitter=emitter)
             if c.source == "scan"]
    assert [c.text for c in scans] == ["0s scan: nearest 2m ahead"]
    assert emitter.stats["scan"].suppressed == 4 and emitter.stats["scan"].coalesced == 5


def test_without_params_every_topic_is_a_source(bag):
    sources = sources_for([bag], None, ["/speech"])
    assert list(sources) == ["/speech"] and sources["/speech"].label == "speech"


def test_replay_command_writes_jsonl_and_a_chunk_log(bag, params, tmp_path, capsys):
    out, log = tmp_path / "chunks.jsonl", tmp_path / "chunks.log"
    assert main(["replay", str(bag), "--params", str(params), "--jsonl", str(out),
                 "--chunk-log", str(log)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    history = [r for r in rows if not r["instant"]]
    records = [r for r in read_log(log) if isinstance(r, ChunkRecord)]
    assert [r.seq for r in records] == [r["seq"] for r in history]
    assert records[0].text == history[0]["text"]
    assert "chunks from 3 topics" in capsys.readouterr().err


def test_a_source_whose_type_differs_from_the_bag_renders_as_the_bags_type_with_a_warning(
        bag, tmp_path, capsys):
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS.replace("sensor_msgs/msg/LaserScan", "nav_msgs/msg/Odometry")
                    .replace(", deadband_m: 0.05", ""))
    sources = sources_for([bag], path, None)
    assert sources["/scan"].type_name == "sensor_msgs/msg/LaserScan"
    assert "/scan is sensor_msgs/msg/LaserScan in the bag" in capsys.readouterr().err
    first = next(replay_chunks(read_bag([bag], sources), sources))
    assert first.text == "0s scan: nearest 2m ahead"


def test_a_missing_bag_is_a_config_error(tmp_path):
    assert main(["replay", str(tmp_path / "nope")]) == 2
