"""Everything on one machine in one process: the reconciler with two in-process (local)
resources, and the policy node asking it directly (a local model cannot be shared between
processes). The aggregator runs as its own process next to it (see all.launch.py)."""

from __future__ import annotations

from csr_ros.nodes.common import run
from csr_ros.nodes.policy import PolicyNode
from csr_ros.nodes.reconciler import ReconcilerNode


def main(args=None) -> int:
    return run(ReconcilerNode, lambda reconciler: PolicyNode(driver=reconciler),
               args=args, threads=6, label="all_in_one")


if __name__ == "__main__":
    raise SystemExit(main())
