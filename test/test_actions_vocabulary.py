"""The action vocabulary (pure): specs, binding seen values, grammar, choices, parsing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csr_ros.actions import SeenValues, Vocabulary
from csr_ros.errors import ActionParseError, ActionSpecError

SPECS = ["wait()", "go_to(room: kitchen|hallway|living room)", "pick(object: $objects)",
         "say(text: str)", "turn(degrees: int, fast: bool)", "scale(factor: float)"]


@pytest.fixture
def vocab() -> Vocabulary:
    return Vocabulary.parse(SPECS).bind({"objects": ["red_mug", "apple"]})


@pytest.mark.parametrize("text,name,args", [
    ("wait()", "wait", {}),
    ("go_to(kitchen)", "go_to", {"room": "kitchen"}),
    ('go_to("living room")', "go_to", {"room": "living room"}),
    ("  pick(apple)\n", "pick", {"object": "apple"}),
    ('say("on my way, Alice")', "say", {"text": "on my way, Alice"}),
    ("turn(-90, true)", "turn", {"degrees": -90, "fast": True}),
    ("scale(0.25)", "scale", {"factor": 0.25}),
    ('{"name": "go_to", "args": {"room": "hallway"}}', "go_to", {"room": "hallway"}),
    ('{"name": "turn", "args": {"degrees": 5, "fast": false}}', "turn",
     {"degrees": 5, "fast": False}),
])
def test_a_decision_parses_into_its_typed_action(vocab, text, name, args):
    action = vocab.parse_decision(text)
    assert (action.name, action.arguments) == (name, args)
    assert json.loads(action.arguments_json) == args
    assert vocab.parse_decision(action.call()) == vocab.parse_decision(action.call())


@pytest.mark.parametrize("text,match", [
    ("", "empty"),
    ("go to the kitchen", "not a call"),
    ("fly()", "unknown action 'fly'"),
    ("go_to(garage)", "'garage', not one of"),
    ("pick(book)", "'book', not one of"),
    ("say(hello)", "must be a quoted text"),
    ('say("")', "is empty"),
    ('say("' + "x" * 40 + '")', "more than 32"),
    ("turn(90)", "takes 2 argument"),
    ("turn(ninety, true)", "must be an integer"),
    ("turn(1, yes)", "true or false"),
    ('{"name": "go_to"', "looks like JSON"),
    ('{"name": "go_to", "args": {"where": "kitchen"}}', "missing"),
    ('{"name": "turn", "args": {"degrees": true, "fast": true}}', "must be int"),
])
def test_a_decision_that_names_no_action_is_refused_with_the_reason(vocab, text, match):
    with pytest.raises(ActionParseError, match=match):
        vocab.parse_decision(text)
    decision = vocab.decide(text, constrained=False)
    assert not decision.valid and decision.error


def test_an_answer_cut_by_the_token_budget_is_reported_incomplete(vocab):
    free = vocab.decide("wait()", constrained=False, finish_reason="length", max_new_tokens=3)
    assert not free.valid
    assert free.error.startswith("incomplete: the budget of 3 tokens")
    cut = vocab.decide('say("on my', constrained=True, finish_reason="length", max_new_tokens=3)
    assert not cut.valid and cut.error.startswith("incomplete")
    # Under a grammar nothing can follow a whole action: only the end token lacked room.
    assert vocab.decide("wait()", constrained=True, finish_reason="length").valid


@pytest.mark.parametrize("spec,match", [
    ("go_to", "not `name"),
    ("go_to(room)", "not `name: type`"),
    ("go_to(room: kitchen||hall)", "empty value"),
    ("go_to(room: a|a)", "repeats a value"),
    ("go_to(room: a, room: b)", "argument names repeat"),
    ('say(text: "x|y)', "quote"),
    ("go_to(room: $1x)", "not `\\$name`"),
])
def test_a_malformed_spec_is_refused_with_the_reason(spec, match):
    with pytest.raises(ActionSpecError, match=match):
        Vocabulary.parse([spec])


def test_repeated_action_names_and_an_empty_vocabulary_are_refused():
    with pytest.raises(ActionSpecError, match="unique"):
        Vocabulary.parse(["wait()", "wait()"])
    with pytest.raises(ActionSpecError, match="at least one action"):
        Vocabulary.parse([])


def test_binding_fills_seen_values_and_leaves_out_an_action_with_none():
    vocab = Vocabulary.parse(["wait()", "pick(object: $objects)"])
    assert vocab.sources == ("objects",)
    assert not vocab.is_closed
    with pytest.raises(ActionSpecError, match="bind"):
        vocab.gbnf()
    empty = vocab.bind({})
    assert [a.name for a in empty.actions] == ["wait"] and empty.dropped == ("pick",)
    bound = vocab.bind({"objects": ["apple", "apple", "keys"]})
    assert bound.choices() == ("wait()", "pick(apple)", "pick(keys)")
    assert "one of the objects seen" in vocab.describe()


def test_a_closed_vocabulary_is_scored_as_choices_and_an_open_one_decoded_by_grammar(vocab):
    closed = Vocabulary.parse(["wait()", "go_to(room: a|b)", "dock(fast: bool)"])
    constraint = closed.constraint()
    assert constraint.kind == "choice"
    assert constraint.choices == ("wait()", "go_to(a)", "go_to(b)", "dock(true)",
                                  "dock(false)")
    assert all(closed.parse_decision(c) for c in constraint.choices)
    assert vocab.constraint().kind == "grammar" and not vocab.constraint().choices
    with pytest.raises(ActionSpecError, match="cannot be listed"):
        vocab.choices()
    with pytest.raises(ActionSpecError, match="more than 2"):
        closed.choices(limit=2)
    assert closed.constraint(max_choices=2).kind == "grammar"


def test_the_json_schema_round_trips_into_the_same_vocabulary(vocab):
    again = Vocabulary.from_json_schema(json.dumps(vocab.json_schema()))
    assert again.gbnf() == vocab.gbnf()
    assert again.parse_decision('{"name": "pick", "args": {"object": "apple"}}').name == "pick"
    with pytest.raises(ActionSpecError, match="type 'array'"):
        Vocabulary.from_json_schema({"anyOf": [{"properties": {
            "name": {"const": "x"}, "args": {"properties": {"a": {"type": "array"}}}}}]})


def test_parameters_give_specs_or_a_schema():
    by_specs = Vocabulary.from_params("wait(); go_to(room: a|b)")
    by_schema = Vocabulary.from_params([], schema=json.dumps(by_specs.json_schema()))
    assert by_schema.gbnf() == by_specs.gbnf()


def test_seen_values_keep_the_most_recent_and_skip_quotes():
    seen = SeenValues.from_params([r'objects=([\w"]+) at \('], max_values=2)
    seen.observe("room kitchen; apple at (1, 2); keys at (0, 0)")
    seen.observe('book at (3, 3); bad"name at (1, 1)')
    assert seen.values() == {"objects": ("book", "keys")}
    with pytest.raises(ActionSpecError, match="needs a group"):
        SeenValues({"objects": "x"})
    with pytest.raises(ActionSpecError, match="name=regex"):
        SeenValues.from_params(["objects"])


_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc"),
                                       blacklist_characters='"\\'), min_size=1, max_size=32)


@settings(max_examples=200, deadline=None)
@given(room=_word, text=_text, degrees=st.integers(-10**8, 10**8), fast=st.booleans())
def test_every_rendered_action_parses_back_to_itself(room, text, degrees, fast):
    vocab = Vocabulary.parse([f"go_to(room: {room}|elsewhere)", "say(text: str)",
                              "turn(degrees: int, fast: bool)"])
    for name, args in (("go_to", (("room", room),)), ("say", (("text", text),)),
                       ("turn", (("degrees", degrees), ("fast", fast)))):
        from csr_ros.actions import Action

        call = Action(name, args, "").call()
        assert vocab.parse_decision(call).args == args


@settings(max_examples=200, deadline=None)
@given(room=_word, text=_text, degrees=st.integers(-10**8, 10**8), fast=st.booleans())
def test_a_decision_written_as_the_grammar_writes_it_parses_back_and_bare_where_it_can(
        room, text, degrees, fast):
    vocab = Vocabulary.parse([f"go_to(room: {room}|elsewhere)", "say(text: str)",
                              "turn(degrees: int, fast: bool)", "wait()"])
    for name, args in (("go_to", (("room", room),)), ("say", (("text", text),)),
                       ("turn", (("degrees", degrees), ("fast", fast))), ("wait", ())):
        from csr_ros.actions import Action

        written = vocab.call_text(Action(name, args, ""))
        assert vocab.parse_decision(written).args == args
    assert vocab.call_text(vocab.parse_decision('go_to("elsewhere")')) == "go_to(elsewhere)"
