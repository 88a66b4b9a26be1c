"""The stream's default sizes and rates, one table: what the ROS nodes, the gateway, the demo and
the fleet start with unless told otherwise.

    ROBOT    the ROS 2 nodes' parameters (csr_ros.ros_params)
    GATEWAY  `csr-ros gateway`: chat sessions over the reconciler
    DEMO     `csr-ros demo`, `demo --ros` (csr_ros.episode_run.EpisodeSettings)
    FLEET    each robot of `csr-ros fleet`

The rows differ only where the use differs, and each row's `why` says how. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class StreamDefaults:
    tau_mem_tokens: int          # static tokens that start an eviction (ASR)
    max_context_tokens: int      # context of each resource
    reserve_tokens: int          # kept free for one query's dynamic part and its answer
    n_catchup_tokens: int        # catch up while the buffer holds more tokens than this
    max_new_tokens: int          # a decision's (an answer's) token budget
    rate_hz: float | None        # decisions per second (None: on request only)
    chunk_rate_hz: float | None  # synthetic chunks per second (None: the robot's sensors decide)
    why: str


ROBOT = StreamDefaults(
    tau_mem_tokens=6144, max_context_tokens=8192, reserve_tokens=512, n_catchup_tokens=256,
    max_new_tokens=48, rate_hz=2.0, chunk_rate_hz=None,
    why="A robot runs for hours: evict at three quarters of an 8192-token context, so the "
        "quarter left holds the reserve and the chunks that arrive while the secondary warms "
        "up; 48 tokens hold an action of the default vocabulary with a free-text argument.")

GATEWAY = replace(
    ROBOT, reserve_tokens=256, n_catchup_tokens=64, max_new_tokens=64, rate_hz=None,
    why="The robot's context and tau_mem, but a chat's messages arrive with its queries, not "
        "as a stream: the reserve is one query's new message and answer (also the largest "
        "max_tokens a client may ask), catch-up starts after a message or two, and an answer "
        "a client leaves unbounded gets 64 tokens.")

DEMO = StreamDefaults(
    tau_mem_tokens=1536, max_context_tokens=4096, reserve_tokens=128, n_catchup_tokens=64,
    max_new_tokens=24, rate_hz=2.0, chunk_rate_hz=0.5,
    why="A synthetic episode evicts sooner than a robot, so that a run of a few minutes on two "
        "CPU cores goes through several eviction cycles and each warm-up stays short; its "
        "dynamic part is a short suffix and task, and an action of its vocabulary fits in 24 "
        "tokens.")

FLEET = replace(
    DEMO, chunk_rate_hz=1.0,
    why="The demo's robot, with chunks twice as fast, so that each robot's history reaches "
        "tau_mem within one run of --duration-s 45 (chunks of about 45 tokens).")
