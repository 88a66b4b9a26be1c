"""Parameters of the three nodes: one schema, validated the same way in a node and in a test.

Each node declares every `ParamSpec` of its schema (name, default, description) with rclpy,
reads the values back into a dict and hands it to `validate`, which applies defaults, checks
types, choices and ranges, and raises `ConfigError` with a message that names the parameter
and says what to write instead. `load_params_file` reads a ROS 2 parameters YAML file
(``node: {ros__parameters: {...}}``) the way ``--params-file`` does, so a file can be checked
before a robot is started.

A spec's bounds also become the range of its ROS descriptor; `dynamic` ones may change while
the node runs, the others are refused by a configured node (`check_change`). The
aggregator's sources are nested parameters (`sources`, `source.<name>.*`). What each
parameter means and what changes at run time: docs/ros.md, "Parameters".

Pure: no rclpy.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import yaml

from csr_ros.chunklog.writer import DEFAULT_MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES
from csr_ros.errors import ConfigError
from csr_ros.render import (KIND_DEFAULTS, EmissionConfig, RenderOptions, TopicPolicy,
                            emission_kind, normalize_type_name)
from csr_ros.render.emission import UNSET
from csr_ros.render.topic_defaults import EVENT, default_period_s
from csr_ros.stream_defaults import ROBOT as STREAM

if TYPE_CHECKING:
    from csr_ros.state import CsrState


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Any                     # its Python type is the parameter's ROS type
    description: str
    choices: tuple[str, ...] = ()
    min_value: float | None = None   # inclusive
    positive: bool = False           # > 0 (for rates and periods that divide)
    required: bool = False           # no usable default: the params file must set it
    element: type | None = None      # element type of an array parameter with an empty default
    max_value: float | None = None   # inclusive
    dynamic: bool = False            # may change at run time, from the next decision on

    @property
    def kind(self) -> type:
        return list if isinstance(self.default, list) else type(self.default)


def _p(name, default, description, **kw) -> ParamSpec:
    return ParamSpec(name, default, description, **kw)


DEFAULT_ACTIONS = ("wait()", "stop()", "look_around()",
                   "move(direction: forward|backward|left|right)", "turn(direction: left|right)",
                   "say(text: str)")

TOPICS = [
    _p("topics.chunks", "csr/chunks", "StateChunk stream (history, gap-free seq)"),
    _p("topics.instant", "csr/instant", "StateChunk stream of 'instant' values (dynamic suffix)"),
    _p("topics.swaps", "csr/swaps", "SwapEvent stream of the reconciler (transient local)"),
    _p("topics.decisions", "csr/decisions", "PolicyDecision stream of the policy node"),
    _p("services.get_chunks", "csr/get_chunks", "GetChunks service of the aggregator"),
    _p("services.query", "csr/query", "Query service of the policy node"),
]

LIFECYCLE = [
    _p("autostart", True, "configure and activate the node as it starts (false: it waits, "
       "unconfigured, for a lifecycle manager's transitions)"),
]

CHUNKS = [
    _p("chunk_log", "", "chunk log directory: crash-safe history that survives a restart of "
       "the node ('' = none; docs/chunklog.md)"),
    _p("chunk_log_retention.retain_bytes", 0, "keep the chunk log's segments under this many "
       "bytes, dropping the oldest whole segments (0 = no limit)", min_value=0),
    _p("chunk_log_retention.retain_s", 0.0, "drop segments last written longer ago than this "
       "(0 = no limit)", min_value=0.0),
    _p("chunk_log_retention.action", "archive", "what happens to a dropped segment: moved to "
       "<chunk_log>/archive/, or deleted", choices=("archive", "delete")),
    _p("chunk_log_retention.compress", False, "archive dropped segments gzip-compressed"),
    _p("chunk_log_segment_bytes", DEFAULT_MAX_SEGMENT_BYTES, "start a new segment of the chunk "
       "log past this size", min_value=MIN_SEGMENT_BYTES),
]

ROBOT = [
    _p("robot_id", "", "this robot's id among several that share servers: openai resources "
       "send it in the routing key of every request (a router keeps each robot on the server "
       "that caches its prefix), diagnostics carry it ('' = the node's namespace without the "
       "leading slash, none in the root namespace)"),
]

AGGREGATOR = TOPICS + LIFECYCLE + CHUNKS + ROBOT + [
    _p("sources", [], "names of the input sources; each is described by source.<name>.*",
       required=True, element=str),
    _p("strict", False, "stop when a source's message type is not installed (false: start "
       "without that source and name it in the log and on /diagnostics)"),
    _p("ring_size", 10000, "chunks kept in memory for GetChunks", min_value=1),
    _p("float_digits", 3, "decimals kept when rendering floats", min_value=0),
    _p("max_array", 8, "arrays longer than this are summarised (n/min/max/mean)", min_value=1),
    _p("max_chars", 2000, "longest chunk text in characters (cut with a marker)", min_value=32),
    _p("poll_hz", 20.0, "how often held (rate-limited) values are checked for release",
       positive=True),
    _p("qos_recheck_s", 2.0, "period of re-matching subscription QoS to new publishers",
       positive=True),
]

SOURCE = [
    _p("topic", "", "topic to subscribe to", required=True),
    _p("type", "", "message type, e.g. sensor_msgs/msg/LaserScan", required=True),
    _p("label", "", "name of the source in the chunk text ('' = the source name)"),
    _p("period_s", 0.0, "minimum time between two chunks of this source (newest kept; -1 = "
       "the type's default, docs/rendering.md)", min_value=-1.0),
    _p("fields", "", "comma-separated dotted fields to keep ('' = type summary / all fields)"),
    _p("summarize", True, "use the built-in summary of the type when there is one"),
    _p("instant", False, "a current value for the dynamic suffix instead of history"),
    _p("event", False, "every message is a chunk: never coalesced, filtered or suppressed "
       "(speech, detections, action results)"),
    _p("keepalive_s", -1.0, "send an unchanged value again after this long (0 = never; "
       "-1 = the type's default)"),
    _p("deadband_m", -1.0, "Odometry: distance moved; LaserScan: change of the nearest/ahead "
       "range (relative beyond 1 m) that makes a new chunk (-1 = the type's default)"),
    _p("deadband_deg", -1.0, "Odometry: turn; Imu: attitude change that makes a new chunk "
       "(-1 = the type's default)"),
    _p("deadband_pct", -1.0, "BatteryState: percent step that makes a new chunk (status "
       "changes always do; -1 = the type's default)"),
    _p("deadband", -1.0, "other types: change of a numeric field (relative beyond 1) that "
       "makes a new chunk; Imu: of a rate or acceleration (-1 = the type's default)"),
]

STATE = [
    _p("model", "smollm2", "model directory, 'smollm2' or a prepared catalog model "
       "('qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b') whose tokenizer and template build the "
       "prompt"),
    _p("tokenizer", "local", "'local': tokenizer files of `model`; 'server': the primary "
       "server's /tokenize", choices=("local", "server")),
    _p("mode", "token", "send token ids ('token') or prompt text ('text')",
       choices=("token", "text")),
    _p("use_chat_template", True, "wrap the prompt in the model's chat template"),
    _p("profile", "You are the policy of a mobile robot. Read the robot's state log and "
       "answer with its next action.", "fixed robot profile (system message)"),
    _p("profile_file", "", "read the profile from this file instead ('' = use `profile`)"),
    _p("max_chunk_tokens", 1024, "longest chunk in tokens (longer ones are truncated)",
       min_value=8),
    _p("context_tokens", STREAM.max_context_tokens, "context maximum of each resource",
       min_value=256),
    # The action vocabulary is part of the fixed profile, so policy and reconciler read it.
    _p("actions.vocabulary", list(DEFAULT_ACTIONS), "typed actions, `name(arg: type, ...)` with "
       "type str|int|float|bool|a|b|c|$seen_name, bounded as int[min,max], float[min,max], "
       "str[..max] ([] and no schema: free text only)", element=str),
    _p("actions.schema", "", "the vocabulary as a JSON schema instead (anyOf of "
       "{name: const, args: {...}} objects; '' = use actions.vocabulary)"),
    _p("actions.in_profile", True, "append the action list and its syntax to the profile"),
    _p("actions.max_str_chars", 32, "longest text argument of an action (a str without its "
       "own [..max])", min_value=1),
]

RESOURCE = [
    _p("resource.kind", "openai", "'openai' (HTTP server) or 'local' (in-process engine)",
       choices=("openai", "local")),
    _p("resource.r1_url", "http://127.0.0.1:8001", "URL of server R1 (openai)"),
    _p("resource.r2_url", "http://127.0.0.1:8002", "URL of server R2 (openai); the policy asks "
       "the primary named by the latest SwapEvent, R1 before the first one"),
    _p("resource.served_model", "", "model name the servers answer to ('' = ask the server)"),
    _p("resource.timeout_s", 30.0, "HTTP timeout of one request", positive=True),
    _p("resource.threads", 0, "CPU threads of the local engine (0 = default)", min_value=0),
    _p("resource.dtype", "auto", "precision of the local engine: auto (the backend and "
       "precision measured fastest on this machine, once, then cached), float32 (the exact "
       "reference), bfloat16", choices=("auto", "float32", "bfloat16")),
]

POLICY = TOPICS + LIFECYCLE + ROBOT + STATE + RESOURCE + [
    _p("task", "Decide the robot's next action in one short line.",
       "instruction of each periodic query", dynamic=True),
    _p("rate_hz", STREAM.rate_hz, "decision rate (a query never starts while one is running)",
       positive=True, max_value=100.0, dynamic=True),
    _p("max_new_tokens", STREAM.max_new_tokens, "tokens generated per decision (an action not "
       "complete within them is published as not valid)", min_value=1, max_value=4096,
       dynamic=True),
    _p("temperature", 0.0, "sampling temperature of the servers' answers (0 = greedy; the "
       "in-process engines of all_in_one decode greedily only)", min_value=0.0, max_value=2.0,
       dynamic=True),
    _p("safe_action", "", "the action published once, for the controller to hold, when no "
       "valid decision came for stale_after_s, when the context would overflow, and on "
       "deactivation; an action of the vocabulary, e.g. wait() ('' = none: only warn)",
       dynamic=True),
    _p("stale_after_s", 5.0, "no valid decision for this long: the safe action, and a warning "
       "with the cause", positive=True, dynamic=True),
    _p("action_ttl_s", 5.0, "each action on csr/actions is valid until its query's start plus "
       "this long (valid_until); a decision that took longer is not published there",
       positive=True, dynamic=True),
    _p("hedge_after_s", 2.0, "a decision the primary server has not answered by then is asked "
       "on the other server too, against the state it holds since the last swap, and the "
       "primary is suspect (asked no more) until it answers; 0 = never", min_value=0.0,
       dynamic=True),
    _p("topics.actions", "csr/actions", "Action stream: the typed action of each valid "
       "decision"),
    _p("services.decide", "csr/decide", "Decide action of the policy node (a decision with "
       "feedback and cancel, queued like the Query service)"),
    _p("actions.mode", "auto", "auto: score a short closed action list (at most 8 actions) "
       "in one pass, else decode with the grammar; choice | grammar | json; free: "
       "unconstrained text, parsed after",
       choices=("auto", "choice", "grammar", "json", "free")),
    _p("actions.seen", [], "enumerations filled from the chunks seen, `name=regex` (group 1 is "
       "a value), used as `$name` in actions.vocabulary", element=str),
    _p("stale_instant_s", 10.0, "instant values older than this are left out of the suffix",
       positive=True, dynamic=True),
    _p("fetch_timeout_s", 5.0, "wait for a GetChunks answer before giving up on a gap",
       positive=True, dynamic=True),
]

RECONCILER = TOPICS + LIFECYCLE + CHUNKS + ROBOT + STATE + RESOURCE + [
    _p("tau_mem_tokens", STREAM.tau_mem_tokens, "static tokens that trigger reconciliation "
       "(eviction)", min_value=1),
    _p("n_catchup_tokens", STREAM.n_catchup_tokens, "catch up while the buffer holds more than "
       "this", min_value=0),
    _p("reserve_tokens", STREAM.reserve_tokens, "room kept for the dynamic part and the answer "
       "of one query", min_value=0),
    _p("startup_timeout_s", 600.0, "keep retrying to reach the resources this long",
       positive=True),
    _p("eviction.policy", "oldest_fraction", "eviction policy",
       choices=("oldest_fraction", "keep_recent_tokens")),
    _p("eviction.fraction", 0.5, "oldest_fraction: share of the chunks dropped",
       positive=True),
    _p("eviction.keep_tokens", 2048, "keep_recent_tokens: chunk tokens kept", min_value=0),
    _p("poll_hz", 10.0, "how often the driver is checked for a new version", positive=True),
]

SCHEMAS: dict[str, list[ParamSpec]] = {"aggregator": AGGREGATOR, "policy": POLICY,
                                       "reconciler": RECONCILER}


def schema(node: str) -> list[ParamSpec]:
    if node not in SCHEMAS:
        raise ConfigError(f"unknown node {node!r}; the nodes are {list(SCHEMAS)}")
    return SCHEMAS[node]


def source_schema(name: str) -> list[ParamSpec]:
    """The specs of one source, with full names `source.<name>.<key>`."""
    return [dataclasses.replace(s, name=f"source.{name}.{s.name}") for s in SOURCE]


def spec_of(node: str, name: str) -> ParamSpec | None:
    """The spec of parameter `name` of `node` (a source's too), or None."""
    for spec in schema(node):
        if spec.name == name:
            return spec
    if node == "aggregator" and name.startswith("source.") and name.count(".") >= 2:
        source = name.split(".")[1]
        return next((s for s in source_schema(source) if s.name == name), None)
    return None


def bounds(spec: ParamSpec) -> tuple[float | None, float | None]:
    """The inclusive range (low, high) a ROS descriptor can say for `spec` (None: unbounded on
    that side). `positive` is said as low 0 (a descriptor's range is closed); the node still
    refuses 0 itself."""
    low = spec.min_value
    if spec.positive and low is None:
        low = 0
    return low, spec.max_value


def constraints_text(spec: ParamSpec) -> str:
    """What the descriptor's `additional_constraints` says: choices, > 0, and whether the
    parameter may change while the node runs."""
    said = []
    if spec.choices:
        said.append(f"one of {list(spec.choices)}")
    if spec.positive:
        said.append("> 0")
    said.append("changes at run time, from the next decision" if spec.dynamic else
                "set before configure (a configured node refuses a change)")
    return "; ".join(said)


def check_change(node: str, name: str, value: Any, *, configured: bool,
                 current: Mapping[str, Any] | None = None) -> Any:
    """A parameter set while the node runs (`ros2 param set`): the checked value, or a
    ConfigError that says why it is refused (the node stays as it was).

    A configured node takes only `dynamic` parameters (the others are part of its cached
    prefix, models or topics); an unconfigured one takes any declared parameter, checked
    again at its next configure. `current`: the node's values, for the checks that need
    another parameter (a safe_action must be an action of the vocabulary)."""
    spec = spec_of(node, name)
    if spec is None:
        raise ConfigError(f"{node}: unknown parameter {name!r}")
    if configured and not spec.dynamic:
        changing = sorted(s.name for s in schema(node) if s.dynamic)
        raise ConfigError(
            f"{node}: {name} cannot change while the node is configured: it is part of what "
            "the node built at configure (the cached prefix, the models, the topics). "
            "Deactivate and clean up the node, set it, then configure it again. What changes "
            f"at run time: {', '.join(changing) or 'nothing'}")
    value = _check(node, spec, value, True)
    if spec.name == "safe_action" and configured and current is not None:
        check_safe_action(node, {**current, "safe_action": value})
    return value


def check_safe_action(node: str, values: Mapping[str, Any]):
    """The safe action parsed by the node's vocabulary (None when `safe_action` is ''), or an
    ActionSpecError that says why it is not an action the controller knows."""
    from csr_ros.errors import ActionParseError, ActionSpecError

    text = values.get("safe_action", "")
    if not text:
        return None
    vocab = vocabulary_from_params(values)
    if vocab is None:
        raise ActionSpecError(f"{node}: safe_action {text!r} needs an action vocabulary "
                              "(actions.vocabulary or actions.schema)")
    try:
        return vocab.parse_decision(text)
    except (ActionParseError, ActionSpecError) as exc:
        raise ActionSpecError(f"{node}: safe_action {text!r} is not an action of the "
                              f"vocabulary: {exc}") from None


# -- validation -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceConfig:
    name: str
    topic: str
    type_name: str          # normalized 'pkg/msg/Name'
    label: str
    period_s: float
    instant: bool
    render: RenderOptions
    emission: EmissionConfig = EmissionConfig()   # resolved: the type's defaults filled in


def validate(node: str, values: Mapping[str, Any], *,
             resolve_type: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Defaults applied, every value checked; raises ConfigError naming what is wrong.

    For the aggregator the result also holds 'sources': a list of `SourceConfig`
    (`resolve_type`, when given, must turn a type name into a message class or raise).
    """
    specs = schema(node)
    names = {s.name for s in specs}
    source_keys = [k for k in values if k.startswith("source.")] if node == "aggregator" else []
    unknown = [k for k in values if k not in names and k not in source_keys
               and not k.startswith("qos_overrides.") and k != "use_sim_time"]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, names, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        msg = f"{node}: unknown parameter(s) {', '.join(hints)}"
        raise ConfigError(msg)
    out = {s.name: _check(node, s, values.get(s.name, s.default), s.name in values)
           for s in specs}
    check_robot_id(out["robot_id"], where=f"{node}: robot_id {out['robot_id']!r}")
    if node == "aggregator":
        out["sources"] = parse_sources(out["sources"], values, resolve_type=resolve_type,
                                       render_defaults=out)
    if node in ("policy", "reconciler"):
        _check_actions(node, out)
    if node == "policy":
        check_safe_action(node, out)
    if node in ("policy", "reconciler") and out["resource.kind"] == "openai" \
            and not (out["resource.r1_url"] and out["resource.r2_url"]):
        raise ConfigError(f"{node}: resource.r1_url and resource.r2_url must name the servers")
    return out


MAX_ROBOT_ID_CHARS = 128
_ROBOT_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")


def check_robot_id(robot_id: str, *, where: str = "") -> str:
    """`robot_id` if it can name a robot ('' too: not set), else a ConfigError that says why.

    The id travels in an HTTP header (the routing key a router reads) and names the robot in
    diagnostics, so it is kept to characters that need no quoting anywhere and that no header
    or key syntax splits on: letters, digits, '_', '-', '.' and '/' (what a ROS namespace holds,
    plus '-' and '.'), starting with a letter, a digit or '_'.
    """
    if robot_id == "":
        return robot_id
    if len(robot_id) > MAX_ROBOT_ID_CHARS or not _ROBOT_ID.fullmatch(robot_id):
        subject = where or f"robot_id {robot_id!r}"
        raise ConfigError(
            f"{subject} cannot name a robot: it travels in an HTTP header (the "
            "routing key of its requests), so it may hold only letters, digits, '_', '-', '.' "
            f"and '/', start with a letter, a digit or '_', and be at most {MAX_ROBOT_ID_CHARS}"
            " characters long (e.g. robot_a, warehouse/robot-7)")
    return robot_id


def robot_id_for(robot_id: str, namespace: str) -> str:
    """The id a node goes by: its `robot_id` parameter when set, else its namespace without
    the leading slash ('/fleet/robot_a' → 'fleet/robot_a'; '' in the root namespace)."""
    return check_robot_id(robot_id) or namespace.strip("/")


def _check_actions(node: str, values: Mapping[str, Any]) -> None:
    """The action vocabulary and the seen-value patterns parse (ActionSpecError names why)."""
    from csr_ros.actions import SeenValues, Vocabulary
    from csr_ros.errors import ActionSpecError

    specs, schema = values["actions.vocabulary"], values["actions.schema"]
    try:
        vocab = None
        if specs or schema:
            vocab = Vocabulary.from_params(specs, schema,
                                           max_str_chars=values["actions.max_str_chars"])
        if node == "policy":
            seen = SeenValues.from_params(values["actions.seen"])
            missing = sorted(set(vocab.sources if vocab else ()) - set(seen.values()))
            if missing:
                raise ActionSpecError(f"actions.vocabulary uses ${missing[0]}, which "
                                      f"actions.seen does not define (add '{missing[0]}=REGEX')")
            if vocab is None and values["actions.mode"] != "free":
                raise ActionSpecError("actions.mode needs actions.vocabulary or actions.schema "
                                      "(or set actions.mode: free)")
    except ActionSpecError as exc:
        raise ActionSpecError(f"{node}: {exc}") from None


def parse_sources(names: Sequence[str], values: Mapping[str, Any], *,
                  resolve_type: Callable[[str], Any] | None = None,
                  render_defaults: Mapping[str, Any] | None = None) -> list[SourceConfig]:
    render_defaults = render_defaults or {}
    if not names:
        raise ConfigError("aggregator: `sources` is empty: list at least one source name and "
                          "describe it under source.<name> (topic, type)")
    if len(set(names)) != len(names):
        raise ConfigError(f"aggregator: `sources` names a source twice: {list(names)}")
    described = {k.split(".")[1] for k in values if k.startswith("source.") and k.count(".") >= 2}
    extra = sorted(described - set(names))
    if extra:
        msg = (f"aggregator: source.{extra[0]}.* is described but {extra[0]!r} is not in "
               f"`sources` {list(names)}; add it there or remove the description")
        raise ConfigError(msg)
    known = {s.name for s in SOURCE}
    sources = []
    for name in names:
        if not name or "." in name or "/" in name:
            raise ConfigError(f"aggregator: source name {name!r} must be non-empty and "
                              "contain neither '.' nor '/'")
        prefix = f"source.{name}."
        for key in values:
            if key.startswith(prefix) and key[len(prefix):] not in known:
                close = difflib.get_close_matches(key[len(prefix):], known, n=1)
                hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
                raise ConfigError(f"aggregator: unknown parameter {key!r}{hint}")
        v = {s.name[len(prefix):]: _check("aggregator", s, values.get(s.name, s.default),
                                          s.name in values)
             for s in source_schema(name)}
        try:
            type_name = normalize_type_name(v["type"])
        except ConfigError as exc:
            raise ConfigError(f"aggregator: source.{name}.type: {exc}") from None
        if resolve_type is not None:
            try:
                resolve_type(type_name)
            except ConfigError as exc:      # the package has no such type (a typo)
                raise ConfigError(f"aggregator: source.{name}.type: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - any other failure means "not installed"
                msg = (f"aggregator: source.{name}.type: message type {type_name!r} is not "
                       f"available ({type(exc).__name__}: {exc}); is its package installed "
                       "and the workspace sourced?")
                raise ConfigError(msg) from None
        fields = tuple(f.strip() for f in v["fields"].split(",") if f.strip())
        options = RenderOptions(fields=fields, summarize=v["summarize"],
                                float_digits=render_defaults.get("float_digits", 3),
                                max_array=render_defaults.get("max_array", 8),
                                max_chars=render_defaults.get("max_chars", 2000))
        emission = EmissionConfig(event=v["event"], keepalive_s=v["keepalive_s"],
                                  deadband_m=v["deadband_m"], deadband_deg=v["deadband_deg"],
                                  deadband_pct=v["deadband_pct"], deadband=v["deadband"])
        try:
            emission = emission.resolved(emission_kind(type_name, options),
                                         where=f"aggregator: source.{name}")
        except ConfigError as exc:
            raise ConfigError(f"{exc} ({type_name})") from None
        if v["period_s"] < 0 and v["period_s"] != UNSET:
            raise ConfigError(f"aggregator: source.{name}.period_s must be >= 0 (or -1 for the "
                              f"type's default), got {v['period_s']}")
        if v["period_s"] == UNSET:
            v["period_s"] = 0.0 if emission.event or v["instant"] else default_period_s(type_name)
        if emission.event and v["period_s"] > 0:
            raise ConfigError(f"aggregator: source.{name}: an event source is never coalesced; "
                              f"set period_s: 0.0 (got {v['period_s']})")
        if emission.event and v["instant"]:
            raise ConfigError(f"aggregator: source.{name}: `event` and `instant` exclude each "
                              "other (an event is history, an instant value is not)")
        sources.append(SourceConfig(name=name, topic=v["topic"], type_name=type_name,
                                    label=v["label"] or name, period_s=v["period_s"],
                                    instant=v["instant"], render=options, emission=emission))
    topics = [s.topic for s in sources]
    dup = sorted({t for t in topics if topics.count(t) > 1})
    if dup:
        raise ConfigError(f"aggregator: topic {dup[0]!r} is listed by two sources")
    return sources


def auto_source(name: str, topic: str, type_name: str, policy: TopicPolicy, *,
                render_defaults: Mapping[str, Any] | None = None) -> SourceConfig:
    """A source for a topic nobody configured, from its type's defaults
    (`render.topic_defaults`)."""
    render_defaults = render_defaults or {}
    options = RenderOptions(float_digits=render_defaults.get("float_digits", 3),
                            max_array=render_defaults.get("max_array", 8),
                            max_chars=min(render_defaults.get("max_chars", 2000),
                                          policy.max_chars))
    event = policy.action == EVENT
    kind = emission_kind(type_name, options)
    overrides = {} if event else {k: v for k, v in policy.emission.items()
                                  if k in KIND_DEFAULTS[kind]}
    emission = EmissionConfig(event=event, **overrides).resolved(kind, where=f"source.{name}")
    return SourceConfig(name=name, topic=topic, type_name=type_name,
                        label=topic.strip("/") or name, period_s=0.0 if event else
                        policy.period_s, instant=False, render=options, emission=emission)


_TYPE_WORDS = {bool: "a boolean (true/false)", int: "an integer", float: "a float",
               str: "a string", list: "a list"}
_VALUE_WORDS = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
                list: "a list", dict: "a mapping", type(None): "empty"}


def type_problem(spec: ParamSpec, value: Any) -> str | None:
    """What is wrong with the type of `value` for `spec`, said about this value; None if it
    fits. ROS 2 parameters are typed, so an integer does not set a float parameter."""
    kind = spec.kind
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return (f"must be a float: write {value}.0, not {value} "
                "(ROS 2 parameters are typed)")
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return None
    what = _VALUE_WORDS.get(type(value), type(value).__name__)
    msg = f"must be {_TYPE_WORDS[kind]}, got {what} {value!r}"
    if kind in (int, float) and isinstance(value, str):
        example = "2.0" if kind is float else "2"
        msg += f": {value!r} is a string, not a number (write a number such as {example}"
        msg += ", unquoted)" if _is_number(value) else ")"
    elif kind is bool and isinstance(value, str):
        msg += ": write true or false, unquoted"
    elif kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        msg += f": quote it (\"{value}\") to make it a string"
    elif kind is list and not isinstance(value, list):
        msg += f": write a list, e.g. [{value!r}]" if value not in (None, "") else ""
    return msg


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_value(node: str, spec: ParamSpec, value: Any) -> Any:
    """`value` for `spec` of `node`, or a ConfigError naming what is wrong (type, choice,
    range)."""
    return _check(node, spec, value, True)


def _check(node: str, spec: ParamSpec, value: Any, given: bool) -> Any:
    where = f"{node}: {spec.name}"
    if spec.required and (not given or value in ("", [], None)):
        raise ConfigError(f"{where} is missing: {spec.description}")
    kind = spec.kind
    problem = type_problem(spec, value)
    if problem is not None:
        raise ConfigError(f"{where} {problem}")
    if kind is list:
        element = spec.element or (type(spec.default[0]) if spec.default else str)
        bad = [x for x in value if not isinstance(x, element)]
        if bad:
            raise ConfigError(f"{where} must be a list of {element.__name__}, got {bad[0]!r}")
    if spec.choices and value not in spec.choices:
        raise ConfigError(f"{where} must be one of {list(spec.choices)}, got {value!r}")
    if spec.positive and not value > 0:
        raise ConfigError(f"{where} must be > 0, got {value}")
    if spec.min_value is not None and value < spec.min_value:
        raise ConfigError(f"{where} must be >= {spec.min_value}, got {value}")
    if spec.max_value is not None and value > spec.max_value:
        raise ConfigError(f"{where} must be <= {spec.max_value}, got {value}")
    return value


# -- parameter files --------------------------------------------------------------------------

def load_params_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """{node name: {dotted parameter name: value}} from a ROS 2 parameters YAML file.

    The sections of one node name under several namespaces (`/**/aggregator`, then a robot's
    own `/robot_b/aggregator` that sets only what differs) are merged in file order, the
    later value winning, as rclpy does for a node both match (so a file with the sections of
    several robots is checked as their merge)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read parameters file {path}: {exc.strerror}") from None
    return parse_params_yaml(text, source=str(path))


def parse_params_yaml(text: str, *, source: str = "<string>") -> dict[str, dict[str, Any]]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: a parameters file is a mapping of node names, "
                          f"got {type(doc).__name__}")
    nodes: dict[str, dict[str, Any]] = {}
    _collect_nodes(doc, "", nodes, source)
    if not nodes:
        raise ConfigError(f"{source}: no `ros__parameters` section found")
    return nodes


def _collect_nodes(tree: Mapping, prefix: str, out: dict, source: str) -> None:
    for key, value in tree.items():
        name = f"{prefix}/{str(key).strip('/')}" if prefix else str(key)
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {name!r} must hold `ros__parameters:` (or a "
                              f"namespace of nodes), got {type(value).__name__}")
        if "ros__parameters" in value:
            params = value["ros__parameters"]
            if not isinstance(params, dict):
                raise ConfigError(f"{source}: {name}.ros__parameters must be a mapping")
            # sections of one node (/**/policy, then /robot_b/policy) merge in file order,
            # the later value winning, as rclpy applies them to a node they both match
            out.setdefault(name.strip("/").rsplit("/", 1)[-1], {}).update(_flatten(params))
        elif all(isinstance(v, dict) for v in value.values()):
            _collect_nodes(value, name, out, source)
        else:
            raise ConfigError(f"{source}: {name!r} has no `ros__parameters:` section; write "
                              f"{name}: ros__parameters: {{...}}")


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def validate_file(path: str | Path, *, resolve_type: Callable[[str], Any] | None = None,
                  ) -> dict[str, dict[str, Any]]:
    """Validate every csr_ros node section of a parameters file; other nodes are left alone."""
    nodes = load_params_file(path)
    mine = {name: params for name, params in nodes.items() if name in SCHEMAS}
    if not mine:
        raise ConfigError(f"{path}: no section for any of the nodes {list(SCHEMAS)}")
    return {name: validate(name, params, resolve_type=resolve_type)
            for name, params in mine.items()}


# -- QoS matching (what `ros2 topic echo` does) -------------------------------------------------

@dataclass(frozen=True)
class QosChoice:
    reliable: bool
    transient_local: bool
    matched: bool            # False: no publisher yet, a profile compatible with any was chosen


def match_publishers(publishers: Sequence[tuple[bool, bool]]) -> QosChoice:
    """Subscription QoS from the publishers' (reliable, transient_local) offers.

    Reliable only if every publisher is reliable; transient local only if every publisher is.
    With no publisher yet: reliable and volatile. A best-effort subscriber drops what a new
    publisher sends before discovery completes on the subscriber's side (the first message of
    `ros2 topic pub --once` is lost that way); a reliable one gets it retransmitted. A
    best-effort publisher that appears later does not match it: the aggregator resubscribes
    when it sees one (incompatible-QoS event, and the periodic recheck).
    """
    if not publishers:
        return QosChoice(reliable=True, transient_local=False, matched=False)
    return QosChoice(reliable=all(r for r, _ in publishers),
                     transient_local=all(t for _, t in publishers), matched=True)


# -- the command line of a node ------------------------------------------------------------------

def params_files_in_args(args: Sequence[str]) -> list[str]:
    """The `--params-file PATH` values of ROS arguments (inside `--ros-args ... [--]`)."""
    files, inside, it = [], False, iter(args)
    for arg in it:
        if arg == "--ros-args":
            inside = True
        elif arg == "--" and inside:
            inside = False
        elif inside and arg == "--params-file":
            files.append(next(it, ""))
    return files


def check_params_files(args: Sequence[str]) -> None:
    """Each params file of a node's command line exists and is a parameters file, or a
    ConfigError says which and why (before rclpy turns it into a raw RCLError)."""
    for path in params_files_in_args(args):
        if not path:
            raise ConfigError("--params-file is given without a file")
        if not Path(path).is_file():
            where = "does not exist" if not Path(path).exists() else "is not a file"
            raise ConfigError(f"parameters file {path} {where}; pass an existing file with "
                              "--ros-args --params-file FILE (the package's own is "
                              "config/csr_ros.yaml)")
        load_params_file(path)


# -- the state every node builds from the same parameters ---------------------------------------

def vocabulary_from_params(params: Mapping):
    """The action vocabulary of the `actions.*` parameters, or None (free text only)."""
    from csr_ros.actions import Vocabulary

    specs, schema = params.get("actions.vocabulary", []), params.get("actions.schema", "")
    if not specs and not schema:
        return None
    return Vocabulary.from_params(specs, schema, max_str_chars=params.get("actions.max_str_chars",
                                                                           32))


def chunk_log_options(params: Mapping, *, keep_state: bool) -> dict[str, Any]:
    """`ChunkLog(path, **options)` from the `chunk_log_*` parameters. `keep_state`: the log
    folds into a state that must be rebuilt (the reconciler's); False for a log that is only
    history (the aggregator's: late joiners get what retention leaves)."""
    from csr_ros.chunklog import Retention

    retain_bytes = params["chunk_log_retention.retain_bytes"]
    retain_s = params["chunk_log_retention.retain_s"]
    retention = None
    if retain_bytes or retain_s:
        try:
            retention = Retention(retain_bytes=retain_bytes or None, retain_s=retain_s or None,
                                  action=params["chunk_log_retention.action"],
                                  compress=params["chunk_log_retention.compress"],
                                  keep_state=keep_state)
        except ConfigError as exc:
            raise ConfigError(f"chunk_log_retention: {exc}") from None
    return {"max_segment_bytes": params["chunk_log_segment_bytes"], "retention": retention}


def state_from_params(params: Mapping, tokenizer) -> CsrState:
    """The empty CsrState of the `model`/`mode`/`profile` parameters (policy and reconciler
    must build the same one, or their tokens differ)."""
    from pathlib import Path

    from csr_ros.chunks import ChunkPolicy
    from csr_ros.layout import Layout
    from csr_ros.state import CsrState

    profile = params["profile"]
    if params.get("profile_file"):
        path = Path(params["profile_file"]).expanduser()
        try:
            profile = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"profile_file {path}: {exc.strerror}") from None
    vocab = vocabulary_from_params(params)
    if vocab is not None and params.get("actions.in_profile", True):
        profile = profile.rstrip() + "\n" + vocab.describe()
    layout = Layout.from_tokenizer(tokenizer, use_chat_template=params["use_chat_template"])
    # truncate, never split: one StateChunk is one Chunk with the same seq on every node
    policy = ChunkPolicy(max_chunk_tokens=params["max_chunk_tokens"], oversize="truncate")
    return CsrState(tokenizer=tokenizer, layout=layout, profile=profile, mode=params["mode"],
                    policy=policy)
