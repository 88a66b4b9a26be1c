"""What else a recorded robot bag holds (`extras=True`): a camera, /tf and /tf_static, velocity
commands, a drive controller's status in a custom type, /rosout, /diagnostics, a simulation
/clock, an IMU and wheel joint states, all derived from the simulated world's samples.

    for t_s, topic, msg in extra_messages(world, ts, rng, odom_hz=10.0, image_hz=10.0,
                                          tf_hz=50.0): ...

They have their own random generator, so a patrol's own messages stay the same with or
without them.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from csr_ros.patrol.messages import Timeline, every_nth, header_msg, quaternion_msg, stamp_msg
from csr_ros.patrol.world import ROOM_BY_NAME, ROOMS, World, room_at

TOPIC_IMAGE = "/camera/image_raw"
TOPIC_TF = "/tf"
TOPIC_TF_STATIC = "/tf_static"
TOPIC_MOTOR = "/motor_status"
TOPIC_CMD_VEL = "/cmd_vel"
TOPIC_ROSOUT = "/rosout"
TOPIC_DIAGNOSTICS = "/diagnostics"
TOPIC_CLOCK = "/clock"
TOPIC_IMU = "/imu/data"
TOPIC_JOINTS = "/joint_states"
EXTRA_TOPIC_TYPES = {
    TOPIC_IMAGE: "sensor_msgs/msg/Image",
    TOPIC_TF: "tf2_msgs/msg/TFMessage",
    TOPIC_TF_STATIC: "tf2_msgs/msg/TFMessage",
    TOPIC_MOTOR: "patrol_msgs/msg/MotorStatus",
    TOPIC_CMD_VEL: "geometry_msgs/msg/Twist",
    TOPIC_ROSOUT: "rcl_interfaces/msg/Log",
    TOPIC_DIAGNOSTICS: "diagnostic_msgs/msg/DiagnosticArray",
    TOPIC_CLOCK: "rosgraph_msgs/msg/Clock",
    TOPIC_IMU: "sensor_msgs/msg/Imu",
    TOPIC_JOINTS: "sensor_msgs/msg/JointState",
}
WHEEL_RADIUS_M, WHEEL_BASE_M = 0.05, 0.4
IMAGE_WIDTH, IMAGE_HEIGHT = 128, 96        # small, so a 10-minute bag stays small; rgb8
# a drive controller's status, a type no tool knows (defined only in the bag)
MOTOR_STATUS_MSG = """\
uint8 MODE_IDLE=0
uint8 MODE_VELOCITY=1
std_msgs/Header header
float32[2] wheel_rpm
float32[2] current_a
float32 temperature_c
uint8 mode
string controller
"""
EXTRA_TYPES = {"patrol_msgs/msg/MotorStatus": MOTOR_STATUS_MSG}


def _transform(ts, t_s: float, parent: str, child: str, x: float, y: float, yaw: float):
    T = ts.types
    return T["geometry_msgs/msg/TransformStamped"](
        header=header_msg(ts, t_s, parent), child_frame_id=child,
        transform=T["geometry_msgs/msg/Transform"](
            translation=T["geometry_msgs/msg/Vector3"](x=x, y=y, z=0.0),
            rotation=quaternion_msg(ts, yaw)))


def _log(ts, t_s: float, level: int, name: str, text: str):
    return ts.types["rcl_interfaces/msg/Log"](
        stamp=stamp_msg(ts, t_s), level=level, name=name, msg=text, file="", function="", line=0)


def _diagnostics(ts, t_s: float, level: float):
    T = ts.types
    status = T["diagnostic_msgs/msg/DiagnosticStatus"]
    kv = T["diagnostic_msgs/msg/KeyValue"]
    low = level < 0.3
    return T["diagnostic_msgs/msg/DiagnosticArray"](header=header_msg(ts, t_s, ""), status=[
        status(level=1 if low else 0, name="power: battery",
               message="low" if low else "ok", hardware_id="bms",
               values=[kv(key="percent", value=f"{100 * level:.1f}")]),
        status(level=0, name="drive: motors", message="ok", hardware_id="motor_driver",
               values=[]),
        status(level=0, name="sensors: lidar", message="ok", hardware_id="lidar", values=[])])


def extra_messages(world: World, ts, rng: np.random.Generator, odom_hz: float,
                   image_hz: float, tf_hz: float) -> Iterator[tuple[float, str, Any]]:
    """(t_s, topic, message) of the extras, in time order."""
    T = ts.types
    out = Timeline()
    add = out.add
    add(0.0, TOPIC_TF_STATIC, T["tf2_msgs/msg/TFMessage"](transforms=[
        _transform(ts, 0.0, "base_link", "base_scan", 0.1, 0.0, 0.0),
        _transform(ts, 0.0, "base_link", "camera_link", 0.15, 0.0, 0.0)]))
    per_image = every_nth(odom_hz, image_hz)
    per_tf = _tf_per_step(odom_hz, tf_hz)
    per_motor = every_nth(odom_hz, 5.0)
    per_diag = max(1, int(round(odom_hz)))
    moving_before = False
    wheels = [0.0, 0.0]
    v_before = 0.0
    cov = np.zeros(9)
    for i, (t_s, pose, level, charging) in enumerate(world.samples):
        vec = T["geometry_msgs/msg/Vector3"]
        accel = (pose.v - v_before) * odom_hz
        v_before = pose.v
        add(t_s + 0.002, TOPIC_IMU, T["sensor_msgs/msg/Imu"](
            header=header_msg(ts, t_s, "imu_link"),
            orientation=quaternion_msg(ts, pose.yaw + rng.normal(0, 0.01)),
            orientation_covariance=cov,
            angular_velocity=vec(x=float(rng.normal(0, 0.005)), y=float(rng.normal(0, 0.005)),
                                 z=float(pose.w + rng.normal(0, 0.005))),
            angular_velocity_covariance=cov,
            linear_acceleration=vec(x=float(accel + rng.normal(0, 0.05)),
                                    y=float(pose.v * pose.w + rng.normal(0, 0.05)),
                                    z=float(9.81 + rng.normal(0, 0.05))),
            linear_acceleration_covariance=cov))
        for side, sign in ((0, -1), (1, 1)):
            wheels[side] += (pose.v + sign * pose.w * WHEEL_BASE_M / 2) / WHEEL_RADIUS_M / odom_hz
        add(t_s + 0.002, TOPIC_JOINTS, T["sensor_msgs/msg/JointState"](
            header=header_msg(ts, t_s, ""), name=["wheel_left_joint", "wheel_right_joint"],
            position=np.array(wheels), velocity=np.zeros(2), effort=np.zeros(0)))
        for k in range(per_tf):
            tk = t_s + k / (per_tf * odom_hz)
            transforms = [_transform(ts, tk, "odom", "base_link", pose.x, pose.y, pose.yaw)]
            if k == 0:
                transforms.append(_transform(ts, tk, "map", "odom", 0.0, 0.0, 0.0))
            add(tk + 0.001, TOPIC_TF, T["tf2_msgs/msg/TFMessage"](transforms=transforms))
        if i % per_image == 0:
            room = room_at(pose.x, pose.y)
            shade = 60 + 20 * ROOMS.index(ROOM_BY_NAME[room]) + int(rng.integers(0, 4))
            add(t_s + 0.007, TOPIC_IMAGE, T["sensor_msgs/msg/Image"](
                header=header_msg(ts, t_s, "camera_link"), height=IMAGE_HEIGHT, width=IMAGE_WIDTH,
                encoding="rgb8", is_bigendian=0, step=IMAGE_WIDTH * 3,
                data=np.full(IMAGE_WIDTH * IMAGE_HEIGHT * 3, shade, dtype=np.uint8)))
        add(t_s, TOPIC_CLOCK, T["rosgraph_msgs/msg/Clock"](clock=stamp_msg(ts, t_s)))
        add(t_s + 0.004, TOPIC_CMD_VEL, T["geometry_msgs/msg/Twist"](
            linear=vec(x=float(pose.v), y=0.0, z=0.0), angular=vec(x=0.0, y=0.0, z=float(pose.w))))
        if i % per_motor == 0:
            rpm = 60 * pose.v / (2 * math.pi * 0.05)
            turn = 60 * pose.w * 0.2 / (2 * math.pi * 0.05)
            mode = T["patrol_msgs/msg/MotorStatus"]
            add(t_s + 0.006, TOPIC_MOTOR, mode(
                header=header_msg(ts, t_s, "base_link"),
                wheel_rpm=np.array([rpm - turn, rpm + turn], dtype=np.float32)
                + rng.normal(0, 0.5, 2).astype(np.float32),
                current_a=np.abs(np.array([rpm - turn, rpm + turn], dtype=np.float32) * 0.01)
                + 0.1 + rng.normal(0, 0.01, 2).astype(np.float32),
                temperature_c=float(35.0 + rng.normal(0, 0.2)),
                mode=mode.MODE_VELOCITY if (pose.v or pose.w) else mode.MODE_IDLE,
                controller="diff_drive"))
        moving = abs(pose.v) > 0.01 or abs(pose.w) > 0.01
        if moving != moving_before:
            add(t_s + 0.008, TOPIC_ROSOUT, _log(ts, t_s, 20, "controller_server",
                                                "Received a goal, begin computing control "
                                                "effort." if moving else "Reached the goal!"))
            moving_before = moving
        if i % per_diag == 0:
            add(t_s + 0.009, TOPIC_DIAGNOSTICS, _diagnostics(ts, t_s, level))
            if level < 0.3 and not charging and i % (per_diag * 30) == 0:
                add(t_s + 0.009, TOPIC_ROSOUT, _log(ts, t_s, 30, "battery_monitor",
                                                    f"Battery low: {100 * level:.0f}%"))
    return iter(out)


def _tf_per_step(odom_hz: float, tf_hz: float) -> int:
    """/tf is faster than the simulation step: this many messages per step."""
    return max(1, int(round(tf_hz / odom_hz)))


def extra_rates_hz(odom_hz: float, image_hz: float, tf_hz: float) -> dict[str, float]:
    """The rates of the extras that do not follow the odometry one for one."""
    return {TOPIC_IMAGE: odom_hz / every_nth(odom_hz, image_hz),
            TOPIC_TF: odom_hz * _tf_per_step(odom_hz, tf_hz), TOPIC_CMD_VEL: odom_hz}
