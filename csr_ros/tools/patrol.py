"""`csr-ros patrol OUT`: write a deterministic home-patrol rosbag2 and its ground truth.

    csr-ros patrol patrol_bag --duration-s 600 --seed 0 --storage mcap
    csr-ros replay patrol_bag --params config/csr_ros.yaml --stats

OUT is a new rosbag2 directory; OUT/ground_truth.json lists what happened (utterances,
detections, action results, room visits with their times). See csr_ros.patrol.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from csr_ros.errors import ConfigError
from csr_ros.patrol import GROUND_TRUTH_FILE, STORAGES, generate_patrol


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="new rosbag2 directory to write")
    parser.add_argument("--duration-s", type=float, default=600.0,
                        help="robot time covered by the bag (default 600)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--storage", choices=STORAGES, default="mcap",
                        help="rosbag2 storage plugin (default mcap)")
    parser.add_argument("--odom-hz", type=float, default=10.0,
                        help="odometry rate, also the simulation step (default 10)")
    parser.add_argument("--scan-hz", type=float, default=5.0,
                        help="laser scan rate, rounded to divide --odom-hz (default 5)")
    parser.add_argument("--battery-hz", type=float, default=1.0,
                        help="battery rate, rounded to divide --odom-hz (default 1)")
    parser.add_argument("--noise", type=float, default=1.0,
                        help="scale of every sensor noise and of the nan/inf share (default 1)")
    parser.add_argument("--detections", choices=("custom", "vision_msgs"), default="custom",
                        help="type of /detections, defined only in the bag: "
                             "patrol_msgs/msg/Detections (default) or "
                             "vision_msgs/msg/Detection2DArray")
    parser.add_argument("--rename", nargs="+", default=[], metavar="OLD=NEW",
                        help="write a patrol topic under another name, as another robot "
                             "would (e.g. /speech/text=/speech /odom=/odometry/filtered)")
    parser.add_argument("--action-results", choices=("string", "custom"), default="string",
                        help="type of /action_result: std_msgs/msg/String (default) or the "
                             "custom patrol_msgs/msg/ActionOutcome")
    parser.add_argument("--extras", action="store_true",
                        help="also write a camera (Image), /tf and /tf_static, /cmd_vel, a "
                             "custom motor status type, /rosout, /diagnostics, /clock, /imu/data "
                             "and /joint_states")
    parser.add_argument("--image-hz", type=float, default=10.0,
                        help="camera rate with --extras (default 10)")
    parser.add_argument("--tf-hz", type=float, default=50.0,
                        help="/tf rate with --extras (default 50)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if it exists")


def parse_renames(pairs: list[str]) -> dict[str, str]:
    renamed = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise ConfigError(f"--rename takes OLD=NEW (e.g. /speech/text=/speech), got {pair!r}")
        renamed[old] = new
    return renamed


def run(args: argparse.Namespace) -> int:
    truth = generate_patrol(args.out, duration_s=args.duration_s, seed=args.seed,
                            storage=args.storage, overwrite=args.overwrite,
                            odom_hz=args.odom_hz, scan_hz=args.scan_hz,
                            battery_hz=args.battery_hz, noise=args.noise,
                            detections=args.detections,
                            topic_names=parse_renames(args.rename), extras=args.extras,
                            image_hz=args.image_hz, tf_hz=args.tf_hz,
                            action_results=args.action_results)
    for topic, info in truth.topics.items():
        print(f"{topic:<36} {info['type']:<34} {info['count']:>6}")
    print(json.dumps(truth.event_counts))
    print(f"wrote {args.out} ({truth.duration_s:g} s, {args.storage}) and "
          f"{args.out / GROUND_TRUTH_FILE}", file=sys.stderr)
    return 0
