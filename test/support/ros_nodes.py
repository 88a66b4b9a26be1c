"""What the in-process node tests give the csr_ros nodes and read back from them: a speech and
a goal source for the aggregator, policy parameters for a server at a URL, speaking once the
aggregator listens reliably, and a probe's newest /diagnostics status of a node. Imported only
by tests that have rclpy (test/ros/)."""

from __future__ import annotations

import time

from rclpy.parameter import Parameter
from std_msgs.msg import String

from support.waiting import wait_for

SPEECH = [Parameter("sources", Parameter.Type.STRING_ARRAY, ["speech", "goal"]),
          Parameter("source.speech.topic", Parameter.Type.STRING, "/test/speech"),
          Parameter("source.speech.type", Parameter.Type.STRING, "std_msgs/msg/String"),
          Parameter("source.goal.topic", Parameter.Type.STRING, "/test/goal"),
          Parameter("source.goal.type", Parameter.Type.STRING, "std_msgs/msg/String"),
          Parameter("source.goal.instant", Parameter.Type.BOOL, True)]


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
