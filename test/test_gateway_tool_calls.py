"""OpenAI tools, tool_choice and response_format as grammars, on their own: what each request
becomes, checked string by string against the real grammar engine (llguidance, with the
default model's tokenizer), and what is refused."""

from __future__ import annotations

import json

import pytest

from csr_ros.actions import OutputConstraint
from csr_ros.errors import GatewayRequestError
from csr_ros.gateway.json_grammar import any_object_gbnf, schema_gbnf
from csr_ros.gateway.tool_calls import parse_tools, plan_decoding


def function(name: str, parameters: dict | None = None, description: str = "") -> dict:
    spec = {"name": name, "description": description}
    if parameters is not None:
        spec["parameters"] = parameters
    return {"type": "function", "function": spec}


def params(required: list[str] | None = None, **properties) -> dict:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required}


# What langchain-core's convert_to_openai_tool writes for `def go_to(room: Literal[...])`,
# `def say(text: str)` and `def turn(degrees: int, speed: float = 0.5, fast: bool = False)`.
GO_TO = function("go_to", params(room={"enum": ["kitchen", "office", "living room"],
                                       "type": "string"}), "Drive the robot to a room.")
SAY = function("say", params(text={"type": "string"}),
               "Say a sentence aloud.\n\n    Args:\n        text: what to say")
TURN = function("turn", params(["degrees"], degrees={"type": "integer"},
                               speed={"default": 0.5, "type": "number"},
                               fast={"default": False, "type": "boolean"}), "Turn in place.")
TOOLS = [GO_TO, SAY, TURN]


@pytest.fixture(scope="module")
def accepts():
    """accepts(grammar, text): the grammar engine takes `text` whole and may stop there."""
    from csr_ros.engine.grammar import GrammarCompiler
    from csr_ros.model_store import resolve_model_dir
    from csr_ros.tokenizer import HFTokenizer

    model_dir = resolve_model_dir(weights=False)
    tokenizer = HFTokenizer(model_dir)
    compiler = GrammarCompiler(model_dir / "tokenizer.json", vocab_size=tokenizer.vocab_size,
                               eos_ids=tokenizer.eos_token_ids)

    def check(grammar: str, text: str) -> bool:
        matcher = compiler.compile(OutputConstraint("grammar", grammar)).matcher
        for token in tokenizer.encode_data(text):
            if not matcher.consume_token(token):
                return False
        return matcher.is_accepting()
    return check


def test_functions_become_actions_whose_arguments_are_their_parameters_in_order():
    tools = parse_tools(TOOLS)
    actions = tools.vocabulary.actions
    assert [a.signature for a in actions] == ["go_to(room)", "say(text)",
                                              "turn(degrees, speed, fast)"]
    assert [arg.kind for arg in actions[2].args] == ["int", "float", "bool"]
    assert actions[0].args[0].values == ("kitchen", "office", "living room")
    profile = tools.profile_text()
    assert "- go_to(room): Drive the robot to a room. (room one of kitchen, office" in profile
    assert "- say(text): Say a sentence aloud. (text a quoted text)" in profile
    assert "Args:" not in profile, "the description's first paragraph only"


def test_required_decodes_only_calls_of_the_tools(accepts):
    decoding = plan_decoding(parse_tools(TOOLS), "required", None)
    grammar = decoding.constraint.grammar
    assert decoding.mode == "call" and decoding.constraint.kind == "grammar"
    for text in ("go_to(kitchen)", 'go_to("living room")', 'say("on my way")',
                 "turn(-90, 0.5, true)"):
        assert accepts(grammar, text), text
    for text in ("go_to(garage)", "say(hi)", "turn(90)", "hello", 'say("")'):
        assert not accepts(grammar, text), text


def test_a_named_function_decodes_only_that_function():
    decoding = plan_decoding(parse_tools(TOOLS), {"type": "function",
                                                  "function": {"name": "go_to"}}, None)
    assert decoding.mode == "call" and [a.name for a in decoding.vocabulary.actions] == ["go_to"]
    # a closed vocabulary this small is scored as a choice where the backend can
    assert decoding.constraint.choices == ("go_to(kitchen)", "go_to(office)",
                                           'go_to("living room")')


