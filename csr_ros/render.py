"""ROS messages → compact, stable chunk text; per-topic coalescing.

    render(msg, label="scan")  →  "scan: stamp_ns=1700000000000000000 frame=laser n=720 ..."

One renderer for the three shapes a message comes in: rclpy generated classes (fields listed
by ``get_fields_and_field_types()``), rosbags dataclasses (``__msgtype__`` plus dataclass
fields) and plain dicts. Each is first turned into plain data (`to_plain`), then optionally
summarised by a per-type summariser (a LaserScan becomes min/max/mean range and the bearing of
the nearest return), then formatted. The text is stable: the same message always renders to
the same string (definition order, fixed float rounding, ``builtin_interfaces/Time`` as int
nanoseconds), so identical history renders to identical tokens.

`Coalescer` rate-limits per topic: a message that arrives inside a topic's minimum period is
held, and a newer one replaces it (counted, never silently): the newest value is emitted when
the period elapses.

Pure: no rclpy, no I/O.
"""

from __future__ import annotations

import array
import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from csr_ros.errors import ConfigError

Plain = Any  # None | bool | int | float | str | list[Plain] | dict[str, Plain]

DEFAULT_FLOAT_DIGITS = 3
DEFAULT_MAX_ARRAY = 8
DEFAULT_MAX_CHARS = 2000
_BARE = re.compile(r"^[A-Za-z0-9_./:+\-]+$")
_TYPE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*/(msg/)?[A-Za-z][A-Za-z0-9_]*$")


# -- message → plain data ---------------------------------------------------------------------

def message_type_name(msg: Any) -> str | None:
    """'pkg/msg/Name' for an rclpy or rosbags message, None for a dict or anything else."""
    msgtype = getattr(msg, "__msgtype__", None)
    if isinstance(msgtype, str):
        return msgtype
    cls = type(msg)
    if hasattr(cls, "get_fields_and_field_types"):
        # rclpy classes live in modules named like 'sensor_msgs.msg._laser_scan'
        parts = cls.__module__.split(".")
        if len(parts) >= 2 and parts[1] in ("msg", "srv", "action"):
            return f"{parts[0]}/{parts[1]}/{cls.__name__}"
    return None


def normalize_type_name(type_name: str) -> str:
    """'sensor_msgs/LaserScan' and 'sensor_msgs/msg/LaserScan' → 'sensor_msgs/msg/LaserScan'."""
    if not _TYPE_NAME.match(type_name or ""):
        msg = (f"message type {type_name!r} is not of the form 'package/msg/Name' "
               "(e.g. 'sensor_msgs/msg/LaserScan')")
        raise ConfigError(msg)
    package, *rest = type_name.split("/")
    return f"{package}/msg/{rest[-1]}"


def _message_fields(msg: Any) -> list[str] | None:
    cls = type(msg)
    if hasattr(cls, "get_fields_and_field_types"):
        return list(cls.get_fields_and_field_types())
    if dataclasses.is_dataclass(msg) and not isinstance(msg, type):
        return [f.name for f in dataclasses.fields(msg) if not f.name.startswith("__")]
    slots = getattr(cls, "__slots__", None)
    if slots:
        return [s.lstrip("_") for s in slots if not s.startswith("__") and s != "_check_fields"]
    return None


def _is_time(fields: Sequence[str]) -> bool:
    return list(fields) == ["sec", "nanosec"]


def to_plain(msg: Any) -> Plain:
    """Nested dicts/lists of builtins; every builtin_interfaces Time/Duration becomes int ns."""
    if msg is None or isinstance(msg, (bool, str)):
        return msg
    if isinstance(msg, int):
        return int(msg)
    if isinstance(msg, float):
        return float(msg)
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return list(bytes(msg))
    if isinstance(msg, Mapping):
        plain = {str(k): to_plain(v) for k, v in msg.items() if not str(k).startswith("__")}
        if _is_time(list(plain)):
            return int(plain["sec"]) * 1_000_000_000 + int(plain["nanosec"])
        return plain
    if isinstance(msg, (list, tuple, array.array)):
        return [to_plain(v) for v in msg]
    tolist = getattr(msg, "tolist", None)  # numpy arrays and numpy scalars
    if callable(tolist):
        return to_plain(tolist())
    fields = _message_fields(msg)
    if fields is None:
        return str(msg)
    if _is_time(fields):
        return int(msg.sec) * 1_000_000_000 + int(msg.nanosec)
    return {name: to_plain(getattr(msg, name)) for name in fields}


