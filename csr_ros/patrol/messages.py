"""The patrol's rosbag2 messages, built through rosbags' typestore from the simulated world.

    ts = typestore()                                   # Jazzy types and the custom ones below
    for t_s, topic, msg in patrol_messages(world, ts, rng, rates_hz=(10.0, 5.0, 1.0), noise=1.0):
        ...                                            # in time order; stamped START_NS + t_s

The sensors (odometry with pose noise, a ray-cast laser scan with inf and nan returns, a
battery) are sampled every n-th simulation step; the events (speech, detections, action
results, the navigation action's status) are stamped when the world records them. The custom
types (patrol_msgs, and vision_msgs, which neither rosbags' stores nor every robot has) are
defined here as .msg text: they exist only in the bag, where a reader learns them.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from csr_ros.patrol.world import (ACTION_RESULT_DELAY_S, DETECTION_DELAY_S, HALL_Y0, HALL_Y1,
                                  ROOM_BY_NAME, ROOMS, Pose, World, room_at)

START_NS = 1_764_000_000_000_000_000          # 2025-11-24T16:00:00Z: bag time of t_s = 0

TOPIC_ODOM = "/odom"
TOPIC_SCAN = "/scan"
TOPIC_BATTERY = "/battery_state"
TOPIC_SPEECH = "/speech/text"
TOPIC_DETECTIONS = "/detections"
TOPIC_NAV_STATUS = "/navigate_to_pose/_action/status"
TOPIC_ACTION_RESULT = "/action_result"

DETECTION_MSG = """\
# Objects seen by the robot's camera, placed in the map frame.
std_msgs/Header header
patrol_msgs/Detection[] detections
"""
DETECTION_ITEM_MSG = """\
uint8 SOURCE_RGB=0
uint8 SOURCE_RGBD=1
string label
float32 confidence
geometry_msgs/Point position
float32[4] bbox
uint8 source
"""
# with action_results="custom": action results in a custom type instead of std_msgs/String
ACTION_RESULT_MSG = """\
uint8 SUCCEEDED=0
uint8 FAILED=1
string name
string target
uint8 outcome
string result
"""
CUSTOM_TYPES = {"patrol_msgs/msg/Detections": DETECTION_MSG,
                "patrol_msgs/msg/Detection": DETECTION_ITEM_MSG,
                "patrol_msgs/msg/ActionOutcome": ACTION_RESULT_MSG}
# vision_msgs (Humble/Jazzy layout) is in neither rosbags' stores nor every robot's install:
# with detections="vision_msgs" it too exists only in the bag.
VISION_MSGS_TYPES = {
    "vision_msgs/msg/Point2D": "float64 x\nfloat64 y\n",
    "vision_msgs/msg/Pose2D": "vision_msgs/Point2D position\nfloat64 theta\n",
    "vision_msgs/msg/BoundingBox2D": ("vision_msgs/Pose2D center\nfloat64 size_x\n"
                                      "float64 size_y\n"),
    "vision_msgs/msg/ObjectHypothesis": "string class_id\nfloat64 score\n",
    "vision_msgs/msg/ObjectHypothesisWithPose": ("vision_msgs/ObjectHypothesis hypothesis\n"
                                                 "geometry_msgs/PoseWithCovariance pose\n"),
    "vision_msgs/msg/Detection2D": ("std_msgs/Header header\n"
                                    "vision_msgs/ObjectHypothesisWithPose[] results\n"
                                    "vision_msgs/BoundingBox2D bbox\nstring id\n"),
    "vision_msgs/msg/Detection2DArray": ("std_msgs/Header header\n"
                                         "vision_msgs/Detection2D[] detections\n"),
}
DETECTION_TYPES = {"custom": "patrol_msgs/msg/Detections",
                   "vision_msgs": "vision_msgs/msg/Detection2DArray"}

SCAN_BEAMS = 360
SCAN_RANGE_MAX_M = 12.0
SCAN_RANGE_MIN_M = 0.12
POSE_NOISE_M = 0.008
YAW_NOISE_RAD = 0.004

TOPIC_TYPES = {
    TOPIC_ODOM: "nav_msgs/msg/Odometry",
    TOPIC_SCAN: "sensor_msgs/msg/LaserScan",
    TOPIC_BATTERY: "sensor_msgs/msg/BatteryState",
    TOPIC_SPEECH: "std_msgs/msg/String",
    TOPIC_DETECTIONS: "patrol_msgs/msg/Detections",
    TOPIC_NAV_STATUS: "action_msgs/msg/GoalStatusArray",
    TOPIC_ACTION_RESULT: "std_msgs/msg/String",
}


def typestore(*more_types: dict[str, str]):
    """rosbags' Jazzy typestore with the custom types (and `more_types`: name -> .msg text)."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_JAZZY)
    types: dict = {}
    for name, text in (CUSTOM_TYPES | VISION_MSGS_TYPES).items():
        types.update(get_types_from_msg(text, name))
    for more in more_types:
        for name, text in more.items():
            types.update(get_types_from_msg(text, name))
    store.register(types)
    return store


