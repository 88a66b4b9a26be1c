"""Change-driven emission per source: which messages become chunks.

    emitter = Emitter(sources)                       # SourceConfig-like objects
    for e in emitter.offer("odom", msg, now_ns): publish(e.text)
    for e in emitter.poll(now_ns): publish(e.text)   # held (rate-limited) values now due
    emitter.pop_time_jumps()                          # clock went backwards: state was reset

Per source, in this order: a minimum period (`period_s`: the newest value is held, older held
ones coalesced), then a change filter (a first value, a change past the deadband, or
`keepalive_s`; otherwise suppressed and counted); event sources skip both, instant ones the
filter. A source's time going back by more than a second resets it (`pop_time_jumps`). The
deadbands per type and their defaults: docs/rendering.md, "When a source makes a chunk".

Every chunk text starts with the episode time in whole seconds: ``"125s odom: at 2.3,-1.2 ..."``.
Pure: no rclpy, no I/O; the aggregator node and `csr-ros replay` use the same object.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any, Iterable, Mapping

from csr_ros.errors import ConfigError
from csr_ros.render.format import Context, RenderOptions, cut
from csr_ros.render.plain import header_frame, header_stamp_ns, message_type_name, to_plain
from csr_ros.render.summaries import Summary
from csr_ros.render.text import summarize

UNSET = -1.0                       # a parameter left at -1 takes the default for the type
TIME_JUMP_TOLERANCE_NS = 1_000_000_000
DEADBANDS = ("deadband_m", "deadband_deg", "deadband_pct", "deadband")

KIND_OF_TYPE = {
    "nav_msgs/msg/Odometry": "odometry",
    "sensor_msgs/msg/LaserScan": "scan",
    "sensor_msgs/msg/BatteryState": "battery",
    "sensor_msgs/msg/Imu": "imu",
    "sensor_msgs/msg/NavSatFix": "gnss",
    "sensor_msgs/msg/Range": "range",
    "sensor_msgs/msg/Temperature": "temperature",
    "geometry_msgs/msg/Twist": "twist",
    "geometry_msgs/msg/TwistStamped": "twist",
    "geometry_msgs/msg/TwistWithCovarianceStamped": "twist",
    "geometry_msgs/msg/PoseStamped": "pose",
    "geometry_msgs/msg/PoseWithCovarianceStamped": "pose",
    "geometry_msgs/msg/Pose": "pose",
    "sensor_msgs/msg/Image": "shape",
    "sensor_msgs/msg/CompressedImage": "shape",
    "sensor_msgs/msg/PointCloud2": "shape",
    "sensor_msgs/msg/CameraInfo": "shape",
    "nav_msgs/msg/OccupancyGrid": "shape",
    "nav_msgs/msg/Path": "path",
    "tf2_msgs/msg/TFMessage": "frames",
    "diagnostic_msgs/msg/DiagnosticArray": "diagnostics",
    "rcl_interfaces/msg/Log": "log",
}
KIND_DEFAULTS: dict[str, dict[str, float]] = {
    "odometry": {"keepalive_s": 60.0, "deadband_m": 2.0, "deadband_deg": 45.0},
    "scan": {"keepalive_s": 120.0, "deadband_m": 0.5},
    "battery": {"keepalive_s": 300.0, "deadband_pct": 5.0},
    "imu": {"keepalive_s": 60.0, "deadband_deg": 10.0, "deadband": 1.0},
    "gnss": {"keepalive_s": 120.0, "deadband_m": 5.0},
    "range": {"keepalive_s": 120.0, "deadband_m": 0.25},
    "temperature": {"keepalive_s": 300.0, "deadband": 1.0},
    "twist": {"keepalive_s": 60.0, "deadband": 0.2, "deadband_deg": 20.0},
    "pose": {"keepalive_s": 60.0, "deadband_m": 2.0, "deadband_deg": 45.0},
    "path": {"keepalive_s": 120.0, "deadband_m": 1.0},
    "shape": {"keepalive_s": 600.0},        # shape/encoding/format: a chunk when they change
    "frames": {"keepalive_s": 600.0},       # a chunk when a new frame pair appears
    "diagnostics": {"keepalive_s": 300.0},  # a chunk when a status leaves or enters OK
    "log": {"keepalive_s": 120.0},          # a chunk per new warning; repeats suppressed
    "generic": {"keepalive_s": 60.0, "deadband": 0.05},
}


def emission_kind(type_name: str | None, options: RenderOptions = RenderOptions()) -> str:
    """How a source's changes are judged: by its type's summary, or generically."""
    if options.fields or not options.summarize:
        return "generic"
    return KIND_OF_TYPE.get(type_name or "", "generic")


@dataclass(frozen=True)
class EmissionConfig:
    event: bool = False
    keepalive_s: float = UNSET        # 0: never re-send an unchanged value
    deadband_m: float = UNSET
    deadband_deg: float = UNSET
    deadband_pct: float = UNSET
    deadband: float = UNSET

    def resolved(self, kind: str, *, where: str = "source") -> "EmissionConfig":
        """Defaults of the kind filled in; a deadband the kind does not use is an error."""
        defaults = KIND_DEFAULTS[kind]
        values = {}
        for f in fields(self):
            if f.name == "event":
                continue
            value = getattr(self, f.name)
            if value != UNSET and not value >= 0:
                raise ConfigError(f"{where}.{f.name} must be >= 0 (or -1 for the type's "
                                  f"default), got {value}")
            if value != UNSET and f.name in DEADBANDS and f.name not in defaults:
                used = [d for d in DEADBANDS if d in defaults]
                judged = ", ".join(used) if used else "any change of its summary, no deadband"
                raise ConfigError(f"{where}.{f.name} does not apply to this source ({kind} "
                                  f"changes are judged by {judged})")
            if value != UNSET and self.event and f.name in DEADBANDS:
                raise ConfigError(f"{where}.{f.name}: an event source is never filtered; "
                                  "remove the deadband or set event: false")
            if value == UNSET and not (self.event and f.name in DEADBANDS):
                value = defaults.get(f.name, UNSET)
            values[f.name] = value
        return replace(self, **values)


# -- the change filter ---------------------------------------------------------------------------

def _angle_diff_deg(a: float, b: float) -> float:
    return abs((a - b + 180.0) % 360.0 - 180.0)


def _num_changed(a: Any, b: Any, band: float, *, relative: bool = True) -> bool:
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) != math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a != b
    return abs(a - b) > band * (max(1.0, abs(a)) if relative else 1.0)


def geo_distance_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in metres (inf when either position is unknown)."""
    if any(math.isnan(v) for v in (lat1, lon1, lat2, lon2)):
        return 0.0 if all(math.isnan(v) for v in (lat1, lat2)) else math.inf
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = (math.sin((p2 - p1) / 2) ** 2
         + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2)
    return 2 * 6_371_000.0 * math.asin(min(1.0, math.sqrt(a)))


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def changed(kind: str, cfg: EmissionConfig, old: Mapping[str, Any],
            new: Mapping[str, Any], seen: Mapping[str, Any] | None = None) -> bool:
    """Whether `new` features differ from `old` (the last chunk's) by more than the source's
    deadbands; `seen` are the features of the value before `new` (None: not known)."""
    if kind == "odometry":
        # a new motion state counts once two values in a row agree on it (velocity noise);
        # while turning in place the state says so: the new heading comes when the turn ends
        confirmed = seen is None or seen.get("motion") == new.get("motion")
        return (old.get("motion") != new.get("motion") and confirmed
                or math.dist((old["x_m"], old["y_m"]), (new["x_m"], new["y_m"])) > cfg.deadband_m
                or (new.get("motion") != "turning"
                    and _angle_diff_deg(old["yaw_deg"], new["yaw_deg"]) > cfg.deadband_deg))
    if kind == "scan":
        return (old.get("blocked") != new.get("blocked")
                or _num_changed(old["nearest_m"], new["nearest_m"], cfg.deadband_m))
    if kind == "battery":
        a, b = old["percent"], new["percent"]
        return (any(old.get(k) != new.get(k) for k in ("status", "health", "present"))
                or math.isnan(a) != math.isnan(b)
                or (not math.isnan(b) and abs(a - b) >= cfg.deadband_pct))
    if kind == "imu":
        for k in ("roll_deg", "pitch_deg", "yaw_deg"):
            if (k in old) != (k in new) or k in new and \
                    _angle_diff_deg(old[k], new[k]) > cfg.deadband_deg:
                return True
        return any(_num_changed(old.get(k, 0.0), new.get(k, 0.0), cfg.deadband, relative=False)
                   for k in new if k.startswith(("gyro_", "acc_")))
    if kind == "gnss":
        return (old.get("fix") != new.get("fix")
                or geo_distance_m(old["lat_deg"], old["lon_deg"], new["lat_deg"],
                                  new["lon_deg"]) > cfg.deadband_m)
    if kind == "range":
        return _num_changed(old["range_m"], new["range_m"], cfg.deadband_m)
    if kind == "temperature":
        return _num_changed(old["temperature_c"], new["temperature_c"], cfg.deadband,
                            relative=False)
    if kind == "twist":
        confirmed = seen is None or seen.get("motion") == new.get("motion")
        return (old.get("motion") != new.get("motion") and confirmed
                or _num_changed(old["v_mps"], new["v_mps"], cfg.deadband, relative=False)
                or _num_changed(old["w_dps"], new["w_dps"], cfg.deadband_deg, relative=False))
    if kind == "pose":
        return (math.dist((old["x_m"], old["y_m"]), (new["x_m"], new["y_m"])) > cfg.deadband_m
                or _angle_diff_deg(old["yaw_deg"], new["yaw_deg"]) > cfg.deadband_deg)
    if kind == "path":
        if (old.get("poses", 0) > 0) != (new.get("poses", 0) > 0):
            return True
        return new.get("poses", 0) > 0 and math.dist((old["x_m"], old["y_m"]),
                                                     (new["x_m"], new["y_m"])) > cfg.deadband_m
    if kind == "frames":
        return not set(new.get("pairs") or ()) <= set(old.get("pairs") or ())
    if kind in ("shape", "diagnostics", "log"):
        return dict(old) != dict(new)
    if set(old) != set(new):
        return True
    for k, b in new.items():
        a = old[k]
        if _is_num(a) and _is_num(b):
            if _num_changed(a, b, cfg.deadband):
                return True
        elif a != b:
            return True
    return False


