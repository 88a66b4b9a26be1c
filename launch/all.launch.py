"""Everything on one machine, no servers: the aggregator, and the reconciler with two
in-process (local) resources plus the policy node in one process (all_in_one).

    ros2 launch csr_ros all.launch.py                   # the embedded SmolLM2 on the CPU
    ros2 launch csr_ros all.launch.py model:=/models/qwen threads:=4
    ros2 launch csr_ros all.launch.py namespace:=robot_a    # /robot_a/csr/chunks, ...
    ros2 launch csr_ros all.launch.py autostart:=false      # unconfigured, for a manager

`resource.kind` is always 'local' here. The other launch arguments set their parameter only
when given; otherwise the params file's value (or the node's default) holds. namespace:=
puts this robot's nodes (and their relative topics and services) under a namespace, so several
robots share one graph; robot_id:= names the robot ('' = the namespace without its slash).

The nodes are managed (lifecycle) nodes: autostart:=true (default) brings them to active,
autostart:=false leaves them unconfigured for the robot's lifecycle manager. A node process
that exits while the launch runs ends the launch (exit 1), naming it and its error.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from csr_ros.launch_actions import watched
from csr_ros.launch_args import LIFECYCLE_ARGUMENTS, ROBOT_ARGUMENTS, check_params_file, \
    given_overrides, lifecycle_parameters, node_namespace, robot_parameters

OVERRIDES = {"model": ("model", str), "threads": ("resource.threads", int),
             "use_sim_time": ("use_sim_time", bool)}


def nodes(context):
    args = context.launch_configurations
    params_file = check_params_file(args["params_file"])
    sim_time = given_overrides(args, {"use_sim_time": OVERRIDES["use_sim_time"]})
    namespace, robot = node_namespace(args["namespace"]), robot_parameters(args)
    lifecycle = lifecycle_parameters(args)
    local = {"resource.kind": "local", **given_overrides(args, OVERRIDES), **robot, **lifecycle}
    return [
        *watched(Node(package="csr_ros", executable="aggregator", name="aggregator",
                      output="screen", namespace=namespace,
                      parameters=[params_file, sim_time | robot | lifecycle]), "aggregator"),
        # the node names come from the code (reconciler, policy); no name= for two nodes
        *watched(Node(package="csr_ros", executable="all_in_one", output="screen",
                      namespace=namespace, parameters=[params_file, local]), "all_in_one"),
    ]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare("csr_ros"), "config",
                                                "csr_ros.yaml"]),
            description="ROS 2 parameters file of the csr_ros nodes"),
        DeclareLaunchArgument("use_sim_time", default_value="",
                              description="true: follow /clock (a bag played with --clock)"),
        DeclareLaunchArgument("model", default_value="",
                              description="'smollm2' (embedded default) or a model directory "
                                          "('' = the params file's)"),
        DeclareLaunchArgument("threads", default_value="",
                              description="CPU threads per local engine ('' = the params "
                                          "file's; 0 = default)"),
        DeclareLaunchArgument("namespace", default_value="",
                              description=ROBOT_ARGUMENTS["namespace"]),
        DeclareLaunchArgument("robot_id", default_value="",
                              description=ROBOT_ARGUMENTS["robot_id"]),
        DeclareLaunchArgument("autostart", default_value="true",
                              description=LIFECYCLE_ARGUMENTS["autostart"]),
        OpaqueFunction(function=nodes),
    ])
