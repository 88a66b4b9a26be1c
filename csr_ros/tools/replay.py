"""`csr-ros replay BAG`: render a recorded bag into chunks with the aggregator's renderer.

    csr-ros replay run1/                                   every topic, printed one per line
    csr-ros replay run1/ --params config/csr_ros.yaml      the aggregator's sources and periods
    csr-ros replay run1.bag --jsonl chunks.jsonl --chunk-log chunks.log

rosbag2 (sqlite3, mcap) and ROS 1 bags are read with rosbags (no ROS install needed). Rate
limits run on the bag's clock, so the chunks are the ones the aggregator would have published
live. A chunk log written here can seed a reconciler (its `chunk_log` parameter).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from csr_ros.errors import ConfigError
from csr_ros.render import Coalescer, Emission, RenderOptions, header_stamp_ns, render
from csr_ros.ros_params import SourceConfig, load_params_file, validate


@dataclass(frozen=True)
class ReplayedChunk:
    seq: int              # gap-free over history chunks; -1 for instant values
    source: str
    stamp_ns: int
    text: str
    coalesced: int
    instant: bool


def replay_chunks(messages: Iterable[tuple[str, int, Any]],
                  sources: Mapping[str, SourceConfig]) -> Iterator[ReplayedChunk]:
    """(topic, bag time ns, message) in bag order → chunks, as the aggregator makes them."""
    by_name = {s.name: s for s in sources.values()}
    coalescer = Coalescer({s.name: s.period_s for s in sources.values()})
    seq = 0

    def emit(emission: Emission) -> ReplayedChunk:
        nonlocal seq
        source = by_name[emission.key]
        msg, received_ns = emission.value
        text = render(msg, label=source.label, type_name=source.type_name, options=source.render)
        stamp_ns = header_stamp_ns(msg) or received_ns
        chunk = ReplayedChunk(seq=-1 if source.instant else seq, source=source.name,
                              stamp_ns=stamp_ns, text=text, coalesced=emission.n_coalesced,
                              instant=source.instant)
        seq += not source.instant
        return chunk

    last_ns = 0
    for topic, t_ns, msg in messages:
        source = sources.get(topic)
        if source is None:
            continue
        last_ns = t_ns
        for emission in coalescer.poll(t_ns):
            yield emit(emission)
        emission = coalescer.offer(source.name, (msg, t_ns), t_ns)
        if emission is not None:
            yield emit(emission)
    for emission in coalescer.flush(last_ns):
        yield emit(emission)


def read_bag(paths: list[Path], topics: Iterable[str]) -> Iterator[tuple[str, int, Any]]:
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    with AnyReader(paths, default_typestore=get_typestore(Stores.ROS2_JAZZY)) as reader:
        wanted = set(topics)
        connections = [c for c in reader.connections if c.topic in wanted]
        for connection, t_ns, raw in reader.messages(connections=connections):
            yield connection.topic, t_ns, reader.deserialize(raw, connection.msgtype)


def bag_topics(paths: list[Path]) -> dict[str, str]:
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    with AnyReader(paths, default_typestore=get_typestore(Stores.ROS2_JAZZY)) as reader:
        return {c.topic: c.msgtype for c in reader.connections}


def sources_for(paths: list[Path], params_file: Path | None,
                topics: list[str] | None) -> dict[str, SourceConfig]:
    """topic → source: the aggregator's sources from a params file, else every bag topic."""
    in_bag = bag_topics(paths)
    if params_file is not None:
        nodes = load_params_file(params_file)
        if "aggregator" not in nodes:
            raise ConfigError(f"{params_file}: no `aggregator` section")
        sources = {s.topic: s for s in validate("aggregator", nodes["aggregator"])["sources"]}
        for topic, source in sources.items():
            if topic in in_bag and in_bag[topic] != source.type_name:
                raise ConfigError(f"source {source.name}: {topic} is {in_bag[topic]} in the bag, "
                                  f"not {source.type_name}")
    else:
        sources = {t: SourceConfig(name=t.strip("/").replace("/", "_") or "root", topic=t,
                                   type_name=m, label=t.strip("/").replace("/", "_") or "root",
                                   period_s=0.0, instant=False, render=RenderOptions())
                   for t, m in in_bag.items()}
    if topics:
        missing = sorted(set(topics) - set(sources))
        if missing:
            raise ConfigError(f"topics {missing} are not in the bag (or not sources); the bag "
                              f"has {sorted(in_bag)}")
        sources = {t: s for t, s in sources.items() if t in topics}
    return sources


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", type=Path, nargs="+",
                        help="rosbag2 directory/file or ROS 1 .bag (several for split bags)")
    parser.add_argument("--params", type=Path, default=None,
                        help="parameters file: use its aggregator sources (topics, periods)")
    parser.add_argument("--topics", nargs="+", default=None, help="only these topics")
    parser.add_argument("--jsonl", type=Path, default=None, help="write chunks as JSON lines")
    parser.add_argument("--chunk-log", type=Path, default=None,
                        help="append the history chunks to this chunk log")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many chunks")


def run(args: argparse.Namespace) -> int:
    for path in args.bag:
        if not path.exists():
            raise ConfigError(f"bag {path} does not exist")
    sources = sources_for(args.bag, args.params, args.topics)
    chunks = replay_chunks(read_bag(args.bag, sources), sources)
    out = args.jsonl.open("w", encoding="utf-8") if args.jsonl else None
    log = None
    if args.chunk_log is not None:
        from csr_ros.chunklog import ChunkLog

        log = ChunkLog(args.chunk_log)
        if log.records:
            log.close()
            raise ConfigError(f"chunk log {args.chunk_log} already holds records; replay into a "
                              "new file so its seqs start at 0")
    n = 0
    try:
        for chunk in chunks:
            if out is not None:
                out.write(json.dumps(vars(chunk), ensure_ascii=False) + "\n")
            else:
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
    print(f"{n} chunks from {len(sources)} topics", file=sys.stderr)
    return 0
