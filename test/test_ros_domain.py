"""The ROS domain a test run or a demo takes for its nodes (csr_ros/ros_domain.py)."""

from __future__ import annotations

import socket

import pytest

from csr_ros.errors import ConfigError
from csr_ros.ros_domain import SLOT_ENV, free_ros_domain


def test_a_chosen_domain_has_its_discovery_port_free(monkeypatch):
    monkeypatch.delenv(SLOT_ENV, raising=False)
    domain = free_ros_domain()
    assert 1 <= domain <= 232
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("", 7410 + 250 * domain))


def test_processes_in_different_slots_never_pick_the_same_domain(monkeypatch):
    picked = {}
    for slot in range(3):
        monkeypatch.setenv(SLOT_ENV, f"{slot}/3")
        picked[slot] = {free_ros_domain() for _ in range(60)}
    for slot, domains in picked.items():
        assert all(d % 3 == slot and 1 <= d <= 232 for d in domains), (slot, domains)
    assert not (picked[0] & picked[1] or picked[1] & picked[2] or picked[0] & picked[2])


@pytest.mark.parametrize("text", ["2", "a/b", "3/3", "-1/2", "0/0", "1/2/3"])
def test_a_malformed_slot_is_a_config_error_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(SLOT_ENV, text)
    with pytest.raises(ConfigError, match=SLOT_ENV):
        free_ros_domain()