def every_nth(odom_hz: float, hz: float) -> int:
    """A topic at `hz` is published every n-th simulation step: its rate rounded to divide it."""
    return max(1, int(round(odom_hz / hz)))


class Timeline:
    """(t_s, topic, message) added in any order, given back in time order (ties: as added)."""

    def __init__(self) -> None:
        self._items: list[tuple[float, int, str, Any]] = []

    def add(self, t_s: float, topic: str, msg: Any) -> None:
        self._items.append((t_s, len(self._items), topic, msg))

    def __iter__(self) -> Iterator[tuple[float, str, Any]]:
        for t_s, _, topic, msg in sorted(self._items, key=lambda m: (m[0], m[1])):
            yield t_s, topic, msg


def stamp_ns(t_s: float) -> int:
    """Bag time (ns) of world time `t_s`: receive stamps and header stamps alike."""
    return START_NS + int(round(t_s * 1e9))


def stamp_msg(ts, t_s: float):
    ns = stamp_ns(t_s)
    return ts.types["builtin_interfaces/msg/Time"](sec=ns // 1_000_000_000,
                                                  nanosec=ns % 1_000_000_000)


def header_msg(ts, t_s: float, frame: str):
    return ts.types["std_msgs/msg/Header"](stamp=stamp_msg(ts, t_s), frame_id=frame)


def quaternion_msg(ts, yaw: float):
    return ts.types["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=math.sin(yaw / 2),
                                                    w=math.cos(yaw / 2))


_ODOM_COV = np.diag([0.001, 0.001, 1e6, 1e6, 1e6, 0.002]).reshape(36).astype(np.float64)


def _odometry(ts, t_s: float, pose: Pose, rng: np.random.Generator, noise: float = 1.0):
    T = ts.types
    x = pose.x + rng.normal(0, POSE_NOISE_M * noise)
    y = pose.y + rng.normal(0, POSE_NOISE_M * noise)
    yaw = pose.yaw + rng.normal(0, YAW_NOISE_RAD * noise)
    v = pose.v + rng.normal(0, 0.004 * noise)
    w = pose.w + rng.normal(0, 0.003 * noise)
    vec = T["geometry_msgs/msg/Vector3"]
    return T["nav_msgs/msg/Odometry"](
        header=header_msg(ts, t_s, "odom"), child_frame_id="base_link",
        pose=T["geometry_msgs/msg/PoseWithCovariance"](
            pose=T["geometry_msgs/msg/Pose"](
                position=T["geometry_msgs/msg/Point"](x=x, y=y, z=0.0),
                orientation=quaternion_msg(ts, yaw)),
            covariance=_ODOM_COV.copy()),
        twist=T["geometry_msgs/msg/TwistWithCovariance"](
            twist=T["geometry_msgs/msg/Twist"](linear=vec(x=v, y=0.0, z=0.0),
                                               angular=vec(x=0.0, y=0.0, z=w)),
            covariance=_ODOM_COV.copy()))


_ANGLES = np.linspace(-math.pi, math.pi, SCAN_BEAMS, endpoint=False)


