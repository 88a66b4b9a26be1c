"""`csr-ros eval`: question sources, scoring, methods and a short evaluation on real resources."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from csr_ros.errors import ConfigError
from csr_ros.bench.eval.episode import (EvalEpisode, Observation, Question, ama_episodes,
                                        load_questions)
from csr_ros.bench.eval.scoring import contains_answer, exact_match, match_choice, normalize_answer
from csr_ros.stats import percentile, wilson_interval

AMA_TINY = Path(__file__).parent / "data" / "ama_tiny.jsonl"
ISSUE_FIELDS = {"method", "budget", "n_questions", "accuracy", "ci95", "ttft_p50_s",
                "ttft_p99_s", "prompt_tokens_mean", "recomputed_tokens_mean"}


# -- sources ------------------------------------------------------------------------------------

def test_ama_episodes_become_one_observation_per_turn_and_questions_after_the_last(tmp_path):
    episodes = ama_episodes(AMA_TINY)
    assert [e.name for e in episodes] == ["tiny-kitchen-0", "tiny-patrol-1"]
    kitchen = episodes[0]
    assert len(kitchen.observations) == 6
    assert kitchen.observations[1].text.startswith("Step 1:\nAction: go to office\n")
    assert all(q.t_s == 6.0 for q in kitchen.questions)
    assert kitchen.context == "Task: Put the red mug in the dishwasher."
    assert kitchen.clock is False
    mcq, given, _, open_ended = kitchen.questions
    assert mcq.question == "Where was the red mug before the agent picked it up?"
    assert mcq.choices == ("kitchen", "office", "hallway", "garage") and mcq.answer == "office"
    labels = ama_episodes(AMA_TINY, mcq="label")[0].questions[0]
    assert labels.choices == ("(A)", "(B)", "(C)", "(D)") and labels.answer == "(B)"
    assert given.choices == ("office", "kitchen", "hallway")
    assert open_ended.choices == () and open_ended.kind == "open"


def test_an_ama_episode_without_qa_pairs_is_rejected_with_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"episode_id": 1, "trajectory": [
        {"turn_idx": 0, "action": "look", "observation": "nothing"}]}) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: missing qa_pairs"):
        ama_episodes(path)


def test_a_questions_file_with_an_answer_outside_its_choices_is_rejected_with_its_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"t_s": 1, "question": "where?", "answer": "kitchen"}\n'
                    '{"t_s": 2, "question": "where?", "answer": "attic", '
                    '"choices": ["kitchen", "office"]}\n')
    with pytest.raises(ConfigError, match=r"q.jsonl:2: the answer 'attic' is not one of"):
        load_questions(path)


def test_a_questions_file_without_t_s_is_rejected():
    with pytest.raises(ConfigError, match="missing t_s"):
        from csr_ros.bench.eval.episode import question_from_record
        question_from_record({"question": "q", "answer": "a"}, where="x")


def test_a_question_sees_every_observation_up_to_its_own_time_and_none_after():
    obs = [Observation(t_s=t, source="s", text=f"o{t}", stamp_ns=int(t * 1e9))
           for t in (0.0, 1.0, 2.0, 3.0)]
    questions = [Question(t_s=1.0, question="q1", answer="a"),
                 Question(t_s=2.5, question="q2", answer="a")]
    items = list(EvalEpisode("e", obs, questions).timeline())
    names = [getattr(i, "text", None) or i.question for i in items]
    assert names == ["o0.0", "o1.0", "q1", "o2.0", "q2"]


# -- scoring ------------------------------------------------------------------------------------

def test_normalized_exact_match_ignores_case_articles_punctuation_and_underscores():
    assert normalize_answer("The Living_Room.") == "living room"
    assert exact_match("the living room", "living_room")
    assert exact_match("(B)", "(b)")
    assert not exact_match("(B)", "(C)")
    assert not exact_match("kitchen and office", "kitchen")
    assert contains_answer("It was in the kitchen.", "kitchen")
    assert not contains_answer("kitchenette", "kitchen")


def test_a_free_answer_is_matched_to_the_choice_it_names_first():
    choices = ["living room", "garage", "room"]
    assert match_choice("Garage", choices) == "garage"
    assert match_choice("In the living room, near the garage.", choices) == "living room"
    assert match_choice("I do not know", choices) is None


def test_wilson_interval_matches_published_values():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_percentile_interpolates_between_order_statistics():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([], 50) is None


# -- methods on the real tokenizer ----------------------------------------------------------------

def test_bm25_retrieves_the_chunk_that_names_the_object_across_underscores(resources):
    from csr_ros.bench.eval.methods import Bm25Method

    method = Bm25Method(resources.primary, resources.tokenizer, resources.layout, k=1)
    method.begin("profile")
    for i, text in enumerate(["camera: detections=[red_mug 0.93] room=office",
                              "odom: x=1.0 y=2.0", "speech: Bob: bring me the apple",
                              "camera: detections=[plant 0.8] room=garage"]):
        method.observe(Observation(t_s=i, source="s", text=text, stamp_ns=i))
    assert [c.text for c in method.select("Where was the red mug last seen?")] == [
        "camera: detections=[red_mug 0.93] room=office\n"]
    method.k = 3
    picked = method.select("red mug or the apple?")
    assert [c.seq for c in picked] == sorted(c.seq for c in picked)   # in time order


def test_the_window_keeps_the_newest_chunks_that_fit_its_budget(resources):
    from csr_ros.bench.eval.methods import WindowMethod

    method = WindowMethod(resources.primary, resources.tokenizer, resources.layout,
                          window_tokens=40)
    method.begin("profile")
    for i in range(10):
        method.observe(Observation(t_s=i, source="s", text=f"odom: x={i}.5 y=2.25 yaw=90",
                                   stamp_ns=i))
    picked = method.select("q")
    assert picked and picked[-1].seq == 9
    assert sum(c.n_tokens for c in picked) <= 40
    assert sum(c.n_tokens for c in method.history.chunks[-len(picked) - 1:]) > 40


# -- choice scoring on the local engine ---------------------------------------------------------

def test_choice_scores_from_a_scratch_of_the_cached_state_equal_a_cold_computation(resources,
                                                                                  smollm2):
    from csr_ros.bench.eval.scoring import score_choices_local
    from csr_ros.state import CsrState

    state = CsrState(tokenizer=resources.tokenizer, layout=resources.layout,
                     profile="You answer questions about a robot.")
    state.add("camera: red_mug seen in the office", source="camera", stamp_ns=1)
    request = state.build_request(task="Where was the red mug? Options: office; garage")
    choices = [resources.tokenizer.encode_data(c) for c in ("office", "the garage")]
    resources.primary.load(request.static_ids)
    _, _, scores = score_choices_local(resources.primary, request, choices)
    assert smollm2.committed_ids == request.static_ids        # nothing left behind
    for ids, got in zip(choices, scores):
        expected = []
        for j, tok in enumerate(ids):
            smollm2.load(list(request.ids) + list(ids[:j]))    # cold, from scratch
            expected.append(float(smollm2.last_logits.log_softmax(-1)[tok]))
        assert got == pytest.approx(expected, abs=2e-3)


# -- a short evaluation end to end --------------------------------------------------------------

def _tiny_args(tmp_path, *extra):
    return ["eval", str(AMA_TINY), "--format", "ama", "--episodes", "1", "--max-questions", "3",
            "--tau-mem", "150", "--reserve-tokens", "96", "--max-context", "1024",
            "--max-new-tokens", "6", "--json", str(tmp_path / "e.json"),
            "--plot", str(tmp_path / "e.png"), "--markdown", str(tmp_path / "e.md"), *extra]


def _check_report(tmp_path, n_questions: int) -> dict:
    report = json.loads((tmp_path / "e.json").read_text())
    rows = report["methods"]
    # beside the window matched to CSR, a window of the latest chunk only
    assert [r["method"] for r in rows] == ["csr", "window", "window", "bm25", "none"]
    assert rows[2]["budget"] == {"window_chunks": 1}
    assert all(q["history_chunks"] == 1 for q in report["questions"]
               if q["label"] == "window window_chunks=1")
    for row in rows:
        assert ISSUE_FIELDS <= set(row)
        assert row["n_questions"] == n_questions
        assert 0.0 <= row["accuracy"] <= 1.0
        assert row["ci95"][0] <= row["accuracy"] <= row["ci95"][1]
        assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"]
    by = {r["method"]: r for r in rows if "window_chunks" not in r["budget"]}
    assert by["none"]["history_tokens_mean"] == 0
    assert by["csr"]["evicted_chunks"] > 0, "tau_mem=150 must evict in this episode"
    # matched by tokens: the window holds about as much history as CSR did
    assert by["window"]["budget"]["window_tokens"] == round(by["csr"]["history_tokens_mean"])
    assert len(report["questions"]) == 5 * n_questions
    assert (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"
    assert "| csr |" in (tmp_path / "e.md").read_text()
    return by


@pytest.mark.slow
def test_a_short_evaluation_runs_every_method_on_the_local_engine(tmp_path, capsys,
                                                                  monkeypatch):
    from csr_ros.cli import main

    monkeypatch.setattr("csr_ros.bench.eval.run.REPLAY_PROGRESS_S", 0.0)   # a line per observation
    assert main(_tiny_args(tmp_path, "--threads", "1")) == 0
    by = _check_report(tmp_path, 3)
    # CSR's history stays cached: it recomputes only the question
    assert by["csr"]["recomputed_tokens_mean"] <= by["window"]["recomputed_tokens_mean"]
    assert by["csr"]["recomputed_tokens_mean"] < by["csr"]["prompt_tokens_mean"] / 2
    assert by["bm25"]["recomputed_tokens_mean"] > by["csr"]["recomputed_tokens_mean"]
    err = capsys.readouterr().err
    # every question is asked of all methods in turn, each on its own fork of the engine
    assert "[1/3 t=6s recall] csr tau_mem=150: " in err and " | none: " in err
    assert re.search(r"\[replay \S+\] 1/\d+ observations, \d+ s", err)     # the replay's progress
    report = json.loads((tmp_path / "e.json").read_text())
    assert all(r["interleaved"] for r in report["methods"])


@pytest.mark.slow
def test_budgets_matched_by_ttft_measure_csrs_ttft_once_for_the_window_and_bm25(tmp_path,
                                                                               capsys):
    from csr_ros.cli import main

    assert main(_tiny_args(tmp_path, "--threads", "1", "--match", "ttft")) == 0
    err = capsys.readouterr().err
    # one calibration (a prefill of CSR's typical history) serves both other methods
    assert err.count("csr tau_mem=150: measuring TTFT on a typical question") == 1
    assert err.count("csr tau_mem=150: TTFT ") == 1
    report = json.loads((tmp_path / "e.json").read_text())
    matched = {r["method"]: r["matched"] for r in report["methods"]
               if "window_chunks" not in r["budget"]}
    assert matched["window"] == matched["bm25"] == "ttft of csr tau_mem=150"


@pytest.mark.slow
def test_a_short_evaluation_runs_every_method_on_llama_cpp_in_process(tmp_path, capsys):
    from csr_ros.cli import main

    assert main(_tiny_args(tmp_path, "--threads", "1", "--backend", "llamacpp")) == 0
    by = _check_report(tmp_path, 3)
    # forks of the llama.cpp engine keep CSR's history cached as the torch engine's do
    assert by["csr"]["recomputed_tokens_mean"] < by["csr"]["prompt_tokens_mean"] / 2
    assert by["bm25"]["recomputed_tokens_mean"] > by["csr"]["recomputed_tokens_mean"]
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["meta"]["backend"] == "llamacpp"
    assert report["meta"]["max_context_tokens"] <= 8192
    assert all(r["interleaved"] for r in report["methods"])


@pytest.mark.slow
@pytest.mark.server
def test_a_short_evaluation_runs_over_a_real_llama_cpp_server(tmp_path, llama_server, capsys):
    from csr_ros.cli import main

    assert main(_tiny_args(tmp_path, "--resource", "openai", "--url", llama_server.url)) == 0
    by = _check_report(tmp_path, 3)
    assert by["csr"]["recomputed_tokens_mean"] < by["bm25"]["recomputed_tokens_mean"]
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["meta"]["resource"] == "openai"




def test_eval_progress_reaches_a_pipe_line_by_line_while_the_run_goes_on(tmp_path):
    """`csr-ros eval ... 2>&1 | cat`: stdout and stderr are pipes. The server the run asks holds
    every request, so the run cannot end before the test has read its first progress line."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    release, answered = threading.Event(), threading.Event()

    class Held(BaseHTTPRequestHandler):
        def do_GET(self):
            release.wait(120.0)         # a run whose lines wait for its end gets there after
            answered.set()
            self.send_error(503)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Held)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cmd = [sys.executable, "-m", "csr_ros.cli", "eval", str(tmp_path / "patrol"), "--format",
           "patrol", "--duration-s", "180", "--n-questions", "3", "--methods", "none",
           "--resource", "openai", "--url", f"http://127.0.0.1:{server.server_address[1]}"]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = [run.stdout.readline()]
        while lines[-1] and not lines[-1].startswith("patrol: "):
            lines.append(run.stdout.readline())
        assert not answered.is_set() and run.poll() is None, "".join(lines)  # still waiting
        assert lines[-1].startswith("patrol: 1 episode(s), 65 observations, 3 questions")
    finally:
        release.set()
        run.kill()
        run.communicate()
        server.shutdown()
        server.server_close()

