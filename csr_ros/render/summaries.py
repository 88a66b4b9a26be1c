"""Compact per-type summaries: what a robot engineer would read off the message, in few tokens.

Each summary works on plain data (so on every message shape) and returns a `Summary`: the chunk
body and the features the change filter compares (units in their names). The generic summary
covers every other type, including custom types that exist only in a bag.

    Odometry          at 2.3,-1.2 heading 90 moving     (or stopped, turning left/right)
    LaserScan         nearest 0.8m front-left, blocked ahead 0.9m   (within 1 m ahead)
    BatteryState      36% discharging
    Imu               rpy 0,1,90° gyro 0,0,2°/s acc 0.1,0,9.8
    JointState        shoulder 0.52 elbow -1.2
    GoalStatusArray   3fa2 succeeded            (only goals whose state changed)
    Detection2DArray  cup 0.91 at 1.2,3.4, person 0.78       (position: the hypothesis pose)
    String            alice: bring me the cup
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from csr_ros.render.format import Context, fmt_float, fmt_text, format_pairs
from csr_ros.render.plain import Plain, StampNs, header_frame


@dataclass(frozen=True)
class Summary:
    text: str                                            # chunk body, after "label: "
    features: dict[str, Any] = field(default_factory=dict)  # compared by the change filter


def _num(v: Plain, default: float = math.nan) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def _frame_note(p: Mapping[str, Plain], ctx: Context) -> str:
    frame = header_frame(p)
    if frame and ctx.usual_frame is not None and frame != ctx.usual_frame:
        return f" frame={fmt_text(frame)}"
    return ""


def yaw_deg(q: Mapping[str, Plain]) -> float:
    x, y, z, w = (_num(q.get(k), 0.0) for k in ("x", "y", "z", "w"))
    return math.degrees(math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z)))


def _rpy_deg(q: Mapping[str, Plain]) -> tuple[float, float, float]:
    x, y, z, w = (_num(q.get(k), 0.0) for k in ("x", "y", "z", "w"))
    roll = math.atan2(2 * (w * x + y * z), 1 - 2 * (x * x + y * y))
    pitch = math.asin(max(-1.0, min(1.0, 2 * (w * y - z * x))))
    return math.degrees(roll), math.degrees(pitch), yaw_deg(q)


MOVING_MPS = 0.05
TURNING_DPS = 5.0


def summarize_odometry(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    pose = (p.get("pose") or {}).get("pose") or {}
    twist = (p.get("twist") or {}).get("twist") or {}
    pos = pose.get("position") or {}
    lin, ang = twist.get("linear") or {}, twist.get("angular") or {}
    x, y = _num(pos.get("x"), 0.0), _num(pos.get("y"), 0.0)
    yaw = yaw_deg(pose.get("orientation") or {})
    v = math.hypot(_num(lin.get("x"), 0.0), _num(lin.get("y"), 0.0))
    w = math.degrees(_num(ang.get("z"), 0.0))
    # hysteresis against sensor noise: a state is left at half the speed that enters it
    was = (ctx.previous or {}).get("motion")
    if v > MOVING_MPS or was == "moving" and v > MOVING_MPS / 2:
        motion = "moving"
    elif abs(w) > TURNING_DPS or was == "turning" and abs(w) > TURNING_DPS / 2:
        motion = "turning left" if w > 0 else "turning right"
    else:
        motion = "stopped"
    text = f"at {fmt_float(x, 1)},{fmt_float(y, 1)} heading {fmt_float(yaw, 0)} {motion}"
    return Summary(text + _frame_note(p, ctx),
                   {"x_m": x, "y_m": y, "yaw_deg": yaw, "motion": motion.split(" ")[0],
                    "v_mps": v, "w_dps": w})


SECTORS = ("ahead", "front-left", "left", "back-left", "behind", "back-right", "right",
           "front-right")
AHEAD_HALF_DEG = 20.0
BLOCKED_M = 1.0              # a return this close ahead: "blocked ahead"


def sector(bearing_deg: float) -> str:
    return SECTORS[int(((bearing_deg + 22.5) % 360) // 45)]


def summarize_laser_scan(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    ranges = p.get("ranges") or []
    lo, hi = _num(p.get("range_min"), 0.0), _num(p.get("range_max"), math.inf)
    a0, da = _num(p.get("angle_min"), 0.0), _num(p.get("angle_increment"), 0.0)
    nearest, nearest_deg, ahead = math.inf, 0.0, math.inf
    n_valid = 0
    for i, r in enumerate(ranges):
        r = _num(r)
        if not (math.isfinite(r) and lo <= r <= hi):
            continue
        n_valid += 1
        bearing = math.degrees(a0 + i * da)
        bearing = (bearing + 180.0) % 360.0 - 180.0
        if r < nearest:
            nearest, nearest_deg = r, bearing
        if abs(bearing) <= AHEAD_HALF_DEG and r < ahead:
            ahead = r
    if not n_valid:
        return Summary("no returns" + _frame_note(p, ctx),
                       {"nearest_m": math.inf, "blocked": False, "ahead_m": math.inf})
    # hysteresis against range noise: blocked within 1 m, clear again beyond 1.2 m
    blocked = ahead <= BLOCKED_M * (1.2 if (ctx.previous or {}).get("blocked") else 1.0)
    if blocked and ahead == nearest:
        text = f"blocked ahead {fmt_float(ahead, 1)}m"
    else:
        text = f"nearest {fmt_float(nearest, 1)}m {sector(nearest_deg)}" + (
            f", blocked ahead {fmt_float(ahead, 1)}m" if blocked else "")
    return Summary(text + _frame_note(p, ctx),
                   {"nearest_m": nearest, "blocked": blocked, "ahead_m": ahead,
                    "nearest_deg": nearest_deg})


BATTERY_STATUS = {0: "unknown", 1: "charging", 2: "discharging", 3: "not charging", 4: "full"}
BATTERY_HEALTH = {0: "unknown", 1: "good", 2: "overheat", 3: "dead", 4: "overvoltage",
                  5: "failure", 6: "cold", 7: "watchdog timer expired",
                  8: "safety timer expired"}


def battery_percent(p: Mapping[str, Plain]) -> float:
    """0-100 from `percentage` (0-1 by the message's definition; some drivers send 0-100),
    else from charge/capacity; NaN when neither is known."""
    pct = _num(p.get("percentage"))
    if math.isfinite(pct) and pct >= 0:
        return pct * 100.0 if pct <= 1.0 else min(pct, 100.0)
    charge, capacity = _num(p.get("charge")), _num(p.get("capacity"))
    if math.isfinite(charge) and math.isfinite(capacity) and capacity > 0:
        return 100.0 * charge / capacity
    return math.nan


def summarize_battery_state(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    pct = battery_percent(p)
    status = BATTERY_STATUS.get(p.get("power_supply_status"), str(p.get("power_supply_status")))
    health = BATTERY_HEALTH.get(p.get("power_supply_health"), str(p.get("power_supply_health")))
    parts = [f"{fmt_float(pct, 0)}%" if math.isfinite(pct) else
             f"{fmt_float(_num(p.get('voltage')), 1)}V", status]
    if health not in ("unknown", "good"):
        parts.append(f"health {health}")
    if p.get("present") is False:
        parts.append("not present")
    return Summary(" ".join(parts) + _frame_note(p, ctx),
                   {"percent": pct, "status": status, "health": health,
                    "present": p.get("present")})


def _vec(v: Mapping[str, Plain] | None) -> tuple[float, float, float]:
    v = v or {}
    return tuple(_num(v.get(k), 0.0) for k in ("x", "y", "z"))  # type: ignore[return-value]


def summarize_imu(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    parts, features = [], {}
    ocov = p.get("orientation_covariance") or [0.0]
    if not (ocov and _num(ocov[0], 0.0) == -1.0):      # -1: the sensor gives no orientation
        roll, pitch, yaw = _rpy_deg(p.get("orientation") or {})
        parts.append(f"rpy {fmt_float(roll, 0)},{fmt_float(pitch, 0)},{fmt_float(yaw, 0)}°")
        features |= {"roll_deg": roll, "pitch_deg": pitch, "yaw_deg": yaw}
    gyro = [math.degrees(g) for g in _vec(p.get("angular_velocity"))]
    acc = _vec(p.get("linear_acceleration"))
    parts.append("gyro " + ",".join(fmt_float(g, 0) for g in gyro) + "°/s")
    parts.append("acc " + ",".join(fmt_float(a, 1) for a in acc))
    features |= {f"gyro_{k}": g for k, g in zip("xyz", gyro)}
    features |= {f"acc_{k}": a for k, a in zip("xyz", acc)}
    return Summary(" ".join(parts) + _frame_note(p, ctx), features)


def summarize_joint_state(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    names = p.get("name") or []
    positions = p.get("position") or []
    pairs = [(str(n), _num(v)) for n, v in zip(names, positions)]
    if not pairs:
        pairs = [(str(n), math.nan) for n in names]
    text = " ".join(f"{fmt_text(n)} {fmt_float(v, 2)}" for n, v in pairs) or "no joints"
    return Summary(text + _frame_note(p, ctx), {n: v for n, v in pairs})


GOAL_STATUS = {0: "unknown", 1: "accepted", 2: "executing", 3: "canceling", 4: "succeeded",
               5: "canceled", 6: "aborted"}
TERMINAL = ("succeeded", "canceled", "aborted")


def _goal_id(s: Mapping[str, Plain]) -> str:
    uuid = ((s.get("goal_info") or {}).get("goal_id") or {}).get("uuid") or []
    return "".join(f"{int(b):02x}" for b in uuid[:2]) or "?"


def summarize_goal_status_array(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """Goals whose state changed since the source's last chunk; all active ones otherwise."""
    goals: dict[str, str] = {}
    for s in p.get("status_list") or []:
        goals[_goal_id(s)] = GOAL_STATUS.get(s.get("status"), str(s.get("status")))
    previous = ctx.previous or {}
    changed = [(g, st) for g, st in goals.items() if previous.get(g) != st]
    shown = changed or [(g, st) for g, st in goals.items() if st not in TERMINAL]
    text = ", ".join(f"{g} {st}" for g, st in shown) or ("no active goals" if goals else
                                                         "no goals")
    return Summary(text, dict(goals))


def _detection(d: Mapping[str, Plain]) -> tuple[str, float, str]:
    results = d.get("results") or []
    best = max(results, key=lambda r: _num((r.get("hypothesis") or r).get("score"), 0.0),
               default=None)
    hyp = {} if best is None else (best.get("hypothesis") or best)  # Humble+: hypothesis.class_id
    name = hyp.get("class_id", hyp.get("id", d.get("id") or "?"))
    position = (((best or {}).get("pose") or {}).get("pose") or {}).get("position") or {}
    x, y = _num(position.get("x"), 0.0), _num(position.get("y"), 0.0)
    where = f" at {fmt_float(x, 1)},{fmt_float(y, 1)}" if (x, y) != (0.0, 0.0) else ""
    return str(name), _num(hyp.get("score")), where


def summarize_detection2d_array(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """Best class and score per detection, and where it is when the hypothesis has a pose."""
    seen = [_detection(d) for d in p.get("detections") or []]
    text = ", ".join(f"{fmt_text(c) if ' ' not in c else c} {fmt_float(s, 2)}{w}"
                     for c, s, w in seen)
    return Summary((text or "nothing") + _frame_note(p, ctx),
                   {"classes": tuple(sorted(c for c, _, _ in seen))})


def summarize_string(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    data = str(p.get("data", ""))
    text = data if data.isprintable() else fmt_text(data)
    return Summary(text or '""', {"data": data})


def _leaves(value: Plain, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _leaves(v, f"{prefix}{k}.", out)
    elif isinstance(value, list):
        numeric = [float(v) for v in value
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numeric and len(numeric) == len(value):
            finite = [v for v in numeric if math.isfinite(v)]
            out[prefix + "n"] = len(value)
            if finite:
                out[prefix + "min"], out[prefix + "max"] = min(finite), max(finite)
                out[prefix + "mean"] = sum(finite) / len(finite)
        else:
            out[prefix + "n"] = len(value)
            for i, v in enumerate(value[:16]):
                _leaves(v, f"{prefix}{i}.", out)
    elif not isinstance(value, StampNs):        # stamps change every message: not a change
        out[prefix.rstrip(".")] = value


def generic_body(p: Mapping[str, Plain], ctx: Context) -> dict[str, Plain]:
    """The message without its header (time is the chunk's; an unusual frame is kept)."""
    body = dict(p)
    header = body.get("header")
    if isinstance(header, Mapping) and set(header) <= {"stamp", "frame_id", "seq"}:
        del body["header"]
        frame = header.get("frame_id")
        if frame and ctx.usual_frame is not None and frame != ctx.usual_frame:
            body = {"frame": frame} | body
    return body


def summarize_generic(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    body = generic_body(p, ctx)
    o = ctx.options
    text = " ".join(format_pairs(body, o.float_digits, o.max_array, ctx=ctx))
    features: dict[str, Any] = {}
    _leaves({k: v for k, v in body.items() if k != "frame"}, "", features)
    return Summary(text or "(empty)", features)


Summarizer = Callable[[Mapping[str, Plain], Context], Summary]

SUMMARIZERS: dict[str, Summarizer] = {
    "nav_msgs/msg/Odometry": summarize_odometry,
    "sensor_msgs/msg/LaserScan": summarize_laser_scan,
    "sensor_msgs/msg/BatteryState": summarize_battery_state,
    "sensor_msgs/msg/Imu": summarize_imu,
    "sensor_msgs/msg/JointState": summarize_joint_state,
    "action_msgs/msg/GoalStatusArray": summarize_goal_status_array,
    "vision_msgs/msg/Detection2DArray": summarize_detection2d_array,
    "std_msgs/msg/String": summarize_string,
}
