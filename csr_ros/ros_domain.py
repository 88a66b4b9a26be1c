"""A ROS domain of one's own on this machine, for tests and demos that start nodes (pure: no
rclpy), so their topics never reach a robot stack or another run on the same host."""

from __future__ import annotations

import os
import random
import socket

from csr_ros.errors import ConfigError, CsrError


#: "k/n": this process picks only domains d with d % n == k. Processes started side by side
#: (the test command's pytest workers) take one k each, so two of them never pick the same
#: domain before either has a participant in it to show that it is taken.
SLOT_ENV = "CSR_ROS_DOMAIN_SLOT"


def free_ros_domain() -> int:
    """A random ROS domain that no DDS participant on this machine uses yet.

    Fast DDS's first participant of domain d listens on UDP port 7410 + 250 d (its unicast
    discovery port); where that port is taken, another run (or a robot stack) is in d."""
    slot, slots = _domain_slot()
    domains = [d for d in range(1, 233) if d % slots == slot]
    rng = random.SystemRandom()
    for _ in range(100):
        domain = rng.choice(domains)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind(("", 7410 + 250 * domain))
            except OSError:
                continue
        return domain
    raise CsrError("no free ROS domain on this machine: every domain's discovery port is taken")


def _domain_slot() -> tuple[int, int]:
    text = os.environ.get(SLOT_ENV, "")
    if not text:
        return 0, 1
    try:
        slot, slots = (int(part) for part in text.split("/"))
    except ValueError:
        slot, slots = -1, 0
    if not 0 <= slot < slots <= 100:
        raise ConfigError(f"{SLOT_ENV}={text!r}: expected 'k/n' with 0 <= k < n <= 100")
    return slot, slots
