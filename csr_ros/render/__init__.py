"""ROS messages → compact, stable chunk text; which messages become chunks.

    render(msg, label="battery")      →  "battery: 36% discharging"
    Emitter(sources).offer("odom", msg, now_ns)  →  [Emitted(text="125s odom: at 2.3,-1.2 ...")]

- `plain`: every message shape (rclpy classes, rosbags dataclasses, dicts) → plain data, with
  message constants left out and Time/Duration typed;
- `format`: generic ``key=value`` formatting (floats, arrays, relative times);
- `summaries`: compact summaries of the common types and the generic one for every other type;
- `text`: one message → ``label: body``;
- `emission`: the per-source change filter (deadbands, keep-alive, events, time jumps) that the
  aggregator node and `csr-ros replay` share;
- `topic_defaults`: per-type defaults for a topic nobody configured (event, state, or left out and why).

Pure: no rclpy, no I/O.
"""

from csr_ros.render.emission import (KIND_DEFAULTS, KIND_OF_TYPE, UNSET, EmissionConfig, Emitted,
                                     Emitter, EmitterSource, SourceStats, TimeJump, changed,
                                     emission_kind, episode_origin_ns)
from csr_ros.render.format import (DEFAULT_FLOAT_DIGITS, DEFAULT_MAX_ARRAY, DEFAULT_MAX_CHARS,
                                   Context, RenderOptions)
from csr_ros.render.plain import (Bulk, DurationNs, Plain, StampNs, header_stamp_ns,
                                  is_constant_name, message_type_name, normalize_type_name,
                                  select_fields, to_plain)
from csr_ros.render.topic_defaults import TopicPolicy, topic_policy, type_policy
from csr_ros.render.summaries import (BATTERY_STATUS, GOAL_STATUS, SUMMARIZERS, Summary,
                                      summarize_battery_state, summarize_detection2d_array,
                                      summarize_generic, summarize_goal_status_array,
                                      summarize_imu, summarize_joint_state, summarize_laser_scan,
                                      summarize_odometry, summarize_string)
from csr_ros.render.text import render, render_plain, summarize

__all__ = [
    "BATTERY_STATUS", "Bulk", "Context", "DEFAULT_FLOAT_DIGITS", "DEFAULT_MAX_ARRAY",
    "DEFAULT_MAX_CHARS", "DurationNs", "EmissionConfig", "Emitted", "Emitter",
    "EmitterSource", "GOAL_STATUS", "KIND_DEFAULTS", "KIND_OF_TYPE", "Plain", "RenderOptions",
    "SUMMARIZERS", "SourceStats", "StampNs", "Summary", "TimeJump", "UNSET", "changed",
    "emission_kind", "header_stamp_ns", "is_constant_name", "message_type_name",
    "normalize_type_name", "render", "render_plain", "select_fields", "summarize",
    "summarize_battery_state", "summarize_detection2d_array", "summarize_generic",
    "summarize_goal_status_array", "summarize_imu", "summarize_joint_state",
    "summarize_laser_scan", "summarize_odometry", "summarize_string", "to_plain",
    "TopicPolicy", "topic_policy", "type_policy", "episode_origin_ns",
]