# -- the episode's origin across restarts ---------------------------------------------------------

_ELAPSED = re.compile(r"^(\d+)s ")


def episode_origin_ns(chunks: Iterable[Any]) -> int | None:
    """The episode start of chunks written before (a chunk log's records, oldest first): the
    first chunk's stamp less the episode time its text starts with (within a second, as times
    are whole seconds). None when no chunk says, e.g. an empty log."""
    for chunk in chunks:
        text, stamp_ns = getattr(chunk, "text", None), getattr(chunk, "stamp_ns", None)
        if isinstance(text, str) and isinstance(stamp_ns, int):
            match = _ELAPSED.match(text)
            if match:
                return stamp_ns - int(match.group(1)) * 1_000_000_000
    return None


# -- the emitter ---------------------------------------------------------------------------------

@dataclass
class SourceStats:
    received: int = 0          # messages offered
    coalesced: int = 0         # replaced while held by the minimum period
    suppressed: int = 0        # judged unchanged by the change filter
    chunks: int = 0            # chunks emitted
    time_resets: int = 0       # times the clock went backwards on this source
    render_errors: int = 0     # messages that could not be rendered (a bad field selection)


@dataclass(frozen=True)
class Emitted:
    source: str
    text: str                  # the chunk text, with the episode time in front
    now_ns: int                # when the message arrived (bag time in a replay)
    stamp_ns: int              # its header stamp, else now_ns
    n_coalesced: int           # messages it replaced while held (minimum period)
    n_suppressed: int          # unchanged messages since the source's previous chunk
    reason: str                # first | change | keepalive | event | instant
    instant: bool

    @property
    def n_skipped(self) -> int:
        """Messages this chunk stands for besides itself (StateChunk.coalesced)."""
        return self.n_coalesced + self.n_suppressed


