"""Any message shape → plain data (dicts, lists, builtins), constants left out.

Three shapes come in: rclpy generated classes (fields listed by
``get_fields_and_field_types()``, constants are class attributes), rosbags dataclasses
(``__msgtype__`` plus dataclass fields; constants are ClassVars, and classes that rosbags builds
from a bag's own definitions list them as dataclass fields) and plain dicts. ROS requires field
names in lower case and constant names in upper case, so an all-upper-case name is a constant
and never becomes data.

``builtin_interfaces`` Time and Duration become `StampNs` / `DurationNs`: ints (so they compare
and serialise as nanoseconds) whose type says what they are, so formatting can write times
relative to the episode and durations in seconds instead of 19-digit integers.
"""

from __future__ import annotations

import array
import dataclasses
import re
from typing import Any, Mapping, Sequence

from csr_ros.errors import ConfigError

Plain = Any  # None | bool | int | float | str | Bulk | list[Plain] | dict[str, Plain]

_TYPE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*/(msg/)?[A-Za-z][A-Za-z0-9_]*$")


class StampNs(int):
    """A builtin_interfaces/Time as int nanoseconds."""


class DurationNs(int):
    """A builtin_interfaces/Duration as int nanoseconds."""


BULK_MIN = 4096     # numeric arrays longer than this are bulk data: only their length is kept


class Bulk:
    """Bulk data (pixels, point data, audio, map cells): its length, never its values.

    Longer numeric arrays than `BULK_MIN` become one, whatever the message shape (numpy,
    array.array, bytes or a list), so no summary reads them and nothing copies them."""
    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Bulk) and other.n == self.n

    def __hash__(self) -> int:
        return hash(("bulk", self.n))

    def __repr__(self) -> str:
        return f"Bulk(n={self.n})"


def is_constant_name(name: str) -> bool:
    """ROS constants are upper case (FOO_BAR, POWER_SUPPLY_STATUS_FULL); fields are lower case."""
    return name.upper() == name and any(c.isalpha() for c in name)


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


def _is_classvar(f: dataclasses.Field) -> bool:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__origin__", f.type)
    return (isinstance(kind, str) and kind.startswith(("ClassVar", "typing.ClassVar"))) \
        or repr(kind).startswith("typing.ClassVar")


def message_fields(msg: Any) -> list[str] | None:
    """The data fields of a message object in definition order; None if it is not one."""
    cls = type(msg)
    if hasattr(cls, "get_fields_and_field_types"):
        names = list(cls.get_fields_and_field_types())
    elif dataclasses.is_dataclass(msg) and not isinstance(msg, type):
        names = [f.name for f in dataclasses.fields(msg) if not _is_classvar(f)]
    else:
        slots = getattr(cls, "__slots__", None)
        if not slots:
            return None
        names = [s.lstrip("_") for s in slots if not s.startswith("__") and s != "_check_fields"]
    return [n for n in names if not n.startswith("__") and not is_constant_name(n)]


def _time_kind(msg: Any, fields: Sequence[str]) -> type[int] | None:
    if list(fields) != ["sec", "nanosec"]:
        return None
    name = message_type_name(msg) or type(msg).__name__
    return DurationNs if name.rsplit("/", 1)[-1].endswith("Duration") else StampNs


def to_plain(msg: Any) -> Plain:
    """Nested dicts/lists of builtins; Time/Duration become `StampNs`/`DurationNs` ints."""
    if msg is None or isinstance(msg, (bool, str)):
        return msg
    if isinstance(msg, int):
        return msg if isinstance(msg, (StampNs, DurationNs)) else int(msg)
    if isinstance(msg, float):
        return float(msg)
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return Bulk(len(msg)) if len(msg) > BULK_MIN else list(bytes(msg))
    if isinstance(msg, Mapping):
        plain = {str(k): to_plain(v) for k, v in msg.items()
                 if not str(k).startswith("__") and not is_constant_name(str(k))}
        if list(plain) == ["sec", "nanosec"]:
            return StampNs(int(plain["sec"]) * 1_000_000_000 + int(plain["nanosec"]))
        return plain
    if isinstance(msg, array.array) and len(msg) > BULK_MIN:
        return Bulk(len(msg))
    if isinstance(msg, (list, tuple)) and len(msg) > BULK_MIN and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in msg):
        return Bulk(len(msg))
    if isinstance(msg, (list, tuple, array.array)):
        return [to_plain(v) for v in msg]
    size = getattr(msg, "size", None)                        # numpy arrays
    kind = getattr(getattr(msg, "dtype", None), "kind", None)
    if isinstance(size, int) and size > BULK_MIN and kind in ("b", "i", "u", "f", "c"):
        return Bulk(size)
    tolist = getattr(msg, "tolist", None)  # numpy arrays and numpy scalars
    if callable(tolist):
        return to_plain(tolist())
    fields = message_fields(msg)
    if fields is None:
        return str(msg)
    kind = _time_kind(msg, fields)
    if kind is not None:
        return kind(int(msg.sec) * 1_000_000_000 + int(msg.nanosec))
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


def header_stamp_ns(msg: Any) -> int | None:
    """The header stamp of a message in int nanoseconds, or None if it has no header."""
    header = msg.get("header") if isinstance(msg, Mapping) else getattr(msg, "header", None)
    stamp = header.get("stamp") if isinstance(header, Mapping) else getattr(header, "stamp", None)
    if stamp is None:
        return None
    value = to_plain(stamp)
    return int(value) if isinstance(value, int) else None


def header_frame(plain: Mapping[str, Plain]) -> str | None:
    header = plain.get("header") if isinstance(plain, Mapping) else None
    if isinstance(header, Mapping) and isinstance(header.get("frame_id"), str):
        return header["frame_id"]
    return None
