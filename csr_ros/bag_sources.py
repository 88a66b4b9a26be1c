"""Which source renders each topic of a recorded bag, and the bag's messages in order.

    plan = plan_sources([bag], params_file)      # topic → source, and why for every topic
    for topic, t_ns, msg in read_bag([bag], plan.sources): ...

rosbag2 (sqlite3, mcap) and ROS 1 bags are read with rosbags (no ROS install needed); custom
message types are learnt from the bag. A params file's sources render their topics (as the
bag's type when it differs). Bag topics the params file does not name are not dropped: a
configured source whose topic is absent takes the one bag topic of its type no source names
(only when there is exactly one: `match_by_type`), and every other topic gets its type's
defaults (`csr_ros.render.topic_defaults`: an event, a change-filtered state, or left out with
the reason). The chunks themselves: csr_ros.bag_replay.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from csr_ros.errors import ConfigError
from csr_ros.render import EmissionConfig, emission_kind
from csr_ros.render.topic_defaults import OMIT, topic_policy, type_policy
from csr_ros.ros_params import SourceConfig, auto_source, load_params_file, validate


def read_bag(paths: list[Path], topics: Iterable[str]) -> Iterator[tuple[str, int, Any]]:
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    with AnyReader(paths, default_typestore=get_typestore(Stores.ROS2_JAZZY)) as reader:
        wanted = set(topics)
        connections = [c for c in reader.connections if c.topic in wanted]
        for connection, t_ns, raw in reader.messages(connections=connections):
            yield connection.topic, t_ns, reader.deserialize(raw, connection.msgtype)



def bag_info(paths: list[Path]) -> tuple[dict[str, str], dict[str, int], float]:
    """topic → type, topic → message count, and the bag's duration in seconds."""
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    with AnyReader(paths, default_typestore=get_typestore(Stores.ROS2_JAZZY)) as reader:
        counts: dict[str, int] = {}
        for c in reader.connections:
            counts[c.topic] = counts.get(c.topic, 0) + (c.msgcount or 0)
        duration_s = (reader.end_time - reader.start_time) / 1e9 if counts else 0.0
        return {c.topic: c.msgtype for c in reader.connections}, counts, duration_s


@dataclass
class TopicPlan:
    """What replay does with one topic of the bag, and why (`--stats`, `--json`)."""
    type_name: str
    messages: int
    source: str | None          # the source that renders it; None: left out
    origin: str                 # config | matched | auto | left out | not configured
    policy: str                 # event, state with its period, or the reason it is left out
    note: str = ""


@dataclass
class SourcePlan:
    sources: dict[str, SourceConfig]          # bag topic → source
    topics: dict[str, TopicPlan]              # every topic of the bag
    absent: dict[str, str]                    # configured source → its topic, not in the bag
    notes: list[str]                          # what was matched or retyped, for stderr

    @property
    def left_out(self) -> dict[str, TopicPlan]:
        return {t: p for t, p in self.topics.items() if p.source is None}


