"""On the robot (e.g. a Raspberry Pi): the aggregator and the policy node.

    ros2 launch csr_ros robot.launch.py r1_url:=http://gpu-server:8001 r2_url:=http://gpu-server:8002
    ros2 launch csr_ros robot.launch.py params_file:=/robot/csr_ros.yaml
    ros2 launch csr_ros robot.launch.py namespace:=robot_a r1_url:=http://router:8000 \
        r2_url:=http://router:8000     # /robot_a/csr/..., routing key robot_a
    ros2 launch csr_ros robot.launch.py autostart:=false    # unconfigured, for a manager
    ros2 launch csr_ros robot.launch.py detections_type:=std_msgs/msg/String  # no vision_msgs

The policy asks the primary server named by the reconciler's latest SwapEvent (csr/swaps);
r1_url/r2_url are what it uses before the first one arrives. A launch argument sets its
parameter only when it is given; otherwise the params file's value (or the node's default)
holds.

Several robots on one graph, sharing the servers: one launch per robot with its own
namespace. Its nodes' topics and services (csr/chunks, csr/decisions, csr/get_chunks, ...)
then live under it; absolute source topics in the params file (/odom) stay absolute, so give
per-robot sources relative names (odom → /robot_a/odom). robot_id ('' = the namespace without
its slash) is the routing key of the robot's requests to a pool of servers behind a router.

The nodes are managed (lifecycle) nodes: autostart:=true (default) brings them to active,
autostart:=false leaves them unconfigured for the robot's lifecycle manager. A node process
that exits while the launch runs ends the launch (exit 1), naming it and its error.
"""

from launch import LaunchDescription
from launch.actions import OpaqueFunction

from csr_ros.launch_actions import declare, node
from csr_ros.launch_args import aggregator_parameters, given_overrides, node_parameters

OVERRIDES = {"r1_url": ("resource.r1_url", str), "r2_url": ("resource.r2_url", str),
             "model": ("model", str), "use_sim_time": ("use_sim_time", bool)}


def nodes(context):
    args = context.launch_configurations
    params_file, every_node = node_parameters(args)
    sim_time = given_overrides(args, {"use_sim_time": OVERRIDES["use_sim_time"]})
    policy = given_overrides(args, OVERRIDES) | every_node
    return [
        *node(args, "aggregator",
              [params_file, sim_time | every_node | aggregator_parameters(args)],
              name="aggregator"),
        *node(args, "policy", [params_file, policy], name="policy"),
    ]


def generate_launch_description():
    return LaunchDescription([
        *declare("params_file", "r1_url", "r2_url", "use_sim_time", "model", "namespace",
                 "robot_id", "autostart", "detections_type"),
        OpaqueFunction(function=nodes),
    ])
