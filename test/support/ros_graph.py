"""Helpers of the ROS node tests: a background-spun graph in this process, node processes
started as a robot integrator starts them (`python -m csr_ros.nodes.<node> --ros-args ...`),
and service calls and lifecycle transitions as the ROS 2 tools make them. Imported only by
tests that have rclpy (see conftest)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import rclpy
from rclpy.utilities import get_default_context
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node

from support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "csr_ros.yaml"


class Graph:
    """Nodes spun by a multi-threaded executor on a background thread, in rclpy's default
    context (so nodes made without `context=` join it too); one graph at a time."""

    def __init__(self, threads: int = 6):
        rclpy.init()
        self.context = get_default_context()
        self.executor = MultiThreadedExecutor(num_threads=threads, context=self.context)
        self.nodes: list[Node] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        from rclpy.exceptions import InvalidHandle

        while not self.stopping.is_set() and self.context.ok():
            try:
                self.executor.spin_once(timeout_sec=0.1)
            except InvalidHandle:   # an entity destroyed while the wait set was built: as
                continue            # csr_ros.nodes.common.spin, the node processes' loop

    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        self.executor.add_node(node)
        return node

    def node(self, name: str) -> Node:
        return self.add(Node(name, context=self.context))

    def remove(self, node: Node) -> None:
        """Stop one node while the others keep running (a node killed mid-run)."""
        self.executor.remove_node(node)
        self.nodes.remove(node)
        close = getattr(node, "close", None)
        if close is not None:
            close()
        node.destroy_node()

    def close(self) -> None:
        """As a node process stops (csr_ros.nodes.common.run): the spin ends, the handlers the
        executor queued run out while it still exists, then the nodes are closed."""
        from csr_ros.nodes.common import drain_callbacks

        for node in self.nodes:
            stop = getattr(node, "stop_callbacks", None)
            if stop is not None:
                stop()
        self.stopping.set()
        self.thread.join(timeout=10.0)
        drain_callbacks(self.executor, timeout_s=5.0)
        self.executor.shutdown()
        for node in reversed(self.nodes):
            close = getattr(node, "close", None)
            if close is not None:
                close()
            node.destroy_node()
        rclpy.try_shutdown()     # the default context: the next graph gets a fresh one


def endpoints(node: Node, topic: str, kind: str) -> set[bytes]:
    """The GIDs of the publishers ('pub') or subscriptions ('sub') of a topic: a restarted
    node's endpoints are new ones, while a stopped node's may linger in the graph a moment."""
    infos = (node.get_publishers_info_by_topic(topic) if kind == "pub"
             else node.get_subscriptions_info_by_topic(topic))
    return {bytes(i.endpoint_gid) for i in infos}


def wait_reliable_subscription(node, publisher, timeout_s: float = 30.0,
                               before: frozenset[bytes] | set[bytes] = frozenset()) -> None:
    """Until the aggregator subscribes to `publisher`'s topic with the QoS it matched to it.

    The aggregator subscribes best effort while a topic has no publisher and re-subscribes
    reliably once it sees one (qos_recheck_s); a message sent across that switch may be lost
    (issue 13, defect 4), which the tests that wait here are not about."""
    from rclpy.qos import ReliabilityPolicy

    topic = publisher.topic_name

    def ready():
        # `before`: subscriptions of earlier nodes, which may linger in the graph a moment
        # after their process ended; the publisher must have matched the new one too.
        infos = node.get_subscriptions_info_by_topic(topic)
        new = [i for i in infos if bytes(i.endpoint_gid) not in before]
        return (len(new) == 1 and new[0].qos_profile.reliability == ReliabilityPolicy.RELIABLE
                and publisher.get_subscription_count() >= len(infos))
    wait_for(ready, timeout_s, f"a reliable subscription to {topic}")


def call(client, request, timeout_s: float = 10.0):
    """A service call from a node spun elsewhere: the answer, or None after timeout_s."""
    future = client.call_async(request)
    deadline = time.monotonic() + timeout_s
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    return future.result() if future.done() else None


class NodeProcess:
    """One node executable in its own process, output in a log file.

    The child imports this checkout's csr_ros (PYTHONPATH) and inherits the test run's
    ROS_DOMAIN_ID and localhost-only discovery (set by conftest). `python`, `env` and `cwd`
    start it elsewhere instead: another venv's interpreter with exactly `env`, from `cwd`."""

    def __init__(self, module: str, *ros_args: str, log: Path, python: str | None = None,
                 env: dict[str, str] | None = None, cwd: Path = ROOT):
        self.module = module
        self.log_path = log
        if env is None:
            env = dict(os.environ, PYTHONUNBUFFERED="1",
                       PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
                           "PYTHONPATH", "").split(os.pathsep) if p]))
        self.argv = [python or sys.executable, "-m", f"csr_ros.nodes.{module}", "--ros-args",
                     *ros_args]
        self._log = open(log, "w", encoding="utf-8")
        self.proc = subprocess.Popen(self.argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def tail(self, n_chars: int = 3000) -> str:
        """The end of its output, headed by its pid and whether it still runs: what a failed
        wait on this process adds to its message (DDS transport errors are printed here)."""
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        return f"--- {self.module} (pid {self.proc.pid}, {state}), end of its output:\n" + \
            self.output[-n_chars:]

    def wait_output(self, text: str, timeout_s: float = 60.0) -> str:
        def seen():
            if text in self.output:
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.module} exited with {self.proc.returncode} before "
                                     f"printing {text!r}:\n{self.output}")
            return False
        wait_for(seen, timeout_s, f"{self.module} to print {text!r}", every_s=0.1)
        return self.output

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.module} still ran after {timeout_s} s:\n"
                                 f"{self.output}") from None
        finally:
            self._log.close()

    def terminate(self, timeout_s: float = 10.0) -> tuple[int, float]:
        """SIGTERM, as systemd, docker stop and ros2 launch send it: (exit code, seconds)."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.module} did not stop within {timeout_s} s of SIGTERM:"
                                 f"\n{self.output}") from None
        finally:
            self._log.close()
        return code, time.monotonic() - started

    def stop(self, timeout_s: float = 10.0) -> None:
        """The cleanup after a test, pass or fail: SIGTERM, SIGKILL only after `timeout_s`.

        A node process that ends on SIGTERM takes its DDS participant down with it. A SIGKILL
        leaves the participant's shared-memory segment in /dev/shm (two files per killed node),
        and Fast DDS does not always recover a port that a killed participant used
        (eProsima/Fast-DDS#5053, #5469): the suspected cause of a run in which a later test's
        aggregator was in the probe's graph and got none of the probe's data for 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def kill(self) -> None:
        """SIGKILL, as a crash: for a test about a crash, not for cleanup (see `stop`)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class Lifecycle:
    """A managed node's lifecycle_msgs services, as a lifecycle manager (or `ros2 lifecycle`)
    calls them: /<node>/get_state and /<node>/change_state."""

    def __init__(self, probe: Node, node: str):
        from lifecycle_msgs.srv import ChangeState, GetState

        self.node = node.rstrip("/")
        self.get_client = probe.create_client(GetState, f"{self.node}/get_state")
        self.change_client = probe.create_client(ChangeState, f"{self.node}/change_state")
        wait_for(lambda: self.get_client.service_is_ready() and
                 self.change_client.service_is_ready(), 30.0, f"{self.node}'s lifecycle services")
        self.state()            # answered: the node is reachable before any transition is sent

    def state(self, timeout_s: float = 60.0) -> str:
        """Asked again until it answers: a request sent while discovery still matches only a
        node of the same name that has gone (an earlier test's) is never answered."""
        from lifecycle_msgs.srv import GetState

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answer = call(self.get_client, GetState.Request(), timeout_s=5.0)
            if answer is not None:
                return answer.current_state.label
        raise AssertionError(f"{self.node}/get_state did not answer in {timeout_s} s")

    def change(self, transition: str, timeout_s: float = 120.0) -> bool:
        """'configure', 'activate', 'deactivate', 'cleanup', 'shutdown': True if it succeeded."""
        from lifecycle_msgs.msg import Transition
        from lifecycle_msgs.srv import ChangeState

        answer = call(self.change_client,
                      ChangeState.Request(transition=Transition(label=transition)),
                      timeout_s=timeout_s)
        assert answer is not None, f"{self.node}/change_state {transition} did not answer"
        return bool(answer.success)


def set_parameters(probe: Node, node: str, **values) -> list:
    """The node's rcl_interfaces/SetParameters service, as `ros2 param set` calls it: one
    result (successful, reason) per parameter, in order."""
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import Parameter

    client = probe.create_client(SetParameters, f"{node.rstrip('/')}/set_parameters")
    wait_for(client.service_is_ready, 30.0, f"{node}/set_parameters")
    request = SetParameters.Request(parameters=[
        Parameter(name, value=value).to_parameter_msg()
        for name, value in values.items()])
    answer = call(client, request, timeout_s=30.0)
    assert answer is not None, f"{node}/set_parameters did not answer"
    probe.destroy_client(client)
    return list(answer.results)