def select_fields(plain: Mapping[str, Plain], paths: Sequence[str]) -> dict[str, Plain]:
    """Pick dotted paths ('pose.pose.position.x'); a key is the path's last part unless two
    paths end alike, then the whole path. A path that does not exist raises ConfigError."""
    lasts = [p.rsplit(".", 1)[-1] for p in paths]
    out: dict[str, Plain] = {}
    for path, last in zip(paths, lasts):
        value: Plain = plain
        for part in path.split("."):
            if isinstance(value, Mapping) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                known = sorted(value) if isinstance(value, Mapping) else []
                msg = f"field {path!r} not found at {part!r}" + (f"; fields here: {known}"
                                                                 if known else "")
                raise ConfigError(msg)
        out[path if lasts.count(last) > 1 else last] = value
    return out


# -- per-type summaries (work on plain data, so on every message shape) -------------------------

def _header(plain: Mapping[str, Plain]) -> dict[str, Plain]:
    header = plain.get("header")
    if not isinstance(header, Mapping):
        return {}
    return {"stamp_ns": header.get("stamp"), "frame": header.get("frame_id")}


def summarize_laser_scan(p: Mapping[str, Plain]) -> dict[str, Plain]:
    ranges = p.get("ranges") or []
    lo, hi = p.get("range_min", 0.0), p.get("range_max", math.inf)
    valid = [(i, r) for i, r in enumerate(ranges) if math.isfinite(r) and lo <= r <= hi]
    out = _header(p) | {"n": len(ranges), "valid": len(valid)}
    if valid:
        i_min, r_min = min(valid, key=lambda ir: ir[1])
        bearing = p.get("angle_min", 0.0) + i_min * p.get("angle_increment", 0.0)
        out |= {"min_m": r_min, "max_m": max(r for _, r in valid),
                "mean_m": sum(r for _, r in valid) / len(valid),
                "nearest_deg": math.degrees(bearing)}
    return out


def _yaw_deg(q: Mapping[str, Plain]) -> float:
    x, y, z, w = (q.get(k, 0.0) for k in ("x", "y", "z", "w"))
    return math.degrees(math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z)))


def summarize_odometry(p: Mapping[str, Plain]) -> dict[str, Plain]:
    pose = p["pose"]["pose"]
    twist = p["twist"]["twist"]
    return _header(p) | {
        "child": p.get("child_frame_id"),
        "x_m": pose["position"]["x"], "y_m": pose["position"]["y"],
        "yaw_deg": _yaw_deg(pose["orientation"]),
        "vx_mps": twist["linear"]["x"], "vy_mps": twist["linear"]["y"],
        "wz_dps": math.degrees(twist["angular"]["z"]),
    }


def _detection(d: Mapping[str, Plain]) -> dict[str, Plain]:
    results = d.get("results") or []
    best = max(results, key=lambda r: (r.get("hypothesis") or r).get("score", 0.0), default=None)
    hyp = {} if best is None else (best.get("hypothesis") or best)  # Humble+: hypothesis.class_id
    bbox = d.get("bbox") or {}
    center = bbox.get("center") or {}
    if "position" in center:                                      # Humble+: center.position.x
        center = center["position"]
    return {"class": hyp.get("class_id", hyp.get("id", d.get("id") or "?")),
            "score": hyp.get("score"), "cx": center.get("x"), "cy": center.get("y"),
            "w": bbox.get("size_x"), "h": bbox.get("size_y")}


def summarize_detection2d_array(p: Mapping[str, Plain]) -> dict[str, Plain]:
    detections = p.get("detections") or []
    return _header(p) | {"n": len(detections), "objects": [_detection(d) for d in detections]}


GOAL_STATUS = {0: "unknown", 1: "accepted", 2: "executing", 3: "canceling", 4: "succeeded",
               5: "canceled", 6: "aborted"}


