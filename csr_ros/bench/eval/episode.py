"""What an evaluation replays: observations in time order, and questions asked at given times.

    EvalEpisode(name, observations=[Observation(t_s, source, text, stamp_ns)], questions=[...])

Sources:
- `bag_episode`: a rosbag2 (mcap, sqlite3) or ROS 1 bag rendered by the aggregator's own code
  (`csr_ros.bag_sources`, `csr_ros.bag_replay`), with a questions file (`load_questions`).
- `ama_episodes`: AMA-Bench episodes: its JSONL (one episode per line, as its published
  `open_end_qa_set.jsonl`), or a single episode as one JSON object in a `.json` file (as
  AMA-Bench publishes example episodes); questions after the whole trajectory.

Questions JSONL, one object per line:
    {"t_s": 42.0, "question": "Where was the red mug last seen?", "answer": "kitchen",
     "choices": ["kitchen", "office", "garage"],          # choices optional; kind/id optional
     "evidence_t_s": [31.0]}                              # optional: the evidence's times
`t_s` counts seconds from the start of the episode (for a bag: its first message).

Pure apart from reading the input files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from csr_ros.errors import ConfigError
from csr_ros.bench.eval.evidence import Evidence, evidence_from_record, steps_named

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class Observation:
    t_s: float             # seconds since the start of the episode
    source: str
    text: str              # rendered, exactly as a chunk would carry it
    stamp_ns: int          # absolute time of the observation
    instant: bool = False  # an 'instant' source: the dynamic suffix, not history


@dataclass(frozen=True)
class Question:
    t_s: float
    question: str
    answer: str
    choices: tuple[str, ...] = ()
    kind: str = ""         # e.g. last_seen | asked_for | last_result | how_long_ago; AMA: A-D
    qid: str = ""
    sub_type: str = ""     # AMA-Bench's sub_type (A1, C4, ...)
    evidence: tuple[Evidence, ...] = ()   # the observations that make the answer true


@dataclass
class EvalEpisode:
    name: str
    observations: list[Observation]
    questions: list[Question]
    context: str = ""      # appended to the profile (an AMA task, a patrol's map)
    start_ns: int = 0      # absolute time of t_s = 0
    clock: bool = True     # the robot's clock is real: the suffix says the current time
    meta: dict = field(default_factory=dict)

    def timeline(self) -> Iterator[Observation | Question]:
        """Observations and questions merged by time; a question sees every observation up to
        and including its own time."""
        observations = sorted(self.observations, key=lambda o: o.t_s)
        questions = sorted(self.questions, key=lambda q: q.t_s)
        i = 0
        for question in questions:
            while i < len(observations) and observations[i].t_s <= question.t_s:
                yield observations[i]
                i += 1
            yield question
        # observations after the last question cannot change any answer: not replayed


# -- questions files ---------------------------------------------------------------------------

def load_questions(path: str | Path) -> list[Question]:
    """Read a questions JSONL file; every problem is reported with its line number."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"questions file {path} does not exist")
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not JSON ({exc.msg})") from None
        questions.append(question_from_record(record, where=f"{path}:{number}"))
    if not questions:
        raise ConfigError(f"{path} holds no questions")
    return questions


def question_from_record(record: object, *, where: str) -> Question:
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: a question must be a JSON object")
    missing = [k for k in ("t_s", "question", "answer") if k not in record]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)} (need t_s, question, answer)")
    try:
        t_s = float(record["t_s"])
    except (TypeError, ValueError):
        msg = f"{where}: t_s must be a number of seconds, got {record['t_s']!r}"
        raise ConfigError(msg) from None
    if t_s < 0:
        raise ConfigError(f"{where}: t_s must be >= 0, got {t_s}")
    question, answer = record["question"], record["answer"]
    if not isinstance(question, str) or not question.strip():
        raise ConfigError(f"{where}: question must be a non-empty string")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise ConfigError(f"{where}: answer must be a non-empty string")
    choices = record.get("choices") or ()
    if choices:
        if not isinstance(choices, list) or not all(isinstance(c, str) and c.strip()
                                                    for c in choices):
            raise ConfigError(f"{where}: choices must be a list of non-empty strings")
        if len(set(choices)) != len(choices):
            raise ConfigError(f"{where}: choices repeat an entry: {choices}")
        if answer not in choices:
            raise ConfigError(f"{where}: the answer {answer!r} is not one of the choices {choices}")
    return Question(t_s=t_s, question=question.strip(), answer=answer.strip(),
                    choices=tuple(choices), kind=str(record.get("kind", "")),
                    qid=str(record.get("id", "")),
                    evidence=evidence_from_record(record.get("evidence_t_s"), where=where))


