"""Everything on one machine in one process: the reconciler with two in-process (local)
resources, and the policy node asking it directly (a local model cannot be shared between
processes). The aggregator runs as its own process next to it (see all.launch.py)."""

from __future__ import annotations

import sys

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor

from csr_ros.errors import CsrError
from csr_ros.nodes.policy import PolicyNode
from csr_ros.nodes.reconciler import ReconcilerNode


def main(args=None) -> int:
    rclpy.init(args=args)
    nodes = []
    executor = MultiThreadedExecutor(num_threads=6)
    try:
        reconciler = ReconcilerNode()
        nodes.append(reconciler)
        nodes.append(PolicyNode(driver=reconciler))
        for node in nodes:
            executor.add_node(node)
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except CsrError as exc:
        print(f"[all_in_one] error: {exc}", file=sys.stderr)
        return 2
    finally:
        executor.shutdown()
        for node in reversed(nodes):
            node.close()
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
