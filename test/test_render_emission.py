"""Change-driven emission: deadbands, keep-alive, events never dropped, time jumps, no constants."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from rosbags.highlevel import AnyReader

from csr_ros import patrol
from csr_ros.bag_replay import replay_chunks
from csr_ros.bag_sources import read_bag, sources_for
from csr_ros.cli import main as cli_main
from csr_ros.errors import ConfigError
from csr_ros.render import EmissionConfig, Emitter, EmitterSource, RenderOptions, render, to_plain
from csr_ros.ros_params import parse_params_yaml, validate
from support.rosmsg_shapes import rclpy_shaped, to_rclpy

S = 1_000_000_000
CONFIG = "config/csr_ros.yaml"
CONSTANT = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")   # POWER_SUPPLY_STATUS_FULL, SOURCE_RGB
LONG_INT = re.compile(r"\d{10,}")                          # nanosecond stamps


def odom(x=0.0, y=0.0, yaw=0.0, v=0.0, w=0.0, frame="odom"):
    return {"header": {"stamp": {"sec": 0, "nanosec": 0}, "frame_id": frame},
            "child_frame_id": "base_link",
            "pose": {"pose": {"position": {"x": x, "y": y, "z": 0.0},
                              "orientation": {"x": 0.0, "y": 0.0, "z": math.sin(yaw / 2),
                                              "w": math.cos(yaw / 2)}},
                     "covariance": [0.0] * 36},
            "twist": {"twist": {"linear": {"x": v, "y": 0.0, "z": 0.0},
                                "angular": {"x": 0.0, "y": 0.0, "z": w}},
                      "covariance": [0.0] * 36}}


def battery(fraction, status=2, health=1):
    return {"header": {"stamp": {"sec": 0, "nanosec": 0}, "frame_id": ""}, "voltage": 24.0,
            "percentage": fraction, "power_supply_status": status, "power_supply_health": health,
            "present": True}


def source(name, type_name, **emission):
    period_s = emission.pop("period_s", 0.0)
    return EmitterSource(name=name, type_name=type_name, label=name, period_s=period_s,
                         emission=EmissionConfig(**emission))


def feed(emitter, name, msgs, *, start_s=0.0, step_s=1.0):
    out = []
    for i, msg in enumerate(msgs):
        out += emitter.offer(name, msg, int((start_s + i * step_s) * S))
    return out


# -- the patrol ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def patrol_bag(tmp_path_factory):
    """A 10-minute patrol with another seed than the one measured in the docs."""
    out = tmp_path_factory.mktemp("patrol") / "bag"
    return out, patrol.generate_patrol(out, duration_s=600.0, seed=7)


def test_every_utterance_detection_and_action_result_of_a_patrol_is_a_chunk_within_budget(
        patrol_bag, tokenizer):
    bag, truth = patrol_bag
    sources = sources_for([bag], CONFIG, None)
    chunks = [c for c in replay_chunks(read_bag([bag], sources), sources) if not c.instant]
    by_source = {name: [c for c in chunks if c.source == name] for name in
                 ("speech", "detections", "actions", "nav_status")}
    assert len(by_source["speech"]) == truth.event_counts["utterance"] > 0
    assert len(by_source["detections"]) == truth.event_counts["detection"] > 0
    assert len(by_source["actions"]) == truth.event_counts["action_result"] > 0
    assert len(by_source["nav_status"]) == truth.event_counts["nav_status"] > 0
    for chunk, event in zip(by_source["speech"], truth.of_kind("utterance")):
        assert event["text"] in chunk.text
    objects = " ".join(c.text for c in by_source["detections"])
    assert all(e["object"] in objects for e in truth.of_kind("detection"))
    for chunk, event in zip(by_source["actions"], truth.of_kind("action")):
        assert chunk.text.endswith(f"{event['name']}({event['target']}): {event['result']}")
    tokens = sum(len(tokenizer.encode_data(c.text + "\n")) for c in chunks)
    assert tokens / truth.duration_s <= 20.0


def test_no_constant_and_no_nanosecond_stamp_appears_in_any_chunk_of_a_patrol(patrol_bag):
    bag, _ = patrol_bag
    for params in (None, CONFIG):                       # every topic as it is, and the config
        sources = sources_for([bag], params, None)
        texts = [c.text for c in replay_chunks(read_bag([bag], sources), sources)]
        assert texts
        leaks = [t for t in texts if CONSTANT.search(t) or LONG_INT.search(t)]
        assert leaks == []


def test_the_same_patrol_renders_to_the_same_chunks_from_rclpy_shaped_messages_and_the_bag(
        tmp_path):
    bag = tmp_path / "bag"
    patrol.generate_patrol(bag, duration_s=90.0, seed=2, storage="sqlite3")
    sources = sources_for([bag], CONFIG, None)
    messages = list(read_bag([bag], sources))
    from_bag = [c.text for c in replay_chunks(messages, sources)]
    live = [(topic, t, rclpy_shaped(m)) for topic, t, m in messages]
    assert type(live[0][2]).get_fields_and_field_types()
    assert [c.text for c in replay_chunks(live, sources)] == from_bag
    assert len(from_bag) > 20


# -- deadband, keep-alive ----------------------------------------------------------------------

def test_odometry_inside_the_deadband_is_suppressed_and_counted_in_the_next_chunk():
    e = Emitter([source("odom", "nav_msgs/msg/Odometry", deadband_m=1.0, deadband_deg=30.0,
                        keepalive_s=0.0)])
    rng = np.random.default_rng(0)
    still = [odom(x=2.0 + rng.normal(0, 0.01), y=rng.normal(0, 0.01), yaw=rng.normal(0, 0.01),
                  v=rng.normal(0, 0.005)) for _ in range(50)]
    out = feed(e, "odom", still)
    assert [c.text for c in out] == ["0s odom: at 2,0 heading 0 stopped"]
    assert e.stats["odom"].suppressed == 49
    moved = feed(e, "odom", [odom(x=3.5, yaw=0.1)], start_s=50)
    assert moved[0].n_suppressed == 49 and moved[0].reason == "change"


def test_odometry_that_moved_turned_or_started_moving_makes_a_chunk():
    e = Emitter([source("odom", "nav_msgs/msg/Odometry", deadband_m=1.0, deadband_deg=30.0,
                        keepalive_s=0.0)])
    texts = [c.text for c in feed(e, "odom", [
        odom(), odom(v=0.4), odom(x=0.1, v=0.4),   # starts moving (two values agree)
        odom(x=0.6, v=0.4), odom(x=1.2, v=0.4),    # moved 1.1 m since the last chunk
        odom(x=1.2, w=0.8),                        # turning in place: the state says it
        odom(x=1.2, yaw=0.5, w=0.8),
        odom(x=1.2, yaw=1.0, w=0.8),               # still turning: no chunk per degree
        odom(x=1.2, yaw=1.57), odom(x=1.2, yaw=1.57),   # stopped: turned 61 degrees
        odom(x=1.2, yaw=1.60)])]                   # 2 degrees: inside the deadband
    assert texts == ["0s odom: at 0,0 heading 0 stopped", "2s odom: at 0.1,0 heading 0 moving",
                     "4s odom: at 1.2,0 heading 0 moving",
                     "6s odom: at 1.2,0 heading 29 turning left",
                     "8s odom: at 1.2,0 heading 90 stopped"]


def test_an_unchanged_value_is_sent_again_once_the_keepalive_has_passed():
    e = Emitter([source("odom", "nav_msgs/msg/Odometry", keepalive_s=10.0)])
    out = feed(e, "odom", [odom()] * 25)
    assert [(c.text, c.reason, c.n_suppressed) for c in out] == [
        ("0s odom: at 0,0 heading 0 stopped", "first", 0),
        ("10s odom: at 0,0 heading 0 stopped", "keepalive", 9),
        ("20s odom: at 0,0 heading 0 stopped", "keepalive", 9)]
    never = Emitter([source("odom", "nav_msgs/msg/Odometry", keepalive_s=0.0)])
    assert len(feed(never, "odom", [odom()] * 25)) == 1


def test_battery_makes_a_chunk_on_a_percent_step_or_a_status_change():
    e = Emitter([source("battery", "sensor_msgs/msg/BatteryState", deadband_pct=5.0,
                        keepalive_s=0.0)])
    levels = [0.50 - 0.001 * i for i in range(80)]          # 50 % down to 42.1 %
    out = feed(e, "battery", [battery(p) for p in levels])
    assert [c.text for c in out] == ["0s battery: 50% discharging",
                                     "50s battery: 45% discharging"]
    out = feed(e, "battery", [battery(0.42, status=1), battery(0.42, status=1),
                              battery(0.42, status=1, health=2)], start_s=80)
    assert [c.text for c in out] == ["80s battery: 42% charging",
                                     "82s battery: 42% charging health overheat"]
    assert render(battery(87.0), label="b", type_name="sensor_msgs/msg/BatteryState") == \
        "b: 87% discharging"                                 # drivers that send 0-100


def test_a_noisy_scan_of_a_still_robot_makes_no_chunks_but_an_obstacle_ahead_does():
    e = Emitter([source("scan", "sensor_msgs/msg/LaserScan", deadband_m=0.5, keepalive_s=0.0)])
    rng = np.random.default_rng(1)

    def scan(ahead_m):
        ranges = 3.0 + rng.normal(0, 0.02, 360)
        ranges[rng.random(360) < 0.05] = np.nan
        ranges[rng.random(360) < 0.02] = np.inf
        ranges[170:190] = ahead_m + rng.normal(0, 0.02, 20)
        return {"angle_min": -math.pi, "angle_increment": 2 * math.pi / 360, "range_min": 0.1,
                "range_max": 10.0, "ranges": ranges.tolist()}

    out = feed(e, "scan", [scan(2.5) for _ in range(30)] + [scan(0.6)], step_s=0.2)
    assert [c.text for c in out] == ["0s scan: nearest 2.5m ahead", "6s scan: blocked ahead 0.6m"]
    assert e.stats["scan"].suppressed == 29


def test_other_types_change_when_a_field_changes_or_a_number_leaves_the_relative_deadband():
    e = Emitter([source("temp", "lab_msgs/msg/Thermometer", deadband=0.05, keepalive_s=0.0)])
    out = feed(e, "temp", [{"temperature": t, "variance": 0.0, "unit": "C"}
                           for t in (40.0, 41.5, 42.1, 42.1)] +
               [{"temperature": 42.1, "variance": 0.0, "unit": "F"}])
    assert [c.text for c in out] == ["0s temp: temperature=40 variance=0 unit=C",
                                     "2s temp: temperature=42.1 variance=0 unit=C",
                                     "4s temp: temperature=42.1 variance=0 unit=F"]


# -- events, goals, custom types, frames, time -------------------------------------------------

def test_event_sources_never_drop_a_message_not_even_identical_ones_in_a_burst():
    e = Emitter([source("speech", "std_msgs/msg/String", event=True),
                 source("status", "std_msgs/msg/String")])
    said = ["alice: stop", "alice: stop", "bob: go to the kitchen"] * 4
    out = [c for i, text in enumerate(said)
           for c in e.offer("speech", {"data": text}, i * S // 100)]      # 100 Hz burst
    assert [c.text.split(": ", 1)[1] for c in out] == said
    assert all(c.reason == "event" for c in out)
    status = feed(e, "status", [{"data": "idle"}] * 5)                    # not an event
    assert len(status) == 1 and e.stats["status"].suppressed == 4


def test_an_event_source_with_a_minimum_period_or_a_deadband_is_a_config_error():
    def check(text):
        return validate("aggregator", parse_params_yaml(text)["aggregator"])

    base = ("aggregator: {ros__parameters: {sources: [s], source: {s: {topic: /s, "
            "type: std_msgs/msg/String, %s}}}}")
    assert check(base % "event: true")["sources"][0].emission.event
    with pytest.raises(ConfigError, match="never coalesced; set period_s: 0.0"):
        check(base % "event: true, period_s: 1.0")
    with pytest.raises(ConfigError, match="never filtered"):
        check(base % "event: true, deadband: 0.1")
    with pytest.raises(ConfigError, match="exclude each other"):
        check(base % "event: true, instant: true")
    odom_base = base.replace("std_msgs/msg/String", "nav_msgs/msg/Odometry")
    with pytest.raises(ConfigError, match=r"deadband_pct does not apply .*deadband_m, "
                                          r"deadband_deg"):
        check(odom_base % "deadband_pct: 5.0")
    with pytest.raises(ConfigError, match="keepalive_s must be >= 0 .or -1"):
        check(odom_base % "keepalive_s: -3.0")
    with pytest.raises(ConfigError, match="must be a float: write 2.0"):
        check(odom_base % "deadband_m: 2")
    odom = check(odom_base % "deadband_m: 2.0")["sources"][0].emission
    assert (odom.deadband_m, odom.deadband_deg, odom.keepalive_s) == (2.0, 45.0, 60.0)


def test_goal_status_chunks_name_only_the_goals_whose_state_changed():
    def goals(*statuses):
        return {"status_list": [{"goal_info": {"goal_id": {"uuid": [i, 0xab] + [0] * 14},
                                               "stamp": {"sec": 5, "nanosec": 0}},
                                 "status": st} for i, st in enumerate(statuses)]}

    e = Emitter([source("nav", "action_msgs/msg/GoalStatusArray", event=True)])
    out = feed(e, "nav", [goals(2), goals(4), goals(4, 2), goals(4, 6), goals(4, 6)])
    assert [c.text for c in out] == ["0s nav: 00ab executing", "1s nav: 00ab succeeded",
                                     "2s nav: 01ab executing", "3s nav: 01ab aborted",
                                     "4s nav: no active goals"]


def test_a_custom_type_known_only_to_the_bag_renders_generically_without_its_constants(
        tmp_path):
    bag = tmp_path / "bag"
    patrol.generate_patrol(bag, duration_s=60.0, seed=0)
    with AnyReader([bag]) as reader:
        conn = next(c for c in reader.connections if c.topic == patrol.TOPIC_DETECTIONS)
        msg = reader.deserialize(next(reader.messages(connections=[conn]))[2], conn.msgtype)
    assert hasattr(msg.detections[0], "SOURCE_RGBD")                 # the constant is there
    assert "SOURCE_RGBD" not in json.dumps(to_plain(msg), default=str)
    text = render(msg, label="seen", options=RenderOptions(float_digits=2, summarize=False))
    assert text.startswith("seen: detections=[{label=towel confidence=0.87 position=11.4,-0.4,0.4 ")
    assert "source=1" in text and not CONSTANT.search(text) and not LONG_INT.search(text)
    # its name says detect: each item's label, score and place, as a Detection2DArray
    assert render(msg, label="seen") == "seen: towel 0.87 at 11.4,-0.4, toothbrush 0.69 at 9.6,0.3"


def test_frame_ids_appear_only_when_they_differ_from_the_sources_usual_frame():
    e = Emitter([source("odom", "nav_msgs/msg/Odometry", keepalive_s=0.0)])
    out = feed(e, "odom", [odom(), odom(x=5.0), odom(x=9.0, frame="map")])
    assert [c.text for c in out] == ["0s odom: at 0,0 heading 0 stopped",
                                     "1s odom: at 5,0 heading 0 stopped",
                                     "2s odom: at 9,0 heading 0 stopped frame=map"]


def test_time_going_backwards_resets_the_source_and_is_reported():
    e = Emitter([source("odom", "nav_msgs/msg/Odometry", keepalive_s=0.0, period_s=1.0)])
    first = feed(e, "odom", [odom()] * 10, start_s=100.0, step_s=0.5)
    assert len(first) == 1 and e.pop_time_jumps() == []
    again = feed(e, "odom", [odom()] * 3, start_s=100.0, step_s=0.5)     # the bag loops
    jumps = e.pop_time_jumps()
    assert [(j.source, j.back_s) for j in jumps] == [("odom", 4.5)]
    assert [(c.text, c.reason) for c in again] == [("0s odom: at 0,0 heading 0 stopped",
                                                    "first")]
    assert e.stats["odom"].time_resets == 1
    earlier = feed(e, "odom", [odom(x=4.0)], start_s=40.0)               # before the start
    assert earlier[0].text == "0s odom: at 4,0 heading 0 stopped" and e.origin_ns == 40 * S
    assert len(e.pop_time_jumps()) == 1 and e.stats["odom"].time_resets == 2
    feed(e, "odom", [odom(x=8.0)], start_s=39.5)                  # 0.5 s of jitter: no reset
    assert e.pop_time_jumps() == [] and e.stats["odom"].time_resets == 2


# -- replay --stats ---------------------------------------------------------------------------

def test_replay_stats_give_tokens_per_robot_second_per_source_and_the_minutes_tau_mem_holds(
        tmp_path, capsys):
    bag = tmp_path / "bag"
    truth = patrol.generate_patrol(bag, duration_s=120.0, seed=5)
    out, png = tmp_path / "stats.json", tmp_path / "tokens.png"
    assert cli_main(["replay", str(bag), "--params", CONFIG, "--stats", "--json", str(out),
                     "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "tau_mem 6144 tokens holds" in printed and "odom" in printed
    report = json.loads(out.read_text())
    s = report["sources"]
    assert s["speech"]["chunks"] == truth.event_counts["utterance"] == s["speech"]["bag_messages"]
    assert report["topics_not_rendered"] == {}
    assert s["odom"]["messages"] == s["odom"]["bag_messages"] == 1200
    assert s["odom"]["coalesced"] + s["odom"]["suppressed"] + s["odom"]["chunks"] == 1200
    total = sum(v["tokens"] for v in s.values())
    assert report["totals"]["tokens"] == total > 0
    assert report["totals"]["tokens_per_s"] == pytest.approx(total / report["robot_time_s"],
                                                              abs=1e-3)
    assert report["tau_mem_minutes"] == pytest.approx(
        6144 / report["totals"]["tokens_per_s"] / 60, abs=0.01)


def test_velocity_noise_around_the_threshold_does_not_flap_between_stopped_and_moving():
    e = Emitter([source("odom", "nav_msgs/msg/Odometry", keepalive_s=0.0)])
    speeds = [0.0, 0.07, 0.0, 0.06, 0.06] + [0.03, 0.045, 0.028, 0.04] * 5 + [0.01, 0.0]
    out = feed(e, "odom", [odom(v=v) for v in speeds])     # a spike, starts, noise, stops
    assert [c.text.split()[-1] for c in out] == ["stopped", "moving", "stopped"]


def test_the_same_patrol_renders_to_the_same_chunks_from_real_rclpy_messages_and_the_bag(
        tmp_path):
    pytest.importorskip("rclpy", reason="the rclpy-shaped variant above runs without ROS")
    bag = tmp_path / "bag"
    patrol.generate_patrol(bag, duration_s=90.0, seed=2, storage="mcap")
    sources = {t: s for t, s in sources_for([bag], CONFIG, None).items()
               if t != patrol.TOPIC_DETECTIONS}   # its type exists only in the bag
    messages = list(read_bag([bag], sources))
    live = [(topic, t, to_rclpy(m)) for topic, t, m in messages]
    assert type(live[0][2]).__module__.startswith("nav_msgs.msg")
    from_bag = [c.text for c in replay_chunks(messages, sources)]
    assert [c.text for c in replay_chunks(live, sources)] == from_bag
    assert {"odom", "scan", "battery", "nav_status", "actions"} <= {
        t.split(" ")[1].rstrip(":") for t in from_bag}
    assert not any(CONSTANT.search(t) for t in from_bag)


def test_the_default_odometry_source_keeps_a_fast_noisy_curving_robot_to_few_chunks(tokenizer):
    """50 Hz, 3 cm pose noise, 0.02 m/s velocity noise, circles of 3 m at 0.5 m/s, then still."""
    odom_source = next(s for s in sources_for_config() if s.name == "odom")
    e = Emitter([odom_source])
    rng = np.random.default_rng(3)
    chunks = []
    for i in range(50 * 300):
        t_s = i / 50
        driving = t_s < 240
        angle = 0.5 / 3.0 * min(t_s, 240)
        msg = odom(x=3 * math.sin(angle) + rng.normal(0, 0.03),
                   y=3 - 3 * math.cos(angle) + rng.normal(0, 0.03),
                   yaw=angle + rng.normal(0, 0.02),
                   v=(0.5 if driving else 0.0) + rng.normal(0, 0.02),
                   w=(0.5 / 3 if driving else 0.0) + rng.normal(0, 0.02))
        chunks += e.poll(int(t_s * S)) + e.offer("odom", msg, int(t_s * S))
    tokens = sum(len(tokenizer.encode_data(c.text + "\n")) for c in chunks)
    assert len(chunks) <= 240 / 3 + 60 / 60 + 2           # under one every 3 s while driving
    assert tokens / 300 <= 6.0
    assert chunks[-1].text.endswith("stopped")


def sources_for_config():
    from csr_ros.ros_params import load_params_file

    return validate("aggregator", load_params_file(CONFIG)["aggregator"])["sources"]


def test_a_faster_noisier_patrol_keeps_every_event_and_the_budget_with_the_default_config(
        tmp_path, tokenizer):
    bag = tmp_path / "bag"
    truth = patrol.generate_patrol(bag, duration_s=300.0, seed=12, odom_hz=50.0, scan_hz=15.0,
                                   noise=3.0)
    assert truth.topics[patrol.TOPIC_ODOM]["count"] == 15000
    sources = sources_for([bag], CONFIG, None)
    chunks = [c for c in replay_chunks(read_bag([bag], sources), sources) if not c.instant]
    for name, kind in (("speech", "utterance"), ("detections", "detection"),
                       ("actions", "action_result"), ("nav_status", "nav_status")):
        assert sum(c.source == name for c in chunks) == truth.event_counts[kind]
    tokens = sum(len(tokenizer.encode_data(c.text + "\n")) for c in chunks)
    assert tokens / truth.duration_s <= 20.0


def test_a_bag_only_detection2d_array_gets_its_summary_with_where_each_object_is(tmp_path):
    bag = tmp_path / "bag"
    truth = patrol.generate_patrol(bag, duration_s=120.0, seed=0, detections="vision_msgs")
    sources = sources_for([bag], CONFIG, None)
    assert sources[patrol.TOPIC_DETECTIONS].type_name == "vision_msgs/msg/Detection2DArray"
    chunks = [c for c in replay_chunks(read_bag([bag], sources), sources)
              if c.source == "detections"]
    assert len(chunks) == truth.event_counts["detection"] >= 2
    seen = truth.of_kind("detection")
    first = [e for e in seen if e["t_s"] == seen[0]["t_s"]]
    assert chunks[0].text == "48s detections: " + ", ".join(
        f"{e['object']} {e['confidence']:.2f} at {e['x_m']:g},{e['y_m']:g}" for e in first)


@pytest.fixture(scope="module")
def typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


def test_imu_joint_state_and_battery_summaries_are_compact_and_the_same_in_every_shape(
        typestore):
    t = typestore.types
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=1_700_000_000,
                                                                            nanosec=5),
                                      frame_id="imu_link")
    vec = t["geometry_msgs/msg/Vector3"]
    imu = t["sensor_msgs/msg/Imu"](
        header=header, orientation=t["geometry_msgs/msg/Quaternion"](
            x=0.0, y=0.0, z=math.sin(math.pi / 4), w=math.cos(math.pi / 4)),
        orientation_covariance=np.zeros(9), angular_velocity=vec(x=0.0, y=0.0, z=0.1),
        angular_velocity_covariance=np.zeros(9), linear_acceleration=vec(x=0.12, y=0.0, z=9.81),
        linear_acceleration_covariance=np.zeros(9))
    joints = t["sensor_msgs/msg/JointState"](
        header=header, name=["shoulder", "elbow"], position=np.array([0.523, -1.2]),
        velocity=np.array([0.0, 0.1]), effort=np.array([]))
    battery_msg = t["sensor_msgs/msg/BatteryState"](
        header=header, voltage=24.1, temperature=30.0, current=-1.0, charge=math.nan,
        capacity=math.nan, design_capacity=5.0, percentage=0.42, power_supply_status=1,
        power_supply_health=2, power_supply_technology=2, present=True,
        cell_voltage=np.zeros(0, dtype=np.float32), cell_temperature=np.zeros(0, dtype=np.float32),
        location="", serial_number="")
    expected = {"imu": "imu: heading 90 turning 6°/s",
                "joints": "joints: shoulder 0.52 elbow -1.2",
                "battery": "battery: 42% charging health overheat"}
    shapes = [lambda m: m, rclpy_shaped]
    try:
        import sensor_msgs.msg  # noqa: F401  (the real rclpy classes, where ROS is installed)
        shapes.append(to_rclpy)
    except ImportError:
        pass
    for shape in shapes:
        for label, msg in (("imu", imu), ("joints", joints), ("battery", battery_msg)):
            assert render(shape(msg), label=label) == expected[label]


# -- a restarted aggregator continues the episode's time ----------------------------------------

def test_a_restart_with_a_chunk_log_continues_the_episode_time_instead_of_starting_at_zero(
        tmp_path):
    from csr_ros.chunklog import ChunkLog
    from csr_ros.render import episode_origin_ns
    from csr_ros.state import Chunk, Seq

    path = tmp_path / "chunks.log"
    speech = EmitterSource("speech", "std_msgs/msg/String", emission=EmissionConfig(event=True))
    first = Emitter([speech])
    with ChunkLog(path) as log:
        for i, t_s in enumerate((1000.0, 1012.5, 1130.2)):          # the aggregator's clock
            e = first.offer("speech", {"data": f"utterance {i}"}, int(t_s * S))[0]
            log.append_chunk(Chunk(seq=Seq(i), source="speech", stamp_ns=e.stamp_ns,
                                   text=e.text, token_ids=()))
    assert [r.text for r in ChunkLog(path).records if hasattr(r, "text")][-1] == \
        "130s speech: utterance 2"
    with ChunkLog(path) as log:                                       # restarted, 10 min later
        origin_ns = episode_origin_ns(log.records)
    assert origin_ns == 1000 * S
    again = Emitter([speech], origin_ns=origin_ns)
    assert again.offer("speech", {"data": "back"}, int(1730.4 * S))[0].text == \
        "730s speech: back"
    assert episode_origin_ns([]) is None
