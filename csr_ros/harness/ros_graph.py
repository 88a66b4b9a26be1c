"""What the runs over a real ROS 2 graph share (`csr-ros demo --ros`, the bag replay and the
watchdog's faults in csr_ros.bench): the nodes, each in its own process as `ros2 run` starts
it, and one observer node in this process that records what they publish.

    NodeProcess  python -m csr_ros.nodes.<node> --ros-args --params-file FILE, output in a log
    Observer     a node in a context of its own, spun on a daemon thread; every callback runs
                 under one lock, so the run reads what it recorded under that lock too
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from csr_ros.errors import CsrError


class NodeProcess:
    """One node of this package in its own process; its stdout and stderr go to `log`."""

    def __init__(self, node: str, params: Path, log: Path, env: dict):
        self.node, self.log_path = node, log
        self._log = open(log, "w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"csr_ros.nodes.{node}", "--ros-args", "--params-file",
             str(params)], env=env, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT)

    def check_alive(self) -> None:
        """Raises CsrError with the end of its log if the process has exited."""
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise CsrError(f"{self.node} exited with {self.proc.returncode}:\n{tail}")

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 20.0) -> dict:
        return stop_all([self], sig, timeout_s)[self.node]


def stop_all(processes: list[NodeProcess], sig: int = signal.SIGINT,
             timeout_s: float = 20.0) -> dict[str, dict]:
    """Signals every process first, then waits for each (killed after `timeout_s`): how each
    exited, {"exit_code", "exit_s"} by node name."""
    started_s = time.monotonic()
    for p in processes:
        if p.proc.poll() is None:
            p.proc.send_signal(sig)
    exits = {}
    for p in processes:
        try:
            code = p.proc.wait(timeout=max(0.0, started_s + timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.proc.kill()
            code = p.proc.wait()
        p._log.close()
        exits[p.node] = {"exit_code": code, "exit_s": round(time.monotonic() - started_s, 2)}
    return exits


class Observer:
    """A node of this process that subscribes, publishes and calls services on the graph."""

    def __init__(self, name: str):
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node

        self.context = Context()
        rclpy.init(context=self.context)
        self.node = Node(name, context=self.context)
        self.lock = threading.Lock()
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._spinner = threading.Thread(target=self._executor.spin, daemon=True)
        self._spinner.start()

    def record(self, msg_type, topic: str, qos,
               keep: Callable[[object], bool] = lambda msg: True) -> list[tuple[float, object]]:
        """The messages on `topic` that `keep` accepts, as (monotonic arrival time, message),
        appended under the lock to the list returned."""
        kept: list[tuple[float, object]] = []

        def on_message(msg) -> None:
            if keep(msg):
                with self.lock:
                    kept.append((time.monotonic(), msg))

        self.node.create_subscription(msg_type, topic, on_message, qos)
        return kept

    def on(self, msg_type, topic: str, qos, callback: Callable[[object], None]) -> None:
        """`callback(msg)` under the lock for every message on `topic`."""
        def on_message(msg) -> None:
            with self.lock:
                callback(msg)

        self.node.create_subscription(msg_type, topic, on_message, qos)

    def call(self, client, request, timeout_s: float = 30.0):
        """A service call's answer; CsrError if the service is not there or does not answer."""
        if not client.wait_for_service(timeout_sec=timeout_s):
            raise CsrError(f"{client.srv_name} is not there")
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout_s):
            raise CsrError(f"{client.srv_name} did not answer within {timeout_s:.0f} s")
        return future.result()

    def close(self) -> None:
        import rclpy

        self._executor.shutdown()
        self._spinner.join(timeout=5)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
