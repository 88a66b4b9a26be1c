"""What only the ROS tests need: every module here imports rclpy and the csr_ros interfaces, so
each is skipped with the reason where they do not import (before the module is imported), and
the graph the in-process nodes spin in.

Where ROS is required (CI, or CSR_ROS_REQUIRE_ROS=1) a missing rclpy has stopped the session
already (test/conftest.py), so nothing here is skipped silently there.
"""

from __future__ import annotations

import pytest

from support.ros_check import ros_missing


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