def write_questions(questions: Iterable[Question], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", encoding="utf-8") as out:
        for q in questions:
            record = {"t_s": q.t_s, "question": q.question, "answer": q.answer}
            if q.choices:
                record["choices"] = list(q.choices)
            if q.kind:
                record["kind"] = q.kind
            if q.qid:
                record["id"] = q.qid
            if q.evidence:
                record["evidence_t_s"] = [{"t_s": e.t_s, "source": e.source} if e.source
                                          else e.t_s for e in q.evidence]
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


# -- (a) a bag and a questions file -------------------------------------------------------------

def bag_episode(paths: list[Path], questions: list[Question], *, params: Path | None = None,
                topics: list[str] | None = None, name: str | None = None) -> EvalEpisode:
    """Render a bag with the aggregator's code (sources, rate limits, renderer) into an episode.

    `t_s` = 0 is the bag time of the first message of a rendered source (the renderer's
    clock starts there too); an observation's `t_s` is the bag time it was emitted at.
    """
    from csr_ros.bag_replay import replay_chunks
    from csr_ros.bag_sources import read_bag, sources_for

    for path in paths:
        if not Path(path).exists():
            raise ConfigError(f"bag {path} does not exist")
    sources = sources_for(list(paths), params, topics)
    first_ns: list[int] = []

    def messages():
        for topic, t_ns, msg in read_bag(list(paths), sources):
            if not first_ns:
                first_ns.append(t_ns)
            yield topic, t_ns, msg

    chunks = list(replay_chunks(messages(), sources))
    if not chunks:
        raise ConfigError(f"no chunks rendered from {[str(p) for p in paths]}: no message on the "
                          f"sources {sorted(sources)}")
    start_ns = first_ns[0]
    observations = [Observation(t_s=max(0.0, (c.t_ns - start_ns) / NS_PER_S),
                                source=c.source, text=c.text, stamp_ns=c.stamp_ns,
                                instant=c.instant) for c in chunks]
    end_s = max(o.t_s for o in observations)
    late = [q for q in questions if q.t_s > end_s + 60.0]
    if late:
        raise ConfigError(f"{len(late)} question(s) are asked after the bag ends ({end_s:.1f} s), "
                          f"first at t_s={late[0].t_s}: is t_s measured from the bag's start?")
    return EvalEpisode(name=name or Path(paths[0]).name, observations=observations,
                       questions=list(questions), start_ns=start_ns)


# -- (b) AMA-Bench episodes ---------------------------------------------------------------------

_OPTION = re.compile(r"\(([A-Z])\)")
_SINGLE_OPTION = re.compile(r"^\s*\(([A-Z])\)\s*$")
MCQ_MODES = ("text", "label")


def split_options(question: str) -> tuple[str, list[tuple[str, str]]] | None:
    """'Where is it? (A) kitchen (B) office' → ('Where is it?', [('(A)', 'kitchen'), ...]);
    None unless the labels run (A), (B), ... in order with non-empty texts."""
    marks = list(_OPTION.finditer(question))
    start = next((i for i, m in enumerate(marks) if m.group(1) == "A"), None)
    if start is None:
        return None
    marks = marks[start:]
    if [m.group(1) for m in marks] != [chr(ord("A") + i) for i in range(len(marks))]:
        return None
    options = []
    for m, nxt in zip(marks, marks[1:] + [None]):
        text = question[m.end():nxt.start() if nxt else len(question)].strip().rstrip(",;")
        if not text:
            return None
        options.append((f"({m.group(1)})", text.strip()))
    if len(options) < 2 or len({t for _, t in options}) != len(options):
        return None
    return question[:marks[0].start()].strip(), options


def ama_episodes(path: str | Path, *, limit: int | None = None,
                 mcq: str = "text") -> list[EvalEpisode]:
    """AMA-Bench episodes: `{episode_id, task, domain, task_type, trajectory: [{turn_idx,
    action, observation}], qa_pairs: [{question, answer, type?, sub_type?, question_uuid?}]}`,
    one per line of a `.jsonl` file, or one JSON object (or a list of them) in a `.json` file.

    Each turn becomes one observation ("Step i:\\nAction: ...\\nObservation: ...", the text
    AMA-Bench's own harness builds), one second apart; the questions come after the last turn.
    A multiple-choice question whose answer is one option, "(B)", is scored over the texts of
    the options it lists (`mcq="text"`: the question keeps its stem, the options become the
    choices, the answer the text of option B), or over the labels "(A)", "(B)", ...
    (`mcq="label"`, AMA's own answer format: small models pick a label regardless of the
    context). `choices` in a qa pair (an extension) is used as given.
    """
    if mcq not in MCQ_MODES:
        raise ConfigError(f"mcq must be one of {MCQ_MODES}, got {mcq!r}")
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"AMA-Bench file {path} does not exist")
    if path.suffix == ".json":
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}); an "
                              "AMA-Bench .json file holds one episode object") from None
        records = document if isinstance(document, list) else [document]
        if not records:
            raise ConfigError(f"{path} holds no episodes")
        return [ama_episode(r, where=f"{path}" + (f"[{i}]" if len(records) > 1 else ""),
                            mcq=mcq) for i, r in enumerate(records[:limit])]
    episodes = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not JSON ({exc.msg})") from None
        episodes.append(ama_episode(record, where=where, mcq=mcq))
        if limit is not None and len(episodes) >= limit:
            break
    if not episodes:
        raise ConfigError(f"{path} holds no episodes")
    return episodes


