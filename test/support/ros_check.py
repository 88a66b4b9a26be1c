"""Whether the ROS tests can run here: rclpy and the csr_ros interfaces import. Imports neither
at module level, so both conftests can ask on a machine without ROS."""

from __future__ import annotations


def ros_missing() -> str | None:
    """Why the ROS tests cannot run here, or None."""
    try:
        import rclpy  # noqa: F401
    except ImportError as exc:
        return (f"rclpy does not import ({exc}): run `bash scripts/setup.sh --ros` (ROS 2 Jazzy "
                "from PyPI) or source a ROS 2 install")
    try:
        from csr_ros.msg import StateChunk  # noqa: F401
        from csr_ros.srv import GetChunks  # noqa: F401
    except ImportError as exc:
        return (f"the csr_ros interfaces do not import ({exc}): run `bash "
                "scripts/build_interfaces.sh` (or colcon build and source install/setup.bash)")
    return None
