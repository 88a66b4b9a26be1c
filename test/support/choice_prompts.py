"""Lettered choice questions after short robot histories, for any model's tokenizer (the
choice-scoring tests of eval, the llama.cpp server and vLLM)."""

from __future__ import annotations

from csr_ros.bench.eval.episode import EvalEpisode, Question
from csr_ros.bench.eval.run import Asking, task_text
from csr_ros.layout import Layout
from csr_ros.state import CsrState

ROOMS = ("kitchen", "living room", "hallway", "office")
PROFILE = "You are the memory of a mobile robot. Answer from the observations."


def robot_state(tokenizer, rooms_seen: dict[str, str], mode: str = "token") -> CsrState:
    """A CSR state whose history says where each object was seen."""
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                     profile=PROFILE, mode=mode)
    state.add("5s odom: moving through the hallway", source="odom", stamp_ns=5)
    for i, (obj, room) in enumerate(rooms_seen.items()):
        state.add(f"{12 + i}s camera: {obj} seen in the {room}", source="camera",
                  stamp_ns=12 + i)
    state.add("20s speech: alice said 'hello'", source="speech", stamp_ns=20)
    return state


def lettered_prompts(tokenizer, mode: str):
    """Six questions after different histories, each with its options in its own order."""
    out = []
    for i, (obj, room) in enumerate([("red_mug", "office"), ("keys", "kitchen"),
                                     ("plant", "living room"), ("apple", "hallway"),
                                     ("red_mug", "kitchen"), ("keys", "office")]):
        question = Question(t_s=30.0, question=f"Where was the {obj} last seen?", answer=room,
                            choices=ROOMS, qid=f"q{i}")
        shown = Asking(shuffle_seed=0).shown(EvalEpisode("e", [], []), question)
        state = robot_state(tokenizer, {obj: room, "book": ROOMS[i % 4]}, mode=mode)
        out.append((state.build_request(task=task_text(question, "label", shown),
                                        suffix="now: 30s"), shown))
    return out
