"""A deterministic, realistic home-patrol rosbag2 and its ground truth.

    truth = generate_patrol("patrol_bag", duration_s=600, seed=0, storage="mcap")
    # or write_patrol("patrol_bag", PatrolSettings(duration_s=600, seed=0, storage="mcap"))
    truth.events            # typed events with t_s: utterance, detection, action, room_visit
    truth.topics            # topic -> {type, count, hz}
    # and patrol_bag/ground_truth.json holds the same (see `PatrolTruth.to_json`)

    csr-ros patrol OUT --duration-s 600 --seed 0 --storage mcap|sqlite3

A robot lives in a flat of six rooms joined by a hallway. It idles (standing still: only sensor
noise moves), is asked for things by people, drives room to room (turn in place, drive, with
noise on the reported pose), docks to charge when its battery runs low, looks at objects and
reports the outcome of its actions. Topics (written through rosbags, so no ROS install is
needed, in mcap or sqlite3 storage):

    /odom                                nav_msgs/msg/Odometry           10 Hz, pose noise
    /scan                                sensor_msgs/msg/LaserScan        5 Hz, inf and nan ranges
    /battery_state                       sensor_msgs/msg/BatteryState     1 Hz, drains, charges
    /speech/text                         std_msgs/msg/String              "speaker: request"
    /detections                          patrol_msgs/msg/Detections       custom, only in the bag
    /navigate_to_pose/_action/status     action_msgs/msg/GoalStatusArray  on every goal change
    /action_result                       std_msgs/msg/String              "name(target): result"

`topic_names` writes them under other names, `action_results="custom"` as a custom type, and
`extras` adds a camera (Image), /tf at 50 Hz, /tf_static, /cmd_vel, a custom motor status,
/rosout, /diagnostics, a simulation /clock, an IMU and wheel joint states, as another robot's
recording would hold them.

The custom detection type is defined as .msg text and registered with rosbags' typestore
when writing; a reader learns it from the bag. The same seed and duration give byte-identical
message data.

The package, bottom up: `world` (the flat, the robot's script, the ground-truth events; numpy
only), `messages` (the rosbags messages of the patrol's topics), `extras` (the topics of
`extras=True`, with their own generator), `bag_writer` (the validated `PatrolSettings`, the
bag and its `PatrolTruth`).
"""

from csr_ros.patrol.bag_writer import (GROUND_TRUTH_FILE, STORAGES, PatrolSettings, PatrolTruth,
                                       generate_patrol, load_truth, write_patrol)
from csr_ros.patrol.extras import EXTRA_TOPIC_TYPES
from csr_ros.patrol.messages import (SCAN_RANGE_MAX_M, START_NS, TOPIC_ACTION_RESULT,
                                     TOPIC_BATTERY, TOPIC_DETECTIONS, TOPIC_NAV_STATUS,
                                     TOPIC_ODOM, TOPIC_SCAN, TOPIC_SPEECH, TOPIC_TYPES)
from csr_ros.patrol.world import room_at

__all__ = ["EXTRA_TOPIC_TYPES", "GROUND_TRUTH_FILE", "SCAN_RANGE_MAX_M", "START_NS", "STORAGES",
           "TOPIC_ACTION_RESULT", "TOPIC_BATTERY", "TOPIC_DETECTIONS", "TOPIC_NAV_STATUS",
           "TOPIC_ODOM", "TOPIC_SCAN", "TOPIC_SPEECH", "TOPIC_TYPES", "PatrolSettings",
           "PatrolTruth", "generate_patrol", "load_truth", "room_at", "write_patrol"]
