"""A deterministic, realistic home-patrol rosbag2 and its ground truth.

    truth = generate_patrol("patrol_bag", duration_s=600, seed=0, storage="mcap")
    truth.events            # typed events with t_s: utterance, detection, action, room_visit
    truth.topics            # topic -> {type, count, hz}
    # and patrol_bag/ground_truth.json holds the same (see `PatrolTruth.to_json`)

    csr-ros patrol OUT --duration-s 600 --seed 0 --storage mcap|sqlite3

A robot lives in a flat of six rooms joined by a hallway. It idles (standing still: only sensor
noise moves), is asked for things by people, drives room to room (turn in place, drive, with
noise on the reported pose), docks to charge when its battery runs low, looks at objects and
reports the outcome of its actions. Topics (written through rosbags, so no ROS install is
needed, in mcap or sqlite3 storage):

    /odom                                nav_msgs/msg/Odometry           10 Hz, pose noise
    /scan                                sensor_msgs/msg/LaserScan        5 Hz, inf and nan ranges
    /battery_state                       sensor_msgs/msg/BatteryState     1 Hz, drains, charges
    /speech/text                         std_msgs/msg/String              "speaker: request"
    /detections                          patrol_msgs/msg/Detections       custom, only in the bag
    /navigate_to_pose/_action/status     action_msgs/msg/GoalStatusArray  on every goal change
    /action_result                       std_msgs/msg/String              "name(target): result"

`topic_names` writes them under other names, `action_results="custom"` as a custom type, and
`extras` adds a camera (Image), /tf at 50 Hz, /tf_static, /cmd_vel, a custom motor status,
/rosout, /diagnostics, a simulation /clock, an IMU and wheel joint states, as another robot's
recording would hold them.

The custom detection type is defined here as .msg text and registered with rosbags' typestore
when writing; a reader learns it from the bag. The same seed and duration give byte-identical
message data.
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from csr_ros.errors import ConfigError

START_NS = 1_764_000_000_000_000_000          # 2025-11-24T16:00:00Z: bag time of t_s = 0
STORAGES = ("mcap", "sqlite3")
GROUND_TRUTH_FILE = "ground_truth.json"

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
CUSTOM_TYPES = {"patrol_msgs/msg/Detections": DETECTION_MSG,
                "patrol_msgs/msg/Detection": DETECTION_ITEM_MSG}
# with extras=True: a drive controller's status, a type no tool knows (defined only in the bag)
MOTOR_STATUS_MSG = """\
uint8 MODE_IDLE=0
uint8 MODE_VELOCITY=1
std_msgs/Header header
float32[2] wheel_rpm
float32[2] current_a
float32 temperature_c
uint8 mode
string controller
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
EXTRA_TYPES = {"patrol_msgs/msg/MotorStatus": MOTOR_STATUS_MSG,
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

ODOM_HZ, SCAN_HZ, BATTERY_HZ = 10.0, 5.0, 1.0
SCAN_BEAMS = 360
SCAN_RANGE_MAX_M = 12.0
SCAN_RANGE_MIN_M = 0.12
DRIVE_MPS = 0.45
TURN_RPS = 0.8
POSE_NOISE_M = 0.008
YAW_NOISE_RAD = 0.004


# -- the flat ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Room:
    name: str
    x0: float
    y0: float
    x1: float
    y1: float
    door_x: float          # where the room opens onto the hallway (hallway itself: unused)
    objects: tuple[tuple[str, float, float], ...] = ()

    @property
    def center(self) -> tuple[float, float]:
        return ((self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2)

    def contains(self, x: float, y: float) -> bool:
        return self.x0 <= x < self.x1 and self.y0 <= y < self.y1


HALL_Y0, HALL_Y1 = 4.0, 6.0
ROOMS = (
    Room("hallway", 0.0, HALL_Y0, 12.0, HALL_Y1, 0.0,
         (("umbrella", 0.6, 4.4), ("shoes", 11.2, 5.5))),
    Room("kitchen", 0.0, HALL_Y1, 4.0, 11.0, 2.0,
         (("red mug", 1.0, 9.8), ("kettle", 3.2, 10.2), ("apple", 2.5, 8.0))),
    Room("living room", 4.0, HALL_Y1, 12.0, 11.0, 7.0,
         (("remote control", 6.5, 9.5), ("book", 10.8, 8.2), ("cat", 9.0, 7.4),
          ("charging dock", 11.3, 10.3))),
    Room("bedroom", 0.0, -1.0, 5.0, HALL_Y0, 2.5,
         (("keys", 0.7, 0.2), ("glasses", 4.2, 2.9), ("backpack", 1.5, 3.3))),
    Room("office", 5.0, -1.0, 9.0, HALL_Y0, 7.0,
         (("laptop", 6.0, -0.3), ("phone", 8.4, 0.6), ("plant", 5.5, 3.4))),
    Room("bathroom", 9.0, -1.0, 12.0, HALL_Y0, 10.5,
         (("towel", 11.4, -0.4), ("toothbrush", 9.6, 0.3))),
)
ROOM_BY_NAME = {r.name: r for r in ROOMS}
DOCK_XY = (11.0, 10.0)
SPEAKERS = ("alice", "bob", "grandma")
REQUEST_TEMPLATES = (
    ("please bring me the {obj}", "fetch"),
    ("can you check on the {obj} in the {room}", "check"),
    ("go and look in the {room}", "inspect"),
    ("where did I leave my {obj}?", "find"),
)


def room_at(x: float, y: float) -> str:
    for room in ROOMS:
        if room.contains(x, y):
            return room.name
    # outside every room (noise at a wall): the nearest one
    return min(ROOMS, key=lambda r: math.dist((x, y), r.center)).name


# -- ground truth --------------------------------------------------------------------------------

@dataclass
class PatrolTruth:
    """What happened, for questions and for checking that nothing was lost."""

    duration_s: float
    seed: int
    storage: str
    start_ns: int
    topics: dict[str, dict[str, Any]]          # topic -> {type, count, hz}
    events: list[dict[str, Any]] = field(default_factory=list)   # by t_s (room visits: enter_s)
    bag_path: str = ""
    renamed: dict[str, str] = field(default_factory=dict)        # default topic -> name written

    def topic(self, default: str) -> str:
        """The name a patrol topic (`TOPIC_SPEECH`, ...) has in this bag."""
        return self.renamed.get(default, default)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]

    @property
    def event_counts(self) -> dict[str, int]:
        """Messages in the bag that carry events, per kind ('detection_objects': objects)."""
        return {
            "utterance": self.topics[self.topic(TOPIC_SPEECH)]["count"],
            "detection": self.topics[self.topic(TOPIC_DETECTIONS)]["count"],
            "detection_objects": len(self.of_kind("detection")),
            "action_result": self.topics[self.topic(TOPIC_ACTION_RESULT)]["count"],
            "nav_status": self.topics[self.topic(TOPIC_NAV_STATUS)]["count"],
            "room_visit": len(self.of_kind("room_visit")),
        }

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self) | {"event_counts": self.event_counts}
        if not doc["renamed"]:
            del doc["renamed"]          # the default patrol's file stays as it was
        return doc


