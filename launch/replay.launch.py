"""Replay a recorded bag into the nodes: `ros2 bag play` publishes the robot's topics, the
aggregator renders them, and the policy decides as if on the robot.

    ros2 launch csr_ros replay.launch.py bag:=/data/run1 rate:=2.0
    ros2 launch csr_ros replay.launch.py bag:=/data/run1 mode:=all threads:=2   # local models
    ros2 launch csr_ros replay.launch.py bag:=/data/run1 topics:="/odom /speech/text" \
        start_offset:=120 delay:=10

mode:=robot (default) runs robot.launch.py (servers elsewhere), mode:=all runs all.launch.py.
Sim time follows the bag's clock (--clock), so stamps and rate limits match the recording.
`delay` waits before playing so the nodes are up (a local model takes a while to load).
Without a ROS install's `ros2 bag`, `csr-ros replay BAG --play` publishes a bag the same way.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription, \
    OpaqueFunction
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.substitutions import FindPackageShare

from csr_ros.launch_args import bag_play_command


def bag_play(context):
    args = context.launch_configurations
    return [ExecuteProcess(cmd=bag_play_command(
        args["bag"], rate=args["rate"], topics=args["topics"],
        start_offset_s=args["start_offset"], delay_s=args["delay"],
        loop=args["loop"].lower() == "true"), name="bag_play", output="screen")]


def generate_launch_description():
    share = FindPackageShare("csr_ros")
    mode = LaunchConfiguration("mode")
    forwarded = {"params_file": LaunchConfiguration("params_file"),
                 "model": LaunchConfiguration("model"), "use_sim_time": "true"}
    return LaunchDescription([
        DeclareLaunchArgument("bag", description="rosbag2 directory (or file) to play"),
        DeclareLaunchArgument("rate", default_value="1.0", description="playback rate"),
        DeclareLaunchArgument("topics", default_value="",
                              description="play only these topics (space-separated; '' = all)"),
        DeclareLaunchArgument("start_offset", default_value="",
                              description="start this many seconds into the bag"),
        DeclareLaunchArgument("delay", default_value="",
                              description="seconds to wait before playing (nodes starting)"),
        DeclareLaunchArgument("loop", default_value="false", description="play in a loop"),
        DeclareLaunchArgument("mode", default_value="robot", choices=["robot", "all"],
                              description="robot: aggregator+policy; all: everything locally"),
        DeclareLaunchArgument(
            "params_file", default_value=PathJoinSubstitution([share, "config", "csr_ros.yaml"]),
            description="ROS 2 parameters file of the csr_ros nodes"),
        DeclareLaunchArgument("model", default_value="",
                              description="model directory whose tokenizer builds the prompt "
                                          "('' = the params file's)"),
        DeclareLaunchArgument("threads", default_value="",
                              description="mode:=all: CPU threads per local engine "
                                          "('' = the params file's)"),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share, "launch",
                                                                "robot.launch.py"])),
            launch_arguments=forwarded.items(),
            condition=IfCondition(PythonExpression(["'", mode, "' == 'robot'"]))),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share, "launch", "all.launch.py"])),
            launch_arguments={**forwarded, "threads": LaunchConfiguration("threads")}.items(),
            condition=IfCondition(PythonExpression(["'", mode, "' == 'all'"]))),
        OpaqueFunction(function=bag_play),
    ])
