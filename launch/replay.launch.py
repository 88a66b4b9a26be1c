"""Replay a recorded bag into the nodes: `ros2 bag play` publishes the robot's topics, the
aggregator renders them, and the policy decides as if on the robot.

    ros2 launch csr_ros replay.launch.py bag:=/data/run1 rate:=2.0
    ros2 launch csr_ros replay.launch.py bag:=/data/run1 mode:=all   # local models, no servers

mode:=robot (default) runs robot.launch.py (servers elsewhere), mode:=all runs all.launch.py.
Sim time follows the bag's clock (--clock), so stamps and rate limits match the recording.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    share = FindPackageShare("csr_ros")
    mode = LaunchConfiguration("mode")
    forwarded = {"params_file": LaunchConfiguration("params_file"),
                 "model": LaunchConfiguration("model"), "use_sim_time": "true"}
    return LaunchDescription([
        DeclareLaunchArgument("bag", description="rosbag2 directory (or file) to play"),
        DeclareLaunchArgument("rate", default_value="1.0", description="playback rate"),
        DeclareLaunchArgument("mode", default_value="robot", choices=["robot", "all"],
                              description="robot: aggregator+policy; all: everything locally"),
        DeclareLaunchArgument(
            "params_file", default_value=PathJoinSubstitution([share, "config", "csr_ros.yaml"]),
            description="ROS 2 parameters file of the csr_ros nodes"),
        DeclareLaunchArgument("model", default_value="smollm2",
                              description="model directory whose tokenizer builds the prompt"),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share, "launch",
                                                                "robot.launch.py"])),
            launch_arguments=forwarded.items(),
            condition=IfCondition(PythonExpression(["'", mode, "' == 'robot'"]))),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share, "launch", "all.launch.py"])),
            launch_arguments=forwarded.items(),
            condition=IfCondition(PythonExpression(["'", mode, "' == 'all'"]))),
        ExecuteProcess(cmd=["ros2", "bag", "play", LaunchConfiguration("bag"),
                            "--rate", LaunchConfiguration("rate"), "--clock"],
                       name="bag_play", output="screen"),
    ])
