"""The aggregator node: the robot's topics → rendered, rate-limited StateChunks.

    subscriptions (one per source, QoS matched to the publishers as `ros2 topic echo` does)
      → Emitter (per source: minimum period, deadband, keep-alive, events never dropped;
                 compact text with the episode time; the same object `csr-ros replay` uses)
      → csr/chunks   StateChunk, gap-free seq          (history)
        csr/instant  StateChunk                        ('instant' sources: the dynamic suffix)
    csr/get_chunks   GetChunks: a bounded ring, then the chunk log, for late joiners
    /diagnostics     per source: publishers of another type, render errors; time jumps

Every chunk and GetChunks answer names the aggregator's stream. With a chunk log the stream id
and the seq continue across restarts; without one a restarted aggregator starts a new stream at
seq 0, and the other nodes begin a new version from it (never a silent merge of two streams).
The node clock going backwards (a bag played with --loop wrapping, a simulator reset) resets
the Emitter's per-source state; each jump is logged and counted on /diagnostics.

Its lifecycle transitions (an inactive aggregator keeps its ring and chunk log and still
answers GetChunks): docs/ros.md, "Managed nodes (lifecycle)".
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections import deque

from rclpy.clock import Clock, ClockType
from rclpy.exceptions import ParameterUninitializedException
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

from csr_ros import ros_params
from csr_ros.chunklog import ChunkLog, ChunkRecord, last_stream
from csr_ros.errors import ConfigError, MessageTypeNotInstalledError
from csr_ros.msg import StateChunk
from csr_ros.node_logic.health import OK, WARN
from csr_ros.nodes.common import (CHUNKS_QOS, INSTANT_QOS, resolve_message_type,
                                  route_library_logging, run, time_msg, unroute_library_logging)
from csr_ros.nodes.managed import ManagedNode
from csr_ros.render import Emitted, Emitter, episode_origin_ns
from csr_ros.ros_params import QosChoice, SourceConfig, match_publishers
from csr_ros.srv import GetChunks
from csr_ros.state import Chunk, Seq

SOURCE_DEPTH = 10            # a sampled source's queue (period_s > 0): the emitter keeps the newest
EVENT_DEPTH = 1000           # the queue of a source whose every message counts (an event source,
                             # or period_s 0: text, results): a burst must not be dropped
MAX_CHUNKS_PER_ANSWER = 2000


def source_depth(source: SourceConfig) -> int:
    """A sampled source may lose older messages in its queue (the emitter would replace them by
    the newest anyway); a source that looks at every message may not, whatever it is called."""
    return EVENT_DEPTH if source.emission.event or source.period_s == 0 else SOURCE_DEPTH


class AggregatorNode(ManagedNode):
    def __init__(self, **kwargs):
        super().__init__("aggregator", **kwargs)
        route_library_logging(self)
        self.said_skipped: set[tuple[str, str]] = set()   # skipped sources, said once each
        self.chunk_log: ChunkLog | None = None
        self.ring: deque[StateChunk] | None = None
        self.sources: dict[str, SourceConfig] = {}
        self.skipped: dict[str, str] = {}                  # source name → why
        self.source_subs: dict[str, object] = {}
        self.timers_made: list = []
        self.declare_schema("aggregator", list(ros_params.AGGREGATOR))
        for name in self._source_names():       # described now, so `ros2 param list` shows them
            self.declare_schema("aggregator", ros_params.source_schema(name))
        self.bring_up()

    def _source_names(self) -> list[str]:
        try:
            return list(self.get_parameter("sources").value or [])
        except ParameterUninitializedException:
            return []

    # -- lifecycle -----------------------------------------------------------------------------

    def configure(self) -> None:
        """Parameters checked, message types resolved, the chunk log opened (the stream and
        seq go on from it), publishers and the GetChunks service made."""
        for name in self._source_names():       # sources set since the node was made
            self.declare_schema("aggregator", ros_params.source_schema(name))
        self.message_types: dict[str, type] = {}          # type name → class
        missing: dict[str, str] = {}
        strict = self.get_parameter("strict").value

        def resolve(type_name: str):
            try:
                self.message_types[type_name] = resolve_message_type(type_name)
            except MessageTypeNotInstalledError as exc:
                if strict:
                    raise
                missing[type_name] = str(exc)

        p = self.params = self.checked_params(resolve_type=resolve)
        self.robot_id = ros_params.robot_id_for(p["robot_id"], self.get_namespace())
        self.sources, self.skipped = {}, {}
        for source in p["sources"]:
            if source.type_name in missing:
                self.skipped[source.name] = missing[source.type_name]
                if (source.name, source.type_name) not in self.said_skipped:
                    # expected where a type's package is not installed (vision_msgs on the
                    # PyPI wheels): said once, and kept on /diagnostics (WARN, skipped.<name>)
                    self.said_skipped.add((source.name, source.type_name))
                    retype = (" (the launch files' detections_type:=std_msgs/msg/String)"
                              if source.name == "detections" else "")
                    self.get_logger().info(
                        f"source {source.name!r} ({source.topic}) skipped: "
                        f"{missing[source.type_name]}; install its package, or give "
                        f"source.{source.name}.type a type that is installed{retype}; "
                        "strict:=true stops instead")
            else:
                self.sources[source.name] = source
        if not self.sources:
            raise ConfigError("aggregator: none of the sources can be subscribed: " +
                              "; ".join(f"{k}: {v}" for k, v in self.skipped.items()))

        self.emitter = Emitter(self.sources.values())
        self.time_jumps = 0
        self.last_time_jump_s: float | None = None
        self.ring = deque(maxlen=p["ring_size"])
        if p["chunk_log"]:
            # only history: retention may drop what no restart needs
            self.chunk_log = ChunkLog(p["chunk_log"],
                                      **ros_params.chunk_log_options(p, keep_state=False))
        self.next_seq = self._restore_seq()
        self.stream = self._restore_stream()
        if self.chunk_log is not None:      # the episode goes on: chunk times continue, not at 0
            self.emitter.origin_ns = episode_origin_ns(self.chunk_log.records)
        self.instant_seq = itertools.count()
        self.render_errors: dict[str, int] = {}
        self.wrong_types: dict[str, set[str]] = {}      # source → other types seen on its topic
        self.source_qos: dict[str, QosChoice] = {}
        # lifecycle publishers: an inactive aggregator publishes nothing
        self.chunk_pub = self.create_lifecycle_publisher(StateChunk, p["topics.chunks"],
                                                         CHUNKS_QOS)
        self.instant_pub = self.create_lifecycle_publisher(StateChunk, p["topics.instant"],
                                                           INSTANT_QOS)
        # served while inactive too: the memory is never dropped, late joiners still catch up
        self.get_chunks_srv = self.create_service(GetChunks, p["services.get_chunks"],
                                                  self.get_chunks_callback)

    def activate(self) -> None:
        """Subscribe to the sources (QoS matched to their publishers) and start the timers."""
        p = self.params
        for source in self.sources.values():
            self._subscribe(source)
        # on the steady clock: with use_sim_time, /clock may stop or go back (a paused or
        # looping bag), and held values, QoS rechecks and diagnostics must go on
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.timers_made = [
            self.create_timer(1.0 / p["poll_hz"], self.poll_callback, clock=steady),
            self.create_timer(p["qos_recheck_s"], self.qos_recheck_callback, clock=steady)]
        self.get_logger().info(
            f"aggregating {len(self.sources)} sources into {p['topics.chunks']} "
            f"from seq {self.next_seq} of stream {self.stream}: " + ", ".join(
                f"{s.name}={s.topic}{' (instant)' if s.instant else ''}"
                for s in self.sources.values()))

    def deactivate(self) -> None:
        """Stop taking messages; what the emitter holds (rate-limited values) becomes chunks
        first, so nothing that arrived is dropped. The ring and the chunk log stay."""
        for timer in self.timers_made:
            self.destroy_timer(timer)
        self.timers_made = []
        for sub in self.source_subs.values():
            self.destroy_subscription(sub)
        self.source_subs = {}
        if self.context.ok():
            self._publish_all(self.emitter.flush(self.get_clock().now().nanoseconds))

    def release(self) -> None:
        for name in ("chunk_pub", "instant_pub"):
            pub = getattr(self, name, None)
            if pub is not None:
                self.destroy_lifecycle_publisher(pub)
                setattr(self, name, None)
        if getattr(self, "get_chunks_srv", None) is not None:
            self.destroy_service(self.get_chunks_srv)
            self.get_chunks_srv = None
        if self.chunk_log is not None:
            self.chunk_log.close()
            self.chunk_log = None
        self.ring = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            unroute_library_logging(self)

    # -- subscriptions -------------------------------------------------------------------------

    def _publisher_qos(self, topic: str) -> QosChoice:
        infos = self.get_publishers_info_by_topic(topic)
        return match_publishers([
            (i.qos_profile.reliability == ReliabilityPolicy.RELIABLE,
             i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL) for i in infos])

    def _subscribe(self, source: SourceConfig) -> None:
        choice = self._publisher_qos(source.topic)
        qos = QoSProfile(depth=source_depth(source),
                         reliability=ReliabilityPolicy.RELIABLE if choice.reliable
                         else ReliabilityPolicy.BEST_EFFORT,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL if choice.transient_local
                         else DurabilityPolicy.VOLATILE)
        old = self.source_subs.pop(source.name, None)
        if old is not None:
            self.destroy_subscription(old)
        self.source_subs[source.name] = self.create_subscription(
            self.message_types[source.type_name], source.topic,
            functools.partial(self.message_callback, source.name), qos)
        self.source_qos[source.name] = choice
        self.get_logger().debug(f"{source.name}: {source.topic} with {choice}")

    def qos_recheck_callback(self) -> None:
        """Publishers that appear later may offer other QoS than what we subscribed with, or
        publish another type (which never reaches us: said once, and on /diagnostics)."""
        for source in self.sources.values():
            self._check_types(source)
            choice = self._publisher_qos(source.topic)
            current = self.source_qos[source.name]
            if choice.matched and not current.matched and \
                    (choice.reliable, choice.transient_local) == \
                    (current.reliable, current.transient_local):
                # the first publisher offers what we subscribed with: keep the subscription (a
                # new one would drop what is in flight, the first words of a new publisher)
                self.source_qos[source.name] = choice
            elif choice.matched and choice != current:
                self.get_logger().info(f"{source.name}: publishers changed, resubscribing "
                                       f"(reliable={choice.reliable}, "
                                       f"transient_local={choice.transient_local})")
                self._subscribe(source)

    def _check_types(self, source: SourceConfig) -> None:
        expected = source.type_name
        seen = {i.topic_type for i in self.get_publishers_info_by_topic(source.topic)}
        other = {t for t in seen if t != expected} - self.wrong_types.get(source.name, set())
        if other:
            self.wrong_types.setdefault(source.name, set()).update(other)
            self.get_logger().warning(
                f"{source.name}: {source.topic} has a publisher of type "
                f"{', '.join(sorted(other))}, but source.{source.name}.type is {expected}: its "
                "messages do not reach the aggregator. Fix the type in the params file or the "
                "publisher")

    # -- messages → chunks ---------------------------------------------------------------------

    def message_callback(self, source_name: str, msg) -> None:
        now_ns = self.get_clock().now().nanoseconds
        self._publish_all(self.emitter.offer(source_name, msg, now_ns))

    def poll_callback(self) -> None:
        self._publish_all(self.emitter.poll(self.get_clock().now().nanoseconds))

    def _publish_all(self, emitted: list[Emitted]) -> None:
        for jump in self.emitter.pop_time_jumps():
            self.time_jumps += 1
            self.last_time_jump_s = jump.back_s
            self.get_logger().warning(f"{jump.source}: the clock went back {jump.back_s:.1f} s "
                                      "(bag loop or simulator reset); its deadband and "
                                      "keep-alive state was reset")
        for name, error in self.emitter.pop_errors():
            # a field selection that does not fit the message: counted and logged, never silent
            count = self.render_errors[name] = self.render_errors.get(name, 0) + 1
            self.get_logger().error(f"{name}: cannot render ({count} so far): {error}",
                                    throttle_duration_sec=10.0)
        for e in emitted:
            self._publish(e)

    def _publish(self, e: Emitted) -> None:
        source = self.sources[e.source]
        text, stamp_ns = e.text, e.stamp_ns
        out = StateChunk(stamp=time_msg(stamp_ns), source=source.name, text=text,
                         coalesced=e.n_skipped, stream=self.stream)
        if source.instant:
            out.seq = next(self.instant_seq)
            self.instant_pub.publish(out)
            return
        out.seq = self.next_seq
        self.next_seq += 1
        self.ring.append(out)
        if self.chunk_log is not None:
            self.chunk_log.append_chunk(Chunk(seq=Seq(out.seq), source=source.name,
                                              stamp_ns=stamp_ns, text=text, token_ids=()))
        self.chunk_pub.publish(out)

    # -- late joiners --------------------------------------------------------------------------

    def get_chunks_callback(self, request, response):
        end = request.end_seq or self.next_seq
        limit = min(request.max_chunks or MAX_CHUNKS_PER_ANSWER, MAX_CHUNKS_PER_ANSWER)
        start = max(request.start_seq, self._first_available_seq())
        chunks = []
        ring_first = self.ring[0].seq if self.ring else self.next_seq
        if start < ring_first and self.chunk_log is not None:
            for record in self.chunk_log.records:
                if isinstance(record, ChunkRecord) and start <= record.seq < min(end, ring_first):
                    chunks.append(StateChunk(stamp=time_msg(record.stamp_ns), seq=int(record.seq),
                                             source=record.source, text=record.text,
                                             stream=self.stream))
                    if len(chunks) >= limit:
                        break
        for chunk in self.ring:
            if len(chunks) >= limit:
                break
            if max(start, ring_first) <= chunk.seq < end:
                chunks.append(chunk)
        response.chunks = chunks
        response.first_available_seq = self._first_available_seq()
        response.next_seq = self.next_seq
        response.stream = self.stream
        return response

    def _first_available_seq(self) -> int:
        if self.chunk_log is not None:
            for record in self.chunk_log.records:
                if isinstance(record, ChunkRecord):
                    return int(record.seq)
        return self.ring[0].seq if self.ring else self.next_seq

    def _restore_seq(self) -> int:
        if self.chunk_log is None:
            return 0
        seqs = [r.seq for r in self.chunk_log.records if isinstance(r, ChunkRecord)]
        return int(seqs[-1]) + 1 if seqs else 0

    def _restore_stream(self) -> str:
        """The stream id: the chunk log's, or a new one (written to the log, if there is one)."""
        stream = last_stream(self.chunk_log.records) if self.chunk_log is not None else ""
        if not stream:
            stream = uuid.uuid4().hex[:12]
            if self.chunk_log is not None:
                self.chunk_log.append_stream(stream)
        return stream

    # -- health --------------------------------------------------------------------------------

    def work_status(self, now_s: float) -> tuple[int, str, list[tuple[str, str]]]:
        """WARN while a configured source is skipped, has a publisher of another type, or
        cannot render; the stream and time jumps as values."""
        level, problems = OK, [f"{name} skipped" for name in self.skipped]
        for name, types in sorted(self.wrong_types.items()):
            problems.append(f"{name}: publisher of {', '.join(sorted(types))} on "
                            f"{self.sources[name].topic}, expected {self.sources[name].type_name}")
        for name, count in sorted(self.render_errors.items()):
            problems.append(f"{name}: {count} messages could not be rendered")
        if problems:
            level = WARN
        values = [("stream", self.stream), ("next_seq", str(self.next_seq)),
                  ("sources", ", ".join(self.sources)), ("time_jumps", str(self.time_jumps))]
        values += [(f"skipped.{name}", why) for name, why in self.skipped.items()]
        if self.last_time_jump_s is not None:
            values.append(("last_time_jump_s", f"{self.last_time_jump_s:.3f}"))
        for name, types in sorted(self.wrong_types.items()):
            values.append((f"wrong_type.{name}", ",".join(sorted(types))))
        return level, "; ".join(problems) or "ok", values


def main(args=None) -> int:
    return run(AggregatorNode, args=args, label="aggregator")


if __name__ == "__main__":
    raise SystemExit(main())