def test_auto_takes_a_call_or_any_text_that_does_not_begin_like_one(accepts):
    decoding = plan_decoding(parse_tools(TOOLS), "auto", None)
    grammar = decoding.constraint.grammar
    assert decoding.mode == "auto"
    for text in ("go_to(office)", 'say("hi")', "I am on my way.", "go", "go to the kitchen",
                 "say hello", "turning now", "sayonara", "ok\nthen", "Über 😀"):
        assert accepts(grammar, text), text
    for text in ("go_to(", "go_to(garage)", "say(hi)", "turn(", " leading space", "",
                 "go_to(kitchen) and more"):
        assert not accepts(grammar, text), text
    assert decoding.is_call("go_to(office)") and not decoding.is_call("go to")


def test_a_parameters_bounds_become_the_calls_range_and_length(accepts):
    turn = function("turn", params(degrees={"type": "integer", "minimum": -180, "maximum": 180},
                                   speed={"type": "number", "minimum": 0, "maximum": 1.5}))
    say = function("say", params(text={"type": "string", "maxLength": 5}))
    tools = parse_tools([turn, say])
    degrees, speed = tools.vocabulary.actions[0].args
    assert (degrees.low, degrees.high) == (-180, 180) and speed.kind == "float"
    grammar = plan_decoding(tools, "required", None).constraint.grammar
    for text in ("turn(-180, 0.0)", "turn(180, 1.5)", "turn(7, 1.25)", 'say("hello")'):
        assert accepts(grammar, text), text
    for text in ("turn(181, 1.0)", "turn(99999, 1.0)", "turn(-181, 0.5)", "turn(0, 1.6)",
                 "turn(0, -0.5)", 'say("hello!")'):
        assert not accepts(grammar, text), text


def test_none_and_no_tools_decode_text_and_tool_choice_without_tools_is_refused():
    assert plan_decoding(parse_tools(TOOLS), "none", None).constraint is None
    assert plan_decoding(None, None, None).mode == "text"
    with pytest.raises(GatewayRequestError, match="tool_choice 'required' needs 'tools'"):
        plan_decoding(None, "required", None)


def test_a_json_schema_response_format_decodes_only_its_values(accepts):
    schema = {"type": "object", "properties": {
        "room": {"enum": ["kitchen", "office"]}, "steps": {"type": "integer"},
        "ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 8},
        "path": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 2},
        "next": {"$ref": "#/$defs/Stop"}},
        "$defs": {"Stop": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
            "room": {"type": "string"}, "then": {"$ref": "#/$defs/Stop"}}}]}}}
    decoding = plan_decoding(None, None, {"type": "json_schema",
                                          "json_schema": {"name": "plan", "schema": schema}})
    grammar = decoding.constraint.grammar
    good = {"room": "office", "steps": -3, "ok": True, "note": None, "path": [1.5, -2e3],
            "next": {"room": "hall", "then": None}}
    as_sent = json.dumps(good, separators=(", ", ": "))
    assert accepts(grammar, as_sent)
    assert accepts(grammar, as_sent.replace('"note": null', '"note": "\\u00e9 \\"x\\""'))
    for bad in (as_sent.replace('"office"', '"garage"'),
                as_sent.replace('"note": null', '"note": "too long a note"'),
                as_sent.replace("[1.5, -2000.0]", "[]"), as_sent.replace('-3', '"3"'),
                as_sent.replace(', "ok": true', ""), as_sent[:-1]):
        assert not accepts(grammar, bad), bad


