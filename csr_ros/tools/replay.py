"""`csr-ros replay BAG`: render a recorded bag into chunks with the aggregator's emitter.

    csr-ros replay run1/                                   every topic, printed one per line
    csr-ros replay run1/ --params config/csr_ros.yaml      the aggregator's sources and policy
    csr-ros replay run1/ --params config/csr_ros.yaml --stats --json stats.json
    csr-ros replay run1.bag --jsonl chunks.jsonl --chunk-log chunks.log
    csr-ros replay run1/ --play --rate 2 --delay 10 --clock    publish it on the ROS graph

rosbag2 (sqlite3, mcap) and ROS 1 bags are read with rosbags (no ROS install needed); custom
message types are learnt from the bag. Minimum periods, deadbands and keep-alives run on the
bag's clock with the same `Emitter` the aggregator node uses, so the chunks are the ones the
aggregator would have published live. `--stats` counts, per source, the messages, chunks,
tokens (of the policy model's tokenizer, SmolLM2 by default), tokens per second of robot time
and the messages coalesced or suppressed, and how many minutes of the bag the reconciler's
`tau_mem_tokens` holds. A chunk log written here can seed a reconciler (its `chunk_log`).

Bag topics the params file does not name are not dropped: a configured source whose topic is
absent takes the one bag topic of its type no source names (only when there is exactly one),
and every other topic gets its type's defaults (`csr_ros.render.topic_defaults`: an event, a
change-filtered state, or left out with the reason); `--stats`/`--json` list which, and every
event source's chunks against the bag's messages. `--only-configured` renders the params file's
topics alone.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from csr_ros.errors import ConfigError
from csr_ros.render import EmissionConfig, Emitted, Emitter, emission_kind
from csr_ros.render.topic_defaults import OMIT, topic_policy, type_policy
from csr_ros.ros_params import SCHEMAS, SourceConfig, auto_source, load_params_file, validate

DEFAULT_TAU_MEM_TOKENS = next(s.default for s in SCHEMAS["reconciler"]
                              if s.name == "tau_mem_tokens")


@dataclass(frozen=True)
class ReplayedChunk:
    seq: int              # gap-free over history chunks; -1 for instant values
    source: str
    stamp_ns: int         # header stamp, else bag time
    t_ns: int             # bag time of the message
    text: str
    coalesced: int        # messages replaced while held by the minimum period
    suppressed: int       # unchanged messages since the source's previous chunk
    reason: str           # first | change | keepalive | event | instant
    instant: bool


def make_emitter(sources: Mapping[str, SourceConfig]) -> Emitter:
    return Emitter(sources.values())


def replay_chunks(messages: Iterable[tuple[str, int, Any]], sources: Mapping[str, SourceConfig],
                  *, emitter: Emitter | None = None) -> Iterator[ReplayedChunk]:
    """(topic, bag time ns, message) in bag order → chunks, as the aggregator makes them."""
    by_topic = {topic: s.name for topic, s in sources.items()}
    emitter = emitter or make_emitter(sources)
    seq = 0

    def chunk(e: Emitted) -> ReplayedChunk:
        nonlocal seq
        out = ReplayedChunk(seq=-1 if e.instant else seq, source=e.source, stamp_ns=e.stamp_ns,
                            t_ns=e.now_ns, text=e.text, coalesced=e.n_coalesced,
                            suppressed=e.n_suppressed, reason=e.reason, instant=e.instant)
        seq += not e.instant
        return out

    last_ns = 0
    for topic, t_ns, msg in messages:
        name = by_topic.get(topic)
        if name is None:
            continue
        last_ns = max(last_ns, t_ns)
        for e in emitter.poll(t_ns):
            yield chunk(e)
        for e in emitter.offer(name, msg, t_ns):
            yield chunk(e)
    for e in emitter.flush(last_ns):
        yield chunk(e)


def read_bag(paths: list[Path], topics: Iterable[str]) -> Iterator[tuple[str, int, Any]]:
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    with AnyReader(paths, default_typestore=get_typestore(Stores.ROS2_JAZZY)) as reader:
        wanted = set(topics)
        connections = [c for c in reader.connections if c.topic in wanted]
        for connection, t_ns, raw in reader.messages(connections=connections):
            yield connection.topic, t_ns, reader.deserialize(raw, connection.msgtype)


def bag_topics(paths: list[Path]) -> dict[str, str]:
    return bag_info(paths)[0]


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", type=Path, nargs="+",
                        help="rosbag2 directory/file or ROS 1 .bag (several for split bags)")
    parser.add_argument("--params", type=Path, default=None,
                        help="parameters file: use its aggregator sources (topics, periods, "
                             "deadbands, keep-alives, events) and its reconciler's tau_mem")
    parser.add_argument("--topics", nargs="+", default=None, help="only these topics")
    parser.add_argument("--only-configured", action="store_true",
                        help="with --params: render only the topics the params file names "
                             "(no source matched by type, no topic added with its type's "
                             "defaults)")
    parser.add_argument("--jsonl", type=Path, default=None, help="write chunks as JSON lines")
    parser.add_argument("--chunk-log", type=Path, default=None,
                        help="append the history chunks to this chunk log")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many chunks")
    parser.add_argument("--play", action="store_true",
                        help="publish the bag on the ROS graph instead (rclpy; for machines "
                             "without `ros2 bag play`): --rate, --start-offset, --delay, "
                             "--clock, --topics")
    from csr_ros.nodes.player import add_play_arguments

    add_play_arguments(parser)
    parser.add_argument("--stats", action="store_true",
                        help="print per-source chunks, tokens, tokens per robot-second, "
                             "coalesced and suppressed messages (instead of the chunks)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the statistics as JSON to this file (implies counting)")
    parser.add_argument("--plot", type=Path, default=None,
                        help="PNG of the history tokens per source against robot time, with "
                             "tau_mem (implies counting)")
    parser.add_argument("--model", default="smollm2",
                        help="model directory, 'smollm2' or a prepared catalog model whose "
                             "tokenizer counts the tokens")


@dataclass
class SourceTally:
    topic: str
    type_name: str
    event: bool
    origin: str = "config"      # config | matched | auto
    policy: str = ""
    bag_messages: int = 0
    chunks: int = 0
    tokens: int = 0
    instant_chunks: int = 0


def tau_mem_tokens(params_file: Path | None) -> int:
    if params_file is None:
        return DEFAULT_TAU_MEM_TOKENS
    nodes = load_params_file(params_file)
    if "reconciler" not in nodes:
        return DEFAULT_TAU_MEM_TOKENS
    return int(validate("reconciler", nodes["reconciler"])["tau_mem_tokens"])


def stats_report(tallies: Mapping[str, SourceTally], emitter: Emitter, duration_s: float,
                 tau_mem: int, bag: list[Path], params: Path | None, n_jumps: int,
                 not_rendered: Mapping[str, str] | None = None,
                 plan: SourcePlan | None = None) -> dict:
    """The numbers `--stats` prints and `--json` writes (history chunks; instant ones apart)."""
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    sources = {}
    for name, t in tallies.items():
        st = emitter.stats[name]
        sources[name] = {
            "topic": t.topic, "type": t.type_name, "event": t.event, "origin": t.origin,
            "policy": t.policy,
            "bag_messages": t.bag_messages, "messages": st.received, "chunks": t.chunks,
            "instant_chunks": t.instant_chunks, "tokens": t.tokens,
            "tokens_per_s": round(per_s(t.tokens), 3),
            "tokens_per_chunk": round(t.tokens / t.chunks, 2) if t.chunks else 0.0,
            "coalesced": st.coalesced, "suppressed": st.suppressed,
            "time_resets": st.time_resets, "render_errors": st.render_errors}
    tokens = sum(t.tokens for t in tallies.values())
    rate = per_s(tokens)
    events = {name: {"topic": s["topic"], "bag_messages": s["bag_messages"],
                     "chunks": s["chunks"], "kept": s["chunks"] == s["bag_messages"]}
              for name, s in sources.items() if s["event"]}
    return {
        "bag": [str(p) for p in bag], "params": str(params) if params else None,
        "robot_time_s": round(duration_s, 3),
        "totals": {"messages": sum(s["messages"] for s in sources.values()),
                   "chunks": sum(t.chunks for t in tallies.values()), "tokens": tokens,
                   "tokens_per_s": round(rate, 3),
                   "coalesced": sum(s["coalesced"] for s in sources.values()),
                   "suppressed": sum(s["suppressed"] for s in sources.values()),
                   "time_resets": n_jumps},
        "tau_mem_tokens": tau_mem,
        "tau_mem_minutes": round(tau_mem / rate / 60.0, 2) if rate > 0 else None,
        "sources": sources,
        "events": events,
        "events_not_rendered": (lost := {
            t: {"type": p.type_name, "messages": p.messages, "why": p.policy}
            for t, p in (plan.left_out if plan else {}).items()
            if p.messages and type_policy(p.type_name, t).action == "event"}),
        "all_events_kept": all(e["kept"] for e in events.values()) and not lost,
        "topics": {t: vars(p) for t, p in (plan.topics if plan else {}).items()},
        "left_out": {t: {"type": p.type_name, "messages": p.messages, "why": p.policy}
                     for t, p in (plan.left_out if plan else {}).items()},
        "sources_not_in_bag": dict(plan.absent if plan else {}),
        "topics_not_rendered": dict(not_rendered or {}),
    }


def plot_tokens(timeline: list[tuple[float, str, int]], report: dict, path: Path) -> Path:
    """Cumulative history tokens per source (and in all) against robot time, with tau_mem."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    t0 = timeline[0][0] if timeline else 0.0
    for name in report["sources"]:
        points = [(t - t0, n) for t, s, n in timeline if s == name]
        if points:
            xs, ys = zip(*points)
            ax.step([x / 60 for x in xs], np.cumsum(ys), where="post", label=name)
    if timeline:
        xs = [(t - t0) / 60 for t, _, _ in timeline]
        ax.step(xs, np.cumsum([n for _, _, n in timeline]), where="post", color="black",
                label=f"all ({report['totals']['tokens_per_s']:.1f} tokens/s)")
    ax.axhline(report["tau_mem_tokens"], color="grey", linestyle="--",
               label=f"tau_mem {report['tau_mem_tokens']} tokens")
    ax.set_xlabel("robot time (min)")
    ax.set_ylabel("history tokens (cumulative)")
    ax.set_title(f"{Path(report['bag'][0]).name}: history tokens per source")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_stats(report: dict) -> None:
    rows = [("source", "type", "msgs", "chunks", "tokens", "tok/s", "tok/chunk", "coalesced",
             "suppressed")]
    for name, s in report["sources"].items():
        marks = [m for m, on in (("event", s["event"]), ("auto", s.get("origin") == "auto"),
                                 ("matched", s.get("origin") == "matched")) if on]
        rows.append((name + (f" ({', '.join(marks)})" if marks else ""),
                     s["type"].split("/")[-1],
                     str(s["messages"]), str(s["chunks"] + s["instant_chunks"]),
                     str(s["tokens"]), f"{s['tokens_per_s']:.2f}", f"{s['tokens_per_chunk']:.1f}",
                     str(s["coalesced"]), str(s["suppressed"])))
    t = report["totals"]
    rows.append(("total", "", str(t["messages"]), str(t["chunks"]), str(t["tokens"]),
                 f"{t['tokens_per_s']:.2f}", "", str(t["coalesced"]), str(t["suppressed"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))))
    events = report.get("events") or {}
    lost = report.get("events_not_rendered") or {}
    if events or lost:
        print("events kept (chunks/bag messages): " + ", ".join(
            f"{name} {e['chunks']}/{e['bag_messages']}" for name, e in events.items())
            + "".join(f", {t} 0/{e['messages']}" for t, e in lost.items())
            + ("; all kept" if report["all_events_kept"] else "; NOT ALL KEPT"))
    for topic, p in (report.get("topics") or {}).items():
        if p["origin"] in ("auto", "matched"):
            print(f"{p['origin']}: {topic} ({p['type_name']}, {p['messages']} msgs) as "
                  f"{p['source']}: {p['note'] or p['policy']}")
    for topic, p in (report.get("left_out") or {}).items():
        print(f"left out: {topic} ({p['type']}, {p['messages']} msgs): "
              f"{p['why'].removeprefix('left out: ')}")
    for name, topic in (report.get("sources_not_in_bag") or {}).items():
        print(f"not in the bag: source {name} ({topic})")
    minutes = report["tau_mem_minutes"]
    print(f"robot time {report['robot_time_s']:.1f} s; tau_mem {report['tau_mem_tokens']} tokens "
          f"holds {minutes if minutes is not None else 'all'} minutes of it"
          + (f"; clock went backwards {t['time_resets']} times" if t["time_resets"] else ""))


