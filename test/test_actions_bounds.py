"""Bounded action arguments (pure): `int[min,max]`, `float[min,max]`, `str[..max]`.

The grammar is checked with llguidance (what the local engines and vLLM's `guidance` backend
compile it with) on the real SmolLM2 tokenizer: the strings it accepts are exactly the
numbers of the range in the spec's precision, and decide() refuses what it would not admit.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from csr_ros.actions import Vocabulary
from csr_ros.errors import ActionParseError, ActionSpecError
from csr_ros.range_grammar import canonical_number, range_gbnf

llg = pytest.importorskip("llguidance")

ROBOT = ["wait()", "turn(degrees: int[-180,180], fast: bool)", "drive(speed_mps: float[0,0.5])",
         "say(text: str[..80])", "label(tag: str[4..6])"]


@pytest.fixture(scope="module")
def lltok():
    from csr_ros.model_store import resolve_model_dir

    return llg.LLTokenizer(str(resolve_model_dir(weights=False) / "tokenizer.json"))


class Grammar:
    """A GBNF compiled once with llguidance; `accepts(text)` runs a fresh matcher over the
    text's tokens, as a decoder would feed them."""

    def __init__(self, lltok, gbnf: str):
        self.tok = lltok
        self.grammar = llg.grammar_from("gbnf", gbnf)
        assert not self.matcher().is_error(), self.matcher().get_error()

    def matcher(self):
        return llg.LLMatcher(self.tok, self.grammar, log_level=0)

    def accepts(self, text: str) -> bool:
        matcher = self.matcher()
        tokens = self.tok.tokenize_str(text)
        if matcher.validate_tokens(tokens) != len(tokens):
            return False
        matcher.consume_tokens(tokens)
        return matcher.is_accepting()


def _admitted(text: str, low: Decimal, high: Decimal, decimals: int) -> bool:
    """What the range grammar must admit: a canonical number (no leading zero, no negative
    zero, at most `decimals` decimals) whose value lies in [low, high]."""
    if not canonical_number(decimals).fullmatch(text) or re.fullmatch(r"-0(\.0*)?", text):
        return False
    return low <= Decimal(text) <= high


# -- the spec syntax -----------------------------------------------------------------------------

def test_bounded_arguments_parse_describe_themselves_and_give_an_example_in_range():
    vocab = Vocabulary.parse(ROBOT)
    turn, drive, say, label = (vocab.actions[i].args[0] for i in (1, 2, 3, 4))
    assert (turn.kind, turn.low, turn.high, turn.decimals) == ("int", -180, 180, 0)
    assert (drive.kind, drive.low, drive.high, drive.decimals) == ("float", 0, Decimal("0.5"), 3)
    assert (say.min_chars, say.max_chars, label.min_chars, label.max_chars) == (1, 80, 4, 6)
    described = vocab.describe()
    assert "degrees an integer from -180 to 180" in described
    assert "speed_mps a number from 0 to 0.5" in described
    assert "text a quoted text of at most 80 characters" in described
    assert "tag a quoted text of 4 to 6 characters" in described
    assert vocab.decide(vocab.example(), constrained=False).valid
    spaced = Vocabulary.parse(["turn(degrees: int[ -180 , 180 ], fast: bool)"])
    assert spaced.actions[0].args == vocab.actions[1].args
    # trailing zeros add no precision; more decimals in a bound do
    assert Vocabulary.parse(["d(x: float[0,0.50])"]).actions[0].args[0].decimals == 3
    assert Vocabulary.parse(["d(x: float[0,0.00125])"]).actions[0].args[0].decimals == 5


@pytest.mark.parametrize("spec,match", [
    ("turn(degrees: int[180,-180])", "minimum 180 is above the maximum -180"),
    ("turn(degrees: int[0,1.5])", "not an integer"),
    ("turn(degrees: int[0.0,1])", "not an integer"),
    ("turn(degrees: int[0])", r"not int\[min,max\]"),
    ("turn(degrees: int[0,])", r"not int\[min,max\]"),
    ("turn(degrees: int[])", r"not int\[min,max\]"),
    ("turn(degrees: int[0,1,2])", r"not int\[min,max\]"),
    ("turn(degrees: int[0,1e3])", "plain decimal"),
    ("turn(degrees: int[0,0x10])", "plain decimal"),
    ("turn(degrees: int[-1000000000,0])", "within ±999999999"),
    ("drive(speed: float[1,0.5])", "minimum 1 is above the maximum 0.5"),
    ("drive(speed: float[0,1000000])", "6 integer digits"),
    ("drive(speed: float[0,0.0000001])", "at most 6 decimals"),
    ("drive(speed: float[zero,1])", "plain decimal"),
    ("say(text: str[..0])", "at least 1 character"),
    ("say(text: str[0..5])", "at least 1 character"),
    ("say(text: str[9..5])", "minimum length 9 is above the maximum 5"),
    ("say(text: str[80])", r"not str\[\.\.max\]"),
    ("say(text: str[..x])", r"not str\[\.\.max\]"),
    ("dock(fast: bool[0,1])", "not a bounded type"),
    ("go(room: a|b[0,1])", "not a bounded type"),
    ("turn(degrees: int[-180,180)", "not a bounded type"),
])
def test_a_bad_bound_is_refused_with_the_reason(spec, match):
    with pytest.raises(ActionSpecError, match=match):
        Vocabulary.parse([spec])


