"""The simulated patrol: a flat of six rooms, a robot that lives in it, and what happens.

    world = World(duration_s=600.0, rng=np.random.default_rng(1), odom_hz=10.0)
    run_script(world)          # idles, is asked, drives, looks, acts, docks: all recorded
    world.samples              # (t_s, Pose, battery level, charging) every 1/odom_hz s
    truth_events(world)        # the ground truth: utterances, detections, actions, room visits

Pure: numpy only. The same generator state gives the same world (the bag's messages and their
noise are drawn from other generators, in messages.py and extras.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

DRIVE_MPS = 0.45
TURN_RPS = 0.8
# after the world records one: when its message is stamped, and its ground-truth time
DETECTION_DELAY_S = 0.05
ACTION_RESULT_DELAY_S = 0.01


# -- the flat ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Room:
    name: str
    x0: float
    y0: float
    x1: float
    y1: float
    door_x: float          # where the room opens onto the hallway (hallway itself: unused)
    objects: tuple[tuple[str, float, float], ...] = ()

    @property
    def center(self) -> tuple[float, float]:
        return ((self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2)

    def contains(self, x: float, y: float) -> bool:
        return self.x0 <= x < self.x1 and self.y0 <= y < self.y1


HALL_Y0, HALL_Y1 = 4.0, 6.0
ROOMS = (
    Room("hallway", 0.0, HALL_Y0, 12.0, HALL_Y1, 0.0,
         (("umbrella", 0.6, 4.4), ("shoes", 11.2, 5.5))),
    Room("kitchen", 0.0, HALL_Y1, 4.0, 11.0, 2.0,
         (("red mug", 1.0, 9.8), ("kettle", 3.2, 10.2), ("apple", 2.5, 8.0))),
    Room("living room", 4.0, HALL_Y1, 12.0, 11.0, 7.0,
         (("remote control", 6.5, 9.5), ("book", 10.8, 8.2), ("cat", 9.0, 7.4),
          ("charging dock", 11.3, 10.3))),
    Room("bedroom", 0.0, -1.0, 5.0, HALL_Y0, 2.5,
         (("keys", 0.7, 0.2), ("glasses", 4.2, 2.9), ("backpack", 1.5, 3.3))),
    Room("office", 5.0, -1.0, 9.0, HALL_Y0, 7.0,
         (("laptop", 6.0, -0.3), ("phone", 8.4, 0.6), ("plant", 5.5, 3.4))),
    Room("bathroom", 9.0, -1.0, 12.0, HALL_Y0, 10.5,
         (("towel", 11.4, -0.4), ("toothbrush", 9.6, 0.3))),
)
ROOM_BY_NAME = {r.name: r for r in ROOMS}
DOCK_XY = (11.0, 10.0)
SPEAKERS = ("alice", "bob", "grandma")
REQUEST_TEMPLATES = (
    ("please bring me the {obj}", "fetch"),
    ("can you check on the {obj} in the {room}", "check"),
    ("go and look in the {room}", "inspect"),
    ("where did I leave my {obj}?", "find"),
)


def room_at(x: float, y: float) -> str:
    for room in ROOMS:
        if room.contains(x, y):
            return room.name
    # outside every room (noise at a wall): the nearest one
    return min(ROOMS, key=lambda r: math.dist((x, y), r.center)).name


# -- the script: what the robot does, every 1/odom_hz s -----------------------------------------

@dataclass
class Pose:
    x: float
    y: float
    yaw: float
    v: float = 0.0
    w: float = 0.0


class World:
    """Integrates the robot's motion along a script of tasks and records what happens."""

    def __init__(self, duration_s: float, rng: np.random.Generator, odom_hz: float):
        self.duration_s = duration_s
        self.rng = rng
        self.dt = 1.0 / odom_hz
        cx, cy = ROOM_BY_NAME["living room"].center
        self.pose = Pose(cx, cy, 0.0)
        self.t = 0.0
        self.battery = float(rng.uniform(0.36, 0.5))
        self.charging = False
        self.samples: list[tuple[float, Pose, float, bool]] = []   # t, pose, battery, charging
        self.utterances: list[dict[str, Any]] = []
        self.detections: list[tuple[float, str, list[tuple[str, float, float, float]]]] = []
        self.nav_goals: list[dict[str, Any]] = []       # {uuid, t_accept, t_end, status}
        self.actions: list[dict[str, Any]] = []

    # motion primitives; each advances time in steps of dt and records samples
    def _step(self, v: float, w: float) -> None:
        p = self.pose
        p.yaw = math.atan2(math.sin(p.yaw + w * self.dt), math.cos(p.yaw + w * self.dt))
        p.x += v * math.cos(p.yaw) * self.dt
        p.y += v * math.sin(p.yaw) * self.dt
        p.v, p.w = v, w
        if self.charging:
            self.battery = min(1.0, self.battery + 0.0025 * self.dt)
        else:
            self.battery -= (0.00012 + 0.00030 * abs(v) / DRIVE_MPS + 0.0001 * abs(w)) * self.dt
        self.samples.append((self.t, Pose(p.x, p.y, p.yaw, v, w), self.battery, self.charging))
        self.t += self.dt

    @property
    def done(self) -> bool:
        return self.t >= self.duration_s - 1e-9

    def idle(self, seconds: float) -> None:
        end = self.t + seconds
        while self.t < end - 1e-9 and not self.done:
            self._step(0.0, 0.0)

    def _turn_to(self, yaw: float) -> None:
        while not self.done:
            err = math.atan2(math.sin(yaw - self.pose.yaw), math.cos(yaw - self.pose.yaw))
            if abs(err) < TURN_RPS * self.dt:
                self._step(0.0, err / self.dt)
                return
            self._step(0.0, math.copysign(TURN_RPS, err))

    def _drive_to(self, x: float, y: float) -> None:
        self._turn_to(math.atan2(y - self.pose.y, x - self.pose.x))
        while not self.done:
            dist = math.dist((self.pose.x, self.pose.y), (x, y))
            if dist < DRIVE_MPS * self.dt:
                self._step(dist / self.dt, 0.0)
                self.pose.v = 0.0
                return
            heading = math.atan2(y - self.pose.y, x - self.pose.x)
            err = math.atan2(math.sin(heading - self.pose.yaw), math.cos(heading - self.pose.yaw))
            self._step(DRIVE_MPS, max(-TURN_RPS, min(TURN_RPS, 2.0 * err)))

    def _waypoints(self, target: tuple[float, float],
                   target_room: str) -> list[tuple[float, float]]:
        here = room_at(self.pose.x, self.pose.y)
        hall_y = (HALL_Y0 + HALL_Y1) / 2
        points: list[tuple[float, float]] = []
        if here != "hallway":
            door = ROOM_BY_NAME[here].door_x
            points += [(door, self.pose.y if abs(self.pose.y - hall_y) < 1 else
                        (HALL_Y1 + 0.8 if self.pose.y > hall_y else HALL_Y0 - 0.8)),
                       (door, hall_y)]
        if target_room != "hallway":
            door = ROOM_BY_NAME[target_room].door_x
            above = ROOM_BY_NAME[target_room].y0 >= HALL_Y1
            points += [(door, hall_y), (door, HALL_Y1 + 0.8 if above else HALL_Y0 - 0.8)]
        points.append(target)
        return points

    def navigate(self, room: str, target: tuple[float, float] | None = None) -> bool:
        """A navigate_to_pose goal: accepted, driven, succeeded (or aborted when blocked)."""
        if self.done:
            return False
        target = target or ROOM_BY_NAME[room].center
        goal = {"uuid": [int(b) for b in self.rng.integers(0, 256, 16)], "room": room,
                "t_accept": self.t, "t_end": None, "status": 2}
        self.nav_goals.append(goal)
        blocked = self.rng.random() < 0.12
        points = self._waypoints(target, room)
        if blocked:                      # a closed door / a cat in the way: gives up half-way
            points = points[:max(1, len(points) // 2)]
        for x, y in points:
            self._drive_to(x, y)
            if self.done:
                break
        if self.done:                    # the recording stopped with the goal still running
            return False
        goal["t_end"], goal["status"] = self.t, (6 if blocked else 4)
        result = "aborted: path blocked" if blocked else "succeeded"
        self.actions.append({"t_s": self.t, "name": "navigate_to_pose", "target": room,
                             "result": result})
        return not blocked

    def look(self, at_least_one: bool = True) -> None:
        """A detection message with some of the objects of the current room."""
        if self.done:
            return
        room = ROOM_BY_NAME[room_at(self.pose.x, self.pose.y)]
        visible = [o for o in room.objects if self.rng.random() < 0.7]
        if not visible and at_least_one and room.objects:
            visible = [room.objects[int(self.rng.integers(len(room.objects)))]]
        if not visible:
            return
        seen = [(name, float(np.round(self.rng.uniform(0.55, 0.98), 3)), x, y)
                for name, x, y in visible]
        self.detections.append((self.t, room.name, seen))
        self.idle(float(self.rng.uniform(1.0, 3.0)))

    def act(self, name: str, target: str, p_fail: float) -> None:
        if self.done:
            return
        self.idle(float(self.rng.uniform(3.0, 8.0)))
        if self.done:
            return
        failed = self.rng.random() < p_fail
        result = {"pick": "failed: grasp slipped", "open": "failed: handle not found"}.get(
            name, "failed") if failed else "succeeded"
        self.actions.append({"t_s": self.t, "name": name, "target": target, "result": result})

    def say(self, speaker: str, request: str, intent: str, room: str, obj: str) -> None:
        self.utterances.append({"t_s": self.t, "speaker": speaker, "request": request,
                                "text": f"{speaker}: {request}", "intent": intent,
                                "room": room, "object": obj})

    def dock(self) -> None:
        if not self.navigate("living room", DOCK_XY) or self.done:
            return
        self.charging = True
        self.actions.append({"t_s": self.t, "name": "dock", "target": "charging dock",
                             "result": "succeeded: charging"})
        self.idle(float(self.rng.uniform(40.0, 70.0)))
        self.charging = False
        if not self.done:
            self.actions.append({"t_s": self.t, "name": "undock", "target": "charging dock",
                                 "result": "succeeded"})


def run_script(world: World) -> None:
    rng = world.rng
    world.idle(float(rng.uniform(8.0, 15.0)))
    rooms = [r.name for r in ROOMS if r.name != "hallway"]
    while not world.done:
        if world.battery < 0.30 and not world.charging:
            world.dock()
            continue
        roll = rng.random()
        if roll < 0.35:                                        # someone asks for something
            speaker = SPEAKERS[int(rng.integers(len(SPEAKERS)))]
            room = rooms[int(rng.integers(len(rooms)))]
            objects = ROOM_BY_NAME[room].objects
            obj = objects[int(rng.integers(len(objects)))][0]
            template, intent = REQUEST_TEMPLATES[int(rng.integers(len(REQUEST_TEMPLATES)))]
            world.say(speaker, template.format(obj=obj, room=room), intent, room, obj)
            world.idle(float(rng.uniform(1.0, 2.5)))
            if world.navigate(room):
                world.look()
                if intent == "fetch":
                    world.act("pick", obj, p_fail=0.25)
        elif roll < 0.75:                                      # patrol to the next room
            here = room_at(world.pose.x, world.pose.y)
            room = [r for r in rooms if r != here][int(rng.integers(len(rooms) - 1))]
            if world.navigate(room):
                world.look()
                if rng.random() < 0.3:
                    world.act("open", "door", p_fail=0.3)
        else:                                                  # stand still a while
            world.idle(float(rng.uniform(15.0, 45.0)))
            if rng.random() < 0.4:
                world.look()


# -- the ground truth ----------------------------------------------------------------------------

def truth_events(world: World) -> list[dict[str, Any]]:
    """What happened, by t_s (a room visit at its enter_s), as the bag's ground truth lists it:
    each event at the time its message is stamped."""
    events: list[dict[str, Any]] = []
    for u in world.utterances:
        events.append({"kind": "utterance", "t_s": round(u["t_s"], 3), "speaker": u["speaker"],
                       "text": u["text"], "request": u["request"], "intent": u["intent"],
                       "room": u["room"], "object": u["object"]})
    for t_s, room, seen in world.detections:
        for name, conf, x, y in seen:
            events.append({"kind": "detection", "t_s": round(t_s + DETECTION_DELAY_S, 3),
                           "object": name, "room": room, "confidence": conf, "x_m": x, "y_m": y})
    for a in world.actions:
        events.append({"kind": "action", "t_s": round(a["t_s"] + ACTION_RESULT_DELAY_S, 3),
                       "name": a["name"], "target": a["target"], "result": a["result"]})
    events.extend(_room_visits(world))
    events.sort(key=lambda e: (e["t_s"], e["kind"]))
    return events


def _room_visits(world: World) -> list[dict[str, Any]]:
    visits: list[dict[str, Any]] = []
    for t_s, pose, _, _ in world.samples:
        room = room_at(pose.x, pose.y)
        if not visits or visits[-1]["room"] != room:
            if visits:
                visits[-1]["leave_s"] = round(t_s, 3)
            visits.append({"kind": "room_visit", "room": room, "enter_s": round(t_s, 3),
                           "leave_s": None, "t_s": round(t_s, 3)})
    return visits