def _scan_ranges(pose: Pose, rng: np.random.Generator, noise: float = 1.0) -> np.ndarray:
    """Ray-cast the current room's walls (doorways open onto far space) and its objects."""
    room = ROOM_BY_NAME[room_at(pose.x, pose.y)]
    angles = _ANGLES + pose.yaw
    dx, dy = np.cos(angles), np.sin(angles)
    with np.errstate(divide="ignore", invalid="ignore"):
        tx = np.where(dx > 0, (room.x1 - pose.x) / dx, np.where(dx < 0, (room.x0 - pose.x) / dx,
                                                               np.inf))
        ty = np.where(dy > 0, (room.y1 - pose.y) / dy, np.where(dy < 0, (room.y0 - pose.y) / dy,
                                                               np.inf))
    t = np.minimum(tx, ty)
    hit_x = pose.x + t * dx
    if room.name == "hallway":
        doors = np.zeros_like(t, dtype=bool)
        for other in ROOMS[1:]:
            doors |= (ty < tx) & (np.abs(hit_x - other.door_x) < 0.45)
    else:
        doors = (ty < tx) & (np.abs(hit_x - room.door_x) < 0.45) & (
            ((dy < 0) & (room.y0 == HALL_Y1)) | ((dy > 0) & (room.y1 == HALL_Y0)))
    t = np.where(doors, t + 2.0 + 3.0 * np.abs(np.sin(angles)), t)   # the space beyond a door
    for _, ox, oy in room.objects:                                  # objects: 0.25 m cylinders
        fx, fy = ox - pose.x, oy - pose.y
        along = fx * dx + fy * dy
        perp2 = fx * fx + fy * fy - along * along
        inside = (along > 0) & (perp2 < 0.25 ** 2)
        t_obj = along - np.sqrt(np.clip(0.25 ** 2 - perp2, 0, None))
        t = np.where(inside & (t_obj < t), t_obj, t)
    t = t + rng.normal(0, 0.01 * noise, t.shape)
    t = np.where(t > SCAN_RANGE_MAX_M, np.inf, t)                   # no return
    glare = rng.random(t.shape) < min(0.5, 0.02 * noise)            # dark/shiny surfaces
    t = np.where(glare, np.nan, t)
    t = np.where(rng.random(t.shape) < min(0.5, 0.01 * noise), np.inf, t)
    return t.astype(np.float32)


def _laser_scan(ts, t_s: float, pose: Pose, rng: np.random.Generator, scan_hz: float,
                noise: float = 1.0):
    return ts.types["sensor_msgs/msg/LaserScan"](
        header=header_msg(ts, t_s, "base_scan"), angle_min=float(-math.pi),
        angle_max=float(math.pi - 2 * math.pi / SCAN_BEAMS),
        angle_increment=float(2 * math.pi / SCAN_BEAMS), time_increment=0.0,
        scan_time=1.0 / scan_hz, range_min=SCAN_RANGE_MIN_M, range_max=SCAN_RANGE_MAX_M,
        ranges=_scan_ranges(pose, rng, noise), intensities=np.zeros(0, dtype=np.float32))


def _battery(ts, t_s: float, level: float, charging: bool, rng: np.random.Generator,
             noise: float = 1.0):
    T = ts.types["sensor_msgs/msg/BatteryState"]
    voltage = 22.2 + 3.0 * level + rng.normal(0, 0.02 * noise)
    current = (2.1 if charging else -1.3) + rng.normal(0, 0.05 * noise)
    return T(header=header_msg(ts, t_s, "battery"), voltage=float(voltage),
             temperature=float(31.0 + rng.normal(0, 0.1)), current=float(current),
             charge=float(5.2 * level), capacity=5.2, design_capacity=5.6,
             percentage=float(level),
             power_supply_status=(T.POWER_SUPPLY_STATUS_CHARGING if charging
                                  else T.POWER_SUPPLY_STATUS_DISCHARGING),
             power_supply_health=T.POWER_SUPPLY_HEALTH_GOOD,
             power_supply_technology=T.POWER_SUPPLY_TECHNOLOGY_LION, present=True,
             cell_voltage=np.full(6, voltage / 6, dtype=np.float32),
             cell_temperature=np.full(6, 31.0, dtype=np.float32),
             location="base", serial_number="PB-2207-0042")


def _string(ts, text: str):
    return ts.types["std_msgs/msg/String"](data=text)


def _detections(ts, t_s: float, seen, rng: np.random.Generator):
    item = ts.types["patrol_msgs/msg/Detection"]
    return ts.types["patrol_msgs/msg/Detections"](
        header=header_msg(ts, t_s, "camera_color_optical_frame"),
        detections=[item(label=name, confidence=conf,
                         position=ts.types["geometry_msgs/msg/Point"](x=float(x), y=float(y),
                                                                      z=0.4),
                         bbox=np.array(rng.uniform([0, 0, 40, 40], [560, 400, 200, 200]),
                                       dtype=np.float32),
                         source=item.SOURCE_RGBD)
                    for name, conf, x, y in seen])


