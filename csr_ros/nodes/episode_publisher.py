"""The episode publisher: the synthetic episode (csr_ros.demo_episode) as a robot's topics.

    /odom            nav_msgs/Odometry         pose and heading of each odometry step
    /scan            sensor_msgs/LaserScan     360 beams to the walls of a 10 m room, per step
    /battery_state   sensor_msgs/BatteryState  the episode's battery level, per step
    /detections      std_msgs/String           "room kitchen; red_mug at (1.20, -0.41) conf 0.87"
    /speech/text     std_msgs/String           "Alice: could you bring me the red mug?"
    /action_result   std_msgs/String           "go_to(kitchen) -> succeeded; now in kitchen"

Detections are text because vision_msgs is not among the ROS 2 wheels on PyPI; the text keeps
the episode's `name at (x, y)` form, which the policy's action vocabulary reads objects from.

It waits until every topic has a subscriber (the aggregator), then publishes each item at its
time in the episode (`chunk_rate_hz` items a second) and stops after `max_items` (0: never).
"""

from __future__ import annotations

import math
import time

from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import BatteryState, LaserScan
from std_msgs.msg import String

from csr_ros.demo_episode import Episode
from csr_ros.nodes.common import run
from csr_ros.nodes.managed import GuardedCallbacks

TOPICS = {"odom": ("/odom", Odometry), "scan": ("/scan", LaserScan),
          "battery": ("/battery_state", BatteryState), "detections": ("/detections", String),
          "speech": ("/speech/text", String), "actions": ("/action_result", String)}
ROOM_HALF_M = 5.0          # the walls the scan sees, around the origin
N_BEAMS = 360


def wall_ranges(x_m: float, y_m: float, yaw_rad: float) -> list[float]:
    """Ranges of N_BEAMS beams from (x, y, yaw) to the walls of a square room."""
    x = max(-ROOM_HALF_M + 0.3, min(ROOM_HALF_M - 0.3, x_m))
    y = max(-ROOM_HALF_M + 0.3, min(ROOM_HALF_M - 0.3, y_m))
    ranges = []
    for i in range(N_BEAMS):
        a = yaw_rad - math.pi + i * 2 * math.pi / N_BEAMS
        c, s = math.cos(a), math.sin(a)
        tx = ((ROOM_HALF_M if c > 0 else -ROOM_HALF_M) - x) / c if abs(c) > 1e-9 else math.inf
        ty = ((ROOM_HALF_M if s > 0 else -ROOM_HALF_M) - y) / s if abs(s) > 1e-9 else math.inf
        ranges.append(round(min(tx, ty), 3))
    return ranges


class EpisodePublisherNode(GuardedCallbacks, Node):
    def __init__(self, **kwargs):
        super().__init__("episode_publisher", **kwargs)
        self.start_guard()              # a callback that raises is logged, never the end
        self.declare_parameter("seed", 0)
        self.declare_parameter("chunk_rate_hz", 0.5)
        self.declare_parameter("detail", 3)
        self.declare_parameter("max_items", 0)
        self.declare_parameter("wait_for_subscribers_s", 30.0)
        p = {name: self.get_parameter(name).value for name in
             ("seed", "chunk_rate_hz", "detail", "max_items", "wait_for_subscribers_s")}
        self.params = p
        self.episode = Episode(p["seed"], chunk_rate_hz=p["chunk_rate_hz"], detail=p["detail"])
        self.items = self.episode.stream()
        self.next_item = next(self.items)
        self.n_published = 0
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.pubs = {name: self.create_publisher(cls, topic, qos)
                     for name, (topic, cls) in TOPICS.items()}
        self.created_s = time.monotonic()
        self.started_s: float | None = None
        self.timer = self.create_timer(0.05, self.tick_callback)
        self.get_logger().info(f"episode seed {p['seed']} at {p['chunk_rate_hz']} items/s on "
                               + ", ".join(t for t, _ in TOPICS.values()))

    def tick_callback(self) -> None:
        now_s = time.monotonic()
        if self.started_s is None:
            waiting = [t for name, (t, _) in TOPICS.items()
                       if self.pubs[name].get_subscription_count() == 0]
            if waiting and now_s - self.created_s < self.params["wait_for_subscribers_s"]:
                return
            if waiting:
                self.get_logger().warning(
                    f"no subscriber on {', '.join(waiting)} after "
                    f"{self.params['wait_for_subscribers_s']:g} s; starting (an aggregator that "
                    "skipped a source says why; /detections here is std_msgs/msg/String)")
            self.started_s = now_s
        while self.started_s + self.next_item.t_s <= now_s:
            self.publish(self.next_item)
            self.n_published += 1
            if 0 < self.params["max_items"] <= self.n_published:
                self.timer.cancel()
                self.get_logger().info(f"published {self.n_published} items; done")
                return
            self.next_item = next(self.items)

    def publish(self, item) -> None:
        d = item.data
        stamp = self.get_clock().now().to_msg()
        if item.source == "odometry":
            odom = Odometry()
            odom.header.stamp, odom.header.frame_id, odom.child_frame_id = stamp, "odom", \
                "base_link"
            odom.pose.pose.position.x, odom.pose.pose.position.y = d["x_m"], d["y_m"]
            odom.pose.pose.orientation.z = math.sin(d["yaw_rad"] / 2)
            odom.pose.pose.orientation.w = math.cos(d["yaw_rad"] / 2)
            self.pubs["odom"].publish(odom)
            scan = LaserScan(angle_min=-math.pi, angle_max=math.pi - 2 * math.pi / N_BEAMS,
                             angle_increment=2 * math.pi / N_BEAMS, range_min=0.1,
                             range_max=12.0,
                             ranges=wall_ranges(d["x_m"], d["y_m"], d["yaw_rad"]))
            scan.header.stamp, scan.header.frame_id = stamp, "laser"
            self.pubs["scan"].publish(scan)
            battery = BatteryState(percentage=d["battery_pct"] / 100.0,
                                   voltage=22.0 + 3.0 * d["battery_pct"] / 100.0, present=True,
                                   power_supply_status=BatteryState.
                                   POWER_SUPPLY_STATUS_DISCHARGING)
            battery.header.stamp, battery.header.frame_id = stamp, "battery"
            self.pubs["battery"].publish(battery)
        elif item.source == "camera":
            self.pubs["detections"].publish(String(data=f"room {d['room']}; " + "; ".join(
                f"{name} at ({x:.2f}, {y:.2f}) conf {conf:.2f}"
                for name, x, y, conf in d["objects"])))
        elif item.source == "speech":
            self.pubs["speech"].publish(String(data=f"{d['person']}: {d['said']}"))
        elif item.source == "action":
            self.pubs["actions"].publish(String(
                data=f"{d['action']} -> {d['result']}; now in {d['room']}"))


def main(args=None) -> int:
    return run(EpisodePublisherNode, args=args, label="episode_publisher")


if __name__ == "__main__":
    raise SystemExit(main())