# -- decide(): the second gate ---------------------------------------------------------------------

@pytest.mark.parametrize("text,error", [
    ("turn(99999, true)", "turn: degrees 99999 outside [-180, 180]"),
    ("turn(-181, false)", "turn: degrees -181 outside [-180, 180]"),
    ("drive(0.501)", "drive: speed_mps 0.501 outside [0, 0.5]"),
    ("drive(-0.001)", "drive: speed_mps -0.001 outside [0, 0.5]"),
    ("drive(0.0001)", "at most 3 decimals"),
    ('say("' + "x" * 81 + '")', "has 81 characters, more than 80"),
    ('label("abc")', "has 3 characters, fewer than 4"),
    ('label("abcdefg")', "has 7 characters, more than 6"),
    ('{"name": "turn", "args": {"degrees": 720, "fast": true}}',
     "turn: degrees 720 outside [-180, 180]"),
    ('{"name": "drive", "args": {"speed_mps": 3.5}}', "drive: speed_mps 3.5 outside [0, 0.5]"),
    ('{"name": "drive", "args": {"speed_mps": NaN}}', "finite"),
    ('{"name": "drive", "args": {"speed_mps": Infinity}}', "finite"),
    ('{"name": "say", "args": {"text": "' + "y" * 81 + '"}}', "more than 80"),
])
def test_an_answer_out_of_range_is_invalid_with_a_clear_error_never_an_action(text, error):
    vocab = Vocabulary.parse(ROBOT)
    for constrained in (False, True):
        decision = vocab.decide(text, constrained=constrained)
        assert decision.action is None and not decision.valid
        assert error in decision.error
    with pytest.raises(ActionParseError, match=re.escape(error)):
        vocab.parse_decision(text)


@pytest.mark.parametrize("text,args", [
    ("turn(-180, true)", {"degrees": -180, "fast": True}),
    ("turn(180, false)", {"degrees": 180, "fast": False}),
    ("drive(0.5)", {"speed_mps": 0.5}),
    ("drive(0.500)", {"speed_mps": 0.5}),
    ("drive(0)", {"speed_mps": 0.0}),
    ('say("' + "x" * 80 + '")', {"text": "x" * 80}),
    ('label("abcd")', {"tag": "abcd"}),
    ('{"name": "drive", "args": {"speed_mps": 0.1}}', {"speed_mps": 0.1}),
    ('{"name": "turn", "args": {"degrees": -180, "fast": false}}',
     {"degrees": -180, "fast": False}),
])
def test_an_answer_at_the_ends_of_its_range_is_an_action(text, args):
    assert Vocabulary.parse(ROBOT).decide(text, constrained=False).action.arguments == args


def test_unbounded_numbers_in_the_json_form_are_held_to_what_the_grammar_writes():
    vocab = Vocabulary.parse(["turn(degrees: int)", "scale(factor: float)"])
    assert vocab.decide('{"name": "turn", "args": {"degrees": 999999999}}',
                        constrained=False).valid
    too_long = vocab.decide('{"name": "turn", "args": {"degrees": 10000000000}}',
                            constrained=False)
    assert not too_long.valid and "more than 9 integer digits" in too_long.error
    assert "finite" in vocab.decide('{"name": "scale", "args": {"factor": -Infinity}}',
                                    constrained=False).error


# -- the JSON schema ---------------------------------------------------------------------------------

def test_the_json_schema_carries_the_bounds_and_round_trips():
    vocab = Vocabulary.parse(ROBOT)
    schema = vocab.json_schema()
    args = {b["properties"]["name"]["const"]: b["properties"]["args"]["properties"]
            for b in schema["anyOf"]}
    assert args["turn"]["degrees"] == {"type": "integer", "minimum": -180, "maximum": 180}
    assert args["drive"]["speed_mps"] == {"type": "number", "minimum": 0, "maximum": 0.5}
    assert args["say"]["text"] == {"type": "string", "minLength": 1, "maxLength": 80}
    assert args["label"]["tag"] == {"type": "string", "minLength": 4, "maxLength": 6}
    again = Vocabulary.from_json_schema(json.dumps(schema))
    assert again == vocab and again.gbnf() == vocab.gbnf()
    # an unbounded text keeps the vocabulary's length, and reads back unbounded
    plain = Vocabulary.parse(["say(text: str)"], max_str_chars=20)
    assert Vocabulary.from_json_schema(plain.json_schema(), max_str_chars=20) == plain


