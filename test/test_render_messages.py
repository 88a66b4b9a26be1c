"""The renderer gives the same compact, stable text for rclpy-, rosbags- and dict-shaped messages."""

from __future__ import annotations

import array
import math

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore, get_types_from_msg

from csr_ros.errors import ConfigError
from csr_ros.render import (RenderOptions, header_stamp_ns, message_type_name,
                            normalize_type_name, render, to_plain)
from support.rosmsg_shapes import Header, LaserScan, Pose, Point, Quaternion, String, Time

STAMP_NS = 1_700_000_000_250_000_000
RANGES = [2.0, 1.5, float("inf"), 0.75, 3.0, 0.05]   # 0.05 is below range_min: not valid


@pytest.fixture(scope="module")
def typestore():
    return get_typestore(Stores.ROS2_JAZZY)


def rclpy_scan():
    return LaserScan(header=Header(stamp=Time(sec=1_700_000_000, nanosec=250_000_000),
                                   frame_id="laser"),
                     angle_min=-math.pi / 2, angle_increment=math.pi / 5, range_min=0.1,
                     range_max=10.0, ranges=array.array("f", RANGES))


def rosbags_scan(typestore):
    t = typestore.types
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](
        sec=1_700_000_000, nanosec=250_000_000), frame_id="laser")
    return t["sensor_msgs/msg/LaserScan"](
        header=header, angle_min=-math.pi / 2, angle_max=math.pi / 2,
        angle_increment=math.pi / 5, time_increment=0.0, scan_time=0.0, range_min=0.1,
        range_max=10.0, ranges=np.array(RANGES, dtype=np.float32),
        intensities=np.array([], dtype=np.float32))


def dict_scan():
    return {"header": {"stamp": {"sec": 1_700_000_000, "nanosec": 250_000_000},
                       "frame_id": "laser"},
            "angle_min": -math.pi / 2, "angle_increment": math.pi / 5, "range_min": 0.1,
            "range_max": 10.0, "ranges": RANGES}


def test_laser_scan_summary_gives_the_nearest_valid_return_and_what_blocks_the_way():
    # 0.05 m is below range_min and inf is no return: the nearest valid return is 0.75 m at 18°
    assert render(rclpy_scan(), label="scan") == "scan: blocked ahead 0.8m"
    far = dict_scan() | {"ranges": [2.0, 1.5, float("nan"), 2.5, 3.0, 0.05]}
    assert render(far, label="scan", type_name="sensor_msgs/msg/LaserScan") == \
        "scan: nearest 1.5m front-right"


def test_rclpy_rosbags_and_dict_messages_render_identically(typestore):
    expected = render(rclpy_scan(), label="scan")
    assert render(rosbags_scan(typestore), label="scan") == expected
    assert render(dict_scan(), label="scan", type_name="sensor_msgs/msg/LaserScan") == expected


def test_type_names_come_from_rclpy_modules_and_rosbags_msgtype(typestore):
    assert message_type_name(rclpy_scan()) == "sensor_msgs/msg/LaserScan"
    assert message_type_name(rosbags_scan(typestore)) == "sensor_msgs/msg/LaserScan"
    assert message_type_name({"data": 1}) is None


def test_stamps_become_int_nanoseconds_in_all_shapes(typestore):
    assert header_stamp_ns(rclpy_scan()) == STAMP_NS
    assert header_stamp_ns(rosbags_scan(typestore)) == STAMP_NS
    assert header_stamp_ns(dict_scan()) == STAMP_NS
    assert header_stamp_ns(String(data="x")) is None
    assert to_plain(Time(sec=2, nanosec=5)) == 2_000_000_005


def test_nested_message_without_summary_writes_points_and_quaternions_as_tuples():
    pose = Pose(position=Point(x=1.23456, y=-0.0001, z=0.0), orientation=Quaternion())
    generic = RenderOptions(summarize=False)          # Pose has a summary: ask for the fields
    assert render(pose, label="pose", options=generic) == \
        "pose: position=1.23,0,0 orientation=0,0,0,1"
    assert render(pose, label="pose") == "pose: at 1.2,0 heading 0"


def test_field_selection_picks_dotted_paths_and_disambiguates_equal_names(typestore):
    t = typestore.types
    odom = odometry(typestore)
    options = RenderOptions(fields=("pose.pose.position.x", "twist.twist.linear.x",
                                    "header.stamp"))
    text = render(odom, label="odom", options=options)
    assert text == "odom: pose.pose.position.x=1.5 twist.twist.linear.x=0.25 stamp=3s"
    assert t  # the typestore built the real dataclasses


def test_unknown_selected_field_raises_a_clear_config_error(typestore):
    with pytest.raises(ConfigError, match=r"field 'pose.pose.positon.x' not found at 'positon'"):
        render(odometry(typestore), label="odom",
               options=RenderOptions(fields=("pose.pose.positon.x",)))


def odometry(typestore):
    t = typestore.types
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=3, nanosec=7),
                                      frame_id="odom")
    q = t["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=math.sin(math.pi / 4),
                                          w=math.cos(math.pi / 4))
    pose = t["geometry_msgs/msg/Pose"](position=t["geometry_msgs/msg/Point"](x=1.5, y=-2.0, z=0.0),
                                       orientation=q)
    vec = t["geometry_msgs/msg/Vector3"]
    twist = t["geometry_msgs/msg/Twist"](linear=vec(x=0.25, y=0.0, z=0.0),
                                         angular=vec(x=0.0, y=0.0, z=0.1))
    return t["nav_msgs/msg/Odometry"](
        header=header, child_frame_id="base_link",
        pose=t["geometry_msgs/msg/PoseWithCovariance"](pose=pose,
                                                       covariance=np.zeros(36, dtype=np.float64)),
        twist=t["geometry_msgs/msg/TwistWithCovariance"](twist=twist,
                                                         covariance=np.zeros(36, dtype=np.float64)))