@dataclass(frozen=True)
class TimeJump:
    source: str
    from_ns: int
    to_ns: int

    @property
    def back_s(self) -> float:
        return (self.from_ns - self.to_ns) / 1e9


@dataclass
class _State:
    kind: str
    cfg: EmissionConfig
    period_ns: int
    last_seen_ns: int | None = None
    last_pass_ns: int | None = None        # when a value last left the rate limiter
    pending: tuple[Any, int] | None = None
    n_held: int = 0                        # values replaced while held
    last_emit_ns: int | None = None
    last_features: Mapping[str, Any] | None = None
    seen_features: Mapping[str, Any] | None = None   # of the value before, chunk or not
    n_coalesced: int = 0                   # since the last chunk
    n_suppressed: int = 0
    usual_frame: str | None = None


@dataclass(frozen=True)
class EmitterSource:
    """What the emitter needs of a source (`ros_params.SourceConfig` has these attributes)."""
    name: str
    type_name: str | None = None
    label: str = ""
    period_s: float = 0.0
    instant: bool = False
    render: RenderOptions = RenderOptions()
    emission: EmissionConfig = EmissionConfig()


class Emitter:
    def __init__(self, sources: Iterable[Any], *, origin_ns: int | None = None):
        self.sources = {s.name: s for s in sources}
        self.origin_ns = origin_ns
        self._states: dict[str, _State] = {}
        self.stats: dict[str, SourceStats] = {}
        for s in self.sources.values():
            emission = getattr(s, "emission", None) or EmissionConfig()
            if emission.event and s.period_s > 0:
                raise ConfigError(f"source {s.name}: an event source is never coalesced; set "
                                  f"period_s: 0.0 (got {s.period_s})")
            kind = emission_kind(s.type_name, s.render)
            self._states[s.name] = _State(kind=kind,
                                          cfg=emission.resolved(kind, where=f"source.{s.name}"),
                                          period_ns=int(round(s.period_s * 1e9)))
            self.stats[s.name] = SourceStats()
        self._jumps: list[TimeJump] = []
        self._errors: list[tuple[str, str]] = []

    # -- input ------------------------------------------------------------------------------

    def offer(self, name: str, msg: Any, now_ns: int) -> list[Emitted]:
        """A message of source `name` arrived at `now_ns`: the chunks it makes now (0 or 1)."""
        if name not in self._states:
            raise ConfigError(f"unknown source {name!r}; the sources are {list(self._states)}")
        st, stats = self._states[name], self.stats[name]
        stats.received += 1
        if self.origin_ns is None or now_ns < self.origin_ns:
            self.origin_ns = now_ns
        if st.last_seen_ns is not None and now_ns < st.last_seen_ns - TIME_JUMP_TOLERANCE_NS:
            self._jumps.append(TimeJump(name, st.last_seen_ns, now_ns))
            stats.time_resets += 1
            stats.coalesced += st.pending is not None     # a held value from before the jump
            self._states[name] = st = _State(kind=st.kind, cfg=st.cfg, period_ns=st.period_ns)
        st.last_seen_ns = max(now_ns, st.last_seen_ns or now_ns)
        if st.period_ns and st.last_pass_ns is not None \
                and now_ns - st.last_pass_ns < st.period_ns:
            if st.pending is not None:
                st.n_held += 1
                stats.coalesced += 1
            st.pending = (msg, now_ns)
            return []
        if st.pending is not None:            # a held value superseded by this later one
            st.n_held += 1
            stats.coalesced += 1
            st.pending = None
        return self._pass(name, st, msg, now_ns, now_ns)

    def poll(self, now_ns: int) -> list[Emitted]:
        """Held values whose minimum period has elapsed."""
        out = []
        for name, st in self._states.items():
            if st.pending is not None and now_ns - st.last_pass_ns >= st.period_ns:
                msg, received_ns = st.pending
                st.pending = None
                out += self._pass(name, st, msg, received_ns, now_ns)
        return out

    def flush(self, now_ns: int) -> list[Emitted]:
        """Every held value now (on shutdown or at the end of a bag)."""
        out = []
        for name, st in self._states.items():
            if st.pending is not None:
                msg, received_ns = st.pending
                st.pending = None
                out += self._pass(name, st, msg, received_ns, now_ns)
        return out

    def pop_time_jumps(self) -> list[TimeJump]:
        jumps, self._jumps = self._jumps, []
        return jumps

    def pop_errors(self) -> list[tuple[str, str]]:
        """(source, message) of every render error since the last call."""
        errors, self._errors = self._errors, []
        return errors

    def elapsed_s(self, now_ns: int) -> int:
        """Whole seconds since the episode's first message (a clock: 12.9 s is 12 s)."""
        origin_ns = now_ns if self.origin_ns is None else self.origin_ns
        return max(0, (now_ns - origin_ns) // 1_000_000_000)

    # -- the change filter --------------------------------------------------------------------

    def _pass(self, name: str, st: _State, msg: Any, received_ns: int,
              now_ns: int) -> list[Emitted]:
        source, stats = self.sources[name], self.stats[name]
        st.last_pass_ns = now_ns
        st.n_coalesced += st.n_held
        st.n_held = 0
        plain = to_plain(msg)
        if st.usual_frame is None and isinstance(plain, Mapping):
            st.usual_frame = header_frame(plain)
        type_name = source.type_name or message_type_name(msg)
        ctx = Context(options=source.render, origin_ns=self.origin_ns,
                      usual_frame=st.usual_frame, previous=st.last_features)
        try:
            summary: Summary = summarize(plain, type_name=type_name, ctx=ctx)
        except ConfigError as exc:
            stats.render_errors += 1
            self._errors.append((name, str(exc)))
            return []
        seen, st.seen_features = st.seen_features, summary.features
        if source.instant:
            reason = "instant"
        elif st.cfg.event:
            reason = "event"
        elif summary.quiet:                   # nothing worth a chunk (an info log line)
            st.n_suppressed += 1
            stats.suppressed += 1
            return []
        elif st.last_features is None:
            reason = "first"
        elif changed(st.kind, st.cfg, st.last_features, summary.features, seen):
            reason = "change"
        elif st.cfg.keepalive_s > 0 and \
                received_ns - st.last_emit_ns >= st.cfg.keepalive_s * 1e9:
            reason = "keepalive"
        else:
            st.n_suppressed += 1
            stats.suppressed += 1
            return []
        text = cut(f"{self.elapsed_s(received_ns)}s {source.label or name}: {summary.text}",
                   source.render.max_chars)
        emitted = Emitted(source=name, text=text, now_ns=received_ns,
                          stamp_ns=header_stamp_ns(msg) or received_ns,
                          n_coalesced=st.n_coalesced, n_suppressed=st.n_suppressed,
                          reason=reason, instant=bool(source.instant))
        st.last_emit_ns, st.last_features = received_ns, summary.features
        st.n_coalesced = st.n_suppressed = 0
        stats.chunks += 1
        return [emitted]


__all__ = ["UNSET", "KIND_DEFAULTS", "KIND_OF_TYPE", "EmissionConfig", "Emitter", "Emitted",
           "EmitterSource", "SourceStats", "TimeJump", "changed", "emission_kind",
           "episode_origin_ns"]
