"""Two robots as two ROS 2 namespaces on one graph, sharing two real llama.cpp servers.

/robot_a runs an aggregator and all_in_one (reconciler and policy in one process), /robot_b an
aggregator, a reconciler and a policy, each node its own process started as the launch files
start them (`--ros-args -r __ns:=/robot_k --params-file ...`), from one params file: the
`/**/<node>` sections every robot shares, then a `/robot_b/<node>` section that gives robot_b
an explicit robot_id. Both robots' resources are `kind: openai` on the same R1 and R2 servers
(no router: a pool behind vllm-router is `csr-ros fleet`'s; here the routing key is checked in
what each node's resources send, which they report on /diagnostics).

The speech source is a relative topic (`speech` → /robot_k/speech), the fleet announcements
an absolute one (/fleet/announcements) that both robots hear. What holds at any speed: each
robot's chunks stay in its namespace, each robot decides over its own history only, no chunk
is lost, and each robot's requests carry its own routing key.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import ReliabilityPolicy
from std_msgs.msg import String

from csr_ros import ros_params
from csr_ros.msg import PolicyDecision, StateChunk
from csr_ros.nodes.common import CHUNKS_QOS, DECISIONS_QOS, DIAGNOSTICS_QOS, chunk_event
from csr_ros.srv import GetChunks

from support.ros_graph import Graph, NodeProcess, call, wait_reliable_subscription
from support.waiting import wait_for

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.server]

ROBOT_B_ID = "warehouse.robot-b"          # robot_a's id is its namespace: robot_a
STATE = {"model": "smollm2", "context_tokens": 4096}


def params_file(path, r1_url: str, r2_url: str):
    resource = {"resource": {"kind": "openai", "r1_url": r1_url, "r2_url": r2_url,
                             "timeout_s": 120.0}}
    nodes = {
        "/**/aggregator": {"ros__parameters": {
            "sources": ["speech", "fleet"],
            "source": {"speech": {"topic": "speech", "type": "std_msgs/msg/String",
                                  "event": True},
                       "fleet": {"topic": "/fleet/announcements", "type": "std_msgs/msg/String",
                                 "event": True}}}},
        "/**/reconciler": {"ros__parameters": STATE | resource | {"tau_mem_tokens": 3000}},
        "/**/policy": {"ros__parameters": STATE | resource | {
            "rate_hz": 2.0, "max_new_tokens": 8, "actions": {"mode": "free"},
            "task": "Where should the robot go next? Answer in a few words."}},
        # a robot's own section after the shared ones: it sets only what differs
        "/robot_b/reconciler": {"ros__parameters": {"robot_id": ROBOT_B_ID}},
        "/robot_b/policy": {"ros__parameters": {"robot_id": ROBOT_B_ID}},
    }
    path.write_text(yaml.safe_dump(json.loads(json.dumps(nodes)), sort_keys=False))
    return path


def expected_static_tokens(chunks: list[StateChunk]) -> int:
    """Static tokens of a fresh state of these params that folded exactly these chunks."""
    from csr_ros.model_store import resolve_model_dir
    from csr_ros.node_logic.stream import make_chunk
    from csr_ros.ros_params import state_from_params
    from csr_ros.tokenizer import HFTokenizer

    state = state_from_params(ros_params.validate("policy", STATE | {"actions.mode": "free"}),
                              HFTokenizer(resolve_model_dir(weights=False)))
    for msg in chunks:
        chunk, _ = make_chunk(state, chunk_event(msg))
        state.append(chunk)
    return state.n_static


def running(procs: list[NodeProcess]) -> bool:
    """True while every node runs; a node that exited fails the test with its log."""
    for proc in procs:
        if proc.proc.poll() is not None:
            raise AssertionError(f"{proc.argv[2:]} exited with {proc.proc.returncode}:\n"
                                 f"{proc.output}")
    return True


def test_two_namespaced_robots_on_one_graph_keep_their_own_chunks_decisions_and_routing_keys(
        llama_server_pair, tmp_path):
    r1, r2 = llama_server_pair
    params = str(params_file(tmp_path / "params.yaml", r1.url, r2.url))
    graph = Graph()
    procs: list[NodeProcess] = []
    robots = ("robot_a", "robot_b")
    try:
        probe = graph.node("csr_ros_test_probe")
        chunks = {robot: [] for robot in robots}
        decisions = {robot: [] for robot in robots}
        statuses: dict[str, dict[str, str]] = {}     # diagnostics status name → its values
        chunk_subs, speech, get_chunks = {}, {}, {}
        for robot in robots:
            chunk_subs[robot] = probe.create_subscription(
                StateChunk, f"/{robot}/csr/chunks", chunks[robot].append, CHUNKS_QOS)
            probe.create_subscription(PolicyDecision, f"/{robot}/csr/decisions",
                                      decisions[robot].append, DECISIONS_QOS)
            speech[robot] = probe.create_publisher(String, f"/{robot}/speech", 100)
            get_chunks[robot] = probe.create_client(GetChunks, f"/{robot}/csr/get_chunks")
        fleet = probe.create_publisher(String, "/fleet/announcements", 100)

        def on_diagnostics(msg):
            for status in msg.status:
                statuses[status.name] = {kv.key: kv.value for kv in status.values}

        probe.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics,
                                  DIAGNOSTICS_QOS)

        def start(module: str, robot: str) -> NodeProcess:
            proc = NodeProcess(module, "-r", f"__ns:=/{robot}", "--params-file", params,
                               log=tmp_path / f"{robot}.{module}.log")
            procs.append(proc)
            return proc

        aggregators = {robot: start("aggregator", robot) for robot in robots}
        for robot in robots:
            aggregators[robot].wait_output("aggregating")
            wait_for(lambda: chunk_subs[robot].get_publisher_count() == 1,
                     what=f"/{robot}/csr/chunks")
            wait_reliable_subscription(probe, speech[robot])
        # both aggregators on the shared topic, each subscribed reliably (see
        # wait_reliable_subscription: a message across the QoS switch may be lost)
        wait_for(lambda: (infos := probe.get_subscriptions_info_by_topic(fleet.topic_name))
                 and len(infos) == 2 and fleet.get_subscription_count() >= 2
                 and all(i.qos_profile.reliability == ReliabilityPolicy.RELIABLE
                         for i in infos), what="two reliable subscriptions to the fleet topic")
        # robot_a: aggregator + all_in_one; robot_b: aggregator + reconciler + policy
        start("all_in_one", "robot_a")
        start("reconciler", "robot_b")
        start("policy", "robot_b")

        said = {"robot_a": [f"robot_a heard: the red cup is on table {i}" for i in range(4)],
                "robot_b": [f"robot_b heard: the dock {i} is free" for i in range(2)]}
        announcement = "fleet: the lift is out of order until noon"
        for text in said["robot_a"]:
            speech["robot_a"].publish(String(data=text))
            time.sleep(0.02)
        fleet.publish(String(data=announcement))
        for text in said["robot_b"]:
            speech["robot_b"].publish(String(data=text))
            time.sleep(0.02)
        expected = {"robot_a": said["robot_a"] + [announcement],
                    "robot_b": [announcement] + said["robot_b"]}

        # each aggregator holds exactly its robot's chunks, gap-free from seq 0 (its
        # GetChunks answer is the record; the probe's own subscription is not under test)
        held = {}
        for robot in robots:
            n = len(expected[robot])

            def all_held():
                answer = call(get_chunks[robot], GetChunks.Request(start_seq=0), timeout_s=10.0)
                return answer is not None and len(answer.chunks) >= n and list(answer.chunks)
            held[robot] = wait_for(all_held, 60.0, f"{n} chunks held by /{robot}/aggregator")
            assert [c.seq for c in held[robot]] == list(range(n)), robot
            for text in expected[robot]:
                assert sum(text in c.text for c in held[robot]) == 1, (robot, text)
        for robot, other in (("robot_a", "robot_b"), ("robot_b", "robot_a")):
            texts = " | ".join(c.text for c in held[robot] + chunks[robot])
            assert not any(t in texts for t in said[other]), \
                f"{other}'s speech reached /{robot}/csr/chunks: {texts}"

        # each robot decides over its own history: its last seq, its own chunks' tokens
        last = {}
        for robot in robots:
            seq = len(expected[robot]) - 1
            last[robot] = wait_for(
                lambda: running(procs) and [d for d in decisions[robot] if d.last_seq == seq],
                240.0, f"a decision of {robot} over its chunks up to seq {seq}")[-1]
            assert max(d.last_seq for d in decisions[robot]) == seq, robot
            assert last[robot].static_tokens == expected_static_tokens(held[robot]), robot
        assert last["robot_a"].static_tokens != last["robot_b"].static_tokens

        # diagnostics: one status per robot and node, its robot id and its routing key
        keys = {"robot_a": "robot_a", "robot_b": ROBOT_B_ID}

        def reported():
            return all("routing_key" in statuses.get(f"csr_ros: {robot}/policy", {}) and
                       "routing_key.r1" in statuses.get(f"csr_ros: {robot}/reconciler", {})
                       for robot in robots)
        wait_for(reported, 30.0, "both robots' policies and reconcilers to report routing keys")
        for robot in robots:
            policy = statuses[f"csr_ros: {robot}/policy"]
            assert policy["robot_id"] == keys[robot], policy
            # The key of the state version its last decision was built against: what the
            # reconciler that loaded that version sends too, though it is another client.
            assert policy["routing_key"] == f"{keys[robot]}/v{last[robot].version}", policy
            assert policy.get("lost_chunks", "0") == "0", policy
            aggregator = statuses[f"csr_ros: {robot}/aggregator"]
            assert aggregator["robot_id"] == robot, "the aggregator's id is its namespace"
            assert aggregator["next_seq"] == str(len(expected[robot])), aggregator
            reconciler = statuses[f"csr_ros: {robot}/reconciler"]
            assert policy["routing_key"] in (reconciler["routing_key.r1"],
                                             reconciler.get("routing_key.r2")), (policy,
                                                                                 reconciler)

        for robot in robots:
            print(f"\n{robot}: {len(decisions[robot])} decisions, last over seq "
                  f"{last[robot].last_seq} ({last[robot].static_tokens} static tokens), routing "
                  f"key {statuses[f'csr_ros: {robot}/policy']['routing_key']}")
        for proc in reversed(procs):
            code, _ = proc.terminate(timeout_s=15.0)
            assert code == 0, proc.output
    finally:
        for proc in procs:
            proc.stop()
        graph.close()
