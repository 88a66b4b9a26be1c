"""What the policy publishes on each fault, and after how long: the real policy node (its own
process, as `ros2 run` starts it) against a real llama.cpp server, one fault at a time.

    python -m csr_ros.bench.watchdog_faults --out out/watchdog_faults \\
        [--stale-after-s 3.0] [--rate-hz 2.0] [--threads 1]

    server killed       SIGKILL of the server's process group; then it is started again
    server stalled      SIGSTOP of the server's process group; then SIGCONT
    invalid answers     max_new_tokens set to 1 at run time (SetParameters): every answer ends
                        incomplete; then set back
    context overflow    no reconciler evicts, and chunks come until the prompt no longer fits
                        context_tokens (a small one, so it happens in seconds; stale_after_s
                        60 s, so that only the overflow can call for the safe action)
    deactivation        change_state deactivate (lifecycle_msgs), then activate

For each: the time from the fault (the kill, the stop, the set, the chunk that overflowed, the
transition's answer) to the safe action on csr/actions, its cause, the valid actions that
still came in between, and the time from the recovery to the next valid action. Times are
measured by this process on one clock (monotonic) at the moment it injects the fault and the
moment the message arrives. Writes DIR/report.json and DIR/table.md (the table of docs/ros.md)
and keeps the node and server logs in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from csr_ros.errors import CsrError
from csr_ros.harness.ros_graph import NodeProcess, Observer
from csr_ros.waiting import wait_until
from csr_ros.ros_domain import free_ros_domain

FAULTS = ("server killed", "server stalled", "invalid answers", "context overflow",
          "deactivation")


@dataclass
class Outcome:
    fault: str
    published: str = ""              # what came on csr/actions after the fault
    cause: str = ""                  # the safe action's cause
    to_safe_s: float | None = None   # fault → safe action
    valid_between: int = 0           # valid actions after the fault, before the safe action
    recovery: str = ""               # what ended the fault
    to_valid_s: float | None = None  # recovery → the next valid action
    notes: list[str] = field(default_factory=list)


class Faults(Observer):
    """csr/actions and csr/decisions with their arrival times; a SetParameters and a
    ChangeState client of the policy, and a publisher of chunks."""

    def __init__(self):
        from lifecycle_msgs.srv import ChangeState
        from rcl_interfaces.srv import SetParameters

        from csr_ros.msg import Action, PolicyDecision, StateChunk
        from csr_ros.nodes.common import ACTIONS_QOS, CHUNKS_QOS, DECISIONS_QOS

        super().__init__("csr_watchdog_faults")
        self.actions = self.record(Action, "csr/actions", ACTIONS_QOS)
        self.decisions = self.record(PolicyDecision, "csr/decisions", DECISIONS_QOS)
        self.chunks = self.node.create_publisher(StateChunk, "csr/chunks", CHUNKS_QOS)
        self.set_client = self.node.create_client(SetParameters, "/policy/set_parameters")
        self.change_client = self.node.create_client(ChangeState, "/policy/change_state")

    def clear(self) -> None:
        with self.lock:
            self.actions.clear()
            self.decisions.clear()

    def valid_actions(self, since_s: float) -> list:
        with self.lock:
            return [(t, a) for t, a in self.actions if t >= since_s and not a.safe]

    def safe_actions(self, since_s: float) -> list:
        with self.lock:
            return [(t, a) for t, a in self.actions if t >= since_s and a.safe]

    def wait(self, what: str, condition, timeout_s: float):
        return wait_until(condition, timeout_s, interval_s=0.02,
                          timeout_error=CsrError(f"no {what} within {timeout_s:.0f} s"))

    def set_parameter(self, name: str, value) -> None:
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter

        answer = self.call(self.set_client, SetParameters.Request(
            parameters=[Parameter(name, value=value).to_parameter_msg()]))
        if not answer.results[0].successful:
            raise CsrError(f"setting {name} was refused: {answer.results[0].reason}")

    def change_state(self, transition: str) -> None:
        from lifecycle_msgs.msg import Transition
        from lifecycle_msgs.srv import ChangeState

        answer = self.call(self.change_client,
                           ChangeState.Request(transition=Transition(label=transition)))
        if not answer.success:
            raise CsrError(f"the {transition} transition failed")

    def publish_chunk(self, seq: int, text: str, stream: str) -> None:
        from csr_ros.msg import StateChunk
        from csr_ros.nodes.common import time_msg

        self.chunks.publish(StateChunk(stamp=time_msg(time.time_ns()), seq=seq, source="log",
                                       text=text, stream=stream))


def _policy_params(url: str, args, **extra) -> dict:
    section = {"resource": {"kind": "openai", "r1_url": url, "r2_url": url,
                            "timeout_s": 60.0},
               "rate_hz": args.rate_hz, "max_new_tokens": 16, "safe_action": "wait()",
               "stale_after_s": args.stale_after_s, "action_ttl_s": 600.0, **extra}
    return {"/**/policy": {"ros__parameters": section}}


def _start_policy(out: Path, name: str, params: dict, env: dict) -> NodeProcess:
    """The policy node in its own process, on a params file of its own."""
    path = out / f"{name}.params.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(params))))
    return NodeProcess("policy", path, out / f"{name}.policy.log", env)


def _until_valid(observer: Faults, since_s: float, n: int = 3,
                 timeout_s: float = 300.0) -> None:
    observer.wait(f"{n} valid actions", lambda: len(observer.valid_actions(since_s)) >= n,
                  timeout_s)


def _safe_after(observer: Faults, outcome: Outcome, fault_s: float, timeout_s: float) -> float:
    t, safe = observer.wait("safe action", lambda: observer.safe_actions(fault_s), timeout_s)[0]
    outcome.to_safe_s = round(t - fault_s, 2)
    outcome.cause = safe.cause
    outcome.valid_between = len([1 for tv, _ in observer.valid_actions(fault_s) if tv < t])
    outcome.published = f"{safe.name}() once (safe, valid until the next action)"
    return t


def _recovered(observer: Faults, outcome: Outcome, what: str, since_s: float) -> None:
    outcome.recovery = what
    t, _ = observer.wait("valid action after the recovery",
                         lambda: observer.valid_actions(since_s), 300.0)[0]
    outcome.to_valid_s = round(t - since_s, 2)
    again = [a for tv, a in observer.safe_actions(since_s)]
    if again:
        outcome.notes.append(f"{len(again)} more safe action(s) after the recovery")


def run_faults(args) -> list[Outcome]:
    from csr_ros.model_store import default_gguf_path
    from csr_ros.servers import free_port, llamacpp_server

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", ROS_DOMAIN_ID=str(free_ros_domain()),
               ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")})
    server = llamacpp_server(default_gguf_path(), port=free_port(), n_ctx=4096,
                             n_threads=args.threads, model_alias="smollm2",
                             log_path=out / "llama_server.log")
    server.start()
    observer = Faults()
    wait_s = 6 * args.stale_after_s + 60.0
    outcomes = []
    try:
        for fault in [f for f in FAULTS if not args.only or f in args.only]:
            print(f"-- {fault}", file=sys.stderr)
            outcome = Outcome(fault)
            outcomes.append(outcome)
            # the overflow alone: chunks keep every query prefilling, which may take longer
            # than stale_after_s on a slow machine, so that clock is set out of the way
            extra = {"context_tokens": 1024, "stale_after_s": 60.0} \
                if fault == "context overflow" else {}
            name = fault.replace(" ", "_")
            observer.clear()
            policy = _start_policy(out, name, _policy_params(server.url, args, **extra), env)
            try:
                if fault == "context overflow":
                    _overflow(observer, outcome, wait_s)
                    continue
                _until_valid(observer, 0.0)
                observer.clear()
                fault_s = time.monotonic()
                if fault == "server killed":
                    server.kill()
                    _safe_after(observer, outcome, fault_s, wait_s)
                    back_s = time.monotonic()
                    server.start()
                    _recovered(observer, outcome, "server started again (from its start)", back_s)
                elif fault == "server stalled":
                    os.killpg(server.pid, signal.SIGSTOP)
                    try:
                        _safe_after(observer, outcome, fault_s, wait_s)
                    finally:
                        back_s = time.monotonic()
                        os.killpg(server.pid, signal.SIGCONT)
                    _recovered(observer, outcome, "SIGCONT", back_s)
                elif fault == "invalid answers":
                    observer.set_parameter("max_new_tokens", 1)
                    fault_s = time.monotonic()       # from the set's answer
                    _safe_after(observer, outcome, fault_s, wait_s)
                    back_s = time.monotonic()
                    observer.set_parameter("max_new_tokens", 16)
                    _recovered(observer, outcome, "max_new_tokens set back to 16", back_s)
                elif fault == "deactivation":
                    observer.change_state("deactivate")
                    _safe_after(observer, outcome, fault_s, wait_s)
                    outcome.notes.append(f"{len(observer.valid_actions(fault_s))} valid "
                                         "actions while inactive")
                    time.sleep(3.0)
                    n = len(observer.valid_actions(fault_s))
                    back_s = time.monotonic()
                    observer.change_state("activate")
                    _recovered(observer, outcome, "activate", back_s)
                    outcome.notes.append(f"{n} valid actions in the 3 s after the safe action")
            except CsrError as exc:
                outcome.notes.append(f"not measured: {exc}")
            finally:
                policy.stop()
    finally:
        observer.close()
        server.stop()
    return outcomes


def _overflow(observer: Faults, outcome: Outcome, wait_s: float) -> None:
    """Chunks of about 60 tokens, one a second, into a policy with context_tokens 1024 and
    no reconciler: the chunk that makes the prompt too long is the fault."""
    stream = "overflow"
    text = ("the robot passed waypoint {} in the east hallway; the floor is clear, battery "
            "at 80 percent, no person in sight, lights on, doors closed, all quiet")
    sent: list[float] = []
    _until_valid(observer, 0.0)
    start_s = time.monotonic()         # a safe action before (a slow first decision) is not it
    for seq in range(200):
        sent.append(time.monotonic())
        observer.publish_chunk(seq, f"{seq}s log: {text.format(seq)}", stream)
        if wait_until(lambda: observer.safe_actions(start_s), 1.0, interval_s=0.02):
            break
    t, safe = observer.wait("safe action", lambda: observer.safe_actions(start_s), wait_s)[0]
    fault_s = max(s for s in sent if s <= t)
    outcome.to_safe_s = round(t - fault_s, 2)
    outcome.cause = safe.cause
    outcome.published = f"{safe.name}() once (safe, valid until the next action)"
    outcome.valid_between = len([1 for tv, _ in observer.valid_actions(fault_s) if tv < t])
    outcome.recovery = "none: without a reconciler nothing evicts (the reconciler would)"


def table(outcomes: list[Outcome], args) -> str:
    rows = ["| fault | what the policy publishes on csr/actions | fault → safe action | "
            "valid actions in between | recovery → next valid action | cause it gives |",
            "|---|---|---|---|---|---|"]
    for o in outcomes:
        to_safe = "not measured" if o.to_safe_s is None else \
            "< 0.01 s" if o.to_safe_s < 0.01 else f"{o.to_safe_s:.2f} s"
        to_valid = "-" if o.to_valid_s is None else f"{o.to_valid_s:.2f} s ({o.recovery})"
        cause = o.cause.replace("|", "/")
        if len(cause) > 160:
            cause = cause[:157] + "..."
        rows.append(f"| {o.fault} | {o.published or '-'} | {to_safe} | {o.valid_between} | "
                    f"{to_valid} | {cause} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m csr_ros.bench.watchdog_faults",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out/watchdog_faults")
    parser.add_argument("--stale-after-s", type=float, default=3.0)
    parser.add_argument("--rate-hz", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp server threads")
    parser.add_argument("--only", nargs="*", choices=FAULTS, default=[],
                        help="these faults only (default: all)")
    args = parser.parse_args(argv)
    outcomes = run_faults(args)
    out = Path(args.out)
    report = {"stale_after_s": args.stale_after_s, "rate_hz": args.rate_hz,
              "outcomes": [asdict(o) for o in outcomes]}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "table.md").write_text(table(outcomes, args))
    print(table(outcomes, args))
    for o in outcomes:
        for note in o.notes:
            print(f"{o.fault}: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
