"""On the GPU server: the reconciler, and optionally the two vLLM servers it drives.

    ros2 launch csr_ros server.launch.py start_servers:=true vllm_config:=/path/to/vllm.yaml

With start_servers:=true, `csr-ros serve vllm` starts R1 and R2 (one per GPU) from the vLLM
config; the reconciler retries until they are healthy (loading a large model takes minutes).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    share = FindPackageShare("csr_ros")
    params_file = LaunchConfiguration("params_file")
    urls = {"resource.r1_url": LaunchConfiguration("r1_url"),
            "resource.r2_url": LaunchConfiguration("r2_url")}
    return LaunchDescription([
        DeclareLaunchArgument(
            "params_file", default_value=PathJoinSubstitution([share, "config", "csr_ros.yaml"]),
            description="ROS 2 parameters file of the csr_ros nodes"),
        DeclareLaunchArgument("r1_url", default_value="http://127.0.0.1:8001",
                              description="URL of inference server R1"),
        DeclareLaunchArgument("r2_url", default_value="http://127.0.0.1:8002",
                              description="URL of inference server R2"),
        DeclareLaunchArgument("model", default_value="smollm2",
                              description="model directory whose tokenizer builds the prompt"),
        DeclareLaunchArgument("start_servers", default_value="false",
                              description="also start the two vLLM servers (csr-ros serve vllm)"),
        DeclareLaunchArgument(
            "vllm_config", default_value=PathJoinSubstitution([share, "config", "vllm.yaml"]),
            description="vLLM servers config for `csr-ros serve vllm`"),
        ExecuteProcess(cmd=["csr-ros", "serve", "vllm", "--config",
                            LaunchConfiguration("vllm_config")],
                       name="vllm_servers", output="screen",
                       condition=IfCondition(LaunchConfiguration("start_servers"))),
        Node(package="csr_ros", executable="reconciler", name="reconciler", output="screen",
             parameters=[params_file, {**urls,
                                       "model": LaunchConfiguration("model")}]),
    ])
