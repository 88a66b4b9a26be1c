"""Compact per-type summaries: what a robot engineer would read off the message, in few tokens.

Each summary works on plain data (so on every message shape) and returns a `Summary`: the chunk
body and the features the change filter compares (units in their names). The generic summary
covers every other type, including custom types that exist only in a bag.

    Odometry          at 2.3,-1.2 heading 90 moving     (or stopped, turning left/right)
    LaserScan         nearest 0.8m front-left, blocked ahead 0.9m   (within 1 m ahead)
    BatteryState      36% discharging
    Imu               heading 90 turning 46°/s  (rpy, gyro, acc when tilted, rotating, shaken)
    JointState        shoulder 0.52 elbow -1.2
    GoalStatusArray   3fa2 succeeded            (only goals whose state changed)
    Detection2DArray  cup 0.91 at 1.2,3.4, person 0.78       (position: the hypothesis pose)
    custom *Detect*   towel 0.87 at 11.4,-0.4                (label/score/position-like fields)
    String            alice: bring me the cup
    Image             640x480 rgb8              (CompressedImage: jpeg 41kB; never pixels)
    PointCloud2       20480 points x,y,z,intensity
    NavSatFix         fix 48.85341,2.34880 alt 35 ±3m
    Range             0.42m
    Temperature       23.5°C
    Twist(Stamped)    moving 0.3m/s 10°/s
    PoseStamped       at 2.3,-1.2 heading 90    (and PoseWithCovarianceStamped)
    Path              12 poses 5.2m to 3.4,1.2
    TFMessage         map>odom, odom>base_link  (the frame pairs; a chunk when one is new)
    DiagnosticArray   warn motor: hot           (only statuses that are not OK)
    Log               warn nav2: no progress    (warn and above; lower levels are quiet)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from csr_ros.render.format import Context, cut, fmt_float, fmt_text, format_pairs
from csr_ros.render.plain import Plain, StampNs, header_frame


@dataclass(frozen=True)
class Summary:
    text: str                                            # chunk body, after "label: "
    features: dict[str, Any] = field(default_factory=dict)  # compared by the change filter
    quiet: bool = False      # nothing worth a chunk (an info log line): suppressed unless event


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


LEVEL_DEG = 2.0          # roll and pitch below this: the robot stands level
STEADY_DPS = 5.0         # rotation rates below this are not written
GRAVITY_MPS2 = 9.81
STEADY_MPS2 = 0.5        # accelerations within this of gravity alone are not written


def summarize_imu(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """What a reader takes from an IMU, in few tokens: ``heading 90 turning 6°/s`` when level,
    ``rpy 3,-12,90°`` when tilted; rates and accelerations only when they are not still/gravity
    (``gyro 12,0,3°/s``, ``acc 2.1,0,9.8``), else ``steady``. The change filter compares them
    all, written or not."""
    parts, features = [], {}
    ocov = p.get("orientation_covariance") or [0.0]
    if not (ocov and _num(ocov[0], 0.0) == -1.0):      # -1: the sensor gives no orientation
        roll, pitch, yaw = _rpy_deg(p.get("orientation") or {})
        if abs(roll) < LEVEL_DEG and abs(pitch) < LEVEL_DEG:
            parts.append(f"heading {fmt_float(yaw, 0)}")
        else:
            parts.append(f"rpy {fmt_float(roll, 0)},{fmt_float(pitch, 0)},{fmt_float(yaw, 0)}°")
        features |= {"roll_deg": roll, "pitch_deg": pitch, "yaw_deg": yaw}
    gyro = [math.degrees(g) for g in _vec(p.get("angular_velocity"))]
    acc = _vec(p.get("linear_acceleration"))
    if abs(gyro[0]) >= STEADY_DPS or abs(gyro[1]) >= STEADY_DPS:
        parts.append("gyro " + ",".join(fmt_float(g, 0) for g in gyro) + "°/s")
    elif abs(gyro[2]) >= STEADY_DPS:
        parts.append(f"turning {fmt_float(gyro[2], 0)}°/s")
    if abs(acc[0]) > STEADY_MPS2 or abs(acc[1]) > STEADY_MPS2 or \
            abs(abs(acc[2]) - GRAVITY_MPS2) > STEADY_MPS2:
        parts.append("acc " + ",".join(fmt_float(a, 1) for a in acc))
    if len(parts) <= 1:
        parts.append("steady")
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


LABEL_KEYS = ("label", "class_name", "class_id", "category", "object", "name", "class", "id")
SCORE_KEYS = ("confidence", "score", "probability", "prob")


def _first(d: Mapping[str, Plain], keys: tuple[str, ...], kind: type | tuple) -> Any:
    for k in keys:
        v = d.get(k)
        if isinstance(v, kind) and not isinstance(v, bool) and v != "":
            return v
    return None


def _where(d: Mapping[str, Plain]) -> str:
    pose = d.get("pose") if isinstance(d.get("pose"), Mapping) else {}
    if isinstance(pose.get("pose"), Mapping):
        pose = pose["pose"]
    for pos in (d.get("position"), pose.get("position"), d.get("center")):
        if isinstance(pos, Mapping) and _num(pos.get("x")) == _num(pos.get("x")):
            x, y = _num(pos.get("x"), 0.0), _num(pos.get("y"), 0.0)
            return f" at {fmt_float(x, 1)},{fmt_float(y, 1)}"
    return ""


def summarize_detection_like(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary | None:
    """A custom detection type (its name says detect): each item's label, score and where it is
    (``towel 0.87 at 11.4,-0.4``), as Detection2DArray is. None when an item has no label-like
    field: the generic summary is used then."""
    body = {k: v for k, v in p.items() if k != "header"}
    lists = [v for v in body.values() if isinstance(v, list) and v
             and all(isinstance(i, Mapping) for i in v)]
    empty = [v for v in body.values() if isinstance(v, list) and not v]
    items = lists[0] if len(lists) == 1 else [] if not lists and empty else [body]
    seen = []
    for item in items:
        label = _first(item, LABEL_KEYS, (str, int))
        if label is None:
            return None
        score = _first(item, SCORE_KEYS, (int, float))
        seen.append((str(label), "" if score is None else f" {fmt_float(float(score), 2)}",
                     _where(item)))
    text = ", ".join(f"{fmt_text(c) if ' ' not in c else c}{s}{w}" for c, s, w in seen)
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


# -- more common types of recorded bags ---------------------------------------------------------

def _dims(p: Mapping[str, Plain]) -> str:
    return f"{int(_num(p.get('width'), 0))}x{int(_num(p.get('height'), 0))}"


def summarize_image(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """Shape and encoding, never pixels: ``640x480 rgb8``."""
    encoding = str(p.get("encoding") or "?")
    return Summary(f"{_dims(p)} {fmt_text(encoding)}" + _frame_note(p, ctx),
                   {"width": p.get("width"), "height": p.get("height"), "encoding": encoding})


def summarize_compressed_image(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """Format and size, never pixels: ``jpeg 41kB``."""
    fmt = str(p.get("format") or "?")
    size_kb = len(p.get("data") or []) / 1024
    return Summary(f"{fmt_text(fmt)} {fmt_float(size_kb, 0)}kB" + _frame_note(p, ctx),
                   {"format": fmt})


def summarize_point_cloud2(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """Point count and fields, never points: ``20480 points x,y,z,intensity``."""
    n = int(_num(p.get("width"), 0)) * max(1, int(_num(p.get("height"), 1)))
    names = ",".join(str(f.get("name")) for f in p.get("fields") or [] if isinstance(f, Mapping))
    organized = int(_num(p.get("height"), 1)) > 1
    text = f"{n} points {names}".rstrip() + (f" {_dims(p)}" if organized else "")
    return Summary(text + _frame_note(p, ctx),
                   {"fields": names, "organized": organized, "dense": p.get("is_dense")})


def summarize_camera_info(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """Resolution and distortion model (the calibration matrices are constants of a camera)."""
    model = str(p.get("distortion_model") or "")
    return Summary(f"{_dims(p)}" + (f" {fmt_text(model)}" if model else "") + _frame_note(p, ctx),
                   {"width": p.get("width"), "height": p.get("height"), "model": model})


def summarize_occupancy_grid(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """Map size and resolution, never cells: ``384x384 0.05m/cell``."""
    info = p.get("info") or {}
    res = _num(info.get("resolution"), 0.0)
    return Summary(f"{_dims(info)} {fmt_float(res, 3)}m/cell" + _frame_note(p, ctx),
                   {"width": info.get("width"), "height": info.get("height"),
                    "resolution_m": res})


NAVSAT_STATUS = {-1: "no fix", 0: "fix", 1: "sbas fix", 2: "gbas fix"}


def summarize_nav_sat_fix(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """``fix 48.85341,2.34880 alt 35 ±3m`` (5 decimals: about a metre)."""
    status = NAVSAT_STATUS.get(int(_num((p.get("status") or {}).get("status"), -1)), "fix")
    lat, lon, alt = (_num(p.get(k)) for k in ("latitude", "longitude", "altitude"))
    if status == "no fix" or not (math.isfinite(lat) and math.isfinite(lon)):
        return Summary("no fix" + _frame_note(p, ctx),
                       {"fix": "no fix", "lat_deg": math.nan, "lon_deg": math.nan})
    text = f"{status} {lat:.5f},{lon:.5f}"
    if math.isfinite(alt):
        text += f" alt {fmt_float(alt, 0)}"
    cov = p.get("position_covariance") or []
    if int(_num(p.get("position_covariance_type"), 0)) > 0 and cov and _num(cov[0], -1) >= 0:
        text += f" ±{fmt_float(math.sqrt(_num(cov[0])), 1)}m"
    return Summary(text + _frame_note(p, ctx), {"fix": status, "lat_deg": lat, "lon_deg": lon})


def summarize_range(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """``0.42m``, or ``out of range`` (inf, nan, outside the sensor's limits)."""
    r = _num(p.get("range"))
    lo, hi = _num(p.get("min_range"), 0.0), _num(p.get("max_range"), math.inf)
    if not (math.isfinite(r) and lo <= r <= hi):
        return Summary("out of range" + _frame_note(p, ctx), {"range_m": math.inf})
    return Summary(f"{fmt_float(r, 2)}m" + _frame_note(p, ctx), {"range_m": r})


def summarize_temperature(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    t = _num(p.get("temperature"))
    return Summary(f"{fmt_float(t, 1)}°C" + _frame_note(p, ctx), {"temperature_c": t})


def summarize_twist(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """A velocity command or estimate: ``moving 0.3m/s 10°/s`` or ``stopped``."""
    twist = p.get("twist") if isinstance(p.get("twist"), Mapping) else p   # TwistStamped
    if isinstance(twist.get("twist"), Mapping):                             # WithCovariance
        twist = twist["twist"]
    lin, ang = twist.get("linear") or {}, twist.get("angular") or {}
    v = _num(lin.get("x"), 0.0)
    w = math.degrees(_num(ang.get("z"), 0.0))
    if abs(v) > MOVING_MPS:
        text, motion = f"{'moving' if v > 0 else 'reversing'} {fmt_float(v, 2)}m/s", "moving"
    elif abs(w) > TURNING_DPS:
        text, motion = "turning", "turning"
    else:
        text, motion = "stopped", "stopped"
    if motion != "stopped" and abs(w) > TURNING_DPS:
        text += f" {fmt_float(w, 0)}°/s"
    return Summary(text + _frame_note(p, ctx), {"motion": motion, "v_mps": v, "w_dps": w})


def summarize_pose(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """PoseStamped, PoseWithCovarianceStamped, Pose: ``at 2.3,-1.2 heading 90``."""
    pose = p.get("pose") if isinstance(p.get("pose"), Mapping) else p
    if isinstance(pose.get("pose"), Mapping):                               # WithCovariance
        pose = pose["pose"]
    pos = pose.get("position") or {}
    x, y, z = _num(pos.get("x"), 0.0), _num(pos.get("y"), 0.0), _num(pos.get("z"), 0.0)
    yaw = yaw_deg(pose.get("orientation") or {})
    text = f"at {fmt_float(x, 1)},{fmt_float(y, 1)}" + (
        f",{fmt_float(z, 1)}" if abs(z) >= 0.05 else "") + f" heading {fmt_float(yaw, 0)}"
    return Summary(text + _frame_note(p, ctx), {"x_m": x, "y_m": y, "yaw_deg": yaw})


def summarize_path(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """A planned path by its length and goal: ``12 poses 5.2m to 3.4,1.2`` (or ``empty``)."""
    points = []
    for stamped in p.get("poses") or []:
        pos = ((stamped.get("pose") or {}).get("position") or {}) if isinstance(
            stamped, Mapping) else {}
        points.append((_num(pos.get("x"), 0.0), _num(pos.get("y"), 0.0)))
    if not points:
        return Summary("empty" + _frame_note(p, ctx), {"poses": 0})
    length = sum(math.dist(a, b) for a, b in zip(points, points[1:]))
    gx, gy = points[-1]
    return Summary(f"{len(points)} poses {fmt_float(length, 1)}m to {fmt_float(gx, 1)},"
                   f"{fmt_float(gy, 1)}" + _frame_note(p, ctx),
                   {"poses": len(points), "x_m": gx, "y_m": gy})


MAX_FRAME_PAIRS = 8


def summarize_tf_message(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """The frame pairs the source has carried (``map>odom, odom>base_link``), not the transforms:
    the change filter makes a chunk only when a new pair appears."""
    pairs = {f"{(t.get('header') or {}).get('frame_id', '?')}>{t.get('child_frame_id', '?')}"
             for t in p.get("transforms") or [] if isinstance(t, Mapping)}
    known = set((ctx.previous or {}).get("pairs") or ())
    every = sorted(known | pairs)
    text = ", ".join(every[:MAX_FRAME_PAIRS]) + (
        f" +{len(every) - MAX_FRAME_PAIRS} more" if len(every) > MAX_FRAME_PAIRS else "")
    return Summary(text or "no transforms", {"pairs": tuple(every)})


DIAGNOSTIC_LEVEL = {0: "ok", 1: "warn", 2: "error", 3: "stale"}


def _level(v: Plain) -> int:
    if isinstance(v, list):            # a `byte` field from rclpy (bytes) comes as a list
        v = v[0] if v else 0
    return int(_num(v, 0))


def summarize_diagnostic_array(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """Only the statuses that are not OK: ``warn motor: hot; error lidar: no data``."""
    bad = []
    for s in p.get("status") or []:
        level = _level(s.get("level"))
        if level != 0:
            name = str(s.get("name") or "?")
            bad.append((name, DIAGNOSTIC_LEVEL.get(level, str(level)), str(s.get("message") or "")))
    statuses = p.get("status") or []
    text = "; ".join(f"{lv} {n}" + (f": {cut(m, 80)}" if m else "") for n, lv, m in bad)
    return Summary(text or f"all ok ({len(statuses)})", {n: lv for n, lv, _ in bad})


LOG_LEVEL = {10: "debug", 20: "info", 30: "warn", 40: "error", 50: "fatal"}
LOG_SHOWN = 30                         # warn and above become chunks; others are quiet


def summarize_log(p: Mapping[str, Plain], ctx: Context = Context()) -> Summary:
    """rcl_interfaces/Log (/rosout): ``warn controller_server: Failed to make progress``."""
    level = _level(p.get("level"))
    name = str(p.get("name") or "?")
    msg = cut(" ".join(str(p.get("msg") or "").split()), 200)
    text = f"{LOG_LEVEL.get(level, str(level))} {name}: {msg}"
    return Summary(text, {"level": level, "name": name, "msg": msg}, quiet=level < LOG_SHOWN)


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
    "sensor_msgs/msg/Image": summarize_image,
    "sensor_msgs/msg/CompressedImage": summarize_compressed_image,
    "sensor_msgs/msg/PointCloud2": summarize_point_cloud2,
    "sensor_msgs/msg/CameraInfo": summarize_camera_info,
    "nav_msgs/msg/OccupancyGrid": summarize_occupancy_grid,
    "sensor_msgs/msg/NavSatFix": summarize_nav_sat_fix,
    "sensor_msgs/msg/Range": summarize_range,
    "sensor_msgs/msg/Temperature": summarize_temperature,
    "geometry_msgs/msg/Twist": summarize_twist,
    "geometry_msgs/msg/TwistStamped": summarize_twist,
    "geometry_msgs/msg/TwistWithCovarianceStamped": summarize_twist,
    "geometry_msgs/msg/PoseStamped": summarize_pose,
    "geometry_msgs/msg/PoseWithCovarianceStamped": summarize_pose,
    "geometry_msgs/msg/Pose": summarize_pose,
    "nav_msgs/msg/Path": summarize_path,
    "tf2_msgs/msg/TFMessage": summarize_tf_message,
    "diagnostic_msgs/msg/DiagnosticArray": summarize_diagnostic_array,
    "rcl_interfaces/msg/Log": summarize_log,
}
