"""Small classes shaped like rclpy's generated message classes (no ROS install needed), and a
rosbags message rebuilt as one of them or as the real rclpy message of its type.

Generated classes keep values in ``__slots__`` named ``_field``, expose them as properties,
list fields with the classmethod ``get_fields_and_field_types()``, live in a module named
``<package>.msg._<snake_name>``, and hold numeric sequences as ``array.array``.
"""

from __future__ import annotations

import array
import dataclasses

import numpy as np


def message_class(type_name: str, fields: dict[str, str], defaults: dict | None = None):
    package, _, name = type_name.split("/")
    defaults = defaults or {}

    def __init__(self, **kwargs):
        for field in fields:
            value = kwargs.get(field, defaults.get(field))
            setattr(self, "_" + field, value() if callable(value) else value)

    namespace = {
        "__slots__": ["_" + f for f in fields] + ["_check_fields"],
        "__init__": __init__,
        "__module__": f"{package}.msg._{name.lower()}",
        "get_fields_and_field_types": classmethod(lambda cls: dict(fields)),
    }
    for field in fields:
        namespace[field] = property(lambda self, f=field: getattr(self, "_" + f))
    return type(name, (), namespace)


Time = message_class("builtin_interfaces/msg/Time", {"sec": "int32", "nanosec": "uint32"},
                     {"sec": 0, "nanosec": 0})
Header = message_class("std_msgs/msg/Header",
                       {"stamp": "builtin_interfaces/Time", "frame_id": "string"},
                       {"stamp": Time, "frame_id": ""})
String = message_class("std_msgs/msg/String", {"data": "string"}, {"data": ""})
LaserScan = message_class(
    "sensor_msgs/msg/LaserScan",
    {"header": "std_msgs/Header", "angle_min": "float", "angle_max": "float",
     "angle_increment": "float", "time_increment": "float", "scan_time": "float",
     "range_min": "float", "range_max": "float", "ranges": "sequence<float>",
     "intensities": "sequence<float>"},
    {"header": Header, "angle_min": 0.0, "angle_max": 0.0, "angle_increment": 0.0,
     "time_increment": 0.0, "scan_time": 0.0, "range_min": 0.0, "range_max": 0.0,
     "ranges": lambda: array.array("f"), "intensities": lambda: array.array("f")})
Point = message_class("geometry_msgs/msg/Point", {"x": "double", "y": "double", "z": "double"},
                      {"x": 0.0, "y": 0.0, "z": 0.0})
Quaternion = message_class("geometry_msgs/msg/Quaternion",
                           {"x": "double", "y": "double", "z": "double", "w": "double"},
                           {"x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0})
Pose = message_class("geometry_msgs/msg/Pose",
                     {"position": "geometry_msgs/Point", "orientation": "geometry_msgs/Quaternion"},
                     {"position": Point, "orientation": Quaternion})


def rclpy_shaped(msg):
    """A rosbags message rebuilt as rclpy generated classes are: fields listed by
    get_fields_and_field_types(), constants as class attributes, numeric arrays as array.array."""
    if not dataclasses.is_dataclass(msg):
        if isinstance(msg, np.ndarray):
            return array.array("f" if msg.dtype == np.float32 else
                               "d" if msg.dtype == np.float64 else "B", msg.tolist())
        if isinstance(msg, list):
            return [rclpy_shaped(m) for m in msg]
        return msg
    names = [f.name for f in dataclasses.fields(msg)]
    consts = {n: getattr(msg, n) for n in names if n.isupper()}
    data = [n for n in names if not n.isupper() and not n.startswith("__")]
    cls = message_class(msg.__msgtype__, {n: "x" for n in data})
    for name, value in consts.items():
        setattr(cls, name, value)
    return cls(**{n: rclpy_shaped(getattr(msg, n)) for n in data})


def to_rclpy(msg):
    """A rosbags message as the real rclpy message of its type (what a live subscription gets)."""
    import importlib

    if isinstance(msg, np.ndarray):
        return msg
    if isinstance(msg, list):
        return [to_rclpy(m) for m in msg]
    if not dataclasses.is_dataclass(msg):
        return msg
    package, _, name = msg.__msgtype__.split("/")
    cls = getattr(importlib.import_module(f"{package}.msg"), name)
    out = cls()
    for field in cls.get_fields_and_field_types():
        setattr(out, field, to_rclpy(getattr(msg, field)))
    return out
