"""Typed actions on the local engine: grammar-masked decoding and closed choices in one pass.

Real SmolLM2 weights and tokenizer, real llguidance masks.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llguidance")

from support.robot_prompts import assert_bounds_hold, decide_pushed  # noqa: E402

from csr_ros.actions import Vocabulary  # noqa: E402
from csr_ros.demo_episode import Episode  # noqa: E402
from csr_ros.layout import Layout  # noqa: E402
from csr_ros.state import CsrState  # noqa: E402

OPEN = ["wait()", "look_around()", "go_to(room: kitchen|living_room|hallway|office|garage)",
        "pick(object: $objects)", "say(text: str)", "turn(degrees: int, fast: bool)",
        "set_speed(m_per_s: float)"]
CLOSED = ["wait()", "look_around()", "go_to(room: kitchen|living_room|hallway|office|garage)",
          "pick(object: $objects)", "place()"]
TASKS = ["Which action next?", "Alice asks you to say hello. Which action next?",
         "Turn around quickly. Which action next?", "Slow down to a crawl. Which action next?",
         "Fetch the apple. Which action next?"]


@pytest.fixture(scope="module", params=["float32", "auto"])
def resource(request):
    """The torch engine in its exact reference precision, and in the precision it runs fastest
    on this CPU (bf16 with int4 decode weights where it computes bf16 natively, else float32
    again). backend="torch" is named: dtype="auto" alone may measure llama.cpp faster here, whose
    grammar and choice scoring test/test_engine_llamacpp.py covers."""
    from csr_ros.resources.local import LocalResource

    res = LocalResource("smollm2", threads=1, max_context_tokens=2048, dtype=request.param,
                        backend="torch")
    yield res
    res.close()


def _state(tokenizer, vocab: Vocabulary, n_chunks: int = 24, seed: int = 0) -> CsrState:
    profile = ("You are the decision policy of a home service robot.\n" + vocab.describe())
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                     profile=profile)
    for item in itertools.islice(Episode(seed).stream(), n_chunks):
        state.add(item.text, source=item.source)
    return state


def test_every_grammar_decoded_action_parses_and_stops_when_complete(resource):
    vocab = Vocabulary.parse(OPEN, max_str_chars=16)
    bound = vocab.bind({"objects": ["apple", "red_mug", "keys"]})
    constraint = bound.constraint("grammar")
    state = _state(resource.engine.tokenizer, vocab)
    resource.load(state.build_request(task="x").static_ids)
    names = set()
    for task in TASKS:
        request = state.build_request(task=task)
        result = resource.query(request, max_new_tokens=32, constraint=constraint)
        decision = bound.decide(result.text, constrained=result.constrained,
                                finish_reason=result.finish_reason)
        assert decision.valid, (task, result.text, decision.error)
        assert result.constrained and result.finish_reason == "stop"
        # It stopped on the action's last token: no end-of-turn token was decoded.
        assert not set(result.token_ids) & set(resource.engine.eos_ids)
        assert resource.engine.tokenizer.decode(result.token_ids) == result.text
        assert result.mask_s > 0
        names.add(decision.action.name)
    assert len(names) >= 2, f"every task gave the same action: {names}"


def test_tokens_the_grammar_forces_are_appended_without_sampling(resource):
    engine = resource.engine
    state = _state(engine.tokenizer, Vocabulary.parse(CLOSED), n_chunks=8)
    request = state.build_request(task=TASKS[4])
    resource.load(request.static_ids)
    compiler = resource._grammar_compiler()
    # One action: every token is forced, nothing is sampled, no forward pass after the prompt.
    only = compiler.compile(Vocabulary.parse(["look_around()"]).constraint("grammar"))
    generation = engine.query(list(request.dynamic_ids), 16, constraint=only)
    assert generation.text == "look_around()" and generation.finish_reason == "stop"
    assert only.n_masks == 0
    # A vocabulary: brackets and the rest of unambiguous names ride along with sampled tokens
    # (where the bytes could still be tokenized in more than one way, the model chooses).
    bound = Vocabulary.parse(OPEN, max_str_chars=16).bind({"objects": ["apple", "keys"]})
    n_sampled = n_tokens = 0
    for task in TASKS:
        constraint = compiler.compile(bound.constraint("grammar"))
        generation = engine.query(list(request.dynamic_ids) + engine.tokenizer.encode_data(task),
                                  32, constraint=constraint)
        assert bound.decide(generation.text, constrained=True,
                            finish_reason=generation.finish_reason).valid, generation.text
        assert 0 < constraint.n_masks <= len(generation.token_ids)
        n_sampled, n_tokens = n_sampled + constraint.n_masks, n_tokens + len(generation.token_ids)
    assert n_sampled < n_tokens
    assert engine.committed_ids == tuple(request.static_ids)


def test_a_json_schema_constraint_gives_json_decisions_that_parse(resource):
    vocab = Vocabulary.parse(OPEN[:4]).bind({"objects": ["apple"]})
    state = _state(resource.engine.tokenizer, vocab)
    request = state.build_request(task=TASKS[0])
    resource.load(request.static_ids)
    result = resource.query(request, max_new_tokens=48, constraint=vocab.constraint("json"))
    assert result.text.startswith("{"), result.text
    assert vocab.decide(result.text, constrained=True, finish_reason=result.finish_reason).valid


def test_an_answer_the_budget_cannot_hold_is_reported_incomplete(resource):
    vocab = Vocabulary.parse(["say(text: str)"], max_str_chars=32)
    state = _state(resource.engine.tokenizer, vocab, n_chunks=4)
    request = state.build_request(task="Say a long sentence.")
    resource.load(request.static_ids)
    result = resource.query(request, max_new_tokens=2, constraint=vocab.constraint())
    decision = vocab.decide(result.text, constrained=True, finish_reason=result.finish_reason,
                            max_new_tokens=2)
    assert result.finish_reason == "length"
    assert not decision.valid and decision.error.startswith("incomplete")


def test_a_constrained_query_leaves_the_committed_state_and_its_logits_unchanged(resource):
    vocab = Vocabulary.parse(OPEN).bind({"objects": ["apple"]})
    state = _state(resource.engine.tokenizer, vocab, n_chunks=8)
    request = state.build_request(task=TASKS[0])
    resource.load(request.static_ids)
    before = resource.engine.snapshot().materialize()
    plain = resource.query(request, max_new_tokens=6)
    resource.query(request, max_new_tokens=16, constraint=vocab.constraint())
    resource.query(request, max_new_tokens=16,
                   constraint=Vocabulary.parse(CLOSED).bind({"objects": ["apple"]}).constraint())
    after = resource.engine.snapshot().materialize()
    assert torch.equal(before.last_logits, after.last_logits)
    assert before.token_ids == after.token_ids
    assert resource.query(request, max_new_tokens=6).token_ids == plain.token_ids


def test_closed_choices_are_scored_in_one_pass_exactly_as_one_by_one(resource):
    vocab = Vocabulary.parse(CLOSED)
    bound = vocab.bind({"objects": ["apple", "red_mug", "keys"]})
    constraint = bound.constraint("choice")
    assert bound.constraint().kind == "grammar"     # 11 choices: auto decodes them instead
    state = _state(resource.engine.tokenizer, vocab)
    request = state.build_request(task=TASKS[4])
    resource.load(request.static_ids)
    result = resource.query(request, max_new_tokens=8, constraint=constraint)
    assert result.constrained and result.decode_s == 0.0
    assert result.text in constraint.choices
    assert bound.decide(result.text, constrained=True).valid
    scores = result.choice_logprobs
    assert result.text == constraint.choices[max(range(len(scores)), key=scores.__getitem__)]

    engine, tok = resource.engine, resource.engine.tokenizer
    for option, score in zip(constraint.choices, scores):
        total = _one_by_one(engine, request.dynamic_ids, tok.encode_data(option))
        assert total == pytest.approx(score, **_tolerance(engine)), option


def _one_by_one(engine, dynamic_ids, ids: list[int]) -> float:
    """Sum of the tokens' log-probabilities, extending the state one token at a time."""
    with engine.scratch():
        engine.extend(list(dynamic_ids))
        total = 0.0
        for i, token in enumerate(ids):
            total += float(engine.last_logits.log_softmax(-1)[token])
            if i + 1 < len(ids):
                engine.extend([token])
    return total


