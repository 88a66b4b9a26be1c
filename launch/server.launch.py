"""On the GPU server: the reconciler, and optionally the two vLLM servers it drives.

    ros2 launch csr_ros server.launch.py start_servers:=true vllm_config:=/path/to/vllm.yaml
    ros2 launch csr_ros server.launch.py namespace:=robot_a    # robot_a's reconciler
    ros2 launch csr_ros server.launch.py autostart:=false      # unconfigured, for a manager

With start_servers:=true, `csr-ros serve vllm` starts R1 and R2 (one per GPU) from the vLLM
config; the reconciler retries until they are healthy (loading a large model takes minutes).
r1_url, r2_url and model set their parameter only when given; otherwise the params file's
value (or the node's default) holds. Each robot of several has its own reconciler:
namespace:= and robot_id:= as for robot.launch.py (the same values on both sides).

The reconciler is a managed (lifecycle) node: autostart:=true (default) brings it to active,
autostart:=false leaves it unconfigured for the lifecycle manager. Its process exiting while
the launch runs ends the launch (exit 1), naming it and its error.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from csr_ros.launch_actions import declare, node
from csr_ros.launch_args import given_overrides, node_parameters

OVERRIDES = {"r1_url": ("resource.r1_url", str), "r2_url": ("resource.r2_url", str),
             "model": ("model", str)}


def nodes(context):
    args = context.launch_configurations
    params_file, every_node = node_parameters(args)
    reconciler = given_overrides(args, OVERRIDES) | every_node
    return node(args, "reconciler", [params_file, reconciler], name="reconciler")


def generate_launch_description():
    return LaunchDescription([
        *declare("params_file", "r1_url", "r2_url", "model"),
        DeclareLaunchArgument("start_servers", default_value="false",
                              description="also start the two vLLM servers (csr-ros serve vllm)"),
        *declare("namespace", "robot_id", "autostart"),
        DeclareLaunchArgument(
            "vllm_config",
            default_value=PathJoinSubstitution([FindPackageShare("csr_ros"), "config",
                                                "vllm.yaml"]),
            description="vLLM servers config for `csr-ros serve vllm`"),
        ExecuteProcess(cmd=["csr-ros", "serve", "vllm", "--config",
                            LaunchConfiguration("vllm_config")],
                       name="vllm_servers", output="screen",
                       condition=IfCondition(LaunchConfiguration("start_servers"))),
        OpaqueFunction(function=nodes),
    ])