def _detection2d_array(ts, t_s: float, seen, rng: np.random.Generator):
    T = ts.types
    header = header_msg(ts, t_s, "camera_color_optical_frame")
    detections = []
    for name, conf, x, y in seen:
        cx, cy, w, h = rng.uniform([0, 0, 40, 40], [560, 400, 200, 200])
        pose = T["geometry_msgs/msg/PoseWithCovariance"](
            pose=T["geometry_msgs/msg/Pose"](
                position=T["geometry_msgs/msg/Point"](x=float(x), y=float(y), z=0.4),
                orientation=quaternion_msg(ts, 0.0)),
            covariance=np.zeros(36, dtype=np.float64))
        hyp = T["vision_msgs/msg/ObjectHypothesisWithPose"](
            hypothesis=T["vision_msgs/msg/ObjectHypothesis"](class_id=name, score=conf),
            pose=pose)
        bbox = T["vision_msgs/msg/BoundingBox2D"](
            center=T["vision_msgs/msg/Pose2D"](
                position=T["vision_msgs/msg/Point2D"](x=float(cx), y=float(cy)), theta=0.0),
            size_x=float(w), size_y=float(h))
        detections.append(T["vision_msgs/msg/Detection2D"](header=header, results=[hyp],
                                                            bbox=bbox, id=""))
    return T["vision_msgs/msg/Detection2DArray"](header=header, detections=detections)


def _goal_status_array(ts, t_s: float, goals: list[dict[str, Any]]):
    T = ts.types
    status_list = []
    for g in goals:
        stamp = stamp_msg(ts, g["t_accept"])
        status_list.append(T["action_msgs/msg/GoalStatus"](
            goal_info=T["action_msgs/msg/GoalInfo"](
                goal_id=T["unique_identifier_msgs/msg/UUID"](
                    uuid=np.array(g["uuid"], dtype=np.uint8)), stamp=stamp),
            status=g["status_at"]))
    return T["action_msgs/msg/GoalStatusArray"](status_list=status_list)


def _action_outcome(ts, a: dict[str, Any]):
    T = ts.types["patrol_msgs/msg/ActionOutcome"]
    ok = a["result"].startswith("succeeded")
    return T(name=a["name"], target=a["target"], outcome=T.SUCCEEDED if ok else T.FAILED,
             result=a["result"])


def patrol_messages(world: World, ts, rng: np.random.Generator,
                    rates_hz: tuple[float, float, float], noise: float,
                    detections: str = "custom",
                    action_results: str = "string") -> Iterator[tuple[float, str, Any]]:
    """(t_s, topic, message) for every message, in time order. `rates_hz`: odometry (the
    simulation step), scan and battery; `noise` scales every sensor noise."""
    out = Timeline()
    odom_hz, scan_hz, battery_hz = rates_hz
    per_scan, per_battery = every_nth(odom_hz, scan_hz), every_nth(odom_hz, battery_hz)
    for i, (t_s, pose, level, charging) in enumerate(world.samples):
        out.add(t_s, TOPIC_ODOM, _odometry(ts, t_s, pose, rng, noise))
        if i % per_scan == 0:
            out.add(t_s + 0.003, TOPIC_SCAN, _laser_scan(ts, t_s, pose, rng, scan_hz, noise))
        if i % per_battery == 0:
            out.add(t_s + 0.005, TOPIC_BATTERY, _battery(ts, t_s, level, charging, rng, noise))
    for u in world.utterances:
        out.add(u["t_s"], TOPIC_SPEECH, _string(ts, u["text"]))
    for t_s, _room, seen in world.detections:
        make = _detections if detections == "custom" else _detection2d_array
        out.add(t_s + DETECTION_DELAY_S, TOPIC_DETECTIONS, make(ts, t_s, seen, rng))
    for a in world.actions:
        out.add(a["t_s"] + ACTION_RESULT_DELAY_S, TOPIC_ACTION_RESULT,
                _string(ts, f"{a['name']}({a['target']}): {a['result']}")
                if action_results == "string" else _action_outcome(ts, a))
    # the action server's status topic: every goal change, with every goal it still holds
    changes = []
    for g in world.nav_goals:
        changes.append((g["t_accept"], g, 2))
        if g["t_end"] is not None:
            changes.append((g["t_end"], g, g["status"]))
    for t_s, goal, status in sorted(changes, key=lambda c: c[0]):
        goal["status_at"] = status
        known = [g for g in world.nav_goals if g["t_accept"] <= t_s and "status_at" in g]
        out.add(t_s + 0.002, TOPIC_NAV_STATUS, _goal_status_array(ts, t_s, known))
    return iter(out)