def _tolerance(engine) -> dict:
    """Exact up to float32 summation order; in reduced precision one-by-one steps run the int4
    decode weights and the one pass the bf16 ones, so the sums agree only to a few percent."""
    if engine.precision == "torch.float32":
        return {"abs": 2e-3}
    return {"rel": 0.05, "abs": 0.1}


def test_options_where_one_is_a_prefix_of_another_are_scored_with_the_end_token(resource):
    engine = resource.engine
    tok = engine.tokenizer
    state = _state(tok, Vocabulary.parse(["wait()"]), n_chunks=4)
    request = state.build_request(task="Say yes or yes please.")
    resource.load(request.static_ids)
    options = ["yes", "yes please"]
    scores = resource.score_choices(request, options)
    end = resource._end_id([tok.encode_data(o) for o in options])
    assert end is not None
    for option, score in zip(options, scores.logprobs):
        total = _one_by_one(engine, request.dynamic_ids, tok.encode_data(option) + [end])
        assert total == pytest.approx(score, **_tolerance(engine)), option


def test_the_actions_benchmark_prints_and_writes_every_mode(tmp_path, capsys):
    import json

    from csr_ros.cli import main

    out = tmp_path / "a.json"
    assert main(["actions", "--chunks", "4", "--reps", "1", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert set(summary["modes"]) == {"choice", "grammar", "free"}
    for mode in ("choice", "grammar"):
        m = summary["modes"][mode]
        assert m["valid"] == m["n"] == 1 and 0 < m["p50_s"] <= m["max_s"]
    assert summary["modes"]["grammar"]["mask_ms_per_token"] > 0
    assert summary["modes"]["choice"]["mask_ms_per_token"] is None
    assert "grammar  latency p50" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["grammar", "json"])
def test_a_model_pushed_out_of_range_decodes_only_in_range_under_the_bounds(resource, kind):
    """Asked to turn 720 degrees and to drive at 3 m/s, the model answers turn(720) and
    drive(3) without the bounds (refused by decide()), and in range under them."""
    assert_bounds_hold(decide_pushed(resource, resource.engine.tokenizer, kind=kind))
