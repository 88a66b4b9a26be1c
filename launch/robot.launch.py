"""On the robot (e.g. a Raspberry Pi): the aggregator and the policy node.

    ros2 launch csr_ros robot.launch.py r1_url:=http://gpu-server:8001 r2_url:=http://gpu-server:8002

The policy asks the primary server named by the reconciler's latest SwapEvent (csr/swaps);
r1_url/r2_url are what it uses before the first one arrives.
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
    urls = {"resource.r1_url": LaunchConfiguration("r1_url"),
            "resource.r2_url": LaunchConfiguration("r2_url")}
    return LaunchDescription([
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare("csr_ros"), "config",
                                                "csr_ros.yaml"]),
            description="ROS 2 parameters file of the csr_ros nodes"),
        DeclareLaunchArgument("r1_url", default_value="http://127.0.0.1:8001",
                              description="URL of inference server R1"),
        DeclareLaunchArgument("r2_url", default_value="http://127.0.0.1:8002",
                              description="URL of inference server R2"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="follow /clock (a bag played with --clock)"),
        DeclareLaunchArgument("model", default_value="smollm2",
                              description="model directory whose tokenizer builds the prompt"),
        Node(package="csr_ros", executable="aggregator", name="aggregator", output="screen",
             parameters=[params_file, sim_time]),
        Node(package="csr_ros", executable="policy", name="policy", output="screen",
             parameters=[params_file, sim_time, {**urls,
                                       "model": LaunchConfiguration("model")}]),
    ])
