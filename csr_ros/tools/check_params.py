"""`csr-ros check-params FILE`: validate a parameters file for the csr_ros nodes without ROS.

Message types of the aggregator's sources are checked against rosbags' Jazzy type store when
rosbags is installed (packages it does not know, such as vision_msgs, are only checked for
their form); on a robot, the aggregator checks them against the installed packages at start.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from csr_ros.bag_sources import known_type_checker
from csr_ros.ros_params import validate_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="ROS 2 parameters YAML (node: ros__parameters)")


def run(args: argparse.Namespace) -> int:
    nodes = validate_file(args.file, resolve_type=known_type_checker())
    for name, params in nodes.items():
        extra = ""
        if name == "aggregator":
            extra = ": " + ", ".join(f"{s.name}={s.topic} ({s.type_name})"
                                     for s in params["sources"])
        print(f"{name}: ok{extra}")
    return 0
