"""The robot side of a soak: the patrol's sensor messages, rendered into chunks as the aggregator
node renders them, with seqs, a ring to resend from, and malformed input on demand.

    traffic = PatrolTraffic(seed=0)
    aggregator = Aggregator(traffic, ring_chunks=8192, sent_path=run_dir / "sent.bin")
    events = aggregator.advance(robot_s=125.0, clock_offset_s=0.0)   # ChunkEvents, in seq order
    aggregator.since(seq)                     # what a restarted reconciler asks for again

The patrol (csr_ros.patrol) is generated in windows of `WINDOW_S` robot-seconds, each from its
own seed, one after the other on one robot clock: a day is 144 windows, never all in memory.
Each topic gets its type's default source (csr_ros.render.topic_defaults, as `csr-ros replay`
gives a bag without a params file) and one `Emitter` renders them all, so minimum periods,
deadbands and keep-alives run as on a robot: about 7 to 8 tokens per robot-second.

The emitter reads the robot's wall clock (`now_ns`); a clock fault adds an offset there. Every
chunk sent is recorded in `sent_path` (a CRC of its text and whether it was malformed, 5 bytes
a chunk), so the audit can compare the reconciler's log with what was sent without keeping a
day of chunks in memory.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import struct
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

from csr_ros.node_logic.stream import ChunkEvent
from csr_ros.patrol.messages import (START_NS, TOPIC_BATTERY, TOPIC_ODOM, TOPIC_SPEECH,
                                     TOPIC_TYPES, patrol_messages, typestore)
from csr_ros.patrol.world import World, run_script
from csr_ros.render import Emitter
from csr_ros.render.topic_defaults import topic_policy
from csr_ros.ros_params import auto_source

WINDOW_S = 600.0
ODOM_HZ, SCAN_HZ, BATTERY_HZ = 10.0, 5.0, 1.0
STREAM = "soak"
SENT_RECORD = struct.Struct("<IB")          # crc32 of the stripped text, malformed flag
MALFORMED_SOURCE = "malformed"


def text_crc(text: str | bytes) -> int:
    """CRC of a chunk text as both ends compare it: stripped, as UTF-8 (lone surrogates kept)."""
    if isinstance(text, str):
        data = text.strip().encode("utf-8", "surrogatepass")
    else:
        data = bytes(text).strip()
    return zlib.crc32(data)


class PatrolTraffic:
    """(robot_s, topic, message) of the patrol, window after window, forever."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.store = typestore()
        self.sources = {}
        for topic, type_name in TOPIC_TYPES.items():
            policy = topic_policy(type_name, topic)
            if policy.action != "omit":
                name = topic.strip("/").replace("/", "_")
                self.sources[topic] = auto_source(name, topic, type_name, policy)
        self.windows = 0

    def messages(self) -> Iterator[tuple[float, str, object]]:
        while True:
            offset_s = self.windows * WINDOW_S
            rng = np.random.default_rng([self.seed, self.windows])
            world = World(WINDOW_S, np.random.default_rng(rng.integers(2 ** 63)), ODOM_HZ)
            run_script(world)
            items = patrol_messages(world, self.store,
                                    np.random.default_rng(rng.integers(2 ** 63)),
                                    (ODOM_HZ, SCAN_HZ, BATTERY_HZ), 1.0)
            self.windows += 1
            for t_s, topic, msg in items:
                if t_s < WINDOW_S:
                    yield offset_s + t_s, topic, msg