# -- (a) a bag and a questions file ---------------------------------------------------------------

BAG_PARAMS = """
aggregator:
  ros__parameters:
    sources: [speech, seen, goal]
    source:
      speech: {topic: /speech, type: std_msgs/msg/String}
      seen: {topic: /seen, type: std_msgs/msg/String}
      goal: {topic: /goal, type: std_msgs/msg/String, instant: true}
"""


@pytest.fixture(scope="module")
def speech_bag(tmp_path_factory):
    """40 s of a robot: an object seen every 2 s in a changing room, two utterances, a goal."""
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_JAZZY)
    string = store.types["std_msgs/msg/String"]
    root = tmp_path_factory.mktemp("evalbag")
    path = root / "run1"
    s = 1_000_000_000
    with Writer(path, version=8) as writer:
        speech = writer.add_connection("/speech", "std_msgs/msg/String", typestore=store)
        seen = writer.add_connection("/seen", "std_msgs/msg/String", typestore=store)
        goal = writer.add_connection("/goal", "std_msgs/msg/String", typestore=store)
        rooms = ["kitchen", "office", "garage", "hallway"]
        for i in range(20):
            text = f"red_mug in {rooms[(i // 5) % 4]}" if i % 5 == 0 else f"plant in {rooms[i % 4]}"
            writer.write(seen, 50 * s + 2 * i * s,
                         store.serialize_cdr(string(data=text), "std_msgs/msg/String"))
        for t, text in ((3, "Alice: please bring me the keys"), (25, "Bob: where is my phone?")):
            writer.write(speech, 50 * s + t * s,
                         store.serialize_cdr(string(data=text), "std_msgs/msg/String"))
        writer.write(goal, 50 * s + 30 * s,
                     store.serialize_cdr(string(data="patrol"), "std_msgs/msg/String"))
    (root / "params.yaml").write_text(BAG_PARAMS)
    (root / "q.jsonl").write_text(
        '{"t_s": 12, "question": "What did Alice ask for?", "answer": "keys", '
        '"choices": ["keys", "phone", "cup"], "kind": "asked_for"}\n'
        '{"t_s": 31, "question": "Where was the red mug last seen?", "answer": "garage", '
        '"choices": ["kitchen", "office", "garage", "hallway"], "kind": "last_seen"}\n'
        '{"t_s": 38, "question": "Who asked about a phone?", "answer": "Bob"}\n')
    return root


