"""A restarted aggregator with a chunk log continues the episode's time (rclpy, Fast DDS)."""

from __future__ import annotations

import threading
import time

import pytest

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from std_msgs.msg import String

from csr_ros.chunklog import ChunkLog, ChunkRecord
from csr_ros.msg import StateChunk
from csr_ros.nodes.aggregator import AggregatorNode
from csr_ros.nodes.common import CHUNKS_QOS
from csr_ros.state import Chunk, Seq

pytestmark = pytest.mark.ros


def test_a_restarted_aggregator_continues_the_episode_time_from_its_chunk_log(tmp_path):
    log_path = tmp_path / "chunks.log"
    earlier_ns = time.time_ns() - 600 * 1_000_000_000       # written 10 min ago, 600 s in
    with ChunkLog(log_path) as log:
        log.append_chunk(Chunk(seq=Seq(0), source="speech", stamp_ns=earlier_ns,
                               text="600s speech: earlier", token_ids=()))
    rclpy.init()
    executor = SingleThreadedExecutor()
    try:
        aggregator = AggregatorNode(parameter_overrides=[
            Parameter("sources", Parameter.Type.STRING_ARRAY, ["speech"]),
            Parameter("source.speech.topic", Parameter.Type.STRING, "/restart/speech"),
            Parameter("source.speech.type", Parameter.Type.STRING, "std_msgs/msg/String"),
            Parameter("source.speech.event", Parameter.Type.BOOL, True),
            Parameter("chunk_log", Parameter.Type.STRING, str(log_path))])
        probe = Node("csr_ros_restart_probe")
        received: list[StateChunk] = []
        probe.create_subscription(StateChunk, "csr/chunks", received.append, CHUNKS_QOS)
        pub = probe.create_publisher(String, "/restart/speech", 10)
        for node in (aggregator, probe):
            executor.add_node(node)
        thread = threading.Thread(target=executor.spin, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        pub.publish(String(data="back again"))
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert received, "no chunk within 30 s"
        seconds = int(received[0].text.split("s ", 1)[0])
        assert received[0].seq == 1 and received[0].text.endswith("speech: back again")
        assert 1199 <= seconds <= 1230                    # 600 s in + 600 s since, not 0
        executor.shutdown()
        aggregator.close()
        records = [r for r in ChunkLog(log_path).records if isinstance(r, ChunkRecord)]
        assert [r.text.split(" ", 1)[1] for r in records] == ["speech: earlier",
                                                               "speech: back again"]
    finally:
        rclpy.try_shutdown()
