"""AMA-Bench's published formats (a single-episode .json, open_end_qa_set.jsonl) and the
evidence a question names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csr_ros.errors import ConfigError
from csr_ros.bench.eval.episode import ama_episodes, load_questions, write_questions
from csr_ros.bench.eval.evidence import Evidence, resolve, steps_named
from csr_ros.bench.eval.run import evidence_keys

DATA = Path(__file__).parent / "data"
SINGLE = DATA / "ama_single_episode.json"
OPEN_END = DATA / "ama_open_end_qa_set.jsonl"


def _steps(episode, question) -> list[int]:
    return sorted(stamp_ns // 1_000_000_000 for _, stamp_ns in evidence_keys(episode)[question])


def test_a_single_episode_json_file_is_read_as_one_episode_with_typed_questions():
    (episode,) = ama_episodes(SINGLE)
    assert episode.name == "bathroom_soap_7"
    assert len(episode.observations) == 12
    assert episode.observations[4].text.startswith(
        "Step 4:\nAction: move soapbar 1 to garbagecan 1\nObservation: You move")
    assert episode.context == "Task: Put two bars of soap into the garbage can."
    assert episode.meta == {"task_type": "pick_two_obj_and_place", "source": "alfworld"}
    assert [(q.kind, q.sub_type) for q in episode.questions] == [
        ("A", "A1"), ("A", "A2"), ("B", "B1"), ("C", "C4"), ("C", "C1"), ("D", "D3")]
    assert all(q.choices == () and q.t_s == 12.0 for q in episode.questions)
    assert [q.qid for q in episode.questions][:2] == ["bathroom_soap_7/0", "bathroom_soap_7/1"]


def test_open_end_qa_set_lines_keep_type_sub_type_and_question_uuid():
    episodes = ama_episodes(OPEN_END)
    assert [e.name for e in episodes] == ["0", "1"]
    assert episodes[1].meta == {"domain": "SOFTWARE", "task_type": "bugfix"}
    q = episodes[1].questions[0]
    assert (q.kind, q.sub_type, q.qid) == ("A", "A1", "1/5f0c1a52-0000-4000-8000-000000000003")
    assert q.answer == "tests/test_add.py::test_negative"
    assert ama_episodes(OPEN_END, limit=1)[0].name == "0"


def test_the_steps_a_question_names_are_its_evidence():
    (episode,) = ama_episodes(SINGLE)
    between, before, from_to, at, throughout, until = episode.questions
    assert _steps(episode, between) == [3, 4, 5]
    assert _steps(episode, before) == list(range(8))
    assert _steps(episode, from_to) == [1, 2, 3, 4]
    assert _steps(episode, at) == [9]
    assert _steps(episode, throughout) == []              # names no step: no evidence
    assert _steps(episode, until) == list(range(12))


def test_steps_are_read_from_ama_benchs_own_question_phrasings():
    last = 149
    assert steps_named("At step 4 with Inventory: soapbar 1, if the agent executes actions "
                       "['move soapbar 1 to garbagecan 1'] sequentially, what state changes "
                       "will occur?", last) == (4,)
    assert steps_named("From step 1 to step 8, what actions made the environment changes?",
                       last) == tuple(range(1, 9))
    assert steps_named("What actions were performed between step 74 and step 76?",
                       last) == (74, 75, 76)
    assert steps_named("What is the location of towel 1, cloth 2, soapbar 3 at step 76?",
                       last) == (76,)
    assert steps_named("Before step 78, which actions were performed on soapbar 1?",
                       last) == tuple(range(78))
    assert steps_named("Until step 106, what were the location histories of soapbar 1?",
                       last) == tuple(range(107))
    assert steps_named("What changes occurred to the inventory throughout the trajectory?",
                       last) == ()
    assert steps_named("After step 140, what did the agent open?", last) == tuple(range(141, 150))
    assert steps_named("What happened in steps 3-5?", last) == (3, 4, 5)
    assert steps_named("Until step 500, what did it do?", 9) == tuple(range(10))   # clipped


def test_evidence_steps_given_in_a_qa_pair_override_the_question_text(tmp_path):
    record = json.loads(SINGLE.read_text())
    record["qa_pairs"] = [{"question": "Where is soapbar 2 now?", "answer": "garbagecan 1",
                           "evidence_steps": [6, 10]}]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(record))
    (episode,) = ama_episodes(path)
    assert _steps(episode, episode.questions[0]) == [6, 10]
    record["qa_pairs"][0]["evidence_steps"] = "6"
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"evidence_steps must be a list"):
        ama_episodes(path)


def test_a_json_file_that_is_not_an_episode_is_rejected_with_the_reason(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"episode_id": 3, "trajectory": []}')
    with pytest.raises(ConfigError, match=r"bad.json: missing qa_pairs"):
        ama_episodes(path)
    path.write_text('{"episode_id": 3,')
    with pytest.raises(ConfigError, match=r"bad.json: not JSON"):
        ama_episodes(path)


def test_a_questions_file_carries_evidence_times_and_writes_them_back(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"t_s": 12, "question": "What did Alice ask for?", "answer": "keys", '
                    '"evidence_t_s": [3, {"t_s": 3.0, "source": "speech"}]}\n'
                    '{"t_s": 20, "question": "q", "answer": "a"}\n')
    first, second = load_questions(path)
    assert first.evidence == (Evidence(t_s=3.0), Evidence(t_s=3.0, source="speech"))
    assert second.evidence == ()
    out = write_questions([first, second], tmp_path / "back.jsonl")
    assert load_questions(out) == [first, second]
    path.write_text('{"t_s": 12, "question": "q", "answer": "a", "evidence_t_s": ["soon"]}\n')
    with pytest.raises(ConfigError, match=r"q.jsonl:1: evidence_t_s entries are times"):
        load_questions(path)


def test_evidence_resolves_to_the_nearest_observation_of_its_source_and_text():
    from csr_ros.bench.eval.episode import Observation

    obs = [Observation(t_s=2.9, source="odom", text="2s odom: at 1,2", stamp_ns=29),
           Observation(t_s=3.0, source="speech", text="3s speech: alice: bring the keys",
                       stamp_ns=30),
           Observation(t_s=3.0, source="goal", text="patrol", stamp_ns=30, instant=True),
           Observation(t_s=9.0, source="speech", text="9s speech: bob: hi", stamp_ns=90)]
    assert resolve([Evidence(t_s=3.0)], obs) == {("speech", 30)}          # not the instant one
    assert resolve([Evidence(t_s=2.8)], obs) == {("odom", 29)}
    assert resolve([Evidence(t_s=2.8, source="speech")], obs) == {("speech", 30)}
    assert resolve([Evidence(t_s=8.5, contains="Bob: HI")], obs) == {("speech", 90)}
    with pytest.raises(ConfigError, match=r"q7: no observation source 'speech' at t_s=6"):
        resolve([Evidence(t_s=6.0, source="speech")], obs, where="q7")
