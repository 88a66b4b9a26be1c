"""What the node tests give the csr_ros nodes and read back from them: a speech and a goal
source for the aggregator, policy parameters for a server at a URL or for none, speaking once
the aggregator listens reliably, a probe's newest /diagnostics status of a node, the lines the
nodes of this process logged (read from its own stderr, not over /rosout), and a node started
with `python -m` whose stderr the test reads. Imported only by tests that have rclpy
(test/ros/)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from rcl_interfaces.msg import Log
from rclpy.parameter import Parameter
from std_msgs.msg import String

from support.ros_graph import ROOT
from support.waiting import wait_for

DEAD_URL = "http://127.0.0.1:9"          # discard port: nothing answers

SPEECH = [Parameter("sources", Parameter.Type.STRING_ARRAY, ["speech", "goal"]),
          Parameter("source.speech.topic", Parameter.Type.STRING, "/test/speech"),
          Parameter("source.speech.type", Parameter.Type.STRING, "std_msgs/msg/String"),
          Parameter("source.goal.topic", Parameter.Type.STRING, "/test/goal"),
          Parameter("source.goal.type", Parameter.Type.STRING, "std_msgs/msg/String"),
          Parameter("source.goal.instant", Parameter.Type.BOOL, True)]



def local_reconciler(*, context_tokens: int, tau_mem_tokens: int) -> list[Parameter]:
    """A reconciler on two in-process SmolLM2 engines of one thread each, that evicts once the
    history passes `tau_mem_tokens` and catches up 16 tokens at a time."""
    return [Parameter("resource.kind", Parameter.Type.STRING, "local"),
            Parameter("resource.threads", Parameter.Type.INTEGER, 1),
            Parameter("context_tokens", Parameter.Type.INTEGER, context_tokens),
            Parameter("tau_mem_tokens", Parameter.Type.INTEGER, tau_mem_tokens),
            Parameter("reserve_tokens", Parameter.Type.INTEGER, 256),
            Parameter("n_catchup_tokens", Parameter.Type.INTEGER, 16)]


def recording_probe(graph, name: str, **topics):
    """A plain node that speaks on /test/speech and appends what comes on each topic to
    `received[key]`, for key=(message type, topic, QoS); its csr/chunks subscription is
    `chunks_sub`, which `say` waits on."""
    node = graph.node(name)
    node.received = {key: [] for key in topics}
    node.speech_pub = node.create_publisher(String, "/test/speech", 100)
    for key, (msg_type, topic, qos) in topics.items():
        sub = node.create_subscription(msg_type, topic, node.received[key].append, qos)
        if topic == "csr/chunks":
            node.chunks_sub = sub
    return node

def say(probe, graph, texts):
    # The aggregator matches its subscription's QoS to the publishers (best effort until it
    # sees one, then reliable): speak once it listens reliably, and the chunks can be heard.
    from rclpy.qos import ReliabilityPolicy

    if hasattr(probe, "chunks_sub"):
        wait_for(lambda: probe.chunks_sub.get_publisher_count() > 0, what="csr/chunks")
    wait_for(lambda: [i for i in probe.get_subscriptions_info_by_topic("/test/speech")
                      if i.qos_profile.reliability == ReliabilityPolicy.RELIABLE]
             and probe.speech_pub.get_subscription_count() == 1, what="a reliable subscription")
    for text in texts:
        probe.speech_pub.publish(String(data=text))
        time.sleep(0.02)


def policy_on(url: str, **extra) -> list[Parameter]:
    values = {"autostart": False, "resource.r1_url": url, "resource.r2_url": url,
              "rate_hz": 2.0, "max_new_tokens": 16, "safe_action": "wait()",
              "stale_after_s": 600.0, "action_ttl_s": 600.0, **extra}
    return [Parameter(k, value=v) for k, v in values.items()]


def status_of(probe, name: str, *, level=None, says: str = ""):
    """The newest /diagnostics status of `csr_ros: name` at `level` whose message has `says`."""
    for status in reversed(probe.statuses.get(f"csr_ros: {name}", [])):
        if (level is None or status.level == level) and says in status.message:
            return status
    return None


# -- one speech source, a policy without servers, and what the nodes of this process logged ------
# (the tests that read the conftest's flat_probe, chunks and /diagnostics as flat lists, and its
# console: the nodes' log lines)

def speech_sources(topic: str = "/defects/speech", period_s: float = 0.0,
                   extra: list | None = None, event: bool = False) -> list[Parameter]:
    return [Parameter("sources", Parameter.Type.STRING_ARRAY, ["speech"]),
            Parameter("source.speech.topic", Parameter.Type.STRING, topic),
            Parameter("source.speech.type", Parameter.Type.STRING, "std_msgs/msg/String"),
            Parameter("source.speech.event", Parameter.Type.BOOL, event),
            Parameter("source.speech.period_s", Parameter.Type.DOUBLE, period_s)] + (extra or [])


def policy_params(**extra) -> list[Parameter]:
    """A policy at 0.2 Hz whose servers never answer (DEAD_URL)."""
    params = [Parameter("rate_hz", Parameter.Type.DOUBLE, 0.2),
              Parameter("resource.r1_url", Parameter.Type.STRING, DEAD_URL),
              Parameter("resource.r2_url", Parameter.Type.STRING, DEAD_URL)]
    return params + [Parameter(k, Parameter.Type.STRING, v) for k, v in extra.items()]


@dataclass(frozen=True)
class LogLine:
    level: int           # rcl_interfaces/msg/Log's: Log.INFO, Log.WARN, ...
    name: str            # the logger's: the node's name ("policy", "robot1.policy")
    msg: str


class Console:
    """What the nodes of this process logged, as rcutils writes each line to the process's
    stderr ("[WARN] [1700000000.1] [policy]: text") before /rosout carries it.

    /rosout is not what a node guarantees: rcl keeps one rosout publisher per logger name in a
    process, and destroying a node of that name (an earlier test's) unregisters it for all, so
    a live node's later lines may never reach /rosout; and /rosout carries the lines of every
    node of that name in the domain. Its stderr has each line at once, whatever ran before."""

    HEAD = re.compile(r"^\[(DEBUG|INFO|WARN|ERROR|FATAL)\] \[[0-9.]+\] \[([^\]]+)\]: ", re.M)
    LEVELS = {"DEBUG": Log.DEBUG, "INFO": Log.INFO, "WARN": Log.WARN, "ERROR": Log.ERROR,
              "FATAL": Log.FATAL}

    def __init__(self, capfd):
        self.capfd = capfd
        self.text = ""             # all read so far, given back to pytest's report at the end

    def lines(self) -> list[LogLine]:
        out, err = self.capfd.readouterr()
        self.text += out + err
        heads = list(self.HEAD.finditer(self.text))
        ends = [h.start() for h in heads[1:]] + [len(self.text)]
        return [LogLine(self.LEVELS[h.group(1)], h.group(2), self.text[h.end():end].rstrip("\n"))
                for h, end in zip(heads, ends)]


def logged(console: Console, node_name: str, *needles: str, level: int = Log.WARN):
    """The lines `node_name` logged at `level` or above that contain every needle."""
    return [m for m in console.lines() if m.name == node_name and m.level >= level
            and all(n in m.msg for n in needles)]


def body(text: str) -> str:
    """A chunk's text without its leading episode time ("12s speech: hi" → "speech: hi")."""
    return text.split(" ", 1)[1].strip()


# -- a node process whose exit code and stderr the test reads ---------------------------------

def run_node(module: str, *ros_args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, "--ros-args", *ros_args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def write_params(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(textwrap.dedent(text))
    return path
