"""Per-type defaults for a topic nobody configured: an event, a change-filtered state, or left out.

    topic_policy("std_msgs/msg/String", "/speech", rate_hz=0.01)   →  event
    topic_policy("sensor_msgs/msg/Image", "/camera/image_raw", 10)  →  state, period 1 s (shape)
    topic_policy("rosgraph_msgs/msg/Clock", "/clock", 100)          →  omit (the simulation clock)

`csr-ros replay --params` uses it for the bag topics the params file does not name; with no
params file every topic gets it. The emission defaults (deadbands, keep-alive) of a state come
from the type's kind (`emission.KIND_DEFAULTS`), the same table a configured source of the
aggregator takes when it leaves them out.

The rule (left out with the reason, an event, a state with its type's summary, or the
generic summary bounded by `UNKNOWN_MAX_CHARS` every `UNKNOWN_PERIOD_S`) and its table:
docs/rendering.md, "Topics the params file does not name".

Pure: no rclpy, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

EVENT = "event"
STATE = "state"
OMIT = "omit"

EVENT_MAX_HZ = 1.0            # an "event" topic faster than this on average is a stream
EVENT_MIN_COUNT = 30          # ... once it has at least this many messages
STREAM_PERIOD_S = 5.0         # minimum period of such a stream (detections that flicker)
UNKNOWN_PERIOD_S = 15.0       # minimum period of an unknown (custom) state type
UNKNOWN_MAX_CHARS = 240       # and its longest chunk
UNKNOWN_DEADBAND = 1.0        # and the change of a numeric field that counts (relative beyond 1)
UNKNOWN_KEEPALIVE_S = 120.0
AUTO_MAX_CHARS = 600          # longest chunk of any other topic added by default

EVENT_TYPES = {
    "std_msgs/msg/String": "text (speech, results, commands)",
    "action_msgs/msg/GoalStatusArray": "action goal states",
    "vision_msgs/msg/Detection2DArray": "detections",
    "vision_msgs/msg/Detection3DArray": "detections",
    "vision_msgs/msg/Classification": "classifications",
}
EVENT_WORDS = re.compile(r"detect|result|speech|utter|transcri|outcome|event|action|alert|alarm",
                         re.IGNORECASE)
SPORADIC_MAX_HZ = 0.05        # an unknown type at most this often on average: its messages are
                              # occurrences (results, alarms), each one kept

STATE_PERIOD_S = {                    # minimum period of each known state type
    "nav_msgs/msg/Odometry": 0.5,
    "sensor_msgs/msg/LaserScan": 0.5,
    "sensor_msgs/msg/BatteryState": 0.0,
    "sensor_msgs/msg/Imu": 10.0,          # attitude and rates move with every turn and bump
    "sensor_msgs/msg/JointState": 10.0,   # wheel joints turn for ever
    "sensor_msgs/msg/NavSatFix": 2.0,
    "sensor_msgs/msg/Range": 1.0,
    "sensor_msgs/msg/Temperature": 5.0,
    "geometry_msgs/msg/Twist": 1.0,
    "geometry_msgs/msg/TwistStamped": 1.0,
    "geometry_msgs/msg/TwistWithCovarianceStamped": 1.0,
    "geometry_msgs/msg/PoseStamped": 1.0,
    "geometry_msgs/msg/PoseWithCovarianceStamped": 1.0,
    "geometry_msgs/msg/Pose": 1.0,
    "nav_msgs/msg/Path": 2.0,
    "sensor_msgs/msg/Image": 1.0,
    "sensor_msgs/msg/CompressedImage": 1.0,
    "sensor_msgs/msg/PointCloud2": 1.0,
    "sensor_msgs/msg/CameraInfo": 1.0,
    "nav_msgs/msg/OccupancyGrid": 1.0,
    "tf2_msgs/msg/TFMessage": 1.0,
    "diagnostic_msgs/msg/DiagnosticArray": 1.0,
    "rcl_interfaces/msg/Log": 1.0,
}
STATE_NOTES = {
    "sensor_msgs/msg/Image": "shape and encoding only",
    "sensor_msgs/msg/CompressedImage": "format and size only",
    "sensor_msgs/msg/PointCloud2": "point count and fields only",
    "sensor_msgs/msg/CameraInfo": "resolution only",
    "nav_msgs/msg/OccupancyGrid": "size and resolution only",
    "tf2_msgs/msg/TFMessage": "frame pairs, a chunk when one is new",
    "diagnostic_msgs/msg/DiagnosticArray": "statuses that are not OK",
    "rcl_interfaces/msg/Log": "warnings and errors, repeats suppressed",
    "nav_msgs/msg/Path": "length and goal, a chunk when the goal moves",
    "sensor_msgs/msg/JointState": "positions: 0.5 rad, relative beyond 1 rad",
    "sensor_msgs/msg/Imu": "a 45 degree turn or tilt, or a shock",
}
STATE_EMISSION = {                    # emission parameters of a topic added by default
    "sensor_msgs/msg/JointState": {"deadband": 0.5},
    # a turn of 45 degrees, a tilt, or a shock (20 deg/s of roll/pitch rate, 20 m/s^2)
    "sensor_msgs/msg/Imu": {"deadband_deg": 45.0, "deadband": 20.0, "keepalive_s": 300.0},
}

OMIT_TYPES = {
    "rosgraph_msgs/msg/Clock": "the simulation clock (every chunk has its time)",
    "rcl_interfaces/msg/ParameterEvent": "node parameter changes (configuration, not state)",
    "visualization_msgs/msg/Marker": "RViz display markers",
    "visualization_msgs/msg/MarkerArray": "RViz display markers",
    "visualization_msgs/msg/InteractiveMarkerUpdate": "RViz display markers",
    "map_msgs/msg/OccupancyGridUpdate": "costmap cells",
    "nav2_msgs/msg/Costmap": "costmap cells",
    "nav2_msgs/msg/VoxelGrid": "costmap cells",
    "bond/msg/Status": "node heartbeats",
    "nav2_msgs/msg/ParticleCloud": "localisation particles (the pose is on odometry/amcl_pose)",
    "geometry_msgs/msg/PoseArray": "pose sets (particle clouds)",
}
OMIT_TOPICS = {
    "/robot_description": "the robot model (URDF)",
}


@dataclass(frozen=True)
class TopicPolicy:
    action: str                        # event | state | omit
    period_s: float = 0.0              # minimum period of a state
    max_chars: int = AUTO_MAX_CHARS
    reason: str = ""                   # why: shown per topic by `replay --stats` and --json
    emission: dict = field(default_factory=dict)  # over the kind's defaults (KIND_DEFAULTS)

    def describe(self) -> str:
        if self.action == OMIT:
            return f"left out: {self.reason}"
        period = f", period {self.period_s:g} s" if self.period_s else ""
        return f"{self.action}{period}" + (f" ({self.reason})" if self.reason else "")


def _omit_reason(type_name: str, topic: str) -> str | None:
    if topic in OMIT_TOPICS:
        return OMIT_TOPICS[topic]
    if type_name in OMIT_TYPES:
        return OMIT_TYPES[type_name]
    name = type_name.rsplit("/", 1)[-1]
    if name.endswith("_FeedbackMessage"):
        return "action feedback (progress; the goal's outcome is on the action's status topic)"
    if "audio" in type_name.lower():
        return "raw audio"
    return None


def type_policy(type_name: str, topic: str = "") -> TopicPolicy:
    """The default for a topic of this type, before its rate is known."""
    omit = _omit_reason(type_name, topic)
    if omit is not None:
        return TopicPolicy(OMIT, reason=omit)
    if type_name in EVENT_TYPES:
        return TopicPolicy(EVENT, reason=EVENT_TYPES[type_name])
    if type_name in STATE_PERIOD_S:
        return TopicPolicy(STATE, period_s=STATE_PERIOD_S[type_name],
                           reason=STATE_NOTES.get(type_name, "change-driven"),
                           emission=dict(STATE_EMISSION.get(type_name, {})))
    words = EVENT_WORDS.search(type_name.rsplit("/", 1)[-1]) or EVENT_WORDS.search(topic)
    if words:
        return TopicPolicy(EVENT, reason=f"{words.group(0).lower()} in the name")
    return TopicPolicy(STATE, period_s=UNKNOWN_PERIOD_S, max_chars=UNKNOWN_MAX_CHARS,
                       emission={"deadband": UNKNOWN_DEADBAND,
                                 "keepalive_s": UNKNOWN_KEEPALIVE_S},
                       reason="no summary for this type: generic, bounded")


def default_period_s(type_name: str) -> float:
    """The minimum period a state of this type takes by default (`period_s: -1.0`)."""
    policy = type_policy(type_name)
    return policy.period_s if policy.action == STATE else 0.0


def topic_policy(type_name: str, topic: str = "", *, rate_hz: float | None = None,
                 count: int | None = None) -> TopicPolicy:
    """`type_policy`, with an event topic that is really a stream kept to its changes."""
    policy = type_policy(type_name, topic)
    if policy.action == STATE and type_name not in STATE_PERIOD_S and rate_hz is not None \
            and rate_hz <= SPORADIC_MAX_HZ:
        return TopicPolicy(EVENT, max_chars=UNKNOWN_MAX_CHARS,
                           reason=f"sporadic ({rate_hz:.2f} Hz): every message")
    if policy.action == EVENT and rate_hz is not None and rate_hz > EVENT_MAX_HZ \
            and (count is None or count >= EVENT_MIN_COUNT):
        return TopicPolicy(STATE, period_s=STREAM_PERIOD_S,
                           reason=f"{policy.reason}, but {rate_hz:.1f} Hz is a stream: "
                                  "changes only")
    return policy


__all__ = ["AUTO_MAX_CHARS", "EVENT", "EVENT_MAX_HZ", "OMIT", "STATE", "TopicPolicy",
           "default_period_s",
           "UNKNOWN_MAX_CHARS", "UNKNOWN_PERIOD_S", "topic_policy", "type_policy"]