def _source_name(topic: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", topic.strip("/")) or "root"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if len(w) >= 3}


def _related(a: str, b: str) -> bool:
    """Whether two names share a word (one word inside the other counts: odom, odometry)."""
    return any(x in y or y in x for x in _words(a) for y in _words(b) if min(len(x), len(y)) >= 4
               or x == y)


def match_by_type(configured: list[SourceConfig], in_bag: Mapping[str, str],
                  ) -> dict[str, tuple[str, str] | str]:
    """Configured sources whose topic is not in the bag → (bag topic, why) when exactly one fits,
    else the reason none was taken (a str). Instant sources are never matched.

    A bag topic fits a source when it has the source's type and no source names it. It is taken
    when it is the only one that fits and no other absent source of that type could take it;
    otherwise when it is the only fitting topic whose name shares a word with the source's
    topic or name, and no other absent source's name shares one with it."""
    named = {s.topic for s in configured}
    absent = [s for s in configured if s.topic not in in_bag and not s.instant]
    fits = {s.name: sorted(t for t, m in in_bag.items() if m == s.type_name and t not in named)
            for s in absent}
    out: dict[str, tuple[str, str] | str] = {}
    for s in absent:
        cands = fits[s.name]
        rivals = [r for r in absent if r.name != s.name and r.type_name == s.type_name]
        if not cands:
            continue
        if len(cands) == 1 and not any(cands[0] in fits[r.name] for r in rivals):
            out[s.name] = (cands[0], f"the bag's only {s.type_name} topic that no source names")
            continue
        by_name = [t for t in cands if _related(t, s.topic) or _related(t, s.name)]
        if len(by_name) == 1 and not any(
                by_name[0] in fits[r.name] and (_related(by_name[0], r.topic)
                                                or _related(by_name[0], r.name))
                for r in rivals):
            out[s.name] = (by_name[0], f"the only {s.type_name} topic that no source names "
                                       "with a name like it")
            continue
        out[s.name] = ""
    taken = {v[0] for v in out.values() if isinstance(v, tuple)}
    for name, found in list(out.items()):
        if isinstance(found, tuple):
            continue
        left = [t for t in fits[name] if t not in taken]
        if not left:
            del out[name]
            continue
        out[name] = (f"not matched: {len(left)} topics of its type could be it "
                     f"({', '.join(left)}) and no name tells which; rendered with their type's "
                     "defaults" if len(left) > 1 else
                     f"not matched: {left[0]} has its type, but so has another absent source "
                     "and no name tells which; rendered with its type's defaults")
    return out


def _describe(source: SourceConfig) -> str:
    if source.instant:
        return "instant"
    if source.emission.event:
        return "event"
    return "state" + (f", period {source.period_s:g} s" if source.period_s else "")


def plan_sources(paths: list[Path], params_file: Path | None, topics: list[str] | None = None,
                 *, only_configured: bool = False) -> SourcePlan:
    """Which source renders each bag topic.

    A params file's sources render their topics (as the bag's type when it differs). A source
    whose topic is not in the bag takes a bag topic of its type that no source names, when that
    is unambiguous (`match_by_type`). Every other topic gets its type's defaults
    (`render.topic_defaults`): an event, a change-filtered state, or left out with the reason;
    `only_configured` renders the params file's topics alone. Without a params file every topic
    gets its type's defaults.
    """
    in_bag, counts, duration_s = bag_info(paths)
    plan = SourcePlan(sources={}, topics={}, absent={}, notes=[])
    render_defaults: Mapping[str, Any] = {}
    if params_file is not None:
        nodes = load_params_file(params_file)
        if "aggregator" not in nodes:
            raise ConfigError(f"{params_file}: no `aggregator` section")
        params = validate("aggregator", nodes["aggregator"])
        render_defaults = params
        configured = params["sources"]
        matches = {} if only_configured else match_by_type(configured, in_bag)
        for source in configured:
            origin, note = "config", ""
            if source.topic not in in_bag:
                found = matches.get(source.name)
                if isinstance(found, str) or found is None:
                    plan.absent[source.name] = source.topic
                    if found:
                        plan.notes.append(f"source {source.name}: {source.topic} is not in the "
                                          f"bag; {found}")
                    continue
                topic, why = found
                origin = "matched"
                note = f"configured as {source.topic}, which is not in the bag; {why}"
                plan.notes.append(f"source {source.name}: {source.topic} is not in the bag; "
                                  f"rendering {topic}, {why}")
                source = replace(source, topic=topic)
            if in_bag[source.topic] != source.type_name:
                note = (f"configured as {source.type_name}; deadbands: the bag type's defaults"
                        if not source.emission.event else
                        f"configured as {source.type_name}")
                plan.notes.append(f"source {source.name}: {source.topic} is "
                                  f"{in_bag[source.topic]} in the bag, not {source.type_name}; "
                                  f"rendering it as {in_bag[source.topic]}")
                source = retyped(source, in_bag[source.topic])
            plan.sources[source.topic] = source
            plan.topics[source.topic] = TopicPlan(
                type_name=in_bag[source.topic], messages=counts.get(source.topic, 0),
                source=source.name, origin=origin, policy=_describe(source), note=note)
    taken = {s.name for s in plan.sources.values()} | set(plan.absent)
    wanted = set(topics or ())
    for topic, type_name in sorted(in_bag.items()):
        if topic in plan.sources:
            continue
        n = counts.get(topic, 0)
        if only_configured and params_file is not None and topic not in wanted:
            plan.topics[topic] = TopicPlan(type_name, n, None, "not configured",
                                           "left out: --only-configured")
            continue
        policy = topic_policy(type_name, topic, rate_hz=n / max(duration_s, 1.0), count=n)
        if policy.action == OMIT and topic in wanted:
            policy = type_policy("unknown/msg/Asked", topic)     # named with --topics: rendered
        if policy.action == OMIT:
            plan.topics[topic] = TopicPlan(type_name, n, None, "left out", policy.describe())
            continue
        source = auto_source(_source_name(topic, taken), topic, type_name, policy,
                             render_defaults=render_defaults)
        plan.sources[topic] = source
        plan.topics[topic] = TopicPlan(type_name, n, source.name, "auto", policy.describe())
    if topics:
        missing = sorted(set(topics) - set(plan.sources))
        if missing:
            raise ConfigError(f"topics {missing} are not in the bag (or not sources); the bag "
                              f"has {sorted(in_bag)}")
        plan.sources = {t: s for t, s in plan.sources.items() if t in topics}
    return plan


def sources_for(paths: list[Path], params_file: Path | None, topics: list[str] | None,
                *, only_configured: bool = False) -> dict[str, SourceConfig]:
    """topic → source (`plan_sources`), its notes printed as warnings."""
    plan = plan_sources(paths, params_file, topics, only_configured=only_configured)
    for note in plan.notes:
        print(f"warning: {note}", file=sys.stderr)
    return plan.sources


def retyped(source: SourceConfig, type_name: str) -> SourceConfig:
    """The source with the bag's message type (deadbands fall back to that type's defaults)."""
    e = source.emission
    emission = EmissionConfig(event=e.event, keepalive_s=e.keepalive_s).resolved(
        emission_kind(type_name, source.render), where=f"source.{source.name}")
    return replace(source, type_name=type_name, emission=emission)


def known_type_checker():
    """type name → rosbags' Jazzy message class (None for a package it does not know, such as
    vision_msgs), LookupError for a message its package lacks; None without rosbags."""
    try:
        from rosbags.typesys import Stores, get_typestore
    except ImportError:
        return None
    types = get_typestore(Stores.ROS2_JAZZY).types
    packages = {name.split("/")[0] for name in types}

    def check(type_name: str):
        if type_name.split("/")[0] in packages and type_name not in types:
            raise LookupError(f"package {type_name.split('/')[0]} has no message "
                              f"{type_name.split('/')[-1]}")
        return types.get(type_name)
    return check