def summarize_goal_status_array(p: Mapping[str, Plain]) -> dict[str, Plain]:
    goals = []
    for s in p.get("status_list") or []:
        uuid = (s.get("goal_info") or {}).get("goal_id", {}).get("uuid") or []
        goals.append("".join(f"{b:02x}" for b in uuid[:4]) + ":"
                     + GOAL_STATUS.get(s.get("status"), str(s.get("status"))))
    return {"goals": goals}


def summarize_string(p: Mapping[str, Plain]) -> dict[str, Plain]:
    return {"data": p.get("data", "")}


SUMMARIZERS: dict[str, Callable[[Mapping[str, Plain]], dict[str, Plain]]] = {
    "sensor_msgs/msg/LaserScan": summarize_laser_scan,
    "nav_msgs/msg/Odometry": summarize_odometry,
    "vision_msgs/msg/Detection2DArray": summarize_detection2d_array,
    "action_msgs/msg/GoalStatusArray": summarize_goal_status_array,
    "std_msgs/msg/String": summarize_string,
}


# -- formatting -------------------------------------------------------------------------------

def _fmt_float(x: float, digits: int) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    text = f"{x:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _fmt_scalar(v: Plain, digits: int) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _fmt_float(v, digits)
    text = str(v)
    return text if _BARE.match(text) else json.dumps(text, ensure_ascii=False)


def _fmt_list(values: list, digits: int, max_array: int) -> str:
    numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(values) > max_array and len(numeric) == len(values):
        finite = [float(v) for v in numeric if math.isfinite(v)]
        if not finite:
            return f"{{n={len(values)}}}"
        return (f"{{n={len(values)} min={_fmt_float(min(finite), digits)} "
                f"max={_fmt_float(max(finite), digits)} "
                f"mean={_fmt_float(sum(finite) / len(finite), digits)}}}")
    shown = [_fmt_value(v, digits, max_array) for v in values[:max_array]]
    if len(values) > max_array:
        shown.append(f"…+{len(values) - max_array}")
    return "[" + ",".join(shown) + "]"


def _fmt_value(v: Plain, digits: int, max_array: int) -> str:
    if isinstance(v, Mapping):
        return "{" + " ".join(_fmt_pairs(v, digits, max_array)) + "}"
    if isinstance(v, list):
        return _fmt_list(v, digits, max_array)
    return _fmt_scalar(v, digits)


def _fmt_pairs(plain: Mapping[str, Plain], digits: int, max_array: int,
               prefix: str = "") -> list[str]:
    pairs = []
    for key, value in plain.items():
        if value in (None, "") and not prefix and key in ("stamp_ns", "frame"):
            continue
        name = prefix + key
        if isinstance(value, Mapping) and value:
            pairs.extend(_fmt_pairs(value, digits, max_array, prefix=name + "."))
        else:
            if isinstance(value, int) and not isinstance(value, bool) and _looks_like_stamp(key):
                name = name if name.endswith("_ns") else name + "_ns"
            pairs.append(f"{name}={_fmt_value(value, digits, max_array)}")
    return pairs


def _looks_like_stamp(key: str) -> bool:
    return key in ("stamp", "stamp_ns") or key.endswith("_stamp")


@dataclass(frozen=True)
class RenderOptions:
    fields: tuple[str, ...] = ()       # dotted paths; when given, the type summary is not used
    summarize: bool = True             # use SUMMARIZERS[type] when there is one
    float_digits: int = DEFAULT_FLOAT_DIGITS
    max_array: int = DEFAULT_MAX_ARRAY  # longer arrays are summarised (n/min/max/mean)
    max_chars: int = DEFAULT_MAX_CHARS  # longer text is cut with a marker saying how much

    def __post_init__(self):
        if not 0 <= self.float_digits <= 9:
            raise ConfigError(f"float_digits must be in 0..9, got {self.float_digits}")
        if self.max_array < 1:
            raise ConfigError(f"max_array must be >= 1, got {self.max_array}")
        if self.max_chars < 32:
            raise ConfigError(f"max_chars must be >= 32, got {self.max_chars}")


