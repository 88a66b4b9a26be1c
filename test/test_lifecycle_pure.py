"""The pure halves of nodes that stay up: callback faults said once then counted, the state a
managed node reports, and what a launch says when one of its nodes dies or its bag player
fails (csr_ros.node_logic.callback_faults, .transitions, csr_ros.launch_args). The rclpy halves
are in test/ros/test_lifecycle_ros.py and test/ros/test_launch_files.py."""

from __future__ import annotations

import pytest

from csr_ros.errors import ConfigError
from csr_ros.launch_args import (error_lines, lifecycle_parameters, node_exit_reason,
                                 player_exit_reason)
from csr_ros.node_logic.callback_faults import CallbackFaults
from csr_ros.node_logic.health import ERROR, WARN
from csr_ros.node_logic.transitions import TransitionRecord

RCL_WARNINGS = [
    "[WARN] [1796187864.938616132] [rcl]: ROS_LOCALHOST_ONLY is deprecated but still honored "
    "if it is enabled. Use ROS_AUTOMATIC_DISCOVERY_RANGE and ROS_STATIC_PEERS instead.",
    "[WARN] [1796187864.960062033] [rcl]: 'localhost_only' is enabled, "
    "'automatic_discovery_range' and 'static_peers' will be ignored."]


def test_a_callback_fault_is_logged_in_full_once_then_as_a_line_at_most_every_10_s():
    faults = CallbackFaults()
    said = [faults.record("tick_callback", "ValueError: boom", t) for t in (0.0, 1.0, 5.0,
                                                                            10.5, 11.0)]
    assert said == ["traceback", None, None, "line", None]
    assert faults.line("tick_callback", "ValueError: boom") == \
        "tick_callback raised again (5 times so far): ValueError: boom"
    # another callback, or another exception type in the same one, is new: its traceback too
    assert faults.record("chunk_callback", "ValueError: boom", 11.0) == "traceback"
    assert faults.record("tick_callback", "KeyError: 'x'", 11.0) == "traceback"
    assert faults.total == 7


def test_a_callback_fault_is_an_error_on_diagnostics_for_30_s_and_stays_counted():
    faults = CallbackFaults()
    assert faults.status(0.0) is None and faults.values() == []
    faults.record("poll_callback", "RuntimeError: no", 100.0)
    assert faults.status(110.0) == ("poll_callback raised RuntimeError: no (1 times, the latest "
                                    "10 s ago); the node goes on")
    assert faults.status(131.0) is None
    assert dict(faults.values()) == {"callback_errors": "1",
                                     "last_callback_error": "poll_callback: RuntimeError: no"}


def test_a_failed_transition_is_an_error_with_its_reason_until_a_later_one_succeeds():
    record = TransitionRecord()
    assert record.level_message() == (WARN, "unconfigured: waiting for a configure transition")
    record.failed("configure", "unconfigured", "policy: rate_hz must be > 0, got 0.0")
    assert record.level_message() == (ERROR, "configure failed: policy: rate_hz must be > 0, got "
                                             "0.0 (the node is unconfigured)")
    assert ("failed_reason", "policy: rate_hz must be > 0, got 0.0") in record.values()
    record.succeeded("configure", "inactive")
    assert record.level_message() == (WARN, "inactive: configured, not working (activate it)")
    record.succeeded("activate", "active")
    assert record.level_message() is None and record.values() == [("lifecycle_state", "active")]


def test_autostart_is_true_unless_the_launch_says_false():
    assert lifecycle_parameters({}) == {"autostart": True}
    assert lifecycle_parameters({"autostart": ""}) == {"autostart": True}
    assert lifecycle_parameters({"autostart": "false"}) == {"autostart": False}
    with pytest.raises(ConfigError, match=r"autostart:='later' is not a boolean"):
        lifecycle_parameters({"autostart": "later"})


def test_the_players_error_is_the_reason_even_after_rcl_warnings():
    """ROS_LOCALHOST_ONLY=1 makes rcl print two deprecation warnings as a process starts; they
    were among the player's last lines, and the launch said them instead of its error."""
    lines = RCL_WARNINGS + ["csr-ros replay: error: cannot read the bag /b: Expected metadata "
                            "file '/b' does not exist."]
    assert player_exit_reason(2, lines) == (
        "the bag player exited with code 2: csr-ros replay: error: cannot read the bag /b: "
        "Expected metadata file '/b' does not exist.")
    assert player_exit_reason(2, lines[::-1]) == player_exit_reason(2, lines)   # wherever it is


def test_the_reason_of_a_process_is_what_it_reported_as_its_error():
    traceback = ["Traceback (most recent call last):", '  File "policy.py", line 9, in tick',
                 "ValueError: Logger severity cannot be changed between calls."]
    assert error_lines(RCL_WARNINGS + traceback) == traceback[-1:]
    assert error_lines(["[policy] error: policy: rate_hz must be > 0, got 0.0"]) == \
        ["[policy] error: policy: rate_hz must be > 0, got 0.0"]
    assert error_lines(["[ERROR] [1.5] [reconciler]: activate failed: unreachable"]) == \
        ["[ERROR] [1.5] [reconciler]: activate failed: unreachable"]
    # nothing that reads as an error: the last lines that are not ROS logs below ERROR
    assert error_lines(RCL_WARNINGS + ["Segmentation fault"]) == ["Segmentation fault"]
    assert error_lines(RCL_WARNINGS) == []


def test_a_node_that_dies_ends_the_launch_naming_it_how_it_ended_and_its_error():
    reason = node_exit_reason("all_in_one", 1, RCL_WARNINGS + [
        "Traceback (most recent call last):",
        "ValueError: Logger severity cannot be changed between calls."])
    assert reason.startswith("the node process all_in_one exited with code 1 while the launch "
                             "ran")
    assert reason.endswith(": ValueError: Logger severity cannot be changed between calls.")
    killed = node_exit_reason("policy", -9, ["[INFO] [1.0] [policy]: deciding at 2.0 Hz"])
    assert "policy was killed by signal 9 (SIGKILL)" in killed
    assert killed.endswith("(it reported no error)")
    assert node_exit_reason("aggregator", 0, []).endswith("(it printed nothing)")
