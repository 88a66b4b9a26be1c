"""`csr-ros check-params` validates a parameters file without ROS."""

from __future__ import annotations

from pathlib import Path

from csr_ros.cli import main

CONFIG = Path(__file__).resolve().parents[1] / "config" / "csr_ros.yaml"


def test_the_shipped_file_passes_and_lists_the_sources(capsys):
    assert main(["check-params", str(CONFIG)]) == 0
    out = capsys.readouterr().out
    assert "aggregator: ok: odom=/odom (nav_msgs/msg/Odometry)" in out
    assert "policy: ok" in out and "reconciler: ok" in out


def test_a_typed_mistake_fails_with_the_fix(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("policy:\n  ros__parameters:\n    rate_hz: 2\n")
    assert main(["check-params", str(path)]) == 2
    assert "rate_hz must be a float: write 2.0, not 2" in capsys.readouterr().err


def test_a_misspelled_message_type_of_a_known_package_fails(tmp_path, capsys):
    text = CONFIG.read_text().replace("sensor_msgs/msg/LaserScan", "sensor_msgs/msg/LaserScn")
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    assert main(["check-params", str(path)]) == 2
    assert "package sensor_msgs has no message LaserScn" in capsys.readouterr().err
