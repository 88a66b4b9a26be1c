"""Choice questions scored so that the answer depends on the memory: lettered, shuffled options,
label / pmi / mean scoring, the report's bias check, and the same letter from every resource
that shares a precision."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from csr_ros.errors import ConfigError, ModelNotFoundError
from csr_ros.bench.eval.episode import EvalEpisode, Question
from csr_ros.bench.eval.run import (LABEL_INSTRUCTION, TEXT_INSTRUCTION, Asking, QuestionRecord,
                                    task_text)
from csr_ros.bench.eval.scoring import option_labels, option_order
from support.choice_prompts import ROOMS, lettered_prompts, robot_state



# -- the options as shown -------------------------------------------------------------------------

def test_options_are_shuffled_by_a_seed_per_question_the_same_in_every_process():
    order = option_order(5, "patrol-0/q003", 0)
    assert sorted(order) == list(range(5))
    # sha256 of the seed and the question, not Python's salted hash(): the same in any process
    assert order == (4, 2, 1, 3, 0)
    assert option_order(5, "patrol-0/q003", 0) == order
    assert option_order(5, "patrol-0/q003", None) == (0, 1, 2, 3, 4)
    keys = [f"q{i:03d}" for i in range(20)]
    assert len({option_order(4, k, 0) for k in keys}) > 5            # it varies by question
    assert [option_order(4, k, 0) for k in keys] != [option_order(4, k, 1) for k in keys]


def test_every_method_sees_a_question_s_options_in_one_order_that_spreads_the_answers_over_the_letters():
    from csr_ros.bench.eval.patrol_questions import patrol_questions

    events = [{"kind": "detection", "t_s": 10.0 + 30 * i, "object": obj, "room": room}
              for i, (obj, room) in enumerate(zip(["red_mug", "keys", "plant", "apple"] * 3,
                                                  ["kitchen", "office", "hallway",
                                                   "bedroom", "living room"] * 3))]
    events += [{"kind": "utterance", "t_s": 40.0, "speaker": "bob", "request": "bring the keys"},
               {"kind": "utterance", "t_s": 70.0, "speaker": "ann", "request": "open the door"},
               {"kind": "action", "t_s": 80.0, "name": "go_to", "target": "office",
                "result": "succeeded"},
               {"kind": "action", "t_s": 90.0, "name": "pick", "target": "keys",
                "result": "failed"}]
    questions = patrol_questions(events, 400.0, n_questions=40, seed=2)
    episode = EvalEpisode("patrol", [], questions)
    shuffled, given = Asking(shuffle_seed=0), Asking(shuffle_seed=None)
    letters = Counter()
    for q in questions:
        shown = shuffled.shown(episode, q)
        assert sorted(shown) == sorted(q.choices)
        assert shown == Asking(("pmi", "mean"), shuffle_seed=0).shown(episode, q)
        letters[option_labels(len(shown))[shown.index(q.answer)]] += 1
    # how_long_ago lists its four buckets in one fixed order: shown as given, its right answer
    # sits where the ages fall; shuffled, no letter holds the answer of most questions
    assert max(letters.values()) <= 0.45 * len(questions)
    ages = [q for q in questions if q.kind == "how_long_ago"]
    assert all(given.shown(episode, q) == q.choices for q in ages)


def test_the_options_are_lettered_in_the_dynamic_part_and_leave_csrs_cached_prefix_unchanged(
        tokenizer):
    question = Question(t_s=30.0, question="Where was the red mug last seen?", answer="office",
                        choices=ROOMS)
    state = robot_state(tokenizer, {"red_mug": "office"})
    asked = {}
    for scoring, shown in (("label", ROOMS), ("label", ROOMS[::-1]), ("pmi", ROOMS)):
        request = state.build_request(task=task_text(question, scoring, shown), suffix="now: 30s")
        asked[(scoring, shown)] = request
        text = tokenizer.decode(request.dynamic_ids)
        assert "\n".join(f"{label}. {room}" for label, room in zip("ABCD", shown)) in text
        assert (LABEL_INSTRUCTION if scoring == "label" else TEXT_INSTRUCTION) in text
    statics = {r.static_ids for r in asked.values()}
    assert statics == {tuple(state.static_ids)}
    assert len({r.dynamic_ids for r in asked.values()}) == 3


def test_unknown_or_repeated_scoring_rules_are_refused_before_a_run():
    from csr_ros.bench.eval.study import EvalSettings

    for rules in (("label", "label"), ("likelihood",), ()):
        with pytest.raises(ConfigError, match="--choice-scoring"):
            Asking(rules)
    with pytest.raises(ConfigError, match="--choice-scoring"):
        EvalSettings(input=(), choice_scoring=("label", "best"))
    with pytest.raises(ConfigError, match="--window-chunks"):
        EvalSettings(input=(), window_chunks=(0,))


# -- the report's bias check ----------------------------------------------------------------------

def _record(label: str, method: str, qid: str, answer: str, prediction: str,
            scoring: str = "label") -> QuestionRecord:
    shown = list(ROOMS)
    return QuestionRecord(
        method=method, label=label, budget={}, episode="e", qid=qid, kind="last_seen",
        t_s=float(qid[1:]), question="Where?", answer=answer, choices=list(ROOMS),
        prediction=prediction, correct=prediction == answer, contains=prediction == answer,
        ttft_s=0.1, decision_s=0.1, prompt_tokens=10, recomputed_tokens=5, history_tokens=0,
        history_chunks=0, scoring=scoring, shown_choices=shown,
        answer_label="ABCD"[shown.index(answer)],
        predicted_label="ABCD"[shown.index(prediction)])


def test_the_bias_check_gives_each_rows_most_frequent_answer_and_warns_where_a_method_answers_as_none():
    from csr_ros.bench.eval.report import bias_table, bias_warnings, summarize

    answers = ["kitchen", "office", "hallway", "living room"] * 5           # 20 questions
    none_said = ["living room"] * 20
    csr_said = list(answers[:18]) + ["living room", "living room"]         # reads the memory
    window_said = ["living room"] * 19 + ["kitchen"]                       # answers as none
    records = []
    for label, said in (("csr", csr_said), ("window", window_said), ("none", none_said)):
        records += [_record(label, label, f"q{i}", a, p)
                    for i, (a, p) in enumerate(zip(answers, said))]
    runs = [{"method": m, "label": m, "budget": {}, "scoring": "label"}
            for m in ("csr", "window", "none")]
    rows = {r["method"]: r for r in summarize(records, runs)}
    assert rows["none"]["top_answer"] == "living room"
    assert rows["none"]["top_answer_share"] == 1.0
    assert rows["none"]["top_answer_accuracy"] == 0.25 == rows["none"]["accuracy"]
    assert rows["none"]["top_label"] == "B" and rows["none"]["top_label_share"] == 1.0
    assert rows["none"]["same_as_none"] is None
    assert rows["csr"]["accuracy"] == 0.95 and rows["csr"]["same_as_none"] == pytest.approx(0.3)
    assert rows["window"]["same_as_none"] == 0.95
    warnings = bias_warnings(list(rows.values()))
    assert len(warnings) == 1 and warnings[0].startswith("window (label) answers as no memory")
    table = bias_table(list(rows.values()))
    assert "| window | - | label | 0.200 | living room | 0.95 | 0.25 | B 0.95 | 0.95 |" in table


def test_each_scoring_rule_is_compared_with_the_no_memory_answers_of_the_same_rule():
    from csr_ros.bench.eval.report import summarize

    records = [_record("csr", "csr", "q1", "office", "office", "label"),
               _record("csr", "csr", "q1", "office", "living room", "mean"),
               _record("none", "none", "q1", "office", "kitchen", "label"),
               _record("none", "none", "q1", "office", "living room", "mean")]
    runs = [{"method": m, "label": m, "budget": {}, "scoring": s}
            for m in ("csr", "none") for s in ("label", "mean")]
    rows = {(r["method"], r["scoring"]): r for r in summarize(records, runs)}
    assert rows[("csr", "label")]["same_as_none"] == 0.0
    assert rows[("csr", "mean")]["same_as_none"] == 1.0
    assert rows[("csr", "label")]["n_questions"] == 1


# -- scoring on the real SmolLM2 ------------------------------------------------------------------

def test_label_scoring_reads_the_letters_log_probabilities_after_one_pass_over_the_dynamic_part(
        resources, smollm2):
    from csr_ros.bench.eval.scoring import ask

    question = Question(t_s=30.0, question="Where was the red mug last seen?",
                        answer="office", choices=ROOMS)
    state = robot_state(resources.tokenizer, {"red_mug": "office"})
    request = state.build_request(task=task_text(question, "label"), suffix="now: 30s")
    resources.primary.load(request.static_ids)
    answer = ask(resources.primary, request, choices=ROOMS, scoring="label",
                 tokenizer=resources.tokenizer)
    assert smollm2.committed_ids == request.static_ids            # nothing left behind
    smollm2.load(list(request.ids))                                # cold, from scratch
    first = smollm2.last_logits.log_softmax(-1)
    letters = [resources.tokenizer.encode_data(letter) for letter in "ABCD"]
    assert all(len(ids) == 1 for ids in letters)
    expected = [float(first[ids[0]]) for ids in letters]
    assert answer.choice_scores == pytest.approx(expected, abs=2e-3)
    best = max(range(4), key=expected.__getitem__)
    assert (answer.label, answer.prediction) == ("ABCD"[best], ROOMS[best])


def test_pmi_subtracts_each_options_content_free_log_likelihood_computed_once_per_option(smollm2):
    from csr_ros.bench.eval.run import EvalResources, content_free_request
    from csr_ros.bench.eval.scoring import ContentFreePrior, ask, ask_choices

    resources = EvalResources.local(engine=smollm2)
    prior_resource = resources.content_free()
    try:
        prior = ContentFreePrior(prior_resource, content_free_request(resources),
                                 resources.tokenizer)
        question = Question(t_s=30.0, question="Where was the red mug last seen?",
                            answer="office", choices=ROOMS)
        state = robot_state(resources.tokenizer, {"red_mug": "office"})
        request = state.build_request(task=task_text(question, "pmi"), suffix="now: 30s")
        resources.primary.load(request.static_ids)
        answers = ask_choices(resources.primary, request, choices=ROOMS,
                              scorings=("pmi", "mean", "sum"), prior=prior,
                              tokenizer=resources.tokenizer)
        assert prior.n_scored == 4
        # the other option set shares three options: only "bedroom" is scored more
        ask(resources.primary, request, choices=ROOMS[1:] + ("bedroom",), scoring="pmi",
            prior=prior, tokenizer=resources.tokenizer)
        assert prior.n_scored == 5
        # the content-free log-likelihood, computed cold from the prompt alone
        free = content_free_request(resources)
        base = []
        for room in ROOMS:
            ids = resources.tokenizer.encode_data(room)
            total = 0.0
            for j, tok in enumerate(ids):
                smollm2.load(list(free.ids) + list(ids[:j]))
                total += float(smollm2.last_logits.log_softmax(-1)[tok])
            base.append(total)
        sums = answers["sum"].choice_scores
        assert answers["pmi"].choice_scores == pytest.approx(
            [s - b for s, b in zip(sums, base)], abs=5e-3)
        n_tokens = [len(resources.tokenizer.encode_data(room)) for room in ROOMS]
        assert answers["mean"].choice_scores == pytest.approx(
            [s / n for s, n in zip(sums, n_tokens)], abs=1e-6)
        # the rules that share the prompt share one pass: the same timings
        assert answers["pmi"].ttft_s == answers["mean"].ttft_s == answers["sum"].ttft_s
        with pytest.raises(ConfigError, match="prompts of their own"):
            ask_choices(resources.primary, request, choices=ROOMS, scorings=("label", "pmi"),
                        prior=prior, tokenizer=resources.tokenizer)
    finally:
        prior_resource.close()
        resources.close()


def test_the_one_chunk_window_holds_the_latest_chunk_only(resources):
    from csr_ros.bench.eval.episode import Observation
    from csr_ros.bench.eval.methods import WindowMethod

    method = WindowMethod(resources.primary, resources.tokenizer, resources.layout,
                          window_chunks=1)
    assert method.budget == {"window_chunks": 1}
    assert method.label == "window window_chunks=1"
    method.begin("profile")
    assert method.select("anything?") == []
    for i, text in enumerate(["odom: in the hallway", "camera: red_mug in the office",
                              "speech: bob said hello"]):
        method.observe(Observation(t_s=i, source="s", text=text, stamp_ns=i))
    assert [c.text for c in method.select("Where is the red mug?")] == [
        "speech: bob said hello\n"]
    with pytest.raises(ConfigError, match="give one of them"):
        WindowMethod(resources.primary, resources.tokenizer, resources.layout,
                     window_tokens=10, window_chunks=1)


# -- a model that reads its context: Qwen2.5-Coder-1.5B -------------------------------------------

QWEN_15B = "qwen2.5-coder-1.5b"


@pytest.fixture(scope="module")
def qwen15b():
    """The 1.5B model on the llama.cpp backend (opt-in: `csr-ros model prepare
    qwen2.5-coder-1.5b`; required under CSR_ROS_REQUIRE_QWEN=1). Neither SmolLM2-135M nor
    Qwen2.5-Coder-0.5B answers a lettered question from its context: each gives one letter
    whatever the history says (SmolLM2 "B", the 0.5B "A"), so neither can show it."""
    pytest.importorskip("llama_cpp")
    from csr_ros.bench.eval.run import EvalResources
    from csr_ros.model_store import resolve_gguf

    try:
        resolve_gguf(QWEN_15B)
    except ModelNotFoundError as error:
        if os.environ.get("CSR_ROS_REQUIRE_QWEN") == "1":
            raise
        pytest.skip(str(error))
    resources = EvalResources.local(QWEN_15B, max_context_tokens=1024, threads=2,
                                    backend="llamacpp")
    yield resources
    resources.close()


@pytest.mark.slow
def test_label_scoring_answers_from_the_history_where_mean_gives_one_answer_whatever_it_holds(
        qwen15b):
    """The issue's failure, on a model that reads its context: the same question after two
    histories. Label scoring gives each history's right room; mean scoring gives one room
    after both, whatever the history says."""
    from csr_ros.bench.eval.scoring import ask_choices

    question = Question(t_s=30.0, question="Where was the red mug last seen?", answer="",
                        choices=ROOMS)
    said = {}
    for room in ("living room", "office"):
        state = robot_state(qwen15b.tokenizer, {"red_mug": room})
        for scorings in (("label",), ("mean",)):
            request = state.build_request(task=task_text(question, scorings[0]),
                                          suffix="now: 30s")
            qwen15b.primary.load(request.static_ids)
            answer = ask_choices(qwen15b.primary, request, choices=ROOMS, scorings=scorings,
                                 tokenizer=qwen15b.tokenizer)[scorings[0]]
            said[(room, scorings[0])] = answer.prediction
    assert said[("living room", "label")] == "living room"
    assert said[("office", "label")] == "office"
    assert said[("living room", "mean")] == said[("office", "mean")]


# -- a run end to end -----------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_scored_by_three_rules_reports_a_row_for_each_and_says_how_the_options_were_shown(
        tmp_path, capsys):
    import json
    from pathlib import Path

    from csr_ros.cli import main
    from csr_ros.bench.eval.episode import ama_episodes

    ama = Path(__file__).parent / "data" / "ama_tiny.jsonl"
    assert main(["eval", str(ama), "--format", "ama", "--episodes", "1", "--max-questions", "3",
                 "--methods", "csr,none", "--tau-mem", "150", "--reserve-tokens", "96",
                 "--max-context", "1024", "--threads", "1", "--choice-scoring", "label,pmi,mean",
                 "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "e.json").read_text())
    rows = report["methods"]
    assert [(r["method"], r["scoring"]) for r in rows] == [
        (m, s) for m in ("csr", "none") for s in ("label", "pmi", "mean")]
    assert all(r["n_questions"] == 3 == r["n_choice"] for r in rows)
    assert report["meta"]["choice_scoring"] == ["label", "pmi", "mean"]
    assert "options shown lettered in an order shuffled per question, seed 0" in out
    assert "| most frequent answer |" in out
    # the order shown is the one the seed gives, the same for every method and rule
    episode = ama_episodes(ama)[0]
    questions = {q.question: q for q in episode.questions}
    for record in report["questions"]:
        question = questions[record["question"]]
        shown = Asking(shuffle_seed=0).shown(episode, question)
        assert record["shown_choices"] == list(shown)
        assert record["answer_label"] == "ABCD"[shown.index(question.answer)]
        assert record["predicted_label"] == "ABCD"[shown.index(record["prediction"])]
    # the report warns for exactly the rows that answer as no memory does
    warned = [r for r in rows if (r["same_as_none"] or 0) >= 0.9]
    assert len(report["meta"]["warnings"]) == len(warned) >= 1
    for warning in report["meta"]["warnings"]:
        assert f"**Warning:** {warning}" in out
        assert "answers as no memory does" in warning


# -- the same letter from every resource that shares a precision ----------------------------------

@pytest.mark.slow
@pytest.mark.server
def test_llama_cpp_in_process_and_its_server_give_the_same_letter_on_the_same_gguf(llama_server):
    """The SmolLM2 GGUF both ways: in process the letters are scored in one pass, the server
    answers one token constrained to the letters (it gives no usable log-probabilities)."""
    from csr_ros.bench.eval.run import EvalResources
    from csr_ros.bench.eval.scoring import ask, check_scoring
    from csr_ros.resources.openai import OpenAIOptions, OpenAIResource

    local = EvalResources.local("smollm2", backend="llamacpp", max_context_tokens=2048,
                                threads=1)
    try:
        with OpenAIResource(OpenAIOptions(llama_server.url)) as server:
            assert server.state_mode == "text"
            with pytest.raises(ConfigError, match="pmi scoring needs"):
                check_scoring(server, ("label", "pmi"))
            local_letters, server_letters = [], []
            for (ours, shown), (theirs, _) in zip(lettered_prompts(local.tokenizer, "token"),
                                                  lettered_prompts(server.tokenizer, "text")):
                assert local.tokenizer.encode_template(theirs.text) == list(ours.ids)
                local.primary.load(ours.static_ids)
                said = ask(local.primary, ours, choices=shown, scoring="label",
                           tokenizer=local.tokenizer)
                server.load(theirs.static_ids, theirs.static_text)
                answered = ask(server, theirs, choices=shown, scoring="label")
                local_letters.append(said.label)
                server_letters.append(answered.label)
                assert answered.prediction == shown["ABCD".index(answered.label)]
    finally:
        local.close()
    assert server_letters == local_letters
    assert len(set(local_letters)) > 1, "every prompt got one letter: the check tells nothing"