def test_odometry_summary_gives_position_heading_and_motion_without_stamp_or_frames(typestore):
    assert render(odometry(typestore), label="odom") == "odom: at 1.5,-2 heading 90 moving"


def test_long_numeric_arrays_are_summarised_and_short_ones_kept(typestore):
    odom = odometry(typestore)
    text = render(odom, label="odom", options=RenderOptions(summarize=False))
    assert "pose.covariance={n=36 all=0}" in text
    assert render({"v": [1.0, 2.0]}, label="v") == "v: v=[1,2]"


def test_strings_with_spaces_or_control_text_are_quoted_so_they_stay_data():
    assert render(String(data="go to the kitchen\nnow"), label="speech") == \
        'speech: "go to the kitchen\\nnow"'
    assert render(String(data="alice: stop"), label="speech") == "speech: alice: stop"
    assert render({"data": "go\nnow", "n": 1}, label="x") == 'x: data="go\\nnow" n=1'


def test_detection2d_array_lists_the_best_class_and_score_of_each_detection(typestore):
    typestore = get_typestore(Stores.ROS2_JAZZY)
    typestore.register(vision_msgs_types())
    t = typestore.types
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=1, nanosec=0),
                                      frame_id="camera")
    hyp = t["vision_msgs/msg/ObjectHypothesis"]
    result = t["vision_msgs/msg/ObjectHypothesisWithPose"]
    pose = t["geometry_msgs/msg/PoseWithCovariance"](
        pose=t["geometry_msgs/msg/Pose"](position=t["geometry_msgs/msg/Point"](x=0.0, y=0.0, z=0.0),
                                         orientation=t["geometry_msgs/msg/Quaternion"](
                                             x=0.0, y=0.0, z=0.0, w=1.0)),
        covariance=np.zeros(36, dtype=np.float64))
    center = t["vision_msgs/msg/Pose2D"](position=t["vision_msgs/msg/Point2D"](x=320.4, y=240.0),
                                         theta=0.0)
    bbox = t["vision_msgs/msg/BoundingBox2D"](center=center, size_x=50.0, size_y=120.0)
    detection = t["vision_msgs/msg/Detection2D"](
        header=header, results=[result(hypothesis=hyp(class_id="cup", score=0.31), pose=pose),
                                result(hypothesis=hyp(class_id="person", score=0.912), pose=pose)],
        bbox=bbox, id="7")
    msg = t["vision_msgs/msg/Detection2DArray"](header=header, detections=[detection])
    assert render(msg, label="detections") == "detections: person 0.91"


def vision_msgs_types():
    """vision_msgs (Humble/Jazzy layout) is not in rosbags' stores; register it from .msg text."""
    defs = {
        "vision_msgs/msg/Point2D": "float64 x\nfloat64 y\n",
        "vision_msgs/msg/Pose2D": "vision_msgs/Point2D position\nfloat64 theta\n",
        "vision_msgs/msg/BoundingBox2D": "vision_msgs/Pose2D center\nfloat64 size_x\nfloat64 size_y\n",
        "vision_msgs/msg/ObjectHypothesis": "string class_id\nfloat64 score\n",
        "vision_msgs/msg/ObjectHypothesisWithPose":
            "vision_msgs/ObjectHypothesis hypothesis\ngeometry_msgs/PoseWithCovariance pose\n",
        "vision_msgs/msg/Detection2D": ("std_msgs/Header header\n"
                                        "vision_msgs/ObjectHypothesisWithPose[] results\n"
                                        "vision_msgs/BoundingBox2D bbox\nstring id\n"),
        "vision_msgs/msg/Detection2DArray": "std_msgs/Header header\nvision_msgs/Detection2D[] detections\n",
    }
    types = {}
    for name, text in defs.items():
        types.update(get_types_from_msg(text, name))
    return types


def test_goal_status_array_names_each_goal_state(typestore):
    t = typestore.types
    status = t["action_msgs/msg/GoalStatus"](
        goal_info=t["action_msgs/msg/GoalInfo"](
            goal_id=t["unique_identifier_msgs/msg/UUID"](uuid=np.arange(16, dtype=np.uint8)),
            stamp=t["builtin_interfaces/msg/Time"](sec=0, nanosec=0)),
        status=4)
    msg = t["action_msgs/msg/GoalStatusArray"](status_list=[status])
    assert render(msg, label="nav") == "nav: 0001 succeeded"


def test_text_over_max_chars_is_cut_with_a_marker_that_says_how_much():
    text = render({"data": "x" * 500}, label="big", options=RenderOptions(max_chars=100))
    assert len(text) == 100
    assert text.endswith("chars cut]")


def test_rendering_is_stable_across_calls_and_floats_round_without_negative_zero():
    msg = {"a": -0.0004, "b": 1e-9, "c": float("nan"), "d": True, "e": None}
    assert render(msg, label="x") == render(msg, label="x") == "x: a=0 b=0 c=nan d=true e=null"


def test_type_names_are_normalized_and_malformed_ones_rejected():
    assert normalize_type_name("sensor_msgs/LaserScan") == "sensor_msgs/msg/LaserScan"
    with pytest.raises(ConfigError, match="not of the form 'package/msg/Name'"):
        normalize_type_name("LaserScan")
