"""Recorded bags that do not follow the params file: other topic names and rates, extra topics
(a 10 Hz camera, /tf at 50 Hz, a custom type nobody knows), still rendered within budget with
every event kept."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from csr_ros import patrol
from csr_ros.bag_replay import replay_chunks
from csr_ros.bag_sources import plan_sources, read_bag
from csr_ros.cli import main as cli_main
from csr_ros.render import (Bulk, Emitter, EmitterSource, RenderOptions, to_plain, topic_policy,
                            type_policy)
from csr_ros.render.emission import EmissionConfig
from csr_ros.render.summaries import (summarize_diagnostic_array, summarize_log,
                                      summarize_nav_sat_fix, summarize_tf_message)

CONFIG = "config/csr_ros.yaml"
S = 1_000_000_000
RENAMED = {"/speech/text": "/speech", "/odom": "/odometry/filtered",
           "/detections": "/detections2d", "/battery_state": "/battery",
           "/action_result": "/robot/action_result"}
CONSTANT = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")
LONG_INT = re.compile(r"\d{10,}")


@pytest.fixture(scope="module")
def other_bag(tmp_path_factory):
    """Three minutes of a robot whose topics are named otherwise and that records more."""
    out = tmp_path_factory.mktemp("other") / "bag"
    truth = patrol.generate_patrol(out, duration_s=180.0, seed=4, odom_hz=10.0, scan_hz=10.0,
                                   battery_hz=0.5, topic_names=RENAMED, extras=True,
                                   image_hz=10.0, tf_hz=50.0, action_results="custom",
                                   detections="vision_msgs")
    return out, truth


def test_a_bag_with_other_topic_names_keeps_every_event_within_budget(other_bag, tmp_path,
                                                                       capsys):
    bag, truth = other_bag
    assert truth.topics["/camera/image_raw"]["count"] >= 1790          # 10 Hz camera
    assert truth.topics["/tf"]["count"] >= 8990                         # 50 Hz transforms
    out = tmp_path / "stats.json"
    assert cli_main(["replay", str(bag), "--params", CONFIG, "--stats",
                     "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    s = report["sources"]
    # the configured sources found their topics by type, and say so
    assert s["speech"]["topic"] == "/speech" and s["speech"]["origin"] == "matched"
    assert s["odom"]["topic"] == "/odometry/filtered" and s["battery"]["topic"] == "/battery"
    assert "matched: /speech" in printed
    # every event: chunks equal the bag's messages, and the report says so
    events = report["events"]
    assert events["speech"]["chunks"] == truth.event_counts["utterance"] > 0
    assert events["detections"]["chunks"] == truth.event_counts["detection"] > 0
    results = [e for e in events.values() if e["topic"] == "/robot/action_result"]
    assert len(results) == 1 and results[0]["chunks"] == truth.event_counts["action_result"] > 0
    assert report["all_events_kept"] and "all kept" in printed
    # the topics nobody configured: each with its policy, none left silently
    topics = report["topics"]
    assert set(topics) == set(truth.topics)
    assert topics["/camera/image_raw"]["origin"] == "auto"
    assert report["left_out"]["/clock"]["why"] == \
        "left out: the simulation clock (every chunk has its time)"
    assert "left out: /clock (rosgraph_msgs/msg/Clock" in printed
    assert topics["/motor_status"]["policy"].startswith("state, period 15 s")
    assert s["camera_image_raw"]["chunks"] <= 2 and s["tf"]["chunks"] <= 3
    assert report["totals"]["tokens_per_s"] <= 20.0
    assert sum(v["tokens"] for v in s.values()) == report["totals"]["tokens"]


def test_nothing_heavy_leaks_from_images_transforms_or_custom_types(other_bag):
    bag, _ = other_bag
    sources = plan_sources([bag], CONFIG).sources
    chunks = list(replay_chunks(read_bag([bag], sources), sources))
    texts = [c.text for c in chunks]
    camera = [t for t in texts if " camera/image_raw: " in t]
    assert camera and all(t.endswith("camera/image_raw: 128x96 rgb8") for t in camera)
    tf = [t for t in texts if " tf: " in t]
    assert tf == [tf[0]] and "map>odom" in tf[0] and "odom>base_link" in tf[0]
    assert max(len(t) for t in texts) < 400
    assert [t for t in texts if CONSTANT.search(t) or LONG_INT.search(t)] == []
    logs = [t for t in texts if " rosout: " in t]
    assert all(" warn " in t or " error " in t for t in logs)      # info lines are quiet


def test_only_configured_renders_the_params_topics_alone_and_names_the_rest(other_bag, tmp_path,
                                                                           capsys):
    bag, _ = other_bag
    plan = plan_sources([bag], CONFIG, only_configured=True)
    assert set(plan.sources) == {"/scan", "/navigate_to_pose/_action/status"}
    assert plan.absent["speech"] == "/speech/text"
    assert plan.topics["/camera/image_raw"].policy == "left out: --only-configured"
    out = tmp_path / "stats.json"
    assert cli_main(["replay", str(bag), "--params", CONFIG, "--only-configured", "--stats",
                     "--json", str(out)]) == 0
    report = json.loads(out.read_text())          # the utterances it did not render are named
    assert not report["all_events_kept"] and "/speech" in report["events_not_rendered"]
    n_speech = report["events_not_rendered"]["/speech"]["messages"]
    assert n_speech > 0 and f"/speech 0/{n_speech}" in capsys.readouterr().out


def test_a_configured_topic_missing_from_the_bag_is_matched_only_when_that_is_unambiguous(
        tmp_path):
    bag = tmp_path / "bag"                  # two String topics, two absent String sources
    patrol.generate_patrol(bag, duration_s=20.0, seed=1,
                           topic_names={"/speech/text": "/speech", "/action_result": "/results"})
    plan = plan_sources([bag], CONFIG)      # the names tell which is which
    assert (plan.sources["/speech"].name, plan.sources["/results"].name) == ("speech", "actions")
    assert plan.topics["/results"].origin == "matched" and "task" in plan.absent   # instant
    other = tmp_path / "other"              # nothing in the names: neither is guessed
    patrol.generate_patrol(other, duration_s=20.0, seed=1,
                           topic_names={"/speech/text": "/audio_in", "/action_result": "/says"})
    plan = plan_sources([other], CONFIG)
    assert {"speech", "actions"} <= set(plan.absent)
    assert any("2 topics of its type could be it (/audio_in, /says)" in n for n in plan.notes)
    for topic in ("/audio_in", "/says"):
        assert plan.topics[topic].origin == "auto" and plan.sources[topic].emission.event


def test_two_absent_sources_of_one_type_do_not_both_claim_the_only_topic_of_that_type():
    from csr_ros.ros_params import SourceConfig
    from csr_ros.bag_sources import match_by_type

    def src(name, topic, instant=False):
        return SourceConfig(name=name, topic=topic, type_name="std_msgs/msg/String", label=name,
                            period_s=0.0, instant=instant, render=RenderOptions())
    bag = {"/voice": "std_msgs/msg/String", "/odom": "nav_msgs/msg/Odometry"}
    found = match_by_type([src("speech", "/speech/text"), src("actions", "/action_result"),
                           src("task", "/current_goal", instant=True)], bag)
    assert isinstance(found["speech"], str) and isinstance(found["actions"], str)
    assert "task" not in found                                  # instant: never matched
    assert match_by_type([src("speech", "/speech/text")], bag)["speech"][0] == "/voice"


def test_type_defaults_make_events_states_or_leave_out_with_a_reason():
    assert type_policy("std_msgs/msg/String", "/speech").action == "event"
    assert type_policy("acme_msgs/msg/ObjectDetections", "/objects").action == "event"
    assert type_policy("acme_msgs/msg/Pulse", "/task_result").action == "event"
    assert type_policy("sensor_msgs/msg/Image", "/cam").action == "state"
    unknown = type_policy("acme_msgs/msg/Wheels", "/wheels")
    assert (unknown.action, unknown.period_s, unknown.max_chars) == ("state", 15.0, 240)
    assert type_policy("rosgraph_msgs/msg/Clock", "/clock").describe().startswith("left out: ")
    assert type_policy("std_msgs/msg/String", "/robot_description").action == "omit"
    assert type_policy("nav2_msgs/action/NavigateToPose_FeedbackMessage", "/x").action == "omit"
    stream = topic_policy("vision_msgs/msg/Detection2DArray", "/det", rate_hz=15.0, count=9000)
    assert stream.action == "state" and "stream" in stream.reason
    assert topic_policy("std_msgs/msg/String", "/speech", rate_hz=0.02, count=12).action == \
        "event"


def test_bulk_arrays_are_kept_as_their_length_in_every_message_shape():
    data = np.zeros(640 * 480 * 3, dtype=np.uint8)
    assert to_plain(data) == to_plain(bytes(data)) == to_plain(list(data[:5000].tolist()) +
                                                               [0] * (len(data) - 5000))
    assert to_plain(data) == Bulk(921600)
    assert to_plain(np.zeros(360, dtype=np.float32)) == [0.0] * 360     # a scan stays data
    e = Emitter([EmitterSource("blob", "acme_msgs/msg/Blob")])
    out = e.offer("blob", {"name": "cam", "data": data}, 0)
    assert out[0].text == "0s blob: name=cam data={n=921600}"


def test_logs_below_warn_are_quiet_unless_the_source_is_an_event():
    info = {"level": 20, "name": "nav", "msg": "Reached the goal!"}
    warn = {"level": 30, "name": "nav", "msg": "Failed  to make\nprogress"}
    assert summarize_log(info).quiet and not summarize_log(warn).quiet
    assert summarize_log(warn).text == "warn nav: Failed to make progress"
    e = Emitter([EmitterSource("log", "rcl_interfaces/msg/Log")])
    out = [c for i, m in enumerate([info, warn, info, warn]) for c in e.offer("log", m, i * S)]
    assert [c.text for c in out] == ["1s log: warn nav: Failed to make progress"]
    assert e.stats["log"].suppressed == 3
    events = Emitter([EmitterSource("log", "rcl_interfaces/msg/Log",
                                    emission=EmissionConfig(event=True))])
    assert len([c for m in (info, warn) for c in events.offer("log", m, 0)]) == 2


def test_diagnostics_list_only_statuses_that_are_not_ok():
    ok = {"level": 0, "name": "motors", "message": "ok"}
    hot = {"level": [1], "name": "lidar", "message": "no data"}     # a byte from rclpy
    assert summarize_diagnostic_array({"status": [ok, ok]}).text == "all ok (2)"
    assert summarize_diagnostic_array({"status": [ok, hot]}).text == "warn lidar: no data"


def test_transforms_make_a_chunk_only_when_a_new_frame_pair_appears():
    def tf(*pairs):
        return {"transforms": [{"header": {"frame_id": a}, "child_frame_id": b}
                               for a, b in pairs]}
    e = Emitter([EmitterSource("tf", "tf2_msgs/msg/TFMessage", period_s=0.0)])
    msgs = [tf(("odom", "base_link"))] * 5 + [tf(("map", "odom"))] + [
        tf(("odom", "base_link"))] * 5
    out = [c.text for i, m in enumerate(msgs) for c in e.offer("tf", m, i * S // 50)]
    assert out == ["0s tf: odom>base_link", "0s tf: map>odom, odom>base_link"]
    assert summarize_tf_message(tf()).text == "no transforms"


def test_gnss_fix_moves_past_its_deadband_in_metres():
    def fix(lat):
        return {"status": {"status": 0}, "latitude": lat, "longitude": 2.3488,
                "altitude": 35.0, "position_covariance": [9.0] + [0.0] * 8,
                "position_covariance_type": 2}
    assert summarize_nav_sat_fix(fix(48.85341)).text == "fix 48.85341,2.34880 alt 35 ±3m"
    assert summarize_nav_sat_fix({"status": {"status": -1}}).text == "no fix"
    e = Emitter([EmitterSource("gps", "sensor_msgs/msg/NavSatFix")])      # 5 m by default
    lats = [48.85341, 48.85343, 48.85345, 48.85341 + 10 / 111_000]
    out = [c.text for i, lat in enumerate(lats) for c in e.offer("gps", fix(lat), i * S)]
    assert len(out) == 2 and e.stats["gps"].suppressed == 2


def test_image_and_point_cloud_summaries_never_carry_their_data():
    store = get_typestore(Stores.ROS2_JAZZY)
    t = store.types
    image = t["sensor_msgs/msg/Image"](
        header=t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=1, nanosec=0),
                                        frame_id="cam"),
        height=480, width=640, encoding="bgr8", is_bigendian=0, step=1920,
        data=np.full(640 * 480 * 3, 7, dtype=np.uint8))
    field = t["sensor_msgs/msg/PointField"]
    cloud = t["sensor_msgs/msg/PointCloud2"](
        header=image.header, height=1, width=20480,
        fields=[field(name=n, offset=4 * i, datatype=7, count=1) for i, n in enumerate("xyz")],
        is_bigendian=False, point_step=12, row_step=12 * 20480,
        data=np.zeros(12 * 20480, dtype=np.uint8), is_dense=True)
    e = Emitter([EmitterSource("cam", "sensor_msgs/msg/Image"),
                 EmitterSource("lidar", "sensor_msgs/msg/PointCloud2")])
    assert e.offer("cam", image, S)[0].text == "0s cam: 640x480 bgr8"
    assert e.offer("lidar", cloud, S)[0].text == "0s lidar: 20480 points x,y,z"
    assert e.offer("cam", image, 2 * S) == []                  # same shape: suppressed


def test_a_configured_source_with_period_minus_one_takes_its_types_default_period():
    from csr_ros.errors import ConfigError
    from csr_ros.ros_params import parse_params_yaml, validate

    def sources(extra):
        text = ("aggregator:\n  ros__parameters:\n    sources: [imu, speech]\n    source:\n"
                "      imu: {topic: /imu, type: sensor_msgs/msg/Imu" + extra + "}\n"
                "      speech: {topic: /speech, type: std_msgs/msg/String, event: true,"
                " period_s: -1.0}\n")
        return {s.name: s for s in validate("aggregator",
                                            parse_params_yaml(text)["aggregator"])["sources"]}
    assert sources("")["imu"].period_s == 0.0                      # unchanged when left out
    got = sources(", period_s: -1.0")
    assert got["imu"].period_s == 10.0 and got["speech"].period_s == 0.0
    with pytest.raises(ConfigError, match=r"period_s must be >= 0 \(or -1"):
        sources(", period_s: -0.5")


def test_a_path_is_its_length_and_goal_and_changes_when_the_goal_moves():
    def path(*xy):
        return {"header": {"frame_id": "map"},
                "poses": [{"pose": {"position": {"x": x, "y": y, "z": 0.0}}} for x, y in xy]}
    e = Emitter([EmitterSource("plan", "nav_msgs/msg/Path")])
    msgs = [path((0, 0), (3, 4)), path((0.5, 0), (3, 4.5)), path((0, 0), (6, 8)), path()]
    out = [c.text for i, m in enumerate(msgs) for c in e.offer("plan", m, i * S)]
    assert out == ["0s plan: 2 poses 5m to 3,4", "2s plan: 2 poses 10m to 6,8", "3s plan: empty"]


def test_the_other_robots_bag_renders_the_same_from_real_rclpy_messages(other_bag):
    pytest.importorskip("rclpy", reason="the rclpy-shaped variant runs without ROS")
    from support.rosmsg_shapes import rclpy_shaped, to_rclpy

    import importlib.util

    bag, _ = other_bag
    plan = plan_sources([bag], CONFIG)
    # the types whose rclpy classes are installed (vision_msgs, patrol_msgs exist only in the bag)
    sources = {t: s for t, s in plan.sources.items()
               if importlib.util.find_spec(s.type_name.split("/")[0]) is not None}
    assert {"/camera/image_raw", "/rosout", "/diagnostics", "/cmd_vel"} <= set(sources)
    messages = list(read_bag([bag], sources))[:4000]          # the first 90 s or so
    from_bag = [c.text for c in replay_chunks(messages, sources)]
    for shape in (to_rclpy, rclpy_shaped):
        live = [(topic, t, shape(m)) for topic, t, m in messages]
        assert [c.text for c in replay_chunks(live, sources)] == from_bag
    assert any(" camera/image_raw: 128x96 rgb8" in t for t in from_bag)
    assert any(" diagnostics: " in t for t in from_bag)


def test_custom_detection_types_are_summarised_by_label_score_and_place_or_generically():
    from csr_ros.render import render

    objects = {"header": {"frame_id": "cam"}, "objects": [
        {"class_name": "cup", "probability": 0.912, "pose": {"pose": {"position": {
            "x": 1.24, "y": 3.0, "z": 0.7}}}, "mask": list(range(20))},
        {"class_name": "person", "probability": 0.78}]}
    assert render(objects, label="seen", type_name="acme_msgs/msg/ObjectDetections") == \
        "seen: cup 0.91 at 1.2,3, person 0.78"
    single = {"label": "dog", "score": 0.5, "center": {"x": 2.0, "y": 1.0}}
    assert render(single, label="d", type_name="acme_msgs/msg/Detection") == "d: dog 0.5 at 2,1"
    assert render({"header": {}, "objects": []}, label="d",
                  type_name="acme_msgs/msg/Detections") == "d: nothing"
    unlabelled = {"boxes": [{"x": 1.0, "y": 2.0}]}           # nothing says what: generic
    assert render(unlabelled, label="d", type_name="acme_msgs/msg/Detections") == \
        "d: boxes=[1,2]"


def test_an_imu_writes_rates_and_accelerations_only_when_they_say_something():
    from csr_ros.render.summaries import summarize_imu

    def imu(yaw_z=0.0, gz=0.0, ax=0.0, roll_x=0.0, gx=0.0):
        return {"orientation": {"x": roll_x, "y": 0.0, "z": yaw_z,
                                "w": (1 - roll_x ** 2 - yaw_z ** 2) ** 0.5},
                "orientation_covariance": [0.0] * 9,
                "angular_velocity": {"x": gx, "y": 0.0, "z": gz},
                "linear_acceleration": {"x": ax, "y": 0.0, "z": 9.8}}
    assert summarize_imu(imu()).text == "heading 0 steady"
    assert summarize_imu(imu(gz=0.8)).text == "heading 0 turning 46°/s"
    assert summarize_imu(imu(ax=2.1)).text == "heading 0 acc 2.1,0,9.8"
    assert summarize_imu(imu(roll_x=0.1, gx=0.3)).text == "rpy 11,0,0° gyro 17,0,0°/s"
    no_attitude = imu() | {"orientation_covariance": [-1.0] + [0.0] * 8}
    assert summarize_imu(no_attitude).text == "steady"


def test_an_unknown_type_that_comes_rarely_is_an_event_and_one_that_streams_is_bounded():
    rare = topic_policy("acme_msgs/msg/TaskReport", "/report", rate_hz=0.03, count=18)
    assert rare.action == "event" and rare.reason.startswith("sporadic (0.03 Hz)")
    busy = topic_policy("acme_msgs/msg/TaskReport", "/report", rate_hz=5.0, count=3000)
    assert (busy.action, busy.period_s) == ("state", 15.0)
    assert topic_policy("sensor_msgs/msg/Image", "/cam", rate_hz=0.01, count=6).action == "state"
    assert type_policy("acme_msgs/msg/Alarm", "/x").action == "event"
