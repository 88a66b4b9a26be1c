"""Replay a recorded bag into the nodes: a bag player publishes the robot's topics, the
aggregator renders them, and the policy decides as if on the robot.

    ros2 launch csr_ros replay.launch.py bag:=/data/run1 rate:=2.0
    ros2 launch csr_ros replay.launch.py bag:=/data/run1 mode:=all threads:=2   # local models
    ros2 launch csr_ros replay.launch.py bag:=/data/run1 topics:="/odom /speech/text" \
        start_offset:=120 delay:=10
    ros2 launch csr_ros replay.launch.py bag:=/data/run1 player:=csr   # no rosbag2 needed
    ros2 launch csr_ros replay.launch.py bag:=/data/run1 namespace:=robot_a   # its nodes there

mode:=robot (default) runs robot.launch.py (servers elsewhere), mode:=all runs all.launch.py.
player:=rosbag2 plays with `ros2 bag play`, player:=csr with `csr-ros replay BAG --play`
(rclpy, for machines without rosbag2 such as the PyPI wheels); player:=auto (default) takes
rosbag2 where `ros2 bag` exists. Sim time follows the bag's clock (--clock), so stamps and rate
limits match the recording. `delay:=SECONDS` waits that long before playing; without it the
bag plays at once, so with mode:=all (local models that take a while to load) give a delay
that covers the load, or the first part of the bag reaches only the aggregator.
detections_type:= retypes the aggregator's /detections source (see all.launch.py).
autostart:= goes to the nodes (false: they wait, unconfigured, for a lifecycle manager), and
a node process that exits ends the launch as in the included launch file.

Every bag argument is checked before any node starts: a bad one stops the launch and leaves no
node behind. A player that exits with an error stops the whole launch, with the error it
reported as the reason (not rcl's warnings around it); a player that finishes leaves the nodes
running.
"""

from collections import deque

from launch import LaunchDescription
from launch.actions import (DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription,
                            OpaqueFunction, RegisterEventHandler)
from launch.event_handlers import OnProcessExit, OnProcessIO
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch_ros.substitutions import FindPackageShare

from csr_ros.errors import CsrError
from csr_ros.launch_actions import declare
from csr_ros.launch_args import aggregator_parameters, check_bag, node_namespace, \
    node_parameters, player_exit_reason, rosbag2_available


class PlayerError(CsrError):
    """The bag player exited with an error: the launch stops with it."""


def replay(context):
    """Check everything first, then the nodes, the player and what stops the launch."""
    args = context.launch_configurations
    play_cmd = check_bag(args, rosbag2=rosbag2_available())
    node_namespace(args["namespace"])          # checked here too: before the player starts
    node_parameters(args)                      # (the params file, robot_id, autostart)
    aggregator_parameters(args)
    share = FindPackageShare("csr_ros").perform(context)
    forwarded = {"params_file": args["params_file"], "model": args["model"],
                 "use_sim_time": "true", "namespace": args["namespace"],
                 "robot_id": args["robot_id"], "autostart": args["autostart"],
                 "detections_type": args["detections_type"]}
    if args["mode"] == "all":
        forwarded["threads"] = args["threads"]
    nodes = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(f"{share}/launch/{args['mode']}.launch.py"),
        launch_arguments=forwarded.items())
    player = ExecuteProcess(cmd=play_cmd, name="bag_player", output="screen")
    last_lines: deque[str] = deque(maxlen=200)     # player_exit_reason finds its error in them

    def heard(event):
        last_lines.extend(event.text.decode(errors="replace").splitlines())

    def exited(event, launch_context):
        if launch_context.is_shutdown:     # stopped with the rest (Ctrl-C): not its error
            return None
        reason = player_exit_reason(event.returncode, list(last_lines))
        if reason is not None:
            raise PlayerError(reason)      # launch logs it, stops every node, exits 1
        return None

    return [nodes, player,
            RegisterEventHandler(OnProcessIO(target_action=player, on_stdout=heard,
                                             on_stderr=heard)),
            RegisterEventHandler(OnProcessExit(target_action=player, on_exit=exited))]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("bag", description="rosbag2 directory (or file) to play"),
        DeclareLaunchArgument("player", default_value="auto",
                              choices=["auto", "rosbag2", "csr"],
                              description="rosbag2: `ros2 bag play`; csr: `csr-ros replay "
                                          "--play` (rclpy); auto: rosbag2 where it exists"),
        DeclareLaunchArgument("rate", default_value="1.0", description="playback rate"),
        DeclareLaunchArgument("topics", default_value="",
                              description="play only these topics (space-separated; '' = all)"),
        DeclareLaunchArgument("start_offset", default_value="",
                              description="start this many seconds into the bag"),
        DeclareLaunchArgument("delay", default_value="",
                              description="seconds to wait before playing (nodes starting; "
                                          "0 or '' = none)"),
        DeclareLaunchArgument("loop", default_value="false", description="play in a loop"),
        DeclareLaunchArgument("mode", default_value="robot", choices=["robot", "all"],
                              description="robot: aggregator+policy; all: everything locally"),
        *declare("params_file", "model", "threads", "namespace", "robot_id", "autostart",
                 "detections_type"),
        OpaqueFunction(function=replay),
    ])
