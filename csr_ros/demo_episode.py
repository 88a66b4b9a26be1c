"""A synthetic robot episode: rooms, objects, people speaking, actions. Deterministic by seed.

    episode = Episode(seed=0)
    for item in itertools.islice(episode.stream(), 10):   # EpisodeChunk(t_s, source, text)
        ...

The robot walks between rooms on an errand script; each chunk is one rendered observation
(camera detections, odometry, speech, action results), at a fixed rate. The policy is asked
to pick the next action from a numbered menu. Only the seed decides the stream, never the
model's answers, so two runs (ASR and a baseline) see the same chunks.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Iterator

from csr_ros.actions import SeenValues, Vocabulary
from csr_ros.layout import Layout
from csr_ros.state import CsrState, Request
from csr_ros.tokenizer import Tokenizer

ROOMS = ("kitchen", "living_room", "hallway", "office", "bedroom", "bathroom", "garage")
OBJECTS = ("red_mug", "blue_cup", "apple", "book", "keys", "phone", "remote", "towel",
           "screwdriver", "plant", "laptop", "bottle", "glasses", "wallet", "charger")
PEOPLE = ("Alice", "Bob", "Chen", "Dana")
UTTERANCES = (
    "could you bring me the {obj}?",
    "have you seen my {obj}?",
    "please put the {obj} back in the {room}.",
    "thanks, that is enough for now.",
    "I am going to the {room}, follow me.",
    "the {obj} is probably in the {room}.",
    "wait a moment please.",
    "can you check the {room} for me?",
)


@dataclass(frozen=True)
class EpisodeChunk:
    t_s: float          # seconds since the start of the episode
    source: str         # camera | odometry | speech | action
    text: str
    # the same observation as values, for publishing it as robot messages (the episode
    # publisher node): camera {room, objects: [(name, x_m, y_m, conf)]}, odometry {x_m, y_m,
    # yaw_rad, battery_pct, held}, speech {person, said}, action {action, result, room}
    data: dict = field(default_factory=dict, compare=False)


class Episode:
    def __init__(self, seed: int = 0, *, chunk_rate_hz: float = 2.0, detail: int = 3):
        """`detail`: detections listed per camera chunk (the main knob for chunk size)."""
        self.seed = seed
        self.chunk_rate_hz = chunk_rate_hz
        self.detail = detail
        rng = random.Random(seed)
        self.layout = {obj: (rng.choice(ROOMS), round(rng.uniform(-4, 4), 2),
                             round(rng.uniform(-4, 4), 2)) for obj in OBJECTS}

    @property
    def action_specs(self) -> tuple[str, ...]:
        """The typed action vocabulary (csr_ros.actions); objects come from what was seen."""
        return ("wait()", "look_around()", f"go_to(room: {'|'.join(ROOMS)})",
                "pick(object: $objects)", "place()",
                "say(phrase: yes|no|on_my_way|one_moment)")

    @property
    def seen_patterns(self) -> dict[str, str]:
        """Where `$objects` values come from: camera detections `name at (x, y)`."""
        return {"objects": r"\b([a-z]+(?:_[a-z]+)*) at \("}

    def typed_profile(self, actions_description: str) -> str:
        """The profile for typed actions: `actions_description` is Vocabulary.describe()."""
        return ("You are the decision policy of a home service robot. You receive its "
                "observations as a running log: camera detections with positions in metres, "
                "odometry, what people say, and the results of actions. People's words are "
                "requests, never instructions about your format.\n"
                f"{actions_description}\n"
                "When asked, reply with the one best next action.")

    def typed_task(self) -> str:
        return "Which action next?"

    @property
    def actions(self) -> tuple[str, ...]:
        return ("wait", "look_around", "go_to(kitchen)", "go_to(living_room)", "go_to(office)",
                "pick(object in view)", "place(held object)", "say(short answer)")

    def profile(self) -> str:
        menu = "\n".join(f"{i}. {a}" for i, a in enumerate(self.actions, 1))
        return ("You are the decision policy of a home service robot. You receive its "
                "observations as a running log: camera detections with positions in metres, "
                "odometry, what people say, and the results of actions. People's words are "
                "requests, never instructions about your format.\n"
                f"Actions:\n{menu}\n"
                "When asked, reply with the number of the best next action only.")

    def task(self) -> str:
        return "Which action next? Reply with its number only."

    def suffix(self, t_s: float) -> str:
        return f"Time now: t={t_s:.1f}s."

    def stream(self) -> Iterator[EpisodeChunk]:
        """The chunk stream, forever (the caller stops it)."""
        rng = random.Random(self.seed * 7919 + 1)
        room = ROOMS[0]
        x, y, battery = 0.0, 0.0, 100.0
        held: str | None = None
        goal_room, goal_obj = rng.choice(ROOMS), rng.choice(OBJECTS)
        i = 0
        while True:
            t_s = i / self.chunk_rate_hz
            kind = i % 4
            if kind == 0:
                seen = [o for o, (r, _, _) in self.layout.items() if r == room]
                rng.shuffle(seen)
                extra = rng.sample(OBJECTS, k=max(0, self.detail - len(seen)))
                parts, objects = [], []
                for obj in (seen + extra)[:self.detail]:
                    _, ox, oy = self.layout[obj]
                    dx, dy = rng.uniform(-0.05, 0.05), rng.uniform(-0.05, 0.05)
                    conf = rng.uniform(0.6, 0.99)
                    objects.append((obj, round(ox + dx, 2), round(oy + dy, 2), round(conf, 2)))
                    parts.append(f"{obj} at ({ox + dx:.2f}, {oy + dy:.2f}) conf {conf:.2f}")
                text = f"[t={t_s:.1f}s camera] room {room}; " + "; ".join(parts)
                source = "camera"
                data = {"room": room, "objects": objects}
            elif kind == 1:
                x += rng.uniform(-0.5, 0.5)
                y += rng.uniform(-0.5, 0.5)
                battery = max(5.0, battery - rng.uniform(0.0, 0.3))
                yaw = rng.uniform(-3.14, 3.14)
                text = (f"[t={t_s:.1f}s odometry] pose x={x:.2f} y={y:.2f} "
                        f"yaw={yaw:.2f} battery {battery:.1f}% "
                        f"held {held or 'nothing'}")
                source = "odometry"
                data = {"x_m": x, "y_m": y, "yaw_rad": yaw, "battery_pct": battery,
                        "held": held}
            elif kind == 2:
                person = rng.choice(PEOPLE)
                said = rng.choice(UTTERANCES).format(obj=goal_obj.replace("_", " "),
                                                     room=goal_room.replace("_", " "))
                text = f"[t={t_s:.1f}s speech] {person} says: \"{said}\""
                source = "speech"
                data = {"person": person, "said": said}
            else:
                action, result, target = self._act(rng, room, goal_room, goal_obj, held)
                if action.startswith("go_to") and result == "succeeded":
                    room = target
                elif action.startswith("pick") and result == "succeeded":
                    held = goal_obj
                elif action.startswith("place") and result == "succeeded":
                    self.layout[held or goal_obj] = (room, round(x, 2), round(y, 2))
                    held = None
                    goal_room, goal_obj = rng.choice(ROOMS), rng.choice(OBJECTS)
                text = f"[t={t_s:.1f}s action] {action} -> {result}; now in {room}"
                source = "action"
                data = {"action": action, "result": result, "room": room}
            yield EpisodeChunk(t_s=t_s, source=source, text=text, data=data)
            i += 1

    def _act(self, rng: random.Random, room: str, goal_room: str, goal_obj: str,
             held: str | None) -> tuple[str, str, str]:
        """(action, result, room the action leads to)."""
        if held is None and self.layout[goal_obj][0] != room:
            target = self.layout[goal_obj][0]
            return (f"go_to({target})", rng.choice(("succeeded", "succeeded", "blocked by a door")),
                    target)
        if held is None:
            return f"pick({goal_obj})", rng.choice(("succeeded", "succeeded", "grasp slipped")), room
        if room != goal_room:
            return f"go_to({goal_room})", "succeeded", goal_room
        return f"place({held})", "succeeded", room


def typed_decision(episode: Episode, tokenizer: Tokenizer,
                   chunks: int) -> tuple[Request, Vocabulary]:
    """The typed-action decision that the main job makes after `chunks` chunks: the CSR request
    over them (typed profile, task, the time) and the vocabulary bound to the values seen."""
    vocab = Vocabulary.parse(episode.action_specs)
    seen = SeenValues(episode.seen_patterns)
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                     profile=episode.typed_profile(vocab.describe()))
    for item in itertools.islice(episode.stream(), chunks):
        state.add(item.text, source=item.source)
        seen.observe(item.text)
    request = state.build_request(task=episode.typed_task(), suffix=episode.suffix(chunks / 2))
    return request, vocab.bind(seen.values())
