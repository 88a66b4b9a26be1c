"""What the nodes do, without ROS, by subject: the chunk stream folded into a state
(`stream`), when queries run (`schedule`), the dynamic suffix (`suffix`), health and
/diagnostics (`health`), swap reports (`swaps`). The nodes feed plain views of their messages
into these and turn the outputs back into ROS calls; the demo, eval and the gateway reuse them.
Pure: no rclpy, no threads, no clocks (times come in)."""
