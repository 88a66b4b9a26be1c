"""Nodes and the bag player stopped by a signal, as processes (Ctrl-C, SIGTERM): an aggregator
exits 0 without a traceback; a policy stopped while its query hangs on the server exits within
seconds, not the query's timeout; `csr-ros replay --play --loop` plays the bag again until
stopped and exits 0. all_in_one stopped while it loads: test_all_in_one_loading_ros.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from rclpy.qos import QoSProfile, ReliabilityPolicy

from support.ros_graph import ROOT
from support.ros_nodes import run_node, write_params
from support.waiting import wait_for

pytestmark = pytest.mark.ros


# -- nodes stopped by Ctrl-C or SIGTERM --------------------------------------------------------

@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_aggregator_exits_0_without_traceback(tmp_path, how):
    params = write_params(tmp_path, """
        /**/aggregator:
          ros__parameters:
            sources: [speech]
            source:
              speech: {topic: /defects/stop, type: std_msgs/msg/String}
    """)
    node = run_node("csr_ros.nodes.aggregator", "--params-file", str(params))
    _wait_for_line(node, "aggregating")
    node.send_signal(how)
    _, err = node.communicate(timeout=5)
    assert node.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


class HangingServer:
    """Accepts HTTP connections and never answers: a model busy with a long query."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.conns:
            conn.close()


def test_a_policy_stopped_during_a_query_exits_within_seconds_and_publishes_nothing(tmp_path):
    server = HangingServer()
    try:
        params = write_params(tmp_path, f"""
            /**/policy:
              ros__parameters:
                rate_hz: 5.0
                resource:
                  r1_url: {server.url}
                  r2_url: {server.url}
                  served_model: smollm2
                  timeout_s: 600.0
        """)
        node = run_node("csr_ros.nodes.policy", "--params-file", str(params))
        _wait_for_line(node, "deciding at")
        wait_for(lambda: server.conns, what="the query to reach the server")
        time.sleep(0.5)
        started = time.monotonic()
        node.send_signal(signal.SIGINT)
        _, err = node.communicate(timeout=300)
        took_s = time.monotonic() - started
    finally:
        server.close()
    assert node.returncode == 0, err
    # The query hangs for its whole timeout_s (600 s): stopping in half of that shows the node
    # did not wait for it, on a machine of any speed.
    assert took_s < 300.0, f"stopped after {took_s:.1f} s: it waited for the hanging query"
    assert "Traceback" not in err and "context is invalid" not in err


def _wait_for_line(node: subprocess.Popen, needle: str, timeout_s: float = 60.0) -> None:
    """Read the node's stderr (rclpy logs there) until `needle` appears."""
    deadline = time.monotonic() + timeout_s
    seen = []
    os.set_blocking(node.stderr.fileno(), False)
    while time.monotonic() < deadline:
        line = node.stderr.readline()
        if line:
            seen.append(line)
            if needle in line:
                os.set_blocking(node.stderr.fileno(), True)
                return
        elif node.poll() is not None:
            break
        else:
            time.sleep(0.05)
    raise AssertionError(f"no {needle!r} from the node: {''.join(seen)}")


# -- the csr player -------------------------------------------------------------------------------

def test_the_csr_player_loops_until_stopped_and_exits_0(tmp_path, graph):
    """`csr-ros replay BAG --play --loop` (replay.launch.py's loop:=true with player:=csr):
    the bag again from its start after its end, until Ctrl-C, which is a clean exit."""
    from nav_msgs.msg import Odometry

    bag = tmp_path / "patrol"
    subprocess.run([sys.executable, "-m", "csr_ros.cli", "patrol", str(bag), "--duration-s",
                    "5"], check=True, capture_output=True, timeout=120, cwd=ROOT)
    from rosbags.highlevel import AnyReader

    with AnyReader([bag]) as reader:
        in_bag = sum(1 for c in reader.connections if c.topic == "/odom"
                     for _ in reader.messages(connections=[c]))
    probe = graph.node("loop_probe")
    odoms = []
    probe.create_subscription(Odometry, "/odom", odoms.append,
                              QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
    player = subprocess.Popen([sys.executable, "-m", "csr_ros.cli", "replay", str(bag), "--play",
                               "--rate", "10", "--loop", "--topics", "/odom"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_line(player, "from the start again")
        wait_for(lambda: len(odoms) > in_bag, timeout_s=60.0, what="a second pass of /odom")
        player.send_signal(signal.SIGINT)
        out, err = player.communicate(timeout=30)
    finally:
        if player.poll() is None:
            player.kill()
    assert player.returncode == 0, err
    assert "Traceback" not in err, err
    assert len(odoms) > in_bag                 # more than one pass of the bag
