"""On the robot (e.g. a Raspberry Pi): the aggregator and the policy node.

    ros2 launch csr_ros robot.launch.py r1_url:=http://gpu-server:8001 r2_url:=http://gpu-server:8002
    ros2 launch csr_ros robot.launch.py params_file:=/robot/csr_ros.yaml

The policy asks the primary server named by the reconciler's latest SwapEvent (csr/swaps);
r1_url/r2_url are what it uses before the first one arrives. A launch argument sets its
parameter only when it is given; otherwise the params file's value (or the node's default)
holds.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from csr_ros.launch_args import check_params_file, given_overrides

OVERRIDES = {"r1_url": ("resource.r1_url", str), "r2_url": ("resource.r2_url", str),
             "model": ("model", str), "use_sim_time": ("use_sim_time", bool)}


def nodes(context):
    args = context.launch_configurations
    params_file = check_params_file(args["params_file"])
    sim_time = given_overrides(args, {"use_sim_time": OVERRIDES["use_sim_time"]})
    return [
        Node(package="csr_ros", executable="aggregator", name="aggregator", output="screen",
             parameters=[params_file, sim_time]),
        Node(package="csr_ros", executable="policy", name="policy", output="screen",
             parameters=[params_file, given_overrides(args, OVERRIDES)]),
    ]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare("csr_ros"), "config",
                                                "csr_ros.yaml"]),
            description="ROS 2 parameters file of the csr_ros nodes"),
        DeclareLaunchArgument("r1_url", default_value="",
                              description="URL of inference server R1 ('' = the params file's)"),
        DeclareLaunchArgument("r2_url", default_value="",
                              description="URL of inference server R2 ('' = the params file's)"),
        DeclareLaunchArgument("use_sim_time", default_value="",
                              description="true: follow /clock (a bag played with --clock)"),
        DeclareLaunchArgument("model", default_value="",
                              description="model directory whose tokenizer builds the prompt "
                                          "('' = the params file's)"),
        OpaqueFunction(function=nodes),
    ])
