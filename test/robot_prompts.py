"""A real CSR prompt from rendered robot chunks, for any model's tokenizer (engine tests)."""

from __future__ import annotations

from csr_ros.layout import Layout
from csr_ros.state import CsrState


def robot_prompt_ids(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(static_ids, dynamic_ids) of six sensor chunks and an obstacle question."""
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                     profile="You are the policy of a mobile robot. Answer with one action.")
    for i in range(6):
        state.add(f"[t={i * 0.5:.1f}s] odom x={0.1 * i:.2f} y={0.05 * i:.2f} yaw={0.3 * i:.2f}; "
                  f"battery {95 - i}%; lidar min {1.5 - 0.1 * i:.2f} m ahead",
                  source="sensors", stamp_ns=i * 500_000_000)
    request = state.build_request(task="An obstacle is ahead. What do you do next?",
                                  suffix="now: t=6.0s")
    return request.static_ids, request.dynamic_ids
