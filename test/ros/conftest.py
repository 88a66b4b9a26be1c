"""What only the ROS tests need: every module here imports rclpy and the csr_ros interfaces, so
each is skipped with the reason where they do not import (before the module is imported); the
graph the in-process nodes spin in, the two probes that record what they publish, and the
console that reads what they log.

Where ROS is required (CI, or CSR_ROS_REQUIRE_ROS=1) a missing rclpy has stopped the session
already (test/conftest.py), so nothing here is skipped silently there.
"""

from __future__ import annotations

import os

import pytest

from support.ros_check import ros_missing

# rcutils' default line format, without colour: what support.ros_nodes.Console reads
os.environ["RCUTILS_CONSOLE_OUTPUT_FORMAT"] = "[{severity}] [{time}] [{name}]: {message}"
os.environ["RCUTILS_COLORIZED_OUTPUT"] = "0"


class ModuleWithoutRos(pytest.Module):
    """A test module of this folder on a machine without ROS: skipped with the reason, never
    imported (its imports of rclpy or csr_ros.msg would fail)."""

    def collect(self):
        pytest.skip(ros_missing(), allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
    if ros_missing() is not None:
        return ModuleWithoutRos.from_parent(parent, path=module_path)
    return None


@pytest.fixture
def graph():
    """Nodes spun on a background thread in this process (support.ros_graph.Graph), closed
    after the test as a node process stops."""
    from support.ros_graph import Graph

    g = Graph()
    yield g
    g.close()


@pytest.fixture
def probe(graph):
    """Records what the nodes publish: chunks, decisions, actions, /diagnostics.

    A module whose tests read another recorder defines its own `probe`, which wins there."""
    from diagnostic_msgs.msg import DiagnosticArray

    from csr_ros.msg import Action, PolicyDecision, StateChunk
    from csr_ros.nodes.common import ACTIONS_QOS, CHUNKS_QOS, DECISIONS_QOS, DIAGNOSTICS_QOS

    from support.ros_nodes import recording_probe

    node = recording_probe(graph, "csr_ros_lifecycle_probe",
                           chunks=(StateChunk, "csr/chunks", CHUNKS_QOS),
                           decisions=(PolicyDecision, "csr/decisions", DECISIONS_QOS),
                           actions=(Action, "csr/actions", ACTIONS_QOS))
    node.statuses: dict[str, list] = {}

    def diagnostics(msg):
        for status in msg.status:
            node.statuses.setdefault(status.name, []).append(status)
    node.create_subscription(DiagnosticArray, "/diagnostics", diagnostics, DIAGNOSTICS_QOS)
    return node


@pytest.fixture
def flat_probe(graph):
    """Records chunks and /diagnostics as flat lists (`.chunks`, `.diagnostics`). A module of
    tests that read these takes it as its `probe`."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.node import Node

    from csr_ros.msg import StateChunk
    from csr_ros.nodes.common import CHUNKS_QOS, DIAGNOSTICS_QOS

    node = graph.add(Node("csr_ros_flat_probe"))
    node.chunks, node.diagnostics = [], []
    node.create_subscription(StateChunk, "csr/chunks", node.chunks.append, CHUNKS_QOS)
    node.create_subscription(DiagnosticArray, "/diagnostics",
                             lambda m: node.diagnostics.extend(m.status), DIAGNOSTICS_QOS)
    return node


@pytest.fixture
def console(capfd):
    """The lines the nodes of this process log, from its stderr (support.ros_nodes.Console,
    read with support.ros_nodes.logged); what it read goes back to the test's report."""
    import sys

    from support.ros_nodes import Console

    reader = Console(capfd)
    yield reader
    reader.lines()
    sys.stderr.write(reader.text)