def test_a_json_object_response_format_decodes_any_object_and_only_objects(accepts):
    rules, root = any_object_gbnf()
    grammar = f"root ::= {root}\n{rules}"
    assert accepts(grammar, '{"a": [1, {"b": null}, "x"], "c": -0.5e2}') and \
        accepts(grammar, "{}")
    assert not accepts(grammar, "[1]") and not accepts(grammar, '"x"')
    decoding = plan_decoding(parse_tools(TOOLS), "auto", {"type": "json_object"})
    assert accepts(decoding.constraint.grammar, '{"a": 1}')
    assert accepts(decoding.constraint.grammar, "go_to(kitchen)")
    assert not accepts(decoding.constraint.grammar, "plain text")


def test_a_past_call_reads_as_the_grammar_writes_one():
    tools = parse_tools(TOOLS)
    assert tools.call_line("go_to", '{"room": "kitchen"}') == "go_to(kitchen)"
    assert tools.call_line("go_to", '{"room": "living room"}') == 'go_to("living room")'
    assert tools.call_line("turn", {"degrees": 5, "speed": 1.0, "fast": False}) == \
        "turn(5, 1.0, false)"
    # not a call of these tools: its name and its arguments as they came
    assert tools.call_line("fly", '{"to": "moon"}') == 'fly({"to":"moon"})'
    assert tools.call_line("go_to", '{"room": "garage"}') == 'go_to({"room":"garage"})'


@pytest.mark.parametrize("tools,match", [
    ("go_to", "'tools' must be a list"),
    ([{"type": "code_interpreter"}], r"tools\[0\] must be .*only function tools"),
    ([function("go-to", params())], "must be an identifier"),
    ([GO_TO, GO_TO], "action names must be unique"),
    ([function("f", params(x={"type": "array", "items": {"type": "string"}}))],
     r"properties.x uses \['items'\]"),
    ([function("f", params(x={"type": "string", "pattern": "^a"}))], r"uses \['pattern'\]"),
    ([function("f", params(x={"type": "object"}))], "has type 'object'"),
    ([function("f", params(x={"enum": [1, 2]}))], "non-empty list of non-empty strings"),
    ([function("f", params(x={"enum": ["a,b"]}))], "comma"),
    ([function("f", {"type": "object", "properties": {}, "anyOf": []})], r"uses \['anyOf'\]"),
    ([function("f", params(x={"type": "integer", "exclusiveMinimum": 0}))],
     r"uses \['exclusiveMinimum'\]"),
    ([function("f", params(x={"type": "integer", "minimum": 0}))],
     "both minimum and maximum, or neither"),
    ([function("f", params(x={"type": "integer", "minimum": 5, "maximum": 1}))],
     "above the maximum"),
])
def test_tools_that_cannot_be_honoured_are_refused_with_the_reason(tools, match):
    with pytest.raises(GatewayRequestError, match=match):
        parse_tools(tools)


@pytest.mark.parametrize("tool_choice,response_format,match", [
    ("sometimes", None, "tool_choice must be"),
    ({"type": "function", "function": {"name": "fly"}}, None, "'fly', which is not in"),
    (None, {"type": "json_schema", "json_schema": {"schema": {"type": "string",
                                                              "format": "date"}}},
     r"^response_format.json_schema.schema uses \['format'\]"),
    (None, {"type": "json_schema", "json_schema": {"schema": {"oneOf": []}}},
     r"uses \['oneOf'\]"),
    (None, {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/X"}}},
     "does not define"),
    (None, {"type": "grammar"}, "type 'grammar' is not supported"),
    (None, {"type": "json_schema"}, "needs {json_schema: {name, schema"),
])
def test_choices_and_formats_that_cannot_be_honoured_are_refused(tool_choice, response_format,
                                                                  match):
    with pytest.raises(GatewayRequestError, match=match):
        plan_decoding(parse_tools(TOOLS), tool_choice, response_format)


def test_a_schema_grammar_names_every_rule_apart_from_the_action_grammar():
    rules, root = schema_gbnf({"type": "object", "properties": {"a": {"type": "string"}}})
    names = {line.split(" ::= ")[0] for line in rules.splitlines() if line}
    assert root in names and all(n.startswith("json-") for n in names)
