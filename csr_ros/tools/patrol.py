"""`csr-ros patrol OUT`: write a deterministic home-patrol rosbag2 and its ground truth.

    csr-ros patrol patrol_bag --duration-s 600 --seed 0 --storage mcap
    csr-ros replay patrol_bag --params config/csr_ros.yaml --stats

OUT is a new rosbag2 directory; OUT/ground_truth.json lists what happened (utterances,
detections, action results, room visits with their times). See csr_ros.patrol: the defaults
and the checks are PatrolSettings'.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from csr_ros.errors import ConfigError
from csr_ros.patrol import GROUND_TRUTH_FILE, STORAGES, PatrolSettings, write_patrol

_D = PatrolSettings()       # the defaults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="new rosbag2 directory to write")
    parser.add_argument("--duration-s", type=float, default=_D.duration_s,
                        help=f"robot time covered by the bag (default {_D.duration_s:g})")
    parser.add_argument("--seed", type=int, default=_D.seed,
                        help=f"random seed (default {_D.seed})")
    parser.add_argument("--storage", choices=STORAGES, default=_D.storage,
                        help=f"rosbag2 storage plugin (default {_D.storage})")
    parser.add_argument("--odom-hz", type=float, default=_D.odom_hz,
                        help=f"odometry rate, also the simulation step (default {_D.odom_hz:g})")
    parser.add_argument("--scan-hz", type=float, default=_D.scan_hz,
                        help=f"laser scan rate, rounded to divide --odom-hz (default "
                             f"{_D.scan_hz:g})")
    parser.add_argument("--battery-hz", type=float, default=_D.battery_hz,
                        help=f"battery rate, rounded to divide --odom-hz (default "
                             f"{_D.battery_hz:g})")
    parser.add_argument("--noise", type=float, default=_D.noise,
                        help=f"scale of every sensor noise and of the nan/inf share (default "
                             f"{_D.noise:g})")
    parser.add_argument("--detections", choices=("custom", "vision_msgs"), default=_D.detections,
                        help="type of /detections, defined only in the bag: "
                             "patrol_msgs/msg/Detections (default) or "
                             "vision_msgs/msg/Detection2DArray")
    parser.add_argument("--rename", nargs="+", default=[], metavar="OLD=NEW",
                        help="write a patrol topic under another name, as another robot "
                             "would (e.g. /speech/text=/speech /odom=/odometry/filtered)")
    parser.add_argument("--action-results", choices=("string", "custom"),
                        default=_D.action_results,
                        help="type of /action_result: std_msgs/msg/String (default) or the "
                             "custom patrol_msgs/msg/ActionOutcome")
    parser.add_argument("--extras", action="store_true",
                        help="also write a camera (Image), /tf and /tf_static, /cmd_vel, a "
                             "custom motor status type, /rosout, /diagnostics, /clock, /imu/data "
                             "and /joint_states")
    parser.add_argument("--image-hz", type=float, default=_D.image_hz,
                        help=f"camera rate with --extras (default {_D.image_hz:g})")
    parser.add_argument("--tf-hz", type=float, default=_D.tf_hz,
                        help=f"/tf rate with --extras (default {_D.tf_hz:g})")
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
    settings = PatrolSettings(duration_s=args.duration_s, seed=args.seed, storage=args.storage,
                              odom_hz=args.odom_hz, scan_hz=args.scan_hz,
                              battery_hz=args.battery_hz, noise=args.noise,
                              detections=args.detections, topic_names=parse_renames(args.rename),
                              extras=args.extras, image_hz=args.image_hz, tf_hz=args.tf_hz,
                              action_results=args.action_results)
    truth = write_patrol(args.out, settings, overwrite=args.overwrite)
    for topic, info in truth.topics.items():
        print(f"{topic:<36} {info['type']:<34} {info['count']:>6}")
    print(json.dumps(truth.event_counts))
    print(f"wrote {args.out} ({truth.duration_s:g} s, {args.storage}) and "
          f"{args.out / GROUND_TRUTH_FILE}", file=sys.stderr)
    return 0
