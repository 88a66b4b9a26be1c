"""ROS 2 nodes: thin rclpy adapters over the pure parts (render, ros_params, policy_core,
reconcile). With the ROS run harnesses (csr_ros.harness), the only place in csr_ros that
imports rclpy; each node module has a `main()` that the executables in bin/ (installed into
lib/csr_ros) call.

    aggregator   topics → rendered StateChunks on csr/chunks (+ GetChunks for late joiners)
    policy       csr/chunks + csr/swaps → CsrState; decisions at rate_hz on csr/decisions
    reconciler   csr/chunks → ASR over two resources; SwapEvents on csr/swaps
"""
