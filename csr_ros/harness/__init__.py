"""Run harnesses of the main job (`csr-ros demo`), below the tool that parses its options.

    episode_loop   the synthetic episode through ASR in this process
    ros_demo       the same episode through the ROS 2 nodes, each in its own process
    ros_graph      what the ROS runs share: node processes started and stopped, topics observed

ros_demo and ros_graph import rclpy, as do the ROS benchmarks in csr_ros.bench: the only modules
outside csr_ros.nodes that do (test/test_package_layers.py).
"""