def _schema_arg(arg: dict) -> dict:
    return {"anyOf": [{"properties": {"name": {"const": "x"},
                                      "args": {"properties": {"a": arg}}}}]}


@pytest.mark.parametrize("arg,match", [
    ({"type": "integer", "minimum": 0}, "both minimum and maximum"),
    ({"type": "number", "maximum": 1}, "both minimum and maximum"),
    ({"type": "integer", "minimum": 0, "maximum": 1.5}, "must be integers"),
    ({"type": "number", "minimum": 2, "maximum": 1}, "minimum 2 is above the maximum 1"),
    ({"type": "number", "minimum": 0, "exclusiveMaximum": 1}, "exclusiveMaximum cannot be"),
    ({"type": "integer", "minimum": 0, "maximum": 10, "multipleOf": 2}, "multipleOf"),
    ({"type": "string", "maxLength": 0}, "at least 1 character, got a maximum of 0"),
    ({"type": "string", "minLength": 5, "maxLength": 3}, "minimum length 5 is above the"),
    ({"type": "string", "pattern": "^[a-z]+$"}, "pattern cannot be"),
])
def test_a_schema_bound_that_cannot_be_held_is_refused_never_dropped(arg, match):
    with pytest.raises(ActionSpecError, match=match):
        Vocabulary.from_json_schema(_schema_arg(arg))


def test_llguidance_decodes_the_json_form_only_in_range(lltok):
    """The JSON constraint as the local engines compile it (csr_ros.engine.grammar)."""
    vocab = Vocabulary.parse(ROBOT[:3])
    grammar = llg.LLMatcher.grammar_from_json_schema(
        vocab.json_schema(), overrides={"whitespace_flexible": False, "item_separator": ", ",
                                        "key_separator": ": "})
    checker = Grammar.__new__(Grammar)
    checker.tok, checker.grammar = lltok, grammar
    turn = '{{"name": "turn", "args": {{"degrees": {}, "fast": true}}}}'
    drive = '{{"name": "drive", "args": {{"speed_mps": {}}}}}'
    for value, inside in ((180, True), (-180, True), (0, True), (181, False), (720, False),
                          (-181, False), (99999, False)):
        assert checker.accepts(turn.format(value)) is inside, value
    for value, inside in (("0.5", True), ("0.25", True), ("0", True), ("0.51", False),
                          ("3", False), ("-0.1", False)):
        assert checker.accepts(drive.format(value)) is inside, value


# -- the range grammar: exactly the range, proved on llguidance ----------------------------------------

def test_the_text_grammar_admits_exactly_the_texts_of_its_length(lltok):
    vocab = Vocabulary.parse(ROBOT)
    grammar = Grammar(lltok, vocab.gbnf())
    for n, inside in ((0, False), (1, True), (80, True), (81, False)):
        assert grammar.accepts('say("' + "a" * n + '")') is inside, n
    for n, inside in ((3, False), (4, True), (6, True), (7, False)):
        assert grammar.accepts('label("' + "b" * n + '")') is inside, n


def _candidates(low: Decimal, high: Decimal, decimals: int) -> set[str]:
    """Numbers around both bounds and zero, written every way an answer might write them."""
    step = Decimal(1).scaleb(-decimals)
    out = {"0", "-0", "00", "-0.0", "0.", ".5", "+1", "1e2", "--1", "1.2.3", ""}
    for centre in (low, high, Decimal(0), (low + high) / 2):
        for k in (-11, -10, -2, -1, 0, 1, 2, 10, 11):
            value = (centre + k * step).quantize(step) if decimals else centre + k
            value = value.to_integral_value() if not decimals else value
            text = format(value, "f")
            out |= {text, text.rstrip("0").rstrip(".") if "." in text else text,
                    text + "0", "0" + text.lstrip("-"), text + "5"}
            if decimals and "." not in text:
                out.add(text + ".0")
    return {t for t in out if len(t) < 24}


_EXHAUSTIVE = [(Decimal(-180), Decimal(180), 0), (Decimal(-12), Decimal(-3), 0),
               (Decimal(7), Decimal(7), 0), (Decimal(0), Decimal("0.5"), 3),
               (Decimal("-1.25"), Decimal("12.5"), 3), (Decimal("-12.5"), Decimal("-0.25"), 3),
               (Decimal("0.001"), Decimal("0.002"), 3), (Decimal(-999999999), Decimal(999999999), 0)]