def run(args: argparse.Namespace) -> int:
    for path in args.bag:
        if not path.exists():
            raise ConfigError(f"bag {path} does not exist")
    if args.play:
        from csr_ros.nodes.player import run_play

        return run_play(args)
    plan = plan_sources(args.bag, args.params, args.topics,
                        only_configured=args.only_configured)
    for note in plan.notes:
        print(f"warning: {note}", file=sys.stderr)
    sources = plan.sources
    counting = args.stats or args.json is not None or args.plot is not None
    if not args.stats:
        for topic, p in plan.left_out.items():
            print(f"note: {topic} ({p.type_name}) not rendered: "
                  f"{p.policy.removeprefix('left out: ')}", file=sys.stderr)
    tokenizer = None
    if counting:
        from csr_ros.model_store import resolve_model_dir
        from csr_ros.tokenizer import HFTokenizer

        tokenizer = HFTokenizer(resolve_model_dir(args.model, weights=False))
        tau_mem = tau_mem_tokens(args.params)
    in_bag, bag_counts, duration_s = bag_info(args.bag)
    not_rendered = {t: m for t, m in in_bag.items() if t not in sources}
    timeline: list[tuple[float, str, int]] = []
    emitter = make_emitter(sources)
    chunks = replay_chunks(read_bag(args.bag, sources), sources, emitter=emitter)
    tallies = {s.name: SourceTally(topic=t, type_name=s.type_name, event=s.emission.event,
                                   origin=plan.topics[t].origin, policy=plan.topics[t].policy,
                                   bag_messages=bag_counts.get(t, 0))
               for t, s in sources.items()}
    out = args.jsonl.open("w", encoding="utf-8") if args.jsonl else None
    log = None
    if args.chunk_log is not None:
        from csr_ros.chunklog import ChunkLog

        log = ChunkLog(args.chunk_log)
        if log.records:
            log.close()
            raise ConfigError(f"chunk log {args.chunk_log} already holds records; replay into a "
                              "new file so its seqs start at 0")
    n, n_jumps = 0, 0
    try:
        for chunk in chunks:
            for jump in emitter.pop_time_jumps():
                n_jumps += 1
                print(f"warning: {jump.source}: the clock went back {jump.back_s:.1f} s; its "
                      "state was reset", file=sys.stderr)
            for source, error in emitter.pop_errors():
                print(f"warning: {source}: cannot render: {error}", file=sys.stderr)
            tally = tallies[chunk.source]
            if chunk.instant:
                tally.instant_chunks += 1
            else:
                tally.chunks += 1
                if tokenizer is not None:
                    from csr_ros.chunks import normalize

                    n_tokens = len(tokenizer.encode_data(normalize(chunk.text)))
                    tally.tokens += n_tokens
                    timeline.append((chunk.t_ns / 1e9, chunk.source, n_tokens))
            if out is not None:
                out.write(json.dumps(vars(chunk), ensure_ascii=False) + "\n")
            elif not counting:
                print(f"{'instant' if chunk.instant else chunk.seq:>7} {chunk.text}")
            if log is not None and not chunk.instant:
                from csr_ros.state import Chunk, Seq

                log.append_chunk(Chunk(seq=Seq(chunk.seq), source=chunk.source,
                                       stamp_ns=chunk.stamp_ns, text=chunk.text, token_ids=()))
            n += 1
            if args.limit is not None and n >= args.limit:
                break
    finally:
        if out is not None:
            out.close()
        if log is not None:
            log.close()
    for jump in emitter.pop_time_jumps():
        n_jumps += 1
        print(f"warning: {jump.source}: the clock went back {jump.back_s:.1f} s; its state was "
              "reset", file=sys.stderr)
    if counting:
        report = stats_report(tallies, emitter, duration_s, tau_mem, args.bag, args.params,
                              n_jumps, not_rendered, plan)
        if args.stats:
            print_stats(report)
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        if args.plot is not None:
            print(f"wrote {plot_tokens(timeline, report, args.plot)}", file=sys.stderr)
    print(f"{n} chunks from {len(sources)} topics", file=sys.stderr)
    return 0
