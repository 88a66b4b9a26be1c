"""The patrol bag and its ground truth: validated settings in, a rosbag2 directory out.

    settings = PatrolSettings(duration_s=600, seed=0, storage="mcap")   # ConfigError if bad
    truth = write_patrol("patrol_bag", settings)      # the bag and patrol_bag/ground_truth.json
    truth = load_truth("patrol_bag")                  # the same, read back

The world is simulated first (world.py), then its messages (messages.py, and extras.py with
`extras`) are written through rosbags in time order, each stamped with its world time. Each
part draws from its own generator seeded from `seed`, so the same settings give byte-identical
message data.
"""

from __future__ import annotations

import heapq
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from csr_ros.errors import ConfigError
from csr_ros.patrol.extras import EXTRA_TOPIC_TYPES, EXTRA_TYPES, extra_messages, extra_rates_hz
from csr_ros.patrol.messages import (DETECTION_TYPES, START_NS, TOPIC_ACTION_RESULT,
                                     TOPIC_BATTERY, TOPIC_DETECTIONS, TOPIC_NAV_STATUS,
                                     TOPIC_ODOM, TOPIC_SCAN, TOPIC_SPEECH, TOPIC_TYPES, every_nth,
                                     patrol_messages, stamp_ns, typestore)
from csr_ros.patrol.world import World, run_script, truth_events

STORAGES = ("mcap", "sqlite3")
GROUND_TRUTH_FILE = "ground_truth.json"


@dataclass(frozen=True)
class PatrolSettings:
    """What a patrol bag holds; the defaults are the documented 10-minute patrol. Every value
    is checked here (ConfigError), before anything is written.

    `odom_hz` is the simulation step; scans and battery are published every n-th step (their
    rates rounded to divide it). `noise` scales every sensor noise (and the share of nan/inf
    scan returns); `detections` is "custom" (patrol_msgs/msg/Detections) or "vision_msgs"
    (vision_msgs/msg/Detection2DArray, Humble layout, map position in the hypothesis pose),
    both defined only in the bag.

    Other robots name their topics otherwise: `topic_names` maps a default topic to the name
    written (``{"/speech/text": "/speech"}``); `action_results="custom"` writes the action
    results as patrol_msgs/msg/ActionOutcome. `extras` adds what else a recorded bag holds:
    a camera (sensor_msgs/Image at `image_hz`), /tf at `tf_hz` and /tf_static, velocity
    commands, a drive controller's status in a custom type, /rosout, /diagnostics, /clock, an
    IMU and wheel joint states (all at the odometry rate but the camera and /tf)."""

    duration_s: float = 600.0
    seed: int = 0
    storage: str = "mcap"
    odom_hz: float = 10.0
    scan_hz: float = 5.0
    battery_hz: float = 1.0
    noise: float = 1.0
    detections: str = "custom"
    topic_names: dict[str, str] = field(default_factory=dict)
    extras: bool = False
    image_hz: float = 10.0
    tf_hz: float = 50.0
    action_results: str = "string"

    def __post_init__(self) -> None:
        object.__setattr__(self, "topic_names", dict(self.topic_names or {}))
        if self.storage not in STORAGES:
            raise ConfigError(f"storage must be one of {list(STORAGES)}, got {self.storage!r}")
        if not self.duration_s >= 5.0:
            raise ConfigError(f"duration_s must be >= 5 s, got {self.duration_s}")
        for name in ("odom_hz", "scan_hz", "battery_hz"):
            _check_hz(name, getattr(self, name))
        if not self.scan_hz <= self.odom_hz >= self.battery_hz:
            raise ConfigError(f"odom_hz ({self.odom_hz}) is the simulation step: scan_hz "
                              f"({self.scan_hz}) and battery_hz ({self.battery_hz}) cannot be "
                              "higher")
        if self.detections not in DETECTION_TYPES:
            raise ConfigError(f"detections must be one of {list(DETECTION_TYPES)}, got "
                              f"{self.detections!r}")
        if not 0 <= self.noise <= 20:
            raise ConfigError(f"noise must be in [0, 20], got {self.noise}")
        if self.action_results not in ("string", "custom"):
            raise ConfigError(f"action_results must be 'string' or 'custom', got "
                              f"{self.action_results!r}")
        for name in ("image_hz", "tf_hz"):
            _check_hz(name, getattr(self, name))
        renamed = self.topic_names
        unknown = sorted(set(renamed) - set(TOPIC_TYPES) - set(EXTRA_TOPIC_TYPES))
        if unknown:
            raise ConfigError(f"topic_names: {unknown} are not patrol topics; they are "
                              f"{sorted(TOPIC_TYPES) + sorted(EXTRA_TOPIC_TYPES)}")
        for old, new in renamed.items():
            if not (isinstance(new, str) and new.startswith("/") and len(new) > 1):
                raise ConfigError(f"topic_names: {old} -> {new!r}: a topic name starts with '/'")
        names = self.names()
        if len(set(names.values())) != len(names):
            raise ConfigError(f"topic_names: two topics would have the same name: {renamed}")

    def topic_types(self) -> dict[str, str]:
        """Default topic -> message type, for every topic the bag holds."""
        types = TOPIC_TYPES | {TOPIC_DETECTIONS: DETECTION_TYPES[self.detections]}
        if self.action_results == "custom":
            types[TOPIC_ACTION_RESULT] = "patrol_msgs/msg/ActionOutcome"
        if self.extras:
            types |= EXTRA_TOPIC_TYPES
        return types

    def names(self) -> dict[str, str]:
        """Default topic -> the name it is written under."""
        return {t: self.topic_names.get(t, t) for t in self.topic_types()}

    def rates_hz(self) -> dict[str, float]:
        """The periodic topics' rates, as the simulation step rounds them."""
        hz = {TOPIC_ODOM: self.odom_hz,
              TOPIC_SCAN: self.odom_hz / every_nth(self.odom_hz, self.scan_hz),
              TOPIC_BATTERY: self.odom_hz / every_nth(self.odom_hz, self.battery_hz)}
        if self.extras:
            hz |= extra_rates_hz(self.odom_hz, self.image_hz, self.tf_hz)
        return hz


