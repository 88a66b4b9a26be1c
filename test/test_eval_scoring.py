"""Scoring open answers as AMA-Bench does: normalized exact match, token F1, an LLM judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csr_ros.bench.eval.judge import Judge, judge_messages, last_yes_no, read_verdict
from csr_ros.bench.eval.scoring import answer_tokens, exact_match, normalize_answer, token_f1

AMA_EPISODE = Path(__file__).parent / "data" / "ama_single_episode.json"


# -- exact match and F1 -------------------------------------------------------------------------

def test_normalization_drops_case_punctuation_and_articles_and_keeps_option_labels():
    assert normalize_answer("At step 76: The towel 1 is at loc_8.") == \
        "at step 76 towel 1 is at loc 8"
    assert answer_tokens("(A) a mug, (B) an apple") == ["(a)", "mug", "(b)", "apple"]
    assert normalize_answer("Line one\n  line two") == "line one line two"
    assert exact_match("(A)", "(a)") and not exact_match("(A)", "(B)")
    assert exact_match("Soapbar 1 is at loc 16!", "soapbar 1 is at  loc 16")
    assert not exact_match("", "") and not exact_match("the", "a")


def test_token_f1_counts_shared_tokens_with_their_multiplicity():
    # prediction: soapbar 1 at loc 16 (5 tokens); reference: at step 77 soapbar 1 is at loc 16
    # (9 tokens); shared: soapbar, 1, at (once), loc, 16 = 5: precision 1, recall 5/9
    assert token_f1("soapbar 1 at loc 16", "At step 77: soapbar 1 is at loc 16.") == \
        pytest.approx(2 * (5 / 9) / (1 + 5 / 9))
    assert token_f1("The kitchen.", "kitchen") == 1.0
    assert token_f1("garage", "kitchen") == 0.0
    assert token_f1("", "kitchen") == 0.0
    assert token_f1("the", "a") == 1.0          # both empty once the articles are gone
    assert token_f1("look look look", "look") == pytest.approx(0.5)   # P 1/3, R 1


# -- the judge's protocol -----------------------------------------------------------------------

def test_the_last_yes_or_no_of_a_reply_is_the_verdict():
    assert last_yes_no("yes") is True
    assert last_yes_no("No.") is False
    assert last_yes_no("No, wait: the location matches the reference, so yes") is True
    assert last_yes_no("Yes, it names the room. But the step is wrong: no") is False
    assert last_yes_no("<think>yes, it looks right</think>\nNo") is False
    assert last_yes_no("<think>no</think>") is None
    assert last_yes_no("Yesterday nobody knew") is None   # whole words only
    assert last_yes_no("") is None


def test_a_reply_with_neither_yes_nor_no_scores_the_token_f1_instead():
    verdict = read_verdict("I cannot tell.", prediction="soapbar 1 at loc 16",
                           reference="soapbar 1 is at loc 16")
    assert not verdict.parsed
    assert verdict.score == pytest.approx(token_f1("soapbar 1 at loc 16", "soapbar 1 is at loc 16"))
    assert 0.0 < verdict.score < 1.0
    assert read_verdict("yes", prediction="x", reference="y").score == 1.0
    assert read_verdict("no", prediction="x", reference="x").score == 0.0


def test_the_judge_prompt_holds_question_reference_prediction_and_the_task():
    system, user = judge_messages("Where is soapbar 1 at step 9?", "garbagecan 1",
                                  "on the sink", context={"Task type": "pick_two",
                                                          "Task": "Put soap away.", "x": ""})
    assert "evaluator" in system
    assert "Question: Where is soapbar 1 at step 9?" in user
    assert "Reference answer: garbagecan 1" in user
    assert "Predicted answer: on the sink" in user
    assert "Task type: pick_two" in user and "Task: Put soap away." in user
    assert "x:" not in user                                 # empty context is left out
    assert user.rstrip().endswith('Reply with "yes" or "no" only, with no explanation.')


class _Recorder:
    """Replies from a fixed list and records the calls (the one stand-in here: it checks
    the cache and the order of calls, which a real model cannot be made to show)."""

    name = "recorder"

    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    def complete(self, system, user):
        self.calls.append(user)
        return self.replies.pop(0)


def test_the_judge_asks_once_per_question_reference_and_prediction():
    judge = Judge(_Recorder(["no", "yes"]))
    assert judge("q", "kitchen", "garage").score == 0.0
    assert judge("q", "kitchen", "garage").score == 0.0      # cached: no second call
    assert judge("q", "kitchen", "the kitchen").score == 1.0
    assert judge.n_calls == 2 and len(judge.client.calls) == 2


# -- a real judge: llama.cpp's server, and the local engine ----------------------------------

@pytest.mark.server
def test_a_judge_on_a_real_server_returns_a_verdict_read_from_its_own_reply(llama_server):
    from csr_ros.bench.eval.judge_clients import OpenAIJudgeClient

    client = OpenAIJudgeClient(llama_server.url, max_tokens=8)
    judge = Judge(client)
    try:
        assert client.model == "smollm2" and judge.name == f"smollm2 at {llama_server.url}"
        verdict = judge("Where was the red mug last seen?", "in the kitchen", "kitchen")
        assert verdict.reply == client.complete(*judge_messages(
            "Where was the red mug last seen?", "in the kitchen", "kitchen"))   # greedy
        assert verdict == read_verdict(verdict.reply, prediction="kitchen",
                                       reference="in the kitchen")
    finally:
        judge.close()


@pytest.mark.slow
def test_a_local_judge_keeps_its_system_message_cached_and_replies_greedily():
    from csr_ros.bench.eval.judge_clients import LocalJudgeClient

    client = LocalJudgeClient("smollm2", threads=1, max_tokens=6)
    try:
        system, user = judge_messages("Which room?", "kitchen", "the kitchen")
        first = client.complete(system, user)
        cached = client.resource.committed_ids
        assert client.complete(system, user) == first
        assert client.resource.committed_ids == cached          # the question left no trace
        other = client.complete(*judge_messages("Which room?", "kitchen", "garage"))
        assert isinstance(other, str) and client.resource.committed_ids == cached
        assert client.name == "smollm2 (local engine)"
    finally:
        client.close()


def _ama_args(tmp_path, *extra):
    return ["eval", str(AMA_EPISODE), "--methods", "csr,none", "--max-questions", "3",
            "--tau-mem", "600", "--reserve-tokens", "96", "--max-context", "2048",
            "--max-new-tokens", "12", "--threads", "1", "--quiet",
            "--json", str(tmp_path / "e.json"), "--markdown", str(tmp_path / "e.md"), *extra]


def _refused(capsys, argv) -> str:
    from csr_ros.cli import main

    assert main(argv) == 2
    return capsys.readouterr().err


def test_the_judge_is_never_the_evaluated_model_unless_asked(tmp_path, capsys):
    assert "is the model being evaluated" in _refused(
        capsys, _ama_args(tmp_path, "--judge-model", "smollm2"))
    assert "is the server being evaluated" in _refused(
        capsys, ["eval", str(AMA_EPISODE), "--resource", "openai", "--url",
                 "http://127.0.0.1:9/v1", "--judge-url", "http://127.0.0.1:9"])
    assert "not both" in _refused(
        capsys, _ama_args(tmp_path, "--judge-model", "x", "--judge-url", "http://127.0.0.1:9"))
    assert "name it with" in _refused(capsys, _ama_args(tmp_path, "--judge-self"))
    assert not (tmp_path / "e.json").exists()                   # refused before any run


@pytest.mark.slow
@pytest.mark.server
def test_an_ama_episode_is_scored_by_exact_match_f1_and_a_judge_on_a_real_server(
        tmp_path, llama_server, capsys):
    from csr_ros.cli import main

    assert "serves 'smollm2', the model being evaluated" in _refused(
        capsys, _ama_args(tmp_path, "--judge-url", llama_server.url))
    assert main(_ama_args(tmp_path, "--judge-url", llama_server.url, "--judge-self")) == 0
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["meta"]["judge"] == f"smollm2 at {llama_server.url}"
    for row in report["methods"]:
        assert row["n_open"] == 3 and 0.0 <= row["f1"] <= 1.0
        assert row["judge"] is not None and row["judge_ci95"][0] <= row["judge"]
        assert set(row["accuracy_by_kind"]) == {"A", "B"}
        assert "evidence_coverage" in row
    for q in report["questions"]:
        assert q["f1"] == pytest.approx(token_f1(q["prediction"], q["answer"]))
        assert q["judge"] == read_verdict(q["judge_reply"], prediction=q["prediction"],
                                          reference=q["answer"]).score
    table = (tmp_path / "e.md").read_text()
    assert "| F1 | judge | evidence coverage |" in table


@pytest.mark.slow
def test_without_a_judge_the_report_leaves_the_judge_empty_and_says_so(tmp_path, capsys):
    from csr_ros.cli import main

    assert main(_ama_args(tmp_path, "--max-questions", "2")) == 0
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["meta"]["judge"] is None
    assert all(row["judge"] is None and row["f1"] is not None for row in report["methods"])
    assert all(q["judge"] is None for q in report["questions"])
    assert "No judge ran" in capsys.readouterr().out


@pytest.mark.slow
def test_a_local_judge_named_by_judge_model_scores_the_open_answers_after_the_run(tmp_path):
    from csr_ros.cli import main

    argv = _ama_args(tmp_path, "--judge-model", "smollm2", "--judge-self",
                     "--judge-max-tokens", "4")
    argv[argv.index("csr,none")] = "none"
    assert main(argv) == 0
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["meta"]["judge"] == "smollm2 (local engine)"
    (row,) = report["methods"]
    assert row["judge"] is not None and row["n_open"] == 3
    for q in report["questions"]:
        assert q["judge"] == read_verdict(q["judge_reply"], prediction=q["prediction"],
                                          reference=q["answer"]).score
    assert "Open answers judged by smollm2 (local engine)" in (tmp_path / "e.md").read_text()