def ama_episode(record: object, *, where: str = "episode", mcq: str = "text") -> EvalEpisode:
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: an episode must be a JSON object")
    missing = [k for k in ("episode_id", "trajectory", "qa_pairs") if k not in record]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)} (AMA-Bench episodes have "
                          "episode_id, task, domain, trajectory, qa_pairs)")
    trajectory, qa_pairs = record["trajectory"], record["qa_pairs"]
    if not isinstance(trajectory, list) or not trajectory:
        raise ConfigError(f"{where}: trajectory must be a non-empty list of turns")
    if not isinstance(qa_pairs, list) or not qa_pairs:
        raise ConfigError(f"{where}: qa_pairs must be a non-empty list")
    observations = []
    at_step: dict[int, int] = {}               # turn_idx -> position in the trajectory
    for i, turn in enumerate(trajectory):
        if not isinstance(turn, dict) or "action" not in turn or "observation" not in turn:
            raise ConfigError(f"{where}: turn {i} needs action and observation")
        turn_idx = turn.get("turn_idx", i)
        if isinstance(turn_idx, int) and not isinstance(turn_idx, bool):
            at_step.setdefault(turn_idx, i)
        text = (f"Step {turn_idx}:\nAction: {_as_text(turn['action'])}\n"
                f"Observation: {_as_text(turn['observation'])}")
        observations.append(Observation(t_s=float(i), source="turn", text=text,
                                        stamp_ns=i * NS_PER_S))
    t_ask = float(len(trajectory))
    last_step = max(at_step, default=-1)
    questions = []
    for j, qa in enumerate(qa_pairs):
        if not isinstance(qa, dict) or "question" not in qa or "answer" not in qa:
            raise ConfigError(f"{where}: qa_pairs[{j}] needs question and answer")
        question, answer = str(qa["question"]).strip(), _as_text(qa["answer"]).strip()
        if not question or not answer:
            raise ConfigError(f"{where}: qa_pairs[{j}] has an empty question or answer")
        choices = qa.get("choices")
        if choices:
            q = question_from_record({"t_s": t_ask, "question": question, "answer": answer,
                                      "choices": choices}, where=f"{where}: qa_pairs[{j}]")
            choices = q.choices
        elif _SINGLE_OPTION.match(answer):
            split = split_options(question) if mcq == "text" else None
            by_label = dict(split[1]) if split else {}
            if answer in by_label:
                question, answer = split[0], by_label[answer]
                choices = tuple(by_label.values())
            else:
                labels = [f"({m})" for m in dict.fromkeys(_OPTION.findall(question))]
                choices = tuple(labels) if answer in labels and len(labels) >= 2 else ()
        steps = qa.get("evidence_steps")            # an extension: the steps, given
        if steps is None:
            steps = steps_named(str(qa["question"]), last_step)
        elif not isinstance(steps, list) or not all(isinstance(n, int) for n in steps):
            raise ConfigError(f"{where}: qa_pairs[{j}].evidence_steps must be a list of steps")
        evidence = tuple(Evidence(t_s=float(at_step[n]), source="turn", exact=True)
                         for n in steps if n in at_step)
        uuid = qa.get("question_uuid")
        questions.append(Question(t_s=t_ask, question=question, answer=answer,
                                  choices=tuple(choices or ()), kind=str(qa.get("type") or ""),
                                  qid=f"{record['episode_id']}/{uuid if uuid else j}",
                                  sub_type=str(qa.get("sub_type") or ""), evidence=evidence))
    task = str(record.get("task") or "").strip()
    meta = {k: record[k] for k in ("domain", "task_type", "source") if k in record}
    return EvalEpisode(name=str(record["episode_id"]), observations=observations,
                       questions=questions, context=f"Task: {task}" if task else "", meta=meta,
                       clock=False)


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