def _check_hz(name: str, hz: float) -> None:
    if not 0 < hz <= 1000:
        raise ConfigError(f"{name} must be in (0, 1000] Hz, got {hz}")


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



def write_patrol(out: str | Path, settings: PatrolSettings | None = None, *,
                 overwrite: bool = False) -> PatrolTruth:
    """Write the patrol bag to directory `out` (and out/ground_truth.json); return the truth.
    `out` must not exist, unless `overwrite`."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    s = settings or PatrolSettings()
    out = Path(out)
    if out.exists():
        if not overwrite:
            raise ConfigError(f"{out} already exists; choose a new directory (a bag is a "
                              "directory rosbag2 creates itself)")
        shutil.rmtree(out)
    rng = np.random.default_rng(s.seed)
    world = World(s.duration_s, np.random.default_rng(rng.integers(2 ** 63)), s.odom_hz)
    run_script(world)
    ts = typestore(EXTRA_TYPES)
    topic_types, names = s.topic_types(), s.names()
    counts = {topic: 0 for topic in topic_types}
    plugin = StoragePlugin.MCAP if s.storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(out, version=9, storage_plugin=plugin) as writer:
        conns = {topic: writer.add_connection(names[topic], msgtype, typestore=ts)
                 for topic, msgtype in topic_types.items()}
        messages = patrol_messages(world, ts, np.random.default_rng(rng.integers(2 ** 63)),
                                   (s.odom_hz, s.scan_hz, s.battery_hz), s.noise, s.detections,
                                   s.action_results)
        if s.extras:        # their own random stream: the patrol's messages stay the same
            more = extra_messages(world, ts, np.random.default_rng([s.seed, 1]), s.odom_hz,
                                  s.image_hz, s.tf_hz)
            messages = heapq.merge(messages, more, key=lambda m: m[0])
        for t_s, topic, msg in messages:
            writer.write(conns[topic], stamp_ns(t_s), ts.serialize_cdr(msg, topic_types[topic]))
            counts[topic] += 1

    duration = world.samples[-1][0] + 1.0 / s.odom_hz if world.samples else 0.0
    hz = s.rates_hz()
    truth = PatrolTruth(
        duration_s=round(duration, 3), seed=s.seed, storage=s.storage, start_ns=START_NS,
        topics={names[t]: {"type": m, "count": counts[t], "hz": hz.get(t)}
                for t, m in topic_types.items()},
        events=truth_events(world), bag_path=str(out),
        renamed={k: v for k, v in s.topic_names.items() if k != v})
    (out / GROUND_TRUTH_FILE).write_text(json.dumps(truth.to_json(), indent=1) + "\n",
                                         encoding="utf-8")
    return truth


def generate_patrol(out: str | Path, *, overwrite: bool = False, **settings: Any) -> PatrolTruth:
    """`write_patrol(out, PatrolSettings(**settings))`: the settings as keywords."""
    return write_patrol(out, PatrolSettings(**settings), overwrite=overwrite)


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
