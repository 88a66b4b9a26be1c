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
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from csr_ros.launch_actions import watched
from csr_ros.launch_args import LIFECYCLE_ARGUMENTS, ROBOT_ARGUMENTS, check_params_file, \
    given_overrides, lifecycle_parameters, node_namespace, robot_parameters

OVERRIDES = {"r1_url": ("resource.r1_url", str), "r2_url": ("resource.r2_url", str),
             "model": ("model", str)}


def nodes(context):
    args = context.launch_configurations
    params_file = check_params_file(args["params_file"])
    reconciler = given_overrides(args, OVERRIDES) | robot_parameters(args) | \
        lifecycle_parameters(args)
    return watched(Node(package="csr_ros", executable="reconciler", name="reconciler",
                        output="screen", namespace=node_namespace(args["namespace"]),
                        parameters=[params_file, reconciler]), "reconciler")


def generate_launch_description():
    share = FindPackageShare("csr_ros")
    return LaunchDescription([
        DeclareLaunchArgument(
            "params_file", default_value=PathJoinSubstitution([share, "config", "csr_ros.yaml"]),
            description="ROS 2 parameters file of the csr_ros nodes"),
        DeclareLaunchArgument("r1_url", default_value="",
                              description="URL of inference server R1 ('' = the params file's)"),
        DeclareLaunchArgument("r2_url", default_value="",
                              description="URL of inference server R2 ('' = the params file's)"),
        DeclareLaunchArgument("model", default_value="",
                              description="model directory whose tokenizer builds the prompt "
                                          "('' = the params file's)"),
        DeclareLaunchArgument("start_servers", default_value="false",
                              description="also start the two vLLM servers (csr-ros serve vllm)"),
        DeclareLaunchArgument("namespace", default_value="",
                              description=ROBOT_ARGUMENTS["namespace"]),
        DeclareLaunchArgument("robot_id", default_value="",
                              description=ROBOT_ARGUMENTS["robot_id"]),
        DeclareLaunchArgument("autostart", default_value="true",
                              description=LIFECYCLE_ARGUMENTS["autostart"]),
        DeclareLaunchArgument(
            "vllm_config", default_value=PathJoinSubstitution([share, "config", "vllm.yaml"]),
            description="vLLM servers config for `csr-ros serve vllm`"),
        ExecuteProcess(cmd=["csr-ros", "serve", "vllm", "--config",
                            LaunchConfiguration("vllm_config")],
                       name="vllm_servers", output="screen",
                       condition=IfCondition(LaunchConfiguration("start_servers"))),
        OpaqueFunction(function=nodes),
    ])
