"""A ROS domain of one's own on this machine, for tests and demos that start nodes (pure: no
rclpy), so their topics never reach a robot stack or another run on the same host."""

from __future__ import annotations

import random
import socket

from csr_ros.errors import CsrError


def free_ros_domain() -> int:
    """A random ROS domain that no DDS participant on this machine uses yet.

    Fast DDS's first participant of domain d listens on UDP port 7410 + 250 d (its unicast
    discovery port); where that port is taken, another run (or a robot stack) is in d."""
    rng = random.SystemRandom()
    for _ in range(100):
        domain = rng.randint(1, 232)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind(("", 7410 + 250 * domain))
            except OSError:
                continue
        return domain
    raise CsrError("no free ROS domain on this machine: every domain's discovery port is taken")