class Aggregator:
    """Messages → chunk events with gap-free seqs, as the aggregator node publishes them."""

    def __init__(self, traffic: PatrolTraffic, *, ring_chunks: int, sent_path: Path):
        self.traffic = traffic
        self.emitter = Emitter(traffic.sources.values())
        self.by_topic = {topic: s.name for topic, s in traffic.sources.items()}
        self.next_seq = 0
        self.ring: collections.deque[ChunkEvent] = collections.deque(maxlen=ring_chunks)
        self.robot_s = 0.0
        self.time_jumps = 0
        self._last: dict[str, object] = {}     # the newest message per topic
        self._messages = traffic.messages()
        self._next = next(self._messages)
        self._sent = open(sent_path, "ab", buffering=64 * 1024)

    def advance(self, robot_s: float, clock_offset_s: float = 0.0) -> list[ChunkEvent]:
        """Every message up to `robot_s` offered to the emitter at the robot's wall clock
        (plus `clock_offset_s`); the chunks that come out."""
        out: list[ChunkEvent] = []
        offset_ns = int(clock_offset_s * 1e9)
        while self._next[0] <= robot_s:
            t_s, topic, msg = self._next
            now_ns = START_NS + int(t_s * 1e9) + offset_ns
            out += self._emit(self.emitter.poll(now_ns))
            name = self.by_topic.get(topic)
            if name is not None:
                out += self._emit(self.emitter.offer(name, msg, now_ns))
                self._last[topic] = msg
            self._next = next(self._messages)
        self.robot_s = robot_s
        out += self._emit(self.emitter.poll(START_NS + int(robot_s * 1e9) + offset_ns))
        self.time_jumps += len(self.emitter.pop_time_jumps())
        return out

    def malformed_burst(self, clock_offset_s: float = 0.0) -> list[ChunkEvent]:
        """Malformed sensor messages through the emitter (empty, oversized, NaN, a lone
        surrogate), then malformed chunk payloads as a broken publisher of csr/chunks would
        send them (non-UTF-8 bytes, empty, oversized, NaN)."""
        ts = self.traffic.store
        now_ns = START_NS + int(self.robot_s * 1e9) + int(clock_offset_s * 1e9)
        string = ts.types["std_msgs/msg/String"]
        speech = self.by_topic[TOPIC_SPEECH]
        out: list[ChunkEvent] = []
        bad = [(speech, string(data="")), (speech, string(data="x " * 300_000)),
               (speech, string(data="speaker\udcff: a lone surrogate"))]
        bad += [(self.by_topic[topic], with_nans(msg)) for topic, msg in self._last.items()
                if topic in (TOPIC_ODOM, TOPIC_BATTERY)]
        for name, msg in bad:
            out += self._emit(self.emitter.offer(name, msg, now_ns), malformed=True)
        stamp = now_ns
        for raw in (b"scan: \xff\xfe\xfd not utf-8", "", "   \n\t ", "y" * 200_000,
                    "nan", "odom: at nan,nan heading nan", b"\xc3\x28 half a character"):
            out.append(self._record(ChunkEvent(seq=self.next_seq, source=MALFORMED_SOURCE,
                                               stamp_ns=stamp, text=raw, stream=STREAM),
                                    malformed=True))
        return out

    def since(self, seq: int) -> tuple[list[ChunkEvent], int]:
        """The events from `seq` on that the ring still holds, and the first seq it holds
        (a seq below it is lost)."""
        first = self.ring[0].seq if self.ring else self.next_seq
        return [e for e in self.ring if e.seq >= seq], first

    def close(self) -> None:
        self._sent.close()

    def _emit(self, emitted, *, malformed: bool = False) -> list[ChunkEvent]:
        out = []
        for e in emitted:
            if e.instant:
                continue
            out.append(self._record(ChunkEvent(seq=self.next_seq, source=e.source,
                                               stamp_ns=e.now_ns, text=e.text, stream=STREAM),
                                    malformed=malformed))
        return out

    def _record(self, event: ChunkEvent, *, malformed: bool) -> ChunkEvent:
        self._sent.write(SENT_RECORD.pack(text_crc(event.text), int(malformed)))
        self.ring.append(event)
        self.next_seq += 1
        return event


def read_sent(path: Path) -> Iterator[tuple[int, int, bool]]:
    """(seq, crc, malformed) of every chunk sent, in order."""
    with open(path, "rb") as f:
        seq = 0
        while True:
            data = f.read(SENT_RECORD.size * 4096)
            if not data:
                return
            for crc, malformed in SENT_RECORD.iter_unpack(data):
                yield seq, crc, bool(malformed)
                seq += 1


def with_nans(msg):
    """The message with every float field (arrays included) NaN: a sensor gone bad."""
    if dataclasses.is_dataclass(msg) and not isinstance(msg, type):
        return dataclasses.replace(msg, **{f.name: with_nans(getattr(msg, f.name))
                                           for f in dataclasses.fields(msg)
                                           if not f.name.startswith("_")})
    if isinstance(msg, float):
        return math.nan
    if isinstance(msg, np.ndarray) and msg.dtype.kind == "f":
        return np.full_like(msg, np.nan)
    if isinstance(msg, list):
        return [with_nans(m) for m in msg]
    return msg
