"""Run harnesses: whole runs over real resources or a real ROS 2 graph, measured, below the
`csr-ros` tools that parse their options.

    episode_loop   the synthetic episode through ASR in this process (`csr-ros demo`)
    ros_demo       the same episode through the ROS 2 nodes, each in its own process
    fleet_runs     K robots' episodes on P servers behind a router (`csr-ros fleet`)
    ttft_bench     TTFT of CSR queries against the unordered baseline, capsules (`csr-ros bench`)
    actions_latency  decision latency of typed actions, mode by mode (`csr-ros actions`)
    replay_graph   a recorded bag through the aggregator and all_in_one, measured
    watchdog_faults  each fault the policy's watchdog answers, on a real server (docs/ros.md)

ros_demo, replay_graph and watchdog_faults run node processes and observe their topics: they
import rclpy, the only modules outside csr_ros.nodes that do (test/test_package_layers.py).
"""