@pytest.mark.parametrize("low,high,decimals", _EXHAUSTIVE)
def test_the_range_grammar_admits_every_number_written_near_its_bounds_exactly_when_in_range(
        lltok, low, high, decimals):
    grammar = Grammar(lltok, "root ::= x\n" + "\n".join(range_gbnf("x", low, high, decimals)))
    texts = _candidates(low, high, decimals)
    if high - low <= 400 and not decimals:
        texts |= {str(v) for v in range(int(low) - 30, int(high) + 31)}
    wrong = [t for t in sorted(texts) if grammar.accepts(t) != _admitted(t, low, high, decimals)]
    assert not wrong, wrong[:10]


@st.composite
def ranges(draw):
    """(low, high, decimals) of a spec: integers, or floats with 0 to 3 decimals in the bounds
    (a float then has 3 decimals, as the spec gives it)."""
    kind = draw(st.sampled_from(["int", "float"]))
    places = 0 if kind == "int" else draw(st.integers(0, 3))
    magnitude = draw(st.sampled_from([10, 1000, 10**6 if kind == "float" else 10**9]))
    ends = sorted(draw(st.integers(-magnitude * 10**places + 1, magnitude * 10**places - 1))
                  for _ in range(2))
    low, high = (Decimal(e).scaleb(-places) for e in ends)
    return kind, low, high


def _spec(kind: str, low: Decimal, high: Decimal) -> Vocabulary:
    return Vocabulary.parse([f"set(v: {kind}[{format(low, 'f')},{format(high, 'f')}])"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=ranges(), data=st.data())
def test_every_number_the_grammar_decodes_parses_in_range(lltok, spec, data):
    """Walk the grammar as a sampler would: each next token drawn from those the mask allows,
    stopping where it may. Whatever comes out is an action, and its value is in range."""
    kind, low, high = spec
    vocab = _spec(kind, low, high)
    matcher = Grammar(lltok, vocab.gbnf()).matcher()
    eos = set(lltok.eos_tokens)
    ids: list[int] = []
    for _ in range(40):
        if matcher.is_stopped():
            break
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8),
                             bitorder="little")[:lltok.vocab_size]
        allowed = [int(i) for i in np.flatnonzero(bits) if int(i) not in eos]
        if not allowed:
            break
        token = data.draw(st.sampled_from(allowed))
        assert matcher.consume_token(token)
        ids.append(token)
    text = lltok.decode_str(ids)
    assert matcher.is_accepting(), text
    decision = vocab.decide(text, constrained=True)
    assert decision.valid, (text, decision.error)
    (value,) = decision.action.arguments.values()
    assert low <= Decimal(repr(value)) <= high


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=ranges(), data=st.data())
def test_every_value_in_range_in_the_specs_precision_is_admitted(lltok, spec, data):
    kind, low, high = spec
    vocab = _spec(kind, low, high)
    decimals = vocab.actions[0].args[0].decimals
    step = Decimal(1).scaleb(-decimals)
    scaled = data.draw(st.integers(int(low / step), int(high / step)))
    value = Decimal(scaled).scaleb(-decimals) if decimals else Decimal(scaled)
    text = format(value, "f")
    if decimals and data.draw(st.booleans()):          # 0.500 may be written 0.5, 0.50
        text = text.rstrip("0").rstrip(".") or "0"
    assume(text not in ("-0", ""))
    grammar = Grammar(lltok, vocab.gbnf())
    assert grammar.accepts(f"set({text})"), text
    assert vocab.decide(f"set({text})", constrained=True).valid


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=ranges(), text=st.one_of(
    st.from_regex(r"-?[0-9]{1,12}(\.[0-9]{1,5})?", fullmatch=True),
    st.text(alphabet="-.0123456789", min_size=1, max_size=10)))
def test_the_grammar_and_decide_agree_on_any_written_number(lltok, spec, text):
    """Anything the grammar admits decide() takes as in range; decide() is more lenient only in
    how a number is written (leading zeros, -0), never in its value."""
    kind, low, high = spec
    vocab = _spec(kind, low, high)
    decimals = vocab.actions[0].args[0].decimals
    accepted = Grammar(lltok, vocab.gbnf()).accepts(f"set({text})")
    assert accepted == _admitted(text, low, high, decimals)
    decision = vocab.decide(f"set({text})", constrained=False)
    if accepted:
        assert decision.valid, decision.error
    if decision.valid:
        assert low <= Decimal(text) <= high
