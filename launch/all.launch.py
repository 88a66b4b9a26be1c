"""Everything on one machine, no servers: the aggregator, and the reconciler with two
in-process (local) resources plus the policy node in one process (all_in_one).

    ros2 launch csr_ros all.launch.py                   # the embedded SmolLM2 on the CPU
    ros2 launch csr_ros all.launch.py model:=/models/qwen threads:=4
    ros2 launch csr_ros all.launch.py namespace:=robot_a    # /robot_a/csr/chunks, ...
    ros2 launch csr_ros all.launch.py autostart:=false      # unconfigured, for a manager
    ros2 launch csr_ros all.launch.py detections_type:=std_msgs/msg/String  # no vision_msgs

`resource.kind` is always 'local' here. The other launch arguments set their parameter only
when given; otherwise the params file's value (or the node's default) holds. namespace:=
puts this robot's nodes (and their relative topics and services) under a namespace, so several
robots share one graph; robot_id:= names the robot ('' = the namespace without its slash).

The nodes are managed (lifecycle) nodes: autostart:=true (default) brings them to active,
autostart:=false leaves them unconfigured for the robot's lifecycle manager. A node process
that exits while the launch runs ends the launch (exit 1), naming it and its error.
"""

from launch import LaunchDescription
from launch.actions import OpaqueFunction

from csr_ros.launch_actions import declare, node
from csr_ros.launch_args import aggregator_parameters, given_overrides, node_parameters

OVERRIDES = {"model": ("model", str), "threads": ("resource.threads", int),
             "use_sim_time": ("use_sim_time", bool)}


def nodes(context):
    args = context.launch_configurations
    params_file, every_node = node_parameters(args)
    sim_time = given_overrides(args, {"use_sim_time": OVERRIDES["use_sim_time"]})
    local = {"resource.kind": "local", **given_overrides(args, OVERRIDES), **every_node}
    return [
        *node(args, "aggregator",
              [params_file, sim_time | every_node | aggregator_parameters(args)],
              name="aggregator"),
        # the node names come from the code (reconciler, policy); no name= for two nodes
        *node(args, "all_in_one", [params_file, local]),
    ]


def generate_launch_description():
    return LaunchDescription([
        *declare("params_file", "use_sim_time", "model", "threads", "namespace", "robot_id",
                 "autostart", "detections_type"),
        OpaqueFunction(function=nodes),
    ])
