"""The synthetic patrol as an evaluation input: the bag `csr_ros.patrol` writes, rendered by
the aggregator's code, and questions generated from its ground truth.

    episode = patrol_episode("patrol_bag", duration_s=600, n_questions=60, seed=0)

Question kinds (multiple choice, four options, answers taken from the ground-truth events that
happened before the question's time; the chunks say the same, so every one is answerable from
a complete memory):
- last_seen:     "Where was the <object> last seen?"            → the room of its last detection
- asked_for:     "What did <speaker> last ask the robot?"      → the request's words
- last_result:   "What did the robot's last action return?"    → "name(target): result"
- how_long_ago:  "How long ago did <speaker> last speak?"      → under 1 / 1-3 / 3-6 / over 6 min

Each question's evidence is the ground-truth event its answer is taken from (the sighting, the
utterance, the action result): the chunk of that event is what a memory must hold.

Question times are drawn uniformly after the first minute; kinds take turns. Deterministic for
a seed. Pure apart from `patrol_episode`, which reads (or writes) the bag.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Sequence

from csr_ros.errors import ConfigError
from csr_ros.bench.eval.episode import EvalEpisode, Question, bag_episode
from csr_ros.bench.eval.evidence import Evidence, resolve

KINDS = ("last_seen", "asked_for", "last_result", "how_long_ago")
AGE_BUCKETS = ((60.0, "under 1 minute"), (180.0, "1 to 3 minutes"), (360.0, "3 to 6 minutes"),
               (float("inf"), "over 6 minutes"))
FIRST_QUESTION_S = 60.0
MARGIN_S = 1.0                 # an event is asked about only once its chunk is surely out


def default_params() -> Path | None:
    """config/csr_ros.yaml of a source checkout (the aggregator's sources for the patrol)."""
    path = Path(__file__).resolve().parents[3] / "config" / "csr_ros.yaml"
    return path if path.is_file() else None


def patrol_episode(directory: str | Path, *, duration_s: float = 600.0, n_questions: int = 60,
                   seed: int = 0, params: Path | None = None, storage: str = "mcap"
                   ) -> EvalEpisode:
    """Read the patrol bag in `directory` (written first when it does not exist) and its
    ground truth; `params` (default: config/csr_ros.yaml) gives the aggregator's sources."""
    from csr_ros.patrol import GROUND_TRUTH_FILE, generate_patrol, load_truth

    directory = Path(directory)
    if not directory.exists():
        generate_patrol(directory, duration_s=duration_s, seed=seed, storage=storage)
    elif not (directory / GROUND_TRUTH_FILE).is_file():
        raise ConfigError(f"{directory} exists but holds no {GROUND_TRUTH_FILE}: not a patrol "
                          "bag (pass a new directory to write one)")
    truth = load_truth(directory)
    questions = patrol_questions(truth.events, truth.duration_s, n_questions=n_questions,
                                 seed=seed)
    return _render(directory, truth, questions, params)


def _render(directory: Path, truth, questions: list[Question],
            params: Path | None) -> EvalEpisode:
    params = params or default_params()
    if params is None:
        raise ConfigError("no parameters file for the patrol's sources: pass --params "
                          "config/csr_ros.yaml")
    episode = bag_episode([directory], questions, params=params,
                          name=f"patrol-{truth.seed}-{int(truth.duration_s)}s")
    episode.meta.update(duration_s=truth.duration_s, seed=truth.seed)
    return episode


def patrol_questions(events: Sequence[dict[str, Any]], duration_s: float, *,
                     n_questions: int = 60, seed: int = 0, at_s: float | None = None,
                     kinds: Sequence[str] = KINDS) -> list[Question]:
    """`n_questions` at times drawn after the first minute, or all at `at_s` (then without
    repeats: fewer when the patrol holds fewer distinct questions)."""
    if n_questions < 1:
        raise ConfigError(f"n_questions must be >= 1, got {n_questions}")
    if duration_s <= FIRST_QUESTION_S + 1.0:
        raise ConfigError(f"the patrol lasts {duration_s:.0f} s; questions start after "
                          f"{FIRST_QUESTION_S:.0f} s: generate a longer one")
    rng = random.Random(seed)
    if at_s is None:
        times = sorted(round(rng.uniform(FIRST_QUESTION_S, duration_s - 0.5), 1)
                       for _ in range(n_questions))
    else:
        times = [float(at_s)] * (20 * n_questions)          # draws; repeats are skipped
    pools = _pools(events)
    questions: list[Question] = []
    asked: set[str] = set()
    for i, t_s in enumerate(times):
        if len(questions) >= n_questions:
            break
        for j in range(len(kinds)):
            kind = kinds[(i + j) % len(kinds)]
            q = _ask(kind, t_s, events, pools, rng)
            if q is not None and (at_s is None or q[0] not in asked):
                asked.add(q[0])
                questions.append(Question(t_s=t_s, question=q[0], answer=q[1],
                                          choices=tuple(q[2]), kind=kind,
                                          qid=f"q{len(questions):03d}",
                                          evidence=(_evidence(q[3]),)))
                break
    if not questions:
        raise ConfigError("the patrol has no event to ask about; generate a longer one")
    return questions


def _pools(events: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    rooms = sorted({e["room"] for e in events if e["kind"] in ("detection", "room_visit")})
    return {"rooms": rooms,
            "requests": sorted({e["request"] for e in events if e["kind"] == "utterance"}),
            "actions": sorted({_action_text(e) for e in events if e["kind"] == "action"})}


def _action_text(e: dict[str, Any]) -> str:
    return f"{e['name']}({e['target']}): {e['result']}"


def _evidence(e: dict[str, Any]) -> Evidence:
    """The observation an event's message became: at the event's bag time, holding what the
    question asks about (the object seen, the words said, the action and its result)."""
    held = {"detection": lambda: e["object"], "utterance": lambda: e["request"],
            "action": lambda: _action_text(e)}[e["kind"]]()
    return Evidence(t_s=float(e["t_s"]), contains=held)


def _before(events, kind: str, t_s: float) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and e["t_s"] + MARGIN_S <= t_s]


def _last_by(events, kind: str, key: str, t_s: float) -> dict[str, dict[str, Any]]:
    """The last event of `kind` before `t_s` for each value of its `key` ({}: none yet)."""
    return {e[key]: e for e in _before(events, kind, t_s)}


def _options(answer: str, pool: Sequence[str], rng: random.Random, n: int = 4) -> list[str]:
    others = sorted(set(pool) - {answer})
    picked = rng.sample(others, min(n - 1, len(others))) + [answer]
    rng.shuffle(picked)
    return picked


def _ask(kind: str, t_s: float, events, pools, rng: random.Random):
    """(question, answer, choices, the event answering it) or None when nothing of this kind
    happened yet."""
    if kind == "last_seen":
        last = _last_by(events, "detection", "object", t_s)
        if not last:
            return None
        obj = rng.choice(sorted(last))
        answer = last[obj]["room"]
        return (f"Where was the {obj} last seen?", answer,
                _options(answer, pools["rooms"], rng), last[obj])
    if kind in ("asked_for", "how_long_ago"):
        last = _last_by(events, "utterance", "speaker", t_s)
        if not last:
            return None
        speaker = rng.choice(sorted(last))
        e = last[speaker]
        if kind == "asked_for":
            options = _options(e["request"], pools["requests"], rng)
            if len(options) < 2:
                return None
            return f"What did {speaker} last ask the robot?", e["request"], options, e
        age_s = t_s - e["t_s"]
        answer = next(label for limit, label in AGE_BUCKETS if age_s < limit)
        return (f"How long ago did {speaker} last speak to the robot?", answer,
                [label for _, label in AGE_BUCKETS], e)
    if kind == "last_result":
        done = _before(events, "action", t_s)
        if not done:
            return None
        answer = _action_text(done[-1])
        options = _options(answer, pools["actions"], rng)
        if len(options) < 2:
            return None
        return "What did the robot's last action return?", answer, options, done[-1]
    raise AssertionError(f"unknown question kind {kind}")


def patrol_ama_record(directory: str | Path, *, duration_s: float = 600.0, n_questions: int = 12,
                      seed: int = 0, params: Path | None = None) -> dict[str, Any]:
    """One patrol as an AMA-Bench episode: each history chunk is a turn (action: its source,
    observation: its text), and multiple-choice questions in AMA's style ("... (A) x (B) y",
    answer "(B)") are asked after the last turn. `how_long_ago` needs a clock, which AMA
    episodes have not, so it is left out."""
    from csr_ros.patrol import generate_patrol, load_truth

    directory = Path(directory)
    if not directory.exists():
        generate_patrol(directory, duration_s=duration_s, seed=seed)
    truth = load_truth(directory)
    questions = patrol_questions(truth.events, truth.duration_s, n_questions=n_questions,
                                 seed=seed, at_s=truth.duration_s + 1.0,
                                 kinds=("last_seen", "asked_for", "last_result"))
    episode = _render(directory, truth, questions, params)
    history = [o for o in episode.observations if not o.instant]
    turns = [{"turn_idx": i, "action": o.source, "observation": o.text}
             for i, o in enumerate(history)]
    step_of = {(o.source, o.stamp_ns): i for i, o in enumerate(history)}
    qa_pairs = []
    for q in questions:
        letters = [chr(ord("A") + i) for i in range(len(q.choices))]
        options = " ".join(f"({letter}) {choice}" for letter, choice in zip(letters, q.choices))
        answer = letters[q.choices.index(q.answer)]
        keys = resolve(q.evidence, history, where=q.question)
        qa_pairs.append({"question": f"{q.question} {options}", "answer": f"({answer})",
                         "type": q.kind, "evidence_steps": sorted(step_of[k] for k in keys)})
    return {"episode_id": f"patrol-{truth.seed}-{int(truth.duration_s)}s",
            "task": "Patrol the flat, help the people in it and report what you saw.",
            "domain": "embodied_ai", "task_type": "patrol", "trajectory": turns,
            "qa_pairs": qa_pairs}


def write_patrol_ama(directories: Sequence[str | Path], out: str | Path, *,
                     duration_s: float = 600.0, n_questions: int = 12, seed: int = 0,
                     params: Path | None = None) -> int:
    """Write each patrol directory (generated with seed + its index when absent) as one line
    of an AMA-Bench JSONL file; returns the number of episodes."""
    import json

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for i, directory in enumerate(directories):
            record = patrol_ama_record(directory, duration_s=duration_s,
                                       n_questions=n_questions, seed=seed + i, params=params)
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(directories)