def render_plain(plain: Plain, *, label: str, type_name: str | None = None,
                 options: RenderOptions = RenderOptions()) -> str:
    """Format plain message data as one line: 'label: key=value key=value ...'."""
    if not isinstance(plain, Mapping):
        plain = {"data": plain}
    if options.fields:
        body = select_fields(plain, options.fields)
    elif options.summarize and type_name in SUMMARIZERS:
        body = SUMMARIZERS[type_name](plain)
    else:
        header = plain.get("header")
        body = dict(plain)
        if isinstance(header, Mapping) and set(header) == {"stamp", "frame_id"}:
            del body["header"]
            body = _header(plain) | body
    text = f"{label}: " + " ".join(_fmt_pairs(body, options.float_digits, options.max_array))
    if len(text) > options.max_chars:
        marker = f" …[{len(text) - options.max_chars} chars cut]"
        text = text[:options.max_chars - len(marker)] + marker
    return text


def render(msg: Any, *, label: str, type_name: str | None = None,
           options: RenderOptions = RenderOptions()) -> str:
    """Render an rclpy message, a rosbags dataclass or a dict as one stable line of text."""
    name = type_name or message_type_name(msg)
    return render_plain(to_plain(msg), label=label,
                        type_name=normalize_type_name(name) if name else None, options=options)


def header_stamp_ns(msg: Any) -> int | None:
    """The header stamp of a message in int nanoseconds, or None if it has no header."""
    header = msg.get("header") if isinstance(msg, Mapping) else getattr(msg, "header", None)
    stamp = header.get("stamp") if isinstance(header, Mapping) else getattr(header, "stamp", None)
    if stamp is None:
        return None
    value = to_plain(stamp)
    return value if isinstance(value, int) else None


# -- rate limiting ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Emission:
    key: str
    value: Any
    now_ns: int          # when it was let through
    n_coalesced: int     # older values it replaced while held (0: nothing was superseded)


@dataclass
class _Slot:
    period_ns: int
    last_emit_ns: int | None = None
    pending: Any = None
    has_pending: bool = False
    n_superseded: int = 0


class Coalescer:
    """Per-key minimum period; holds the newest value inside the period, emits it when due.

        e = c.offer("scan", msg, now_ns)   # Emission now, or None (held)
        for e in c.poll(now_ns): ...       # held values whose period has elapsed
    """

    def __init__(self, periods_s: Mapping[str, float] | None = None, default_period_s: float = 0.0):
        for key, period in {"default": default_period_s, **(periods_s or {})}.items():
            if not period >= 0:
                raise ConfigError(f"min period of {key!r} must be >= 0 s, got {period}")
        self._default_ns = int(default_period_s * 1e9)
        self._slots = {k: _Slot(int(p * 1e9)) for k, p in (periods_s or {}).items()}
        self.n_superseded_total = 0

    def _slot(self, key: str) -> _Slot:
        if key not in self._slots:
            self._slots[key] = _Slot(self._default_ns)
        return self._slots[key]

    def offer(self, key: str, value: Any, now_ns: int) -> Emission | None:
        slot = self._slot(key)
        if slot.last_emit_ns is None or now_ns - slot.last_emit_ns >= slot.period_ns:
            n = slot.n_superseded + (1 if slot.has_pending else 0)
            if slot.has_pending:
                self.n_superseded_total += 1
            return self._emit(key, slot, value, now_ns, n)
        if slot.has_pending:
            slot.n_superseded += 1
            self.n_superseded_total += 1
        slot.pending, slot.has_pending = value, True
        return None

    def poll(self, now_ns: int) -> list[Emission]:
        due = []
        for key, slot in self._slots.items():
            if slot.has_pending and now_ns - slot.last_emit_ns >= slot.period_ns:
                due.append(self._emit(key, slot, slot.pending, now_ns, slot.n_superseded))
        return due

    def flush(self, now_ns: int) -> list[Emission]:
        """Everything held, now (on shutdown)."""
        return [self._emit(key, slot, slot.pending, now_ns, slot.n_superseded)
                for key, slot in self._slots.items() if slot.has_pending]

    def next_due_ns(self) -> int | None:
        times = [s.last_emit_ns + s.period_ns for s in self._slots.values() if s.has_pending]
        return min(times) if times else None

    @property
    def n_pending(self) -> int:
        return sum(s.has_pending for s in self._slots.values())

    @staticmethod
    def _emit(key: str, slot: _Slot, value: Any, now_ns: int, n: int) -> Emission:
        slot.last_emit_ns, slot.pending, slot.has_pending, slot.n_superseded = now_ns, None, False, 0
        return Emission(key=key, value=value, now_ns=now_ns, n_coalesced=n)