# -- the script: what the robot does, at 10 Hz ----------------------------------------------------

@dataclass
class _Pose:
    x: float
    y: float
    yaw: float
    v: float = 0.0
    w: float = 0.0


class _World:
    """Integrates the robot's motion along a script of tasks and records what happens."""

    def __init__(self, duration_s: float, rng: np.random.Generator, odom_hz: float = ODOM_HZ):
        self.duration_s = duration_s
        self.rng = rng
        self.dt = 1.0 / odom_hz
        cx, cy = ROOM_BY_NAME["living room"].center
        self.pose = _Pose(cx, cy, 0.0)
        self.t = 0.0
        self.battery = float(rng.uniform(0.36, 0.5))
        self.charging = False
        self.samples: list[tuple[float, _Pose, float, bool]] = []   # t, pose, battery, charging
        self.utterances: list[dict[str, Any]] = []
        self.detections: list[tuple[float, str, list[tuple[str, float, float, float]]]] = []
        self.nav_goals: list[dict[str, Any]] = []       # {uuid, t_accept, t_end, status}
        self.actions: list[dict[str, Any]] = []

    # motion primitives; each advances time in steps of dt and records samples
    def _step(self, v: float, w: float) -> None:
        p = self.pose
        p.yaw = math.atan2(math.sin(p.yaw + w * self.dt), math.cos(p.yaw + w * self.dt))
        p.x += v * math.cos(p.yaw) * self.dt
        p.y += v * math.sin(p.yaw) * self.dt
        p.v, p.w = v, w
        if self.charging:
            self.battery = min(1.0, self.battery + 0.0025 * self.dt)
        else:
            self.battery -= (0.00012 + 0.00030 * abs(v) / DRIVE_MPS + 0.0001 * abs(w)) * self.dt
        self.samples.append((self.t, _Pose(p.x, p.y, p.yaw, v, w), self.battery, self.charging))
        self.t += self.dt

    @property
    def done(self) -> bool:
        return self.t >= self.duration_s - 1e-9

    def idle(self, seconds: float) -> None:
        end = self.t + seconds
        while self.t < end - 1e-9 and not self.done:
            self._step(0.0, 0.0)

    def _turn_to(self, yaw: float) -> None:
        while not self.done:
            err = math.atan2(math.sin(yaw - self.pose.yaw), math.cos(yaw - self.pose.yaw))
            if abs(err) < TURN_RPS * self.dt:
                self._step(0.0, err / self.dt)
                return
            self._step(0.0, math.copysign(TURN_RPS, err))

    def _drive_to(self, x: float, y: float) -> None:
        self._turn_to(math.atan2(y - self.pose.y, x - self.pose.x))
        while not self.done:
            dist = math.dist((self.pose.x, self.pose.y), (x, y))
            if dist < DRIVE_MPS * self.dt:
                self._step(dist / self.dt, 0.0)
                self.pose.v = 0.0
                return
            heading = math.atan2(y - self.pose.y, x - self.pose.x)
            err = math.atan2(math.sin(heading - self.pose.yaw), math.cos(heading - self.pose.yaw))
            self._step(DRIVE_MPS, max(-TURN_RPS, min(TURN_RPS, 2.0 * err)))

    def _waypoints(self, target: tuple[float, float],
                   target_room: str) -> list[tuple[float, float]]:
        here = room_at(self.pose.x, self.pose.y)
        hall_y = (HALL_Y0 + HALL_Y1) / 2
        points: list[tuple[float, float]] = []
        if here != "hallway":
            door = ROOM_BY_NAME[here].door_x
            points += [(door, self.pose.y if abs(self.pose.y - hall_y) < 1 else
                        (HALL_Y1 + 0.8 if self.pose.y > hall_y else HALL_Y0 - 0.8)),
                       (door, hall_y)]
        if target_room != "hallway":
            door = ROOM_BY_NAME[target_room].door_x
            above = ROOM_BY_NAME[target_room].y0 >= HALL_Y1
            points += [(door, hall_y), (door, HALL_Y1 + 0.8 if above else HALL_Y0 - 0.8)]
        points.append(target)
        return points

    def navigate(self, room: str, target: tuple[float, float] | None = None) -> bool:
        """A navigate_to_pose goal: accepted, driven, succeeded (or aborted when blocked)."""
        if self.done:
            return False
        target = target or ROOM_BY_NAME[room].center
        goal = {"uuid": [int(b) for b in self.rng.integers(0, 256, 16)], "room": room,
                "t_accept": self.t, "t_end": None, "status": 2}
        self.nav_goals.append(goal)
        blocked = self.rng.random() < 0.12
        points = self._waypoints(target, room)
        if blocked:                      # a closed door / a cat in the way: gives up half-way
            points = points[:max(1, len(points) // 2)]
        for x, y in points:
            self._drive_to(x, y)
            if self.done:
                break
        if self.done:                    # the recording stopped with the goal still running
            return False
        goal["t_end"], goal["status"] = self.t, (6 if blocked else 4)
        result = "aborted: path blocked" if blocked else "succeeded"
        self.actions.append({"t_s": self.t, "name": "navigate_to_pose", "target": room,
                             "result": result})
        return not blocked

    def look(self, at_least_one: bool = True) -> None:
        """A detection message with some of the objects of the current room."""
        if self.done:
            return
        room = ROOM_BY_NAME[room_at(self.pose.x, self.pose.y)]
        visible = [o for o in room.objects if self.rng.random() < 0.7]
        if not visible and at_least_one and room.objects:
            visible = [room.objects[int(self.rng.integers(len(room.objects)))]]
        if not visible:
            return
        seen = [(name, float(np.round(self.rng.uniform(0.55, 0.98), 3)), x, y)
                for name, x, y in visible]
        self.detections.append((self.t, room.name, seen))
        self.idle(float(self.rng.uniform(1.0, 3.0)))

    def act(self, name: str, target: str, p_fail: float) -> None:
        if self.done:
            return
        self.idle(float(self.rng.uniform(3.0, 8.0)))
        if self.done:
            return
        failed = self.rng.random() < p_fail
        result = {"pick": "failed: grasp slipped", "open": "failed: handle not found"}.get(
            name, "failed") if failed else "succeeded"
        self.actions.append({"t_s": self.t, "name": name, "target": target, "result": result})

    def say(self, speaker: str, request: str, intent: str, room: str, obj: str) -> None:
        self.utterances.append({"t_s": self.t, "speaker": speaker, "request": request,
                                "text": f"{speaker}: {request}", "intent": intent,
                                "room": room, "object": obj})

    def dock(self) -> None:
        if not self.navigate("living room", DOCK_XY) or self.done:
            return
        self.charging = True
        self.actions.append({"t_s": self.t, "name": "dock", "target": "charging dock",
                             "result": "succeeded: charging"})
        self.idle(float(self.rng.uniform(40.0, 70.0)))
        self.charging = False
        if not self.done:
            self.actions.append({"t_s": self.t, "name": "undock", "target": "charging dock",
                                 "result": "succeeded"})


def _script(world: _World) -> None:
    rng = world.rng
    world.idle(float(rng.uniform(8.0, 15.0)))
    rooms = [r.name for r in ROOMS if r.name != "hallway"]
    while not world.done:
        if world.battery < 0.30 and not world.charging:
            world.dock()
            continue
        roll = rng.random()
        if roll < 0.35:                                        # someone asks for something
            speaker = SPEAKERS[int(rng.integers(len(SPEAKERS)))]
            room = rooms[int(rng.integers(len(rooms)))]
            objects = ROOM_BY_NAME[room].objects
            obj = objects[int(rng.integers(len(objects)))][0]
            template, intent = REQUEST_TEMPLATES[int(rng.integers(len(REQUEST_TEMPLATES)))]
            world.say(speaker, template.format(obj=obj, room=room), intent, room, obj)
            world.idle(float(rng.uniform(1.0, 2.5)))
            if world.navigate(room):
                world.look()
                if intent == "fetch":
                    world.act("pick", obj, p_fail=0.25)
        elif roll < 0.75:                                      # patrol to the next room
            here = room_at(world.pose.x, world.pose.y)
            room = [r for r in rooms if r != here][int(rng.integers(len(rooms) - 1))]
            if world.navigate(room):
                world.look()
                if rng.random() < 0.3:
                    world.act("open", "door", p_fail=0.3)
        else:                                                  # stand still a while
            world.idle(float(rng.uniform(15.0, 45.0)))
            if rng.random() < 0.4:
                world.look()


# -- messages ------------------------------------------------------------------------------------

def _typestore():
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_JAZZY)
    types: dict = {}
    for name, text in (CUSTOM_TYPES | VISION_MSGS_TYPES | EXTRA_TYPES).items():
        types.update(get_types_from_msg(text, name))
    store.register(types)
    return store


def _time(ts, t_s: float):
    ns = START_NS + int(round(t_s * 1e9))
    return ts.types["builtin_interfaces/msg/Time"](sec=ns // 1_000_000_000,
                                                  nanosec=ns % 1_000_000_000)


def _header(ts, t_s: float, frame: str):
    return ts.types["std_msgs/msg/Header"](stamp=_time(ts, t_s), frame_id=frame)


def _quat(ts, yaw: float):
    return ts.types["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=math.sin(yaw / 2),
                                                    w=math.cos(yaw / 2))


_ODOM_COV = np.diag([0.001, 0.001, 1e6, 1e6, 1e6, 0.002]).reshape(36).astype(np.float64)


def _odometry(ts, t_s: float, pose: _Pose, rng: np.random.Generator, noise: float = 1.0):
    T = ts.types
    x = pose.x + rng.normal(0, POSE_NOISE_M * noise)
    y = pose.y + rng.normal(0, POSE_NOISE_M * noise)
    yaw = pose.yaw + rng.normal(0, YAW_NOISE_RAD * noise)
    v = pose.v + rng.normal(0, 0.004 * noise)
    w = pose.w + rng.normal(0, 0.003 * noise)
    vec = T["geometry_msgs/msg/Vector3"]
    return T["nav_msgs/msg/Odometry"](
        header=_header(ts, t_s, "odom"), child_frame_id="base_link",
        pose=T["geometry_msgs/msg/PoseWithCovariance"](
            pose=T["geometry_msgs/msg/Pose"](
                position=T["geometry_msgs/msg/Point"](x=x, y=y, z=0.0),
                orientation=_quat(ts, yaw)),
            covariance=_ODOM_COV.copy()),
        twist=T["geometry_msgs/msg/TwistWithCovariance"](
            twist=T["geometry_msgs/msg/Twist"](linear=vec(x=v, y=0.0, z=0.0),
                                               angular=vec(x=0.0, y=0.0, z=w)),
            covariance=_ODOM_COV.copy()))


_ANGLES = np.linspace(-math.pi, math.pi, SCAN_BEAMS, endpoint=False)


def _scan_ranges(pose: _Pose, rng: np.random.Generator, noise: float = 1.0) -> np.ndarray:
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


def _laser_scan(ts, t_s: float, pose: _Pose, rng: np.random.Generator, scan_hz: float = SCAN_HZ,
                noise: float = 1.0):
    return ts.types["sensor_msgs/msg/LaserScan"](
        header=_header(ts, t_s, "base_scan"), angle_min=float(-math.pi),
        angle_max=float(math.pi - 2 * math.pi / SCAN_BEAMS),
        angle_increment=float(2 * math.pi / SCAN_BEAMS), time_increment=0.0,
        scan_time=1.0 / scan_hz, range_min=SCAN_RANGE_MIN_M, range_max=SCAN_RANGE_MAX_M,
        ranges=_scan_ranges(pose, rng, noise), intensities=np.zeros(0, dtype=np.float32))


def _battery(ts, t_s: float, level: float, charging: bool, rng: np.random.Generator,
             noise: float = 1.0):
    T = ts.types["sensor_msgs/msg/BatteryState"]
    voltage = 22.2 + 3.0 * level + rng.normal(0, 0.02 * noise)
    current = (2.1 if charging else -1.3) + rng.normal(0, 0.05 * noise)
    return T(header=_header(ts, t_s, "battery"), voltage=float(voltage),
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
        header=_header(ts, t_s, "camera_color_optical_frame"),
        detections=[item(label=name, confidence=conf,
                         position=ts.types["geometry_msgs/msg/Point"](x=float(x), y=float(y),
                                                                      z=0.4),
                         bbox=np.array(rng.uniform([0, 0, 40, 40], [560, 400, 200, 200]),
                                       dtype=np.float32),
                         source=item.SOURCE_RGBD)
                    for name, conf, x, y in seen])


def _detection2d_array(ts, t_s: float, seen, rng: np.random.Generator):
    T = ts.types
    header = _header(ts, t_s, "camera_color_optical_frame")
    detections = []
    for name, conf, x, y in seen:
        cx, cy, w, h = rng.uniform([0, 0, 40, 40], [560, 400, 200, 200])
        pose = T["geometry_msgs/msg/PoseWithCovariance"](
            pose=T["geometry_msgs/msg/Pose"](
                position=T["geometry_msgs/msg/Point"](x=float(x), y=float(y), z=0.4),
                orientation=_quat(ts, 0.0)),
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
        stamp = _time(ts, g["t_accept"])
        status_list.append(T["action_msgs/msg/GoalStatus"](
            goal_info=T["action_msgs/msg/GoalInfo"](
                goal_id=T["unique_identifier_msgs/msg/UUID"](
                    uuid=np.array(g["uuid"], dtype=np.uint8)), stamp=stamp),
            status=g["status_at"]))
    return T["action_msgs/msg/GoalStatusArray"](status_list=status_list)


# -- the bag -------------------------------------------------------------------------------------

def _action_outcome(ts, a: dict[str, Any]):
    T = ts.types["patrol_msgs/msg/ActionOutcome"]
    ok = a["result"].startswith("succeeded")
    return T(name=a["name"], target=a["target"], outcome=T.SUCCEEDED if ok else T.FAILED,
             result=a["result"])


def _messages(world: _World, ts, rng: np.random.Generator, rates: tuple[float, float, float],
              noise: float, detections: str = "custom",
              action_results: str = "string") -> Iterator[tuple[float, str, Any]]:
    """(t_s, topic, message) for every message, in time order."""
    out: list[tuple[float, int, str, Any]] = []
    n = 0

    def add(t_s: float, topic: str, msg: Any) -> None:
        nonlocal n
        out.append((t_s, n, topic, msg))
        n += 1

    odom_hz, scan_hz, battery_hz = rates
    per_scan = max(1, int(round(odom_hz / scan_hz)))
    per_battery = max(1, int(round(odom_hz / battery_hz)))
    for i, (t_s, pose, level, charging) in enumerate(world.samples):
        add(t_s, TOPIC_ODOM, _odometry(ts, t_s, pose, rng, noise))
        if i % per_scan == 0:
            add(t_s + 0.003, TOPIC_SCAN, _laser_scan(ts, t_s, pose, rng, scan_hz, noise))
        if i % per_battery == 0:
            add(t_s + 0.005, TOPIC_BATTERY, _battery(ts, t_s, level, charging, rng, noise))
    for u in world.utterances:
        add(u["t_s"], TOPIC_SPEECH, _string(ts, u["text"]))
    for t_s, _room, seen in world.detections:
        make = _detections if detections == "custom" else _detection2d_array
        add(t_s + 0.05, TOPIC_DETECTIONS, make(ts, t_s, seen, rng))
    for a in world.actions:
        add(a["t_s"] + 0.01, TOPIC_ACTION_RESULT,
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
        add(t_s + 0.002, TOPIC_NAV_STATUS, _goal_status_array(ts, t_s, known))
    out.sort(key=lambda m: (m[0], m[1]))
    for t_s, _, topic, msg in out:
        yield t_s, topic, msg


# -- extras: what else a recorded robot bag holds (extras=True) ----------------------------------

TOPIC_IMAGE = "/camera/image_raw"
TOPIC_TF = "/tf"
TOPIC_TF_STATIC = "/tf_static"
TOPIC_MOTOR = "/motor_status"
TOPIC_CMD_VEL = "/cmd_vel"
TOPIC_ROSOUT = "/rosout"
TOPIC_DIAGNOSTICS = "/diagnostics"
TOPIC_CLOCK = "/clock"
TOPIC_IMU = "/imu/data"
TOPIC_JOINTS = "/joint_states"
EXTRA_TOPIC_TYPES = {
    TOPIC_IMAGE: "sensor_msgs/msg/Image",
    TOPIC_TF: "tf2_msgs/msg/TFMessage",
    TOPIC_TF_STATIC: "tf2_msgs/msg/TFMessage",
    TOPIC_MOTOR: "patrol_msgs/msg/MotorStatus",
    TOPIC_CMD_VEL: "geometry_msgs/msg/Twist",
    TOPIC_ROSOUT: "rcl_interfaces/msg/Log",
    TOPIC_DIAGNOSTICS: "diagnostic_msgs/msg/DiagnosticArray",
    TOPIC_CLOCK: "rosgraph_msgs/msg/Clock",
    TOPIC_IMU: "sensor_msgs/msg/Imu",
    TOPIC_JOINTS: "sensor_msgs/msg/JointState",
}
WHEEL_RADIUS_M, WHEEL_BASE_M = 0.05, 0.4
IMAGE_WIDTH, IMAGE_HEIGHT = 128, 96        # small, so a 10-minute bag stays small; rgb8


def _transform(ts, t_s: float, parent: str, child: str, x: float, y: float, yaw: float):
    T = ts.types
    return T["geometry_msgs/msg/TransformStamped"](
        header=_header(ts, t_s, parent), child_frame_id=child,
        transform=T["geometry_msgs/msg/Transform"](
            translation=T["geometry_msgs/msg/Vector3"](x=x, y=y, z=0.0),
            rotation=_quat(ts, yaw)))


def _log(ts, t_s: float, level: int, name: str, text: str):
    return ts.types["rcl_interfaces/msg/Log"](
        stamp=_time(ts, t_s), level=level, name=name, msg=text, file="", function="", line=0)


def _diagnostics(ts, t_s: float, level: float):
    T = ts.types
    status = T["diagnostic_msgs/msg/DiagnosticStatus"]
    kv = T["diagnostic_msgs/msg/KeyValue"]
    low = level < 0.3
    return T["diagnostic_msgs/msg/DiagnosticArray"](header=_header(ts, t_s, ""), status=[
        status(level=1 if low else 0, name="power: battery",
               message="low" if low else "ok", hardware_id="bms",
               values=[kv(key="percent", value=f"{100 * level:.1f}")]),
        status(level=0, name="drive: motors", message="ok", hardware_id="motor_driver",
               values=[]),
        status(level=0, name="sensors: lidar", message="ok", hardware_id="lidar", values=[])])


def _extra_messages(world: _World, ts, rng: np.random.Generator, odom_hz: float,
                    image_hz: float, tf_hz: float) -> Iterator[tuple[float, str, Any]]:
    """(t_s, topic, message) of the extras, in time order."""
    T = ts.types
    out: list[tuple[float, int, str, Any]] = []

    def add(t_s: float, topic: str, msg: Any) -> None:
        out.append((t_s, len(out), topic, msg))

    add(0.0, TOPIC_TF_STATIC, T["tf2_msgs/msg/TFMessage"](transforms=[
        _transform(ts, 0.0, "base_link", "base_scan", 0.1, 0.0, 0.0),
        _transform(ts, 0.0, "base_link", "camera_link", 0.15, 0.0, 0.0)]))
    per_image = max(1, int(round(odom_hz / image_hz)))
    per_tf = max(1, int(round(tf_hz / odom_hz)))
    per_motor = max(1, int(round(odom_hz / 5.0)))
    per_diag = max(1, int(round(odom_hz)))
    moving_before = False
    wheels = [0.0, 0.0]
    v_before = 0.0
    cov = np.zeros(9)
    for i, (t_s, pose, level, charging) in enumerate(world.samples):
        vec = T["geometry_msgs/msg/Vector3"]
        accel = (pose.v - v_before) * odom_hz
        v_before = pose.v
        add(t_s + 0.002, TOPIC_IMU, T["sensor_msgs/msg/Imu"](
            header=_header(ts, t_s, "imu_link"),
            orientation=_quat(ts, pose.yaw + rng.normal(0, 0.01)), orientation_covariance=cov,
            angular_velocity=vec(x=float(rng.normal(0, 0.005)), y=float(rng.normal(0, 0.005)),
                                 z=float(pose.w + rng.normal(0, 0.005))),
            angular_velocity_covariance=cov,
            linear_acceleration=vec(x=float(accel + rng.normal(0, 0.05)),
                                    y=float(pose.v * pose.w + rng.normal(0, 0.05)),
                                    z=float(9.81 + rng.normal(0, 0.05))),
            linear_acceleration_covariance=cov))
        for side, sign in ((0, -1), (1, 1)):
            wheels[side] += (pose.v + sign * pose.w * WHEEL_BASE_M / 2) / WHEEL_RADIUS_M / odom_hz
        add(t_s + 0.002, TOPIC_JOINTS, T["sensor_msgs/msg/JointState"](
            header=_header(ts, t_s, ""), name=["wheel_left_joint", "wheel_right_joint"],
            position=np.array(wheels), velocity=np.zeros(2), effort=np.zeros(0)))
        for k in range(per_tf):
            tk = t_s + k / (per_tf * odom_hz)
            transforms = [_transform(ts, tk, "odom", "base_link", pose.x, pose.y, pose.yaw)]
            if k == 0:
                transforms.append(_transform(ts, tk, "map", "odom", 0.0, 0.0, 0.0))
            add(tk + 0.001, TOPIC_TF, T["tf2_msgs/msg/TFMessage"](transforms=transforms))
        if i % per_image == 0:
            room = room_at(pose.x, pose.y)
            shade = 60 + 20 * ROOMS.index(ROOM_BY_NAME[room]) + int(rng.integers(0, 4))
            add(t_s + 0.007, TOPIC_IMAGE, T["sensor_msgs/msg/Image"](
                header=_header(ts, t_s, "camera_link"), height=IMAGE_HEIGHT, width=IMAGE_WIDTH,
                encoding="rgb8", is_bigendian=0, step=IMAGE_WIDTH * 3,
                data=np.full(IMAGE_WIDTH * IMAGE_HEIGHT * 3, shade, dtype=np.uint8)))
        add(t_s, TOPIC_CLOCK, T["rosgraph_msgs/msg/Clock"](clock=_time(ts, t_s)))
        add(t_s + 0.004, TOPIC_CMD_VEL, T["geometry_msgs/msg/Twist"](
            linear=vec(x=float(pose.v), y=0.0, z=0.0), angular=vec(x=0.0, y=0.0, z=float(pose.w))))
        if i % per_motor == 0:
            rpm = 60 * pose.v / (2 * math.pi * 0.05)
            turn = 60 * pose.w * 0.2 / (2 * math.pi * 0.05)
            mode = T["patrol_msgs/msg/MotorStatus"]
            add(t_s + 0.006, TOPIC_MOTOR, mode(
                header=_header(ts, t_s, "base_link"),
                wheel_rpm=np.array([rpm - turn, rpm + turn], dtype=np.float32)
                + rng.normal(0, 0.5, 2).astype(np.float32),
                current_a=np.abs(np.array([rpm - turn, rpm + turn], dtype=np.float32) * 0.01)
                + 0.1 + rng.normal(0, 0.01, 2).astype(np.float32),
                temperature_c=float(35.0 + rng.normal(0, 0.2)),
                mode=mode.MODE_VELOCITY if (pose.v or pose.w) else mode.MODE_IDLE,
                controller="diff_drive"))
        moving = abs(pose.v) > 0.01 or abs(pose.w) > 0.01
        if moving != moving_before:
            add(t_s + 0.008, TOPIC_ROSOUT, _log(ts, t_s, 20, "controller_server",
                                                "Received a goal, begin computing control "
                                                "effort." if moving else "Reached the goal!"))
            moving_before = moving
        if i % per_diag == 0:
            add(t_s + 0.009, TOPIC_DIAGNOSTICS, _diagnostics(ts, t_s, level))
            if level < 0.3 and not charging and i % (per_diag * 30) == 0:
                add(t_s + 0.009, TOPIC_ROSOUT, _log(ts, t_s, 30, "battery_monitor",
                                                    f"Battery low: {100 * level:.0f}%"))
    out.sort(key=lambda m: (m[0], m[1]))
    for t_s, _, topic, msg in out:
        yield t_s, topic, msg


TOPIC_TYPES = {
    TOPIC_ODOM: "nav_msgs/msg/Odometry",
    TOPIC_SCAN: "sensor_msgs/msg/LaserScan",
    TOPIC_BATTERY: "sensor_msgs/msg/BatteryState",
    TOPIC_SPEECH: "std_msgs/msg/String",
    TOPIC_DETECTIONS: "patrol_msgs/msg/Detections",
    TOPIC_NAV_STATUS: "action_msgs/msg/GoalStatusArray",
    TOPIC_ACTION_RESULT: "std_msgs/msg/String",
}


def _room_visits(world: _World) -> list[dict[str, Any]]:
    visits: list[dict[str, Any]] = []
    for t_s, pose, _, _ in world.samples:
        room = room_at(pose.x, pose.y)
        if not visits or visits[-1]["room"] != room:
            if visits:
                visits[-1]["leave_s"] = round(t_s, 3)
            visits.append({"kind": "room_visit", "room": room, "enter_s": round(t_s, 3),
                           "leave_s": None, "t_s": round(t_s, 3)})
    return visits


def generate_patrol(out: str | Path, *, duration_s: float = 600.0, seed: int = 0,
                    storage: str = "mcap", overwrite: bool = False, odom_hz: float = ODOM_HZ,
                    scan_hz: float = SCAN_HZ, battery_hz: float = BATTERY_HZ,
                    noise: float = 1.0, detections: str = "custom",
                    topic_names: dict[str, str] | None = None, extras: bool = False,
                    image_hz: float = 10.0, tf_hz: float = 50.0,
                    action_results: str = "string") -> PatrolTruth:
    """Write the patrol bag to directory `out` (and out/ground_truth.json); return the truth.

    `odom_hz` is the simulation step; scans and battery are published every n-th step (their
    rates rounded to divide it). `noise` scales every sensor noise (and the share of nan/inf
    scan returns); `detections` is "custom" (patrol_msgs/msg/Detections) or "vision_msgs"
    (vision_msgs/msg/Detection2DArray, Humble layout, map position in the hypothesis pose),
    both defined only in the bag. The defaults are the documented 10-minute patrol.

    Other robots name their topics otherwise: `topic_names` maps a default topic to the name
    written (``{"/speech/text": "/speech"}``); `action_results="custom"` writes the action
    results as patrol_msgs/msg/ActionOutcome. `extras` adds what else a recorded bag holds:
    a camera (sensor_msgs/Image at `image_hz`), /tf at `tf_hz` and /tf_static, velocity commands,
    a drive controller's status in a custom type, /rosout, /diagnostics, /clock, an IMU and
    wheel joint states (all at the odometry rate but the camera and /tf)."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    if storage not in STORAGES:
        raise ConfigError(f"storage must be one of {list(STORAGES)}, got {storage!r}")
    if not duration_s >= 5.0:
        raise ConfigError(f"duration_s must be >= 5 s, got {duration_s}")
    for name, hz in (("odom_hz", odom_hz), ("scan_hz", scan_hz), ("battery_hz", battery_hz)):
        if not 0 < hz <= 1000:
            raise ConfigError(f"{name} must be in (0, 1000] Hz, got {hz}")
    if not scan_hz <= odom_hz >= battery_hz:
        raise ConfigError(f"odom_hz ({odom_hz}) is the simulation step: scan_hz ({scan_hz}) "
                          f"and battery_hz ({battery_hz}) cannot be higher")
    if detections not in DETECTION_TYPES:
        raise ConfigError(f"detections must be one of {list(DETECTION_TYPES)}, got "
                          f"{detections!r}")
    if not 0 <= noise <= 20:
        raise ConfigError(f"noise must be in [0, 20], got {noise}")
    if action_results not in ("string", "custom"):
        raise ConfigError(f"action_results must be 'string' or 'custom', got {action_results!r}")
    for name, hz in (("image_hz", image_hz), ("tf_hz", tf_hz)):
        if not 0 < hz <= 1000:
            raise ConfigError(f"{name} must be in (0, 1000] Hz, got {hz}")
    renamed = dict(topic_names or {})
    unknown = sorted(set(renamed) - set(TOPIC_TYPES) - set(EXTRA_TOPIC_TYPES))
    if unknown:
        raise ConfigError(f"topic_names: {unknown} are not patrol topics; they are "
                          f"{sorted(TOPIC_TYPES) + sorted(EXTRA_TOPIC_TYPES)}")
    for old, new in renamed.items():
        if not (isinstance(new, str) and new.startswith("/") and len(new) > 1):
            raise ConfigError(f"topic_names: {old} -> {new!r}: a topic name starts with '/'")
    out = Path(out)
    if out.exists():
        if not overwrite:
            raise ConfigError(f"{out} already exists; choose a new directory (a bag is a "
                              "directory rosbag2 creates itself)")
        import shutil
        shutil.rmtree(out)
    rng = np.random.default_rng(seed)
    world = _World(duration_s, np.random.default_rng(rng.integers(2 ** 63)), odom_hz)
    _script(world)
    ts = _typestore()
    topic_types = TOPIC_TYPES | {TOPIC_DETECTIONS: DETECTION_TYPES[detections]}
    if action_results == "custom":
        topic_types[TOPIC_ACTION_RESULT] = "patrol_msgs/msg/ActionOutcome"
    if extras:
        topic_types |= EXTRA_TOPIC_TYPES
    names = {t: renamed.get(t, t) for t in topic_types}
    if len(set(names.values())) != len(names):
        raise ConfigError(f"topic_names: two topics would have the same name: {renamed}")
    counts = {topic: 0 for topic in topic_types}
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(out, version=9, storage_plugin=plugin) as writer:
        conns = {topic: writer.add_connection(names[topic], msgtype, typestore=ts)
                 for topic, msgtype in topic_types.items()}
        messages = _messages(world, ts, np.random.default_rng(rng.integers(2 ** 63)),
                             (odom_hz, scan_hz, battery_hz), noise, detections, action_results)
        if extras:          # their own random stream: the patrol's messages stay the same
            more = _extra_messages(world, ts, np.random.default_rng([seed, 1]), odom_hz,
                                   image_hz, tf_hz)
            messages = heapq.merge(messages, more, key=lambda m: m[0])
        for t_s, topic, msg in messages:
            stamp_ns = START_NS + int(round(t_s * 1e9))
            writer.write(conns[topic], stamp_ns, ts.serialize_cdr(msg, topic_types[topic]))
            counts[topic] += 1

    events: list[dict[str, Any]] = []
    for u in world.utterances:
        events.append({"kind": "utterance", "t_s": round(u["t_s"], 3), "speaker": u["speaker"],
                       "text": u["text"], "request": u["request"], "intent": u["intent"],
                       "room": u["room"], "object": u["object"]})
    for t_s, room, seen in world.detections:
        for name, conf, x, y in seen:
            events.append({"kind": "detection", "t_s": round(t_s + 0.05, 3), "object": name,
                           "room": room, "confidence": conf, "x_m": x, "y_m": y})
    for a in world.actions:
        events.append({"kind": "action", "t_s": round(a["t_s"] + 0.01, 3), "name": a["name"],
                       "target": a["target"], "result": a["result"]})
    events.extend(_room_visits(world))
    events.sort(key=lambda e: (e["t_s"], e["kind"]))
    duration = world.samples[-1][0] + 1.0 / odom_hz if world.samples else 0.0
    per_scan = max(1, int(round(odom_hz / scan_hz)))
    per_battery = max(1, int(round(odom_hz / battery_hz)))
    hz = {TOPIC_ODOM: odom_hz, TOPIC_SCAN: odom_hz / per_scan, TOPIC_BATTERY: odom_hz / per_battery}
    if extras:
        hz |= {TOPIC_IMAGE: odom_hz / max(1, int(round(odom_hz / image_hz))),
               TOPIC_TF: odom_hz * max(1, int(round(tf_hz / odom_hz))), TOPIC_CMD_VEL: odom_hz}
    truth = PatrolTruth(
        duration_s=round(duration, 3), seed=seed, storage=storage, start_ns=START_NS,
        topics={names[t]: {"type": m, "count": counts[t], "hz": hz.get(t)}
                for t, m in topic_types.items()},
        events=events, bag_path=str(out), renamed={k: v for k, v in renamed.items() if k != v})
    (out / GROUND_TRUTH_FILE).write_text(json.dumps(truth.to_json(), indent=1) + "\n",
                                         encoding="utf-8")
    return truth


def load_truth(bag: str | Path) -> PatrolTruth:
    """The ground truth written next to a patrol bag (bag/ground_truth.json)."""
    path = Path(bag) / GROUND_TRUTH_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}; was the bag written by "
                          "`csr-ros patrol`?") from None
    doc.pop("event_counts", None)
    return PatrolTruth(**doc)
