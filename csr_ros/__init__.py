"""csr_ros: cached state representation, asynchronous state reconciliation and execution-state
capsules for LLM policies on ROS 2 robots.

The pure parts (state, layout, chunks, eviction, reconcile, render) import neither torch nor
rclpy; the local engine imports torch; the node modules import rclpy.
"""

__version__ = "0.1.0"
