"""Evidence coverage: whether the observations that make an answer true are in the prompt a
method built, whatever the model answers."""

from __future__ import annotations

from collections import Counter

import pytest

from csr_ros.bench.eval.evidence import Evidence, covered, resolve


def test_an_observation_split_into_chunks_is_covered_only_when_all_its_chunks_are_in(
        tokenizer, layout):
    from csr_ros.chunks import ChunkPolicy
    from csr_ros.state import CsrState

    state = CsrState(tokenizer=tokenizer, layout=layout, profile="p",
                     policy=ChunkPolicy(max_chunk_tokens=8))
    long = state.add("You open the cabinet 3. In it, you see a cloth 1, a soapbar 2 and a "
                     "candle 3.", source="turn", stamp_ns=7)
    short = state.add("You close the cabinet 3.", source="turn", stamp_ns=8)
    assert len(long) > 1 and len(short) == 1
    seen = Counter((c.source, c.stamp_ns) for c in state.chunks)
    key = frozenset({("turn", 7)})
    assert covered(key, state.chunks, seen)
    assert not covered(key, long[1:] + short, seen)            # its first piece is missing
    assert covered(frozenset({("turn", 8)}), short, seen)
    assert not covered(frozenset({("turn", 9)}), state.chunks, seen)   # never observed


def test_patrol_questions_name_the_chunk_of_the_event_their_answer_comes_from(tmp_path):
    from csr_ros.bench.eval.patrol_questions import patrol_episode

    episode = patrol_episode(tmp_path / "patrol", duration_s=150.0, n_questions=12, seed=1)
    observations = {(o.source, o.stamp_ns): o for o in episode.observations}
    for q in episode.questions:
        (key,) = resolve(q.evidence, episode.observations, where=q.qid)
        text = observations[key].text
        assert observations[key].t_s < q.t_s
        if q.kind == "last_seen":
            assert key[0] == "detections" and q.question.split("the ")[1].split(" last")[0] \
                in text.replace("_", " ")
        elif q.kind in ("asked_for", "how_long_ago"):
            assert key[0] == "speech"
            if q.kind == "asked_for":
                assert q.answer in text
        else:
            assert key[0] == "actions" and q.answer in text


@pytest.mark.slow
def test_on_a_patrol_no_memory_covers_nothing_csr_covers_recent_events_and_bm25_finds_old_ones(
        tmp_path):
    """A 150 s patrol (seed 1): bob speaks at 11.7 s, alice at 93.2 s. Asked at 94 s, alice's
    words are the newest chunk; asked at 149 s, bob's lie 800 tokens back."""
    from csr_ros.bench.eval.episode import Question
    from csr_ros.bench.eval.patrol_questions import patrol_episode
    from csr_ros.bench.eval.report import summarize
    from csr_ros.bench.eval.run import EvalResources, MethodSpec, evaluate

    episode = patrol_episode(tmp_path / "patrol", duration_s=150.0, n_questions=2, seed=1)
    options = ("go and look in the bathroom", "where did I leave my keys?")
    recent = Question(t_s=94.0, question="What did alice last ask the robot?", answer=options[1],
                      choices=options, kind="recent", qid="recent",
                      evidence=(Evidence(t_s=93.2, contains=options[1]),))
    old = Question(t_s=149.0, question="What did bob last ask the robot?", answer=options[0],
                   choices=options, kind="old", qid="old",
                   evidence=(Evidence(t_s=11.7, contains=options[0]),))
    episode.questions = [recent, old] + episode.questions
    resources = EvalResources.local("smollm2", max_context_tokens=2048, threads=1)
    specs = [MethodSpec("csr", {"tau_mem_tokens": 1536, "reserve_tokens": 256}),
             MethodSpec("csr", {"tau_mem_tokens": 300, "reserve_tokens": 256}),
             MethodSpec("window", {"window_tokens": 60}),
             MethodSpec("bm25", {"k": 3}),
             MethodSpec("none")]
    try:
        records, runs = evaluate([episode], specs, resources, max_new_tokens=4)
    finally:
        resources.close()
    by = {(r.label, r.qid): r.evidence_covered for r in records}
    assert by[("csr tau_mem=1536", "recent")] and by[("csr tau_mem=1536", "old")]
    assert by[("csr tau_mem=300", "recent")] and not by[("csr tau_mem=300", "old")]
    assert by[("window window_tokens=60", "recent")] and not by[("window window_tokens=60", "old")]
    assert by[("bm25 k=3", "old")]                  # retrieval finds bob's words by his name
    rows = {row["label"]: row for row in summarize(records, runs)}
    assert rows["none"]["evidence_coverage"] == 0.0
    assert rows["none"]["n_with_evidence"] == len(episode.questions) == 4
    assert rows["csr tau_mem=1536"]["evidence_coverage"] == 1.0
    assert rows["csr tau_mem=1536"]["evicted_chunks"] == 0
    assert rows["csr tau_mem=300"]["evicted_chunks"] > 0
    assert 0.0 < rows["csr tau_mem=300"]["evidence_coverage"] < 1.0
    assert rows["csr tau_mem=300"]["accuracy_by_kind"]["old"]["evidence_coverage"] == 0.0


def test_a_patrol_written_as_ama_names_each_questions_evidence_turn(tmp_path):
    import json

    from csr_ros.bench.eval.episode import ama_episodes
    from csr_ros.bench.eval.patrol_questions import write_patrol_ama
    from csr_ros.bench.eval.run import evidence_keys

    out = tmp_path / "patrol_ama.jsonl"
    write_patrol_ama([tmp_path / "p0"], out, duration_s=150.0, n_questions=6, seed=1)
    record = json.loads(out.read_text())
    (episode,) = ama_episodes(out)
    for qa, question in zip(record["qa_pairs"], episode.questions):
        (step,) = qa["evidence_steps"]
        turn = record["trajectory"][step]["observation"]
        if qa["type"] in ("asked_for", "last_result"):
            assert question.answer in turn
        else:
            assert turn.split(": ", 1)[0].endswith("detections")
        keys = evidence_keys(episode)[question]
        assert keys == {("turn", step * 1_000_000_000)}
