"""Everything on one machine, no servers: the aggregator, and the reconciler with two
in-process (local) resources plus the policy node in one process (all_in_one).

    ros2 launch csr_ros all.launch.py                   # the embedded SmolLM2 on the CPU
    ros2 launch csr_ros all.launch.py model:=/models/qwen threads:=4
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    params_file = LaunchConfiguration("params_file")
    sim_time = {"use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool)}
    model = LaunchConfiguration("model")
    local = {"resource.kind": "local", "model": model,
             "resource.threads": ParameterValue(LaunchConfiguration("threads"), value_type=int)}
    return LaunchDescription([
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare("csr_ros"), "config",
                                                "csr_ros.yaml"]),
            description="ROS 2 parameters file of the csr_ros nodes"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="follow /clock (a bag played with --clock)"),
        DeclareLaunchArgument("model", default_value="smollm2",
                              description="'smollm2' (embedded default) or a model directory"),
        DeclareLaunchArgument("threads", default_value="0",
                              description="CPU threads per local engine (0 = default)"),
        Node(package="csr_ros", executable="aggregator", name="aggregator", output="screen",
             parameters=[params_file, sim_time]),
        # the node names come from the code (reconciler, policy); no name= for two nodes
        Node(package="csr_ros", executable="all_in_one", output="screen",
             parameters=[params_file, sim_time, local]),
    ])
