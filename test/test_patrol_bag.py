"""The patrol bag generator: deterministic, readable with rosbags, shaped as documented."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from csr_ros import patrol
from csr_ros.cli import main as cli_main
from csr_ros.errors import ConfigError

DURATION_S = 120.0


def read_all(bag: Path):
    from rosbags.highlevel import AnyReader

    with AnyReader([bag]) as reader:          # no typestore given: the custom type is in the bag
        types = {c.topic: c.msgtype for c in reader.connections}
        rows = [(c.topic, t_ns, bytes(raw), reader.deserialize(raw, c.msgtype))
                for c, t_ns, raw in reader.messages()]
    return types, rows


@pytest.fixture(scope="module")
def mcap_bag(tmp_path_factory):
    out = tmp_path_factory.mktemp("patrol") / "bag"
    return out, patrol.generate_patrol(out, duration_s=DURATION_S, seed=3, storage="mcap")


def test_the_same_seed_writes_the_same_messages_and_truth(tmp_path, mcap_bag):
    bag, truth = mcap_bag
    again = patrol.generate_patrol(tmp_path / "again", duration_s=DURATION_S, seed=3)
    assert again.events == truth.events
    assert [r[:3] for r in read_all(tmp_path / "again")[1]] == [r[:3] for r in read_all(bag)[1]]
    other = patrol.generate_patrol(tmp_path / "other", duration_s=DURATION_S, seed=4)
    assert other.events != truth.events


@pytest.mark.parametrize("storage", patrol.STORAGES)
def test_both_storages_read_back_with_rosbags_including_the_custom_type(tmp_path, storage):
    truth = patrol.generate_patrol(tmp_path / "bag", duration_s=60.0, seed=0, storage=storage)
    types, rows = read_all(tmp_path / "bag")
    assert types == patrol.TOPIC_TYPES
    counts = {t: sum(1 for r in rows if r[0] == t) for t in types}
    assert counts == {t: info["count"] for t, info in truth.topics.items()}
    detections = [r[3] for r in rows if r[0] == patrol.TOPIC_DETECTIONS]
    assert detections and all(d.detections[0].label for d in detections)


def test_sensor_topics_have_their_rates_over_the_whole_duration(mcap_bag):
    bag, truth = mcap_bag
    _, rows = read_all(bag)
    for topic, hz in ((patrol.TOPIC_ODOM, 10.0), (patrol.TOPIC_SCAN, 5.0),
                      (patrol.TOPIC_BATTERY, 1.0)):
        stamps = [t for tp, t, _, _ in rows if tp == topic]
        assert len(stamps) == round(DURATION_S * hz) == truth.topics[topic]["count"]
        gaps_s = np.diff(stamps) / 1e9
        assert abs(float(np.median(gaps_s)) - 1.0 / hz) < 1e-3
    assert all(b >= a for a, b in zip([r[1] for r in rows], [r[1] for r in rows][1:]))
    assert rows[0][1] == patrol.START_NS


def test_scans_hold_inf_and_nan_ranges_and_valid_returns(mcap_bag):
    _, rows = read_all(mcap_bag[0])
    ranges = np.concatenate([m.ranges for tp, _, _, m in rows if tp == patrol.TOPIC_SCAN])
    assert np.isnan(ranges).any() and np.isinf(ranges).any()
    finite = ranges[np.isfinite(ranges)]
    assert finite.size > 0.8 * ranges.size and finite.max() <= patrol.SCAN_RANGE_MAX_M


def test_the_robot_stands_still_at_times_and_drives_between_rooms(mcap_bag):
    bag, truth = mcap_bag
    _, rows = read_all(bag)
    xy = np.array([(m.pose.pose.position.x, m.pose.pose.position.y)
                   for tp, _, _, m in rows if tp == patrol.TOPIC_ODOM])
    step_m = np.linalg.norm(np.diff(xy, axis=0), axis=1)
    assert (step_m < 0.05).sum() > 100          # idle: only pose noise moves
    assert step_m.max() < 0.2 and (step_m > 0.03).sum() > 50
    rooms = [e["room"] for e in truth.of_kind("room_visit")]
    assert len(set(rooms)) >= 3 and "hallway" in rooms
    assert all(e["leave_s"] is None or e["leave_s"] > e["enter_s"]
               for e in truth.of_kind("room_visit"))


def test_battery_drains_and_its_status_changes_when_docked(tmp_path):
    truth = patrol.generate_patrol(tmp_path / "bag", duration_s=600.0, seed=0)
    _, rows = read_all(tmp_path / "bag")
    battery = [m for tp, _, _, m in rows if tp == patrol.TOPIC_BATTERY]
    statuses = {m.power_supply_status for m in battery}
    assert statuses == {1, 2}                   # charging and discharging
    discharging = [m.percentage for m in battery if m.power_supply_status == 2]
    assert discharging[0] > min(discharging)
    assert any(e["name"] == "dock" for e in truth.of_kind("action"))


def test_ground_truth_events_match_the_bag_messages(mcap_bag):
    bag, truth = mcap_bag
    _, rows = read_all(bag)
    speech = [m.data for tp, _, _, m in rows if tp == patrol.TOPIC_SPEECH]
    assert speech == [e["text"] for e in truth.of_kind("utterance")]
    for e in truth.of_kind("utterance"):
        assert e["text"] == f"{e['speaker']}: {e['request']}"
    results = [m.data for tp, _, _, m in rows if tp == patrol.TOPIC_ACTION_RESULT]
    assert results == [f"{e['name']}({e['target']}): {e['result']}"
                       for e in truth.of_kind("action")]
    seen = [(d.label, round(t / 1e9 - patrol.START_NS / 1e9, 2))
            for tp, t, _, m in rows if tp == patrol.TOPIC_DETECTIONS for d in m.detections]
    assert seen == [(e["object"], round(e["t_s"], 2)) for e in truth.of_kind("detection")]
    for e in truth.of_kind("detection"):
        assert patrol.room_at(e["x_m"], e["y_m"]) == e["room"]
    saved = json.loads((bag / patrol.GROUND_TRUTH_FILE).read_text())
    assert saved["events"] == truth.events and saved["event_counts"] == truth.event_counts
    assert patrol.load_truth(bag).events == truth.events


def test_nav_status_arrays_report_every_goal_change(mcap_bag):
    bag, truth = mcap_bag
    _, rows = read_all(bag)
    arrays = [m for tp, _, _, m in rows if tp == patrol.TOPIC_NAV_STATUS]
    terminal = {}
    for a in arrays:
        for s in a.status_list:
            if s.status in (4, 6):
                terminal.setdefault(bytes(s.goal_info.goal_id.uuid), s.status)
    navs = [e for e in truth.of_kind("action") if e["name"] == "navigate_to_pose"]
    assert len(terminal) == len(navs) >= 1
    assert math.isclose(len(arrays), len(navs) * 2, abs_tol=1)   # accepted + finished (+running)


def test_patrol_command_writes_the_bag_and_refuses_an_existing_directory(tmp_path, capsys):
    assert cli_main(["patrol", str(tmp_path / "b"), "--duration-s", "10", "--storage",
                     "sqlite3"]) == 0
    assert (tmp_path / "b" / patrol.GROUND_TRUTH_FILE).exists()
    assert "/odom" in capsys.readouterr().out
    assert cli_main(["patrol", str(tmp_path / "b"), "--duration-s", "10"]) == 2
    with pytest.raises(ConfigError, match="storage"):
        patrol.generate_patrol(tmp_path / "c", storage="bag")


def test_rates_and_noise_can_be_chosen_and_bad_ones_are_refused(tmp_path):
    truth = patrol.generate_patrol(tmp_path / "fast", duration_s=20.0, odom_hz=50.0,
                                   scan_hz=15.0, battery_hz=2.0, noise=4.0)
    counts = {t: info["count"] for t, info in truth.topics.items()}
    assert counts[patrol.TOPIC_ODOM] == 1000 and counts[patrol.TOPIC_SCAN] == 334
    assert truth.topics[patrol.TOPIC_SCAN]["hz"] == pytest.approx(50 / 3)
    assert counts[patrol.TOPIC_BATTERY] == 40
    _, rows = read_all(tmp_path / "fast")
    ranges = np.concatenate([m.ranges for tp, _, _, m in rows if tp == patrol.TOPIC_SCAN])
    assert 0.05 < np.isnan(ranges).mean() < 0.12            # 4x the 2 % of glare
    with pytest.raises(ConfigError, match="scan_hz .* cannot be higher"):
        patrol.generate_patrol(tmp_path / "bad", scan_hz=20.0)
    with pytest.raises(ConfigError, match="noise must be in"):
        patrol.generate_patrol(tmp_path / "bad", noise=-1.0)


def test_other_names_and_extras_leave_the_patrols_own_messages_byte_identical(tmp_path):
    from rosbags.highlevel import AnyReader

    def messages(path, **kw):
        patrol.generate_patrol(path, duration_s=20.0, seed=6, **kw)
        with AnyReader([path]) as reader:
            return [(c.topic, t, bytes(raw)) for c, t, raw in reader.messages()]

    plain = messages(tmp_path / "plain")
    other = messages(tmp_path / "other", extras=True,
                     topic_names={"/speech/text": "/speech", "/odom": "/odometry/filtered"})
    back = {"/speech": "/speech/text", "/odometry/filtered": "/odom"}
    own = [(back.get(topic, topic), t, raw) for topic, t, raw in other
           if back.get(topic, topic) in patrol.TOPIC_TYPES]
    assert own == plain
    extra = {topic for topic, _, _ in other} - {back.get(t, t) for t, _, _ in plain} - set(back)
    assert extra == set(patrol.EXTRA_TOPIC_TYPES)


def test_the_patrol_command_writes_other_names_and_refuses_a_rename_it_cannot_read(tmp_path,
                                                                                   capsys):
    out = tmp_path / "bag"
    assert cli_main(["patrol", str(out), "--duration-s", "10", "--rename", "/speech/text=/speech",
                     "--action-results", "custom"]) == 0
    truth = patrol.load_truth(out)
    assert truth.topic(patrol.TOPIC_SPEECH) == "/speech" and "/speech" in truth.topics
    assert truth.topics["/action_result"]["type"] == "patrol_msgs/msg/ActionOutcome"
    assert cli_main(["patrol", str(tmp_path / "b2"), "--rename", "/speech/text"]) == 2
    assert "--rename takes OLD=NEW" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="not patrol topics"):
        patrol.generate_patrol(tmp_path / "b3", duration_s=10.0, topic_names={"/nope": "/x"})


def test_patrol_settings_refuse_bad_values_before_an_existing_bag_is_touched(tmp_path):
    bag = tmp_path / "bag"
    patrol.generate_patrol(bag, duration_s=10.0, seed=2)
    before = {p.name: p.read_bytes() for p in bag.iterdir()}
    for bad, match in (({"duration_s": 2.0}, "duration_s must be >= 5 s"),
                       ({"tf_hz": 0.0}, r"tf_hz must be in \(0, 1000\]"),
                       ({"detections": "yolo"}, "detections must be one of"),
                       ({"action_results": "json"}, "action_results must be"),
                       ({"topic_names": {"/odom": "odom"}}, "a topic name starts with '/'"),
                       ({"topic_names": {"/speech/text": "/odom"}}, "the same name")):
        with pytest.raises(ConfigError, match=match):
            patrol.write_patrol(bag, patrol.PatrolSettings(**bad), overwrite=True)
    assert {p.name: p.read_bytes() for p in bag.iterdir()} == before
    settings = patrol.PatrolSettings(seed=2, duration_s=10.0, extras=True)
    assert settings.names()["/tf"] == "/tf" and settings.rates_hz()["/tf"] == 50.0
    truth = patrol.write_patrol(bag, settings, overwrite=True)
    assert truth.topics["/tf"]["count"] == 500 and truth.seed == 2