def test_a_bag_renders_with_the_aggregators_sources_and_times_from_its_first_message(speech_bag):
    from csr_ros.bench.eval.episode import bag_episode

    questions = load_questions(speech_bag / "q.jsonl")
    episode = bag_episode([speech_bag / "run1"], questions, params=speech_bag / "params.yaml")
    history = [o for o in episode.observations if not o.instant]
    assert len(history) == 22
    assert history[0].t_s == 0.0 and "red_mug in kitchen" in history[0].text
    alice = next(o for o in history if "Alice" in o.text)
    assert alice.t_s == 3.0 and alice.source == "speech"
    (goal,) = [o for o in episode.observations if o.instant]
    assert goal.t_s == 30.0
    items = list(episode.timeline())
    first_q = next(i for i, item in enumerate(items) if isinstance(item, Question))
    assert all(item.t_s <= 12.0 for item in items[:first_q])


def test_questions_asked_long_after_the_bag_ends_are_rejected(speech_bag):
    from csr_ros.bench.eval.episode import bag_episode

    late = [Question(t_s=500.0, question="q", answer="a")]
    with pytest.raises(ConfigError, match="after the bag ends"):
        bag_episode([speech_bag / "run1"], late, params=speech_bag / "params.yaml")


@pytest.mark.slow
def test_a_bag_evaluation_asks_each_question_at_its_time(speech_bag, tmp_path):
    from csr_ros.cli import main

    out = tmp_path / "bag.json"
    assert main(["eval", str(speech_bag / "run1"), "--questions", str(speech_bag / "q.jsonl"),
                 "--params", str(speech_bag / "params.yaml"), "--methods", "csr,window",
                 "--window-tokens", "48", "--max-context", "1024", "--tau-mem", "512",
                 "--threads", "1", "--max-new-tokens", "4", "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    by = {r["label"]: r for r in report["methods"]}
    assert by["window window_tokens=48"]["budget"] == {"window_tokens": 48}
    assert by["window window_chunks=1"]["budget"] == {"window_chunks": 1}
    csr = [q for q in report["questions"] if q["method"] == "csr"]
    window = [q for q in report["questions"] if q["label"] == "window window_tokens=48"]
    assert [q["t_s"] for q in csr] == [12.0, 31.0, 38.0]
    # CSR's cached history grows with time; the window's stays within its budget
    assert csr[0]["history_tokens"] < csr[1]["history_tokens"] < csr[2]["history_tokens"]
    assert all(q["history_tokens"] <= 48 for q in window)
    # questions at different times: the window slid, so it recomputed its history
    assert all(w["recomputed_tokens"] > c["recomputed_tokens"] for w, c in zip(window[1:], csr[1:]))


# -- (c) the synthetic patrol -------------------------------------------------------------------

EVENTS = [
    {"kind": "utterance", "t_s": 10.0, "speaker": "alice", "request": "please bring me the keys"},
    {"kind": "detection", "t_s": 20.0, "object": "keys", "room": "bedroom"},
    {"kind": "action", "t_s": 30.0, "name": "pick", "target": "keys", "result": "succeeded"},
    {"kind": "room_visit", "t_s": 31.0, "room": "kitchen"},
    {"kind": "detection", "t_s": 70.0, "object": "keys", "room": "kitchen"},
    {"kind": "utterance", "t_s": 200.0, "speaker": "alice", "request": "where did I leave my phone?"},
    {"kind": "action", "t_s": 250.0, "name": "open", "target": "door", "result": "failed"},
]


def test_patrol_questions_are_answered_by_the_events_before_them():
    from csr_ros.bench.eval.patrol_questions import patrol_questions

    questions = patrol_questions(EVENTS, 400.0, n_questions=40, seed=3)
    assert len(questions) == 40
    for q in questions:
        assert q.answer in q.choices and q.t_s >= 60.0
        if q.kind == "last_seen":
            assert q.answer == ("bedroom" if q.t_s < 71.0 else "kitchen")
        elif q.kind == "asked_for":
            assert q.answer == ("please bring me the keys" if q.t_s < 201.0
                                else "where did I leave my phone?")
        elif q.kind == "last_result":
            assert q.answer == ("pick(keys): succeeded" if q.t_s < 251.0
                                else "open(door): failed")
        else:
            age_s = q.t_s - (10.0 if q.t_s < 201.0 else 200.0)
            assert q.answer == ("under 1 minute" if age_s < 60 else "1 to 3 minutes"
                                if age_s < 180 else "3 to 6 minutes" if age_s < 360
                                else "over 6 minutes")
    assert {q.kind for q in questions} == {"last_seen", "asked_for", "last_result",
                                           "how_long_ago"}
    assert questions == patrol_questions(EVENTS, 400.0, n_questions=40, seed=3)


def test_a_patrol_directory_becomes_an_episode_whose_chunks_hold_each_answer(tmp_path):
    from csr_ros.bench.eval.patrol_questions import patrol_episode

    episode = patrol_episode(tmp_path / "patrol", duration_s=150.0, n_questions=16, seed=1)
    assert (tmp_path / "patrol" / "ground_truth.json").is_file()
    assert len(episode.questions) == 16 and episode.clock
    texts = [(o.t_s, o.text) for o in episode.observations if not o.instant]
    assert texts[0][1].startswith("0s ")
    for q in episode.questions:
        before = " ".join(text for t, text in texts if t <= q.t_s)
        if q.kind == "last_seen":
            assert q.question.split("the ", 1)[1].removesuffix(" last seen?") in before
        elif q.kind == "asked_for":
            assert q.answer in before
        elif q.kind == "last_result":
            assert q.answer in before
    with pytest.raises(ConfigError, match="holds no ground_truth.json"):
        (tmp_path / "empty").mkdir()
        patrol_episode(tmp_path / "empty")


def test_a_patrol_written_in_ama_format_reads_back_as_multiple_choice_episodes(tmp_path):
    from csr_ros.bench.eval.patrol_questions import write_patrol_ama

    out = tmp_path / "patrol_ama.jsonl"
    assert write_patrol_ama([tmp_path / "p0", tmp_path / "p1"], out, duration_s=120.0,
                            n_questions=5, seed=4) == 2
    episodes = ama_episodes(out)
    assert [e.name for e in episodes] == ["patrol-4-120s", "patrol-5-120s"]
    for e in episodes:
        assert e.observations[0].text.startswith("Step 0:\nAction: ")
        assert 1 <= len(e.questions) <= 5
        assert len({q.question for q in e.questions}) == len(e.questions)
        for q in e.questions:
            assert q.answer in q.choices and "(A)" not in q.question
            assert q.t_s == len(e.observations)
        for q in ama_episodes(out, mcq="label")[0].questions:
            assert q.choices[0] == "(A)" and q.answer in q.choices


def test_percentile_is_numpys_default_on_any_samples():
    import numpy as np
    from hypothesis import given, strategies as st

    @given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=50),
           st.sampled_from([0, 1, 50, 90, 99, 100]))
    def check(values, q):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-9)
    check()
