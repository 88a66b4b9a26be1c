"""A recorded bag rendered into chunks with the aggregator's emitter, counted per source.

    chunks = replay_chunks(read_bag(paths, sources), sources)      # as the aggregator makes them
    replayed = replay_bag(paths, plan, tokenizer=tokenizer)        # counted (`csr-ros replay`)
    report = replayed.report(tau_mem_tokens(params), paths, params, plan)

Minimum periods, deadbands and keep-alives run on the bag's clock with the same `Emitter` the
aggregator node uses, so the chunks are the ones the aggregator would have published live.
The report counts, per source, the messages, chunks, tokens (of the policy model's
tokenizer), tokens per second of robot time and the messages coalesced or suppressed, how many
minutes of the bag the reconciler's `tau_mem_tokens` holds, and every event source's chunks
against the bag's messages. Which source renders which topic: csr_ros.bag_sources.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from csr_ros.bag_sources import SourcePlan, bag_info, read_bag
from csr_ros.errors import ConfigError
from csr_ros.render import Emitted, Emitter
from csr_ros.render.topic_defaults import type_policy
from csr_ros.ros_params import SourceConfig, load_params_file, validate
from csr_ros.stream_defaults import ROBOT


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
    """The reconciler's tau_mem in a params file, else the robot's default."""
    if params_file is None:
        return ROBOT.tau_mem_tokens
    nodes = load_params_file(params_file)
    if "reconciler" not in nodes:
        return ROBOT.tau_mem_tokens
    return int(validate("reconciler", nodes["reconciler"])["tau_mem_tokens"])


@dataclass
class Replayed:
    """What `replay_bag` counted."""
    emitter: Emitter
    tallies: dict[str, SourceTally]                  # per source name
    duration_s: float                                # the bag's robot time
    not_rendered: dict[str, str]                     # bag topic → type, for no source
    timeline: list[tuple[float, str, int]] = field(default_factory=list)  # (s, source, tokens)
    n_chunks: int = 0
    n_jumps: int = 0                                 # times a source's clock went back

    def report(self, tau_mem: int, bag: list[Path], params: Path | None,
               plan: SourcePlan | None = None) -> dict:
        """The numbers `--stats` prints and `--json` writes (history chunks; instant ones
        apart)."""
        per_s = (lambda x: x / self.duration_s) if self.duration_s > 0 else (lambda x: 0.0)
        sources = {}
        for name, t in self.tallies.items():
            st = self.emitter.stats[name]
            sources[name] = {
                "topic": t.topic, "type": t.type_name, "event": t.event, "origin": t.origin,
                "policy": t.policy,
                "bag_messages": t.bag_messages, "messages": st.received, "chunks": t.chunks,
                "instant_chunks": t.instant_chunks, "tokens": t.tokens,
                "tokens_per_s": round(per_s(t.tokens), 3),
                "tokens_per_chunk": round(t.tokens / t.chunks, 2) if t.chunks else 0.0,
                "coalesced": st.coalesced, "suppressed": st.suppressed,
                "time_resets": st.time_resets, "render_errors": st.render_errors}
        tokens = sum(t.tokens for t in self.tallies.values())
        rate = per_s(tokens)
        events = {name: {"topic": s["topic"], "bag_messages": s["bag_messages"],
                         "chunks": s["chunks"], "kept": s["chunks"] == s["bag_messages"]}
                  for name, s in sources.items() if s["event"]}
        return {
            "bag": [str(p) for p in bag], "params": str(params) if params else None,
            "robot_time_s": round(self.duration_s, 3),
            "totals": {"messages": sum(s["messages"] for s in sources.values()),
                       "chunks": sum(t.chunks for t in self.tallies.values()), "tokens": tokens,
                       "tokens_per_s": round(rate, 3),
                       "coalesced": sum(s["coalesced"] for s in sources.values()),
                       "suppressed": sum(s["suppressed"] for s in sources.values()),
                       "time_resets": self.n_jumps},
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
            "topics_not_rendered": dict(self.not_rendered),
        }


def replay_bag(paths: list[Path], plan: SourcePlan, *, tokenizer=None, limit: int | None = None,
               on_chunk: Callable[[ReplayedChunk], None] = lambda chunk: None,
               chunk_log: Path | None = None) -> Replayed:
    """Every chunk of the plan's sources in bag order (at most `limit`) to `on_chunk`, counted
    per source; with a `tokenizer` also their tokens; history chunks appended to a new
    `chunk_log`. Clock jumps and render errors are warned about on stderr."""
    from csr_ros.chunklog import ChunkLog
    from csr_ros.chunks import normalize
    from csr_ros.state import Chunk, Seq

    sources = plan.sources
    in_bag, bag_counts, duration_s = bag_info(paths)
    emitter = make_emitter(sources)
    tallies = {s.name: SourceTally(topic=t, type_name=s.type_name, event=s.emission.event,
                                   origin=plan.topics[t].origin, policy=plan.topics[t].policy,
                                   bag_messages=bag_counts.get(t, 0))
               for t, s in sources.items()}
    out = Replayed(emitter, tallies, duration_s,
                   {t: m for t, m in in_bag.items() if t not in sources})
    log = None
    if chunk_log is not None:
        log = ChunkLog(chunk_log)
        if log.records:
            log.close()
            raise ConfigError(f"chunk log {chunk_log} already holds records; replay into a "
                              "new file so its seqs start at 0")
    try:
        for chunk in replay_chunks(read_bag(paths, sources), sources, emitter=emitter):
            _warn_jumps(out)
            for source, error in emitter.pop_errors():
                print(f"warning: {source}: cannot render: {error}", file=sys.stderr)
            tally = tallies[chunk.source]
            if chunk.instant:
                tally.instant_chunks += 1
            else:
                tally.chunks += 1
                if tokenizer is not None:
                    n_tokens = len(tokenizer.encode_data(normalize(chunk.text)))
                    tally.tokens += n_tokens
                    out.timeline.append((chunk.t_ns / 1e9, chunk.source, n_tokens))
            on_chunk(chunk)
            if log is not None and not chunk.instant:
                log.append_chunk(Chunk(seq=Seq(chunk.seq), source=chunk.source,
                                       stamp_ns=chunk.stamp_ns, text=chunk.text, token_ids=()))
            out.n_chunks += 1
            if limit is not None and out.n_chunks >= limit:
                break
    finally:
        if log is not None:
            log.close()
    _warn_jumps(out)
    return out


def _warn_jumps(out: Replayed) -> None:
    for jump in out.emitter.pop_time_jumps():
        out.n_jumps += 1
        print(f"warning: {jump.source}: the clock went back {jump.back_s:.1f} s; its state was "
              "reset", file=sys.stderr)


def format_stats(report: dict) -> str:
    """The table and notes `--stats` prints."""
    lines = []
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
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))
    events = report.get("events") or {}
    lost = report.get("events_not_rendered") or {}
    if events or lost:
        lines.append("events kept (chunks/bag messages): " + ", ".join(
            f"{name} {e['chunks']}/{e['bag_messages']}" for name, e in events.items())
            + "".join(f", {t} 0/{e['messages']}" for t, e in lost.items())
            + ("; all kept" if report["all_events_kept"] else "; NOT ALL KEPT"))
    for topic, p in (report.get("topics") or {}).items():
        if p["origin"] in ("auto", "matched"):
            lines.append(f"{p['origin']}: {topic} ({p['type_name']}, {p['messages']} msgs) "
                         f"as {p['source']}: {p['note'] or p['policy']}")
    for topic, p in (report.get("left_out") or {}).items():
        lines.append(f"left out: {topic} ({p['type']}, {p['messages']} msgs): "
                     f"{p['why'].removeprefix('left out: ')}")
    for name, topic in (report.get("sources_not_in_bag") or {}).items():
        lines.append(f"not in the bag: source {name} ({topic})")
    minutes = report["tau_mem_minutes"]
    lines.append(f"robot time {report['robot_time_s']:.1f} s; tau_mem {report['tau_mem_tokens']} "
                 f"tokens holds {minutes if minutes is not None else 'all'} minutes of it"
                 + (f"; clock went backwards {t['time_resets']} times" if t["time_resets"]
                    else ""))
    return "\n".join(lines)
