"""Typed robot actions: the vocabulary, its grammar, and parsing a decision into an action.

    vocab = Vocabulary.parse(["wait()", "go_to(room: kitchen|hallway|office)",
                              "pick(object: $objects)", "say(text: str)"])
    bound = vocab.bind({"objects": seen.values("objects")})   # fill `$name` enumerations
    constraint = bound.constraint()      # what a backend needs to decode only valid actions
    action = bound.parse_decision("go_to(kitchen)")   # name 'go_to', args (('room', 'kitchen'),)

The syntax of a spec and of a decision, the bounds and what they refuse, and how one grammar
serves every backend: docs/library.md, "Typed actions a robot can execute".

Pure: no I/O, no torch.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Iterable, Mapping, Sequence

from csr_ros.errors import ActionParseError, ActionSpecError
from csr_ros.range_grammar import range_gbnf

CONSTRAINT_KINDS = ("auto", "grammar", "choice", "json")
DEFAULT_MAX_STR_CHARS = 32
DEFAULT_MAX_CHOICES = 256
# `auto` scores a closed list in one pass only when it is this short. Every option's tokens go
# through that pass (the demo's 23 actions: a 73-token trie), while grammar decoding runs one
# forward per free choice and appends the forced tokens (brackets, names) without sampling:
# with 23 options, decision p50/p99 161/319 ms scoring against 103/223 ms decoding
# (`csr-ros demo --cycles 3 --actions choice|auto`); with up to about 8 the two cost the same.
AUTO_MAX_CHOICES = 8
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BARE = re.compile(r"[A-Za-z0-9_.\-]+")
_SPEC = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*", re.S)
# Numbers as an answer may write them: the integer part's digits bound the magnitude (an int
# fits a controller's int32), the decimals the precision of a float.
INT_DIGITS = 9
FLOAT_INT_DIGITS = 6
FLOAT_DECIMALS = 3                         # an unbounded float; a bounded one at least as many
MAX_FLOAT_DECIMALS = 6
_INT = re.compile(rf"-?[0-9]{{1,{INT_DIGITS}}}")
_BOUNDED = re.compile(r"(int|float|str)\s*\[(.*)\]", re.S)
_BOUND_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_STR_BOUNDS = re.compile(r"\s*([0-9]+)?\s*\.\.\s*([0-9]+)\s*")
_STR_FORBIDDEN = re.compile(r'["\\\x00-\x1f]')


@dataclass(frozen=True)
class Arg:
    name: str
    kind: str                              # enum, str, int, float or bool
    values: tuple[str, ...] = ()           # enum: the allowed values
    source: str | None = None              # enum: `$source` values come from bind()
    low: Decimal | None = None             # int, float: the inclusive range, both or neither
    high: Decimal | None = None
    min_chars: int | None = None           # str: the length range, both or neither (None: 1
    max_chars: int | None = None           # to the vocabulary's max_str_chars)

    def __post_init__(self):
        assert (self.low is None) == (self.high is None), "a range needs both ends"
        assert (self.min_chars is None) == (self.max_chars is None), "a length needs both ends"
        assert self.low is None or self.kind in ("int", "float"), f"a range on a {self.kind}"
        assert self.max_chars is None or self.kind == "str", f"a length on a {self.kind}"

    @property
    def bound(self) -> bool:
        return self.kind != "enum" or self.source is None or bool(self.values)

    @property
    def decimals(self) -> int:
        """A float's most fraction digits: 3, or what its bounds need (0 for an int)."""
        if self.kind != "float":
            return 0
        return max([FLOAT_DECIMALS] + [_decimals(b) for b in (self.low, self.high)
                                       if b is not None])

    def range_text(self) -> str:
        return f"[{self.low}, {self.high}]"

    def describe(self) -> str:
        if self.kind == "enum":
            if self.source is not None and not self.values:
                return f"{self.name} one of the {self.source} seen"
            return f"{self.name} one of {', '.join(self.values)}"
        if self.low is not None:
            what = "an integer" if self.kind == "int" else "a number"
            return f"{self.name} {what} from {self.low} to {self.high}"
        if self.max_chars is not None:
            if self.min_chars == 1:
                return f"{self.name} a quoted text of at most {self.max_chars} characters"
            return (f"{self.name} a quoted text of {self.min_chars} to {self.max_chars} "
                    "characters")
        return {"str": f"{self.name} a quoted text", "int": f"{self.name} an integer",
                "float": f"{self.name} a number", "bool": f"{self.name} true or false"}[self.kind]


@dataclass(frozen=True)
class ActionSpec:
    name: str
    args: tuple[Arg, ...] = ()

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(a.name for a in self.args)})"


@dataclass(frozen=True)
class Action:
    """A parsed decision: the action's name and its arguments in declaration order."""

    name: str
    args: tuple[tuple[str, object], ...]
    text: str                              # the decision as written, stripped

    @property
    def arguments(self) -> dict[str, object]:
        return dict(self.args)

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False, separators=(",", ":"))

    def call(self) -> str:
        """The call form with every text quoted, e.g. `go_to("kitchen")` (it parses back)."""
        return f"{self.name}({', '.join(_render_value(v) for _, v in self.args)})"


@dataclass(frozen=True)
class OutputConstraint:
    """What a backend needs to produce only valid decisions (plain data, picklable).

    `grammar` (GBNF) is always set; `choices` lists every decision of a closed vocabulary;
    `json_schema` describes the JSON form. `kind` says which one the caller wants used.
    """

    kind: str                              # "grammar" | "choice" | "json"
    grammar: str
    choices: tuple[str, ...] = ()
    json_schema: dict | None = None

    def __post_init__(self):
        assert self.kind in ("grammar", "choice", "json"), f"unknown constraint kind {self.kind}"
        assert self.kind != "choice" or self.choices, "a choice constraint needs choices"


@dataclass(frozen=True)
class ChoiceScores:
    """Closed-choice scoring: the log-probability of each whole option (then end of turn)."""

    options: tuple[str, ...]
    logprobs: tuple[float, ...]
    n_tokens: tuple[int, ...]              # tokens of each option, without the end token

    @property
    def best(self) -> int:
        return max(range(len(self.options)), key=self.logprobs.__getitem__)



@dataclass(frozen=True)
class Decision:
    """A decision as the policy reports it: the typed action, or why there is none."""

    text: str
    action: Action | None
    constrained: bool
    error: str = ""

    @property
    def valid(self) -> bool:
        return self.action is not None


@dataclass(frozen=True)
class Vocabulary:
    actions: tuple[ActionSpec, ...]
    max_str_chars: int = DEFAULT_MAX_STR_CHARS
    dropped: tuple[str, ...] = field(default=(), compare=False)   # left out by bind()

    def __post_init__(self):
        if not self.actions:
            raise ActionSpecError("an action vocabulary needs at least one action"
                                  + (f" (left out for empty enumerations: "
                                     f"{', '.join(self.dropped)})" if self.dropped else ""))
        names = [a.name for a in self.actions]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ActionSpecError(f"action names must be unique; repeated: {repeated}")
        if self.max_str_chars < 1:
            raise ActionSpecError(f"max_str_chars must be >= 1, got {self.max_str_chars}")

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def parse(cls, specs: str | Iterable[str], *,
              max_str_chars: int = DEFAULT_MAX_STR_CHARS) -> "Vocabulary":
        """From spec strings like `go_to(room: kitchen|hallway)` (a list, or `;`-separated)."""
        if isinstance(specs, str):
            specs = [s for s in specs.split(";")]
        items = [s.strip() for s in specs if s and s.strip()]
        return cls(tuple(_parse_spec(s) for s in items), max_str_chars=max_str_chars)

    @classmethod
    def from_json_schema(cls, schema: dict | str, *,
                         max_str_chars: int = DEFAULT_MAX_STR_CHARS) -> "Vocabulary":
        """From a JSON schema of the form `json_schema()` writes: anyOf/oneOf of objects with a
        `name` const and an `args` object whose properties are enum/string/integer/number/
        boolean."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ActionSpecError(f"the action schema is not JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise ActionSpecError("the action schema must be a JSON object")
        branches = schema.get("anyOf") or schema.get("oneOf") or [schema]
        return cls(tuple(_spec_from_schema(b, i, max_str_chars)
                         for i, b in enumerate(branches)), max_str_chars=max_str_chars)

    @classmethod
    def from_params(cls, specs: Sequence[str] | str = (), schema: str = "", *,
                    max_str_chars: int = DEFAULT_MAX_STR_CHARS) -> "Vocabulary":
        """Parameters give either spec strings or a JSON schema (a schema wins when both)."""
        if schema and schema.strip():
            return cls.from_json_schema(schema, max_str_chars=max_str_chars)
        return cls.parse(specs, max_str_chars=max_str_chars)

    @property
    def sources(self) -> tuple[str, ...]:
        """The `$name` enumerations bind() fills, in order of first use."""
        seen = OrderedDict()
        for spec in self.actions:
            for arg in spec.args:
                if arg.source is not None:
                    seen[arg.source] = None
        return tuple(seen)

    def bind(self, values: Mapping[str, Sequence[str]]) -> "Vocabulary":
        """Fill `$name` enumerations; an action with an empty one is left out (`dropped`)."""
        kept, dropped = [], []
        for spec in self.actions:
            args = []
            for arg in spec.args:
                if arg.source is not None:
                    filled = tuple(dict.fromkeys(str(v) for v in values.get(arg.source, ())
                                                 if str(v)))
                    for value in filled:
                        _check_enum_value(value, f"${arg.source}")
                    arg = replace(arg, values=filled)
                args.append(arg)
            if all(a.kind != "enum" or a.values for a in args):
                kept.append(replace(spec, args=tuple(args)))
            else:
                dropped.append(spec.name)
        return Vocabulary(tuple(kept), max_str_chars=self.max_str_chars, dropped=tuple(dropped))

    # -- what the model and the backends see ---------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """Only enumerations and booleans: every decision can be listed."""
        return all(a.kind in ("enum", "bool") and a.bound for s in self.actions for a in s.args)

    def n_choices(self) -> int | None:
        if not self.is_closed:
            return None
        total = 0
        for spec in self.actions:
            n = 1
            for arg in spec.args:
                n *= 2 if arg.kind == "bool" else len(arg.values)
            total += n
        return total

    def choices(self, *, limit: int = DEFAULT_MAX_CHOICES) -> tuple[str, ...]:
        """Every decision of a closed vocabulary, in call form."""
        self._check_bound("its choices")
        n = self.n_choices()
        if n is None:
            raise ActionSpecError("the vocabulary has free arguments (str, int, float): its "
                                  "decisions cannot be listed; decode with its grammar")
        if n > limit:
            raise ActionSpecError(f"the vocabulary has {n} decisions, more than {limit}: decode "
                                  "with its grammar instead of listing them")
        out = []
        for spec in self.actions:
            pools = [("true", "false") if a.kind == "bool" else a.values for a in spec.args]
            for combo in itertools.product(*pools):
                out.append(f"{spec.name}({', '.join(_render_enum(v) for v in combo)})")
        return tuple(out)

    def describe(self) -> str:
        """The action list for the prompt's fixed profile: the syntax and every argument."""
        lines = []
        for spec in self.actions:
            line = f"- {spec.signature}"
            if spec.args:
                line += " with " + "; ".join(a.describe() for a in spec.args)
            lines.append(line)
        quoted = any(a.kind == "str" for s in self.actions for a in s.args)
        return (f"Actions (reply with exactly one call, arguments in order"
                f"{', texts in double quotes' if quoted else ''}, e.g. {self.example()}):\n"
                + "\n".join(lines))

    def example(self) -> str:
        spec = next((s for s in self.actions if s.args), self.actions[0])
        return f"{spec.name}({', '.join(_example_value(a) for a in spec.args)})"

    def call_text(self, action: Action) -> str:
        """`action` written as the grammar writes it (enumeration values bare where they can
        be, as in `choices()`): what the model sees of a past decision, so that it reads as
        the ones it decodes. `parse_decision` reads it back as `action`."""
        spec = self._spec(action.name)
        values = [_render_enum(str(value)) if arg.kind == "enum" else _render_value(value)
                  for arg, (_, value) in zip(spec.args, action.args)]
        return f"{spec.name}({', '.join(values)})"

    def gbnf(self) -> str:
        """The decision grammar in GBNF (llama.cpp's grammar format)."""
        self._check_bound("a grammar")
        rules = ["root ::= " + " | ".join(f"a{i}" for i in range(len(self.actions)))]
        used: set[str] = set()
        for i, spec in enumerate(self.actions):
            parts = [_gbnf_literal(spec.name + "(")]
            for j, arg in enumerate(spec.args):
                if j:
                    parts.append('", "')
                if arg.kind == "enum":
                    rules.append(f"a{i}-{j} ::= " + " | ".join(
                        _gbnf_literal(_render_enum(v)) for v in arg.values))
                    parts.append(f"a{i}-{j}")
                elif arg.max_chars is not None:
                    rules.append(f"a{i}-{j} ::= " + _gbnf_str(arg.min_chars, arg.max_chars))
                    parts.append(f"a{i}-{j}")
                elif arg.low is not None:
                    rules += range_gbnf(f"a{i}-{j}", arg.low, arg.high, arg.decimals)
                    parts.append(f"a{i}-{j}")
                else:
                    parts.append(arg.kind)
                    used.add(arg.kind)
            parts.append('")"')
            rules.insert(1 + i, f"a{i} ::= " + " ".join(parts))
        if "str" in used:
            rules.append("str ::= " + _gbnf_str(1, self.max_str_chars))
        if "int" in used:
            rules.append('int ::= "-"? [0-9]{1,9}')
        if "float" in used:
            rules.append('float ::= "-"? [0-9]{1,6} ("." [0-9]{1,3})?')
        if "bool" in used:
            rules.append('bool ::= "true" | "false"')
        return "\n".join(rules) + "\n"

    def json_schema(self) -> dict:
        """The JSON form's schema: {"name": <const>, "args": {<arg>: <value>, ...}}."""
        self._check_bound("a JSON schema")
        branches = []
        for spec in self.actions:
            props = {a.name: _arg_schema(a, self.max_str_chars) for a in spec.args}
            branches.append({
                "type": "object",
                "properties": {"name": {"const": spec.name},
                               "args": {"type": "object", "properties": props,
                                        "required": [a.name for a in spec.args],
                                        "additionalProperties": False}},
                "required": ["name", "args"], "additionalProperties": False})
        return {"anyOf": branches}

    def constraint(self, kind: str = "auto", *, max_choices: int = DEFAULT_MAX_CHOICES,
                   auto_max_choices: int = AUTO_MAX_CHOICES) -> OutputConstraint:
        """`auto`: choice when the vocabulary is closed and has at most `auto_max_choices`
        decisions (see AUTO_MAX_CHOICES), else grammar. `choice` lists up to `max_choices`."""
        if kind not in CONSTRAINT_KINDS:
            raise ActionSpecError(f"constraint kind must be one of {CONSTRAINT_KINDS}, "
                                  f"got {kind!r}")
        n = self.n_choices()
        if kind == "auto":
            small = n is not None and n <= min(max_choices, auto_max_choices)
            kind = "choice" if small else "grammar"
        choices = self.choices(limit=max_choices) if kind == "choice" else ()
        schema = self.json_schema() if kind == "json" else None
        return OutputConstraint(kind=kind, grammar=self.gbnf(), choices=choices,
                                json_schema=schema)

    def _check_bound(self, what: str) -> None:
        unbound = [s for s in self.sources
                   if any(a.source == s and not a.values for sp in self.actions for a in sp.args)]
        if unbound:
            raise ActionSpecError(f"bind() the enumerations {unbound} before asking for {what}")

    # -- parsing -------------------------------------------------------------------------------

    def parse_decision(self, text: str) -> Action:
        """The typed action a decision's text names; ActionParseError says what is wrong."""
        stripped = (text or "").strip()
        if not stripped:
            raise ActionParseError("the decision is empty")
        if stripped.startswith("{"):
            return self._parse_json(stripped)
        match = _SPEC.fullmatch(stripped)
        if match is None:
            raise ActionParseError(f"{_clip(stripped)!r} is not a call `name(args)`; expected "
                                   f"one of {self._names()}")
        name, body = match.group(1), match.group(2)
        spec = self._spec(name)
        raw = _split_args(body)
        if len(raw) != len(spec.args):
            raise ActionParseError(f"{spec.signature} takes {len(spec.args)} argument(s), got "
                                   f"{len(raw)} in {_clip(stripped)!r}")
        args = tuple((arg.name, self._value(arg, value, spec))
                     for arg, value in zip(spec.args, raw))
        return Action(name=spec.name, args=args, text=stripped)

    def decide(self, text: str, *, constrained: bool, finish_reason: str = "stop",
               max_new_tokens: int | None = None) -> Decision:
        """Parse a backend's answer into a Decision; an unfinished answer is never valid.

        A constrained answer that parses is complete even if the budget ended with it (the
        grammar allows nothing after an action; a server only lacked the room for its end
        token). An unconstrained one cut by the budget might have gone on, so it is not.
        Any other finish_reason (a stream the server gave up on) is the server's error, never
        a budget that ran out, and never an action even if the text so far parses.
        """
        if finish_reason not in ("stop", "length"):
            return Decision(text=text, action=None, constrained=constrained,
                            error=f"server error: the answer ended with finish_reason "
                                  f"{finish_reason!r} ({_clip((text or '').strip())!r})")
        if finish_reason == "length" and constrained:
            try:
                return Decision(text=text, action=self.parse_decision(text), constrained=True)
            except ActionParseError:
                pass
        if finish_reason == "length":
            budget = "" if max_new_tokens is None else f" of {max_new_tokens} tokens"
            return Decision(text=text, action=None, constrained=constrained,
                            error=f"incomplete: the budget{budget} ended before the action was "
                                  f"complete ({_clip(text.strip())!r})")
        try:
            return Decision(text=text, action=self.parse_decision(text), constrained=constrained)
        except ActionParseError as exc:
            return Decision(text=text, action=None, constrained=constrained, error=str(exc))

    def _parse_json(self, text: str) -> Action:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ActionParseError(f"the decision looks like JSON but is not: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ActionParseError('a JSON decision is {"name": ..., "args": {...}}')
        spec = self._spec(data["name"])
        given = data.get("args") or {}
        if not isinstance(given, dict):
            raise ActionParseError(f"{spec.name}: args must be an object")
        extra = sorted(set(given) - {a.name for a in spec.args})
        missing = [a.name for a in spec.args if a.name not in given]
        if extra or missing:
            raise ActionParseError(f"{spec.signature}: missing {missing}, unknown {extra}")
        args = []
        for arg in spec.args:
            value = given[arg.name]
            where = f"{spec.name}: argument {arg.name!r}"
            if arg.kind in ("enum", "str"):
                if not isinstance(value, str):
                    raise ActionParseError(f"{where} must be a string, got {value!r}")
                value = self._value(arg, json.dumps(value, ensure_ascii=False), spec)
            elif not _json_type_fits(arg.kind, value):
                raise ActionParseError(f"{where} must be {arg.kind}, got {value!r}")
            elif arg.kind in ("int", "float"):
                if not math.isfinite(value):
                    raise ActionParseError(f"{where} must be a finite number, got {value!r}")
                # repr: the shortest text that reads back as the same float (0.1, not the
                # binary 0.1000000000000000055...), compared exactly with the bounds
                _check_range(arg, Decimal(repr(value)), json.dumps(value), spec)
            args.append((arg.name, float(value) if arg.kind == "float" else value))
        return Action(name=spec.name, args=tuple(args), text=text)

    def _check_length(self, arg: Arg, value: str, where: str) -> None:
        most = self.max_str_chars if arg.max_chars is None else arg.max_chars
        if len(value) > most:
            raise ActionParseError(f"{where} has {len(value)} characters, more than {most}")
        if arg.min_chars is not None and len(value) < arg.min_chars:
            raise ActionParseError(f"{where} has {len(value)} characters, fewer than "
                                   f"{arg.min_chars}")

    def _spec(self, name: str) -> ActionSpec:
        for spec in self.actions:
            if spec.name == name:
                return spec
        raise ActionParseError(f"unknown action {name!r}; expected one of {self._names()}")

    def _names(self) -> str:
        return ", ".join(s.signature for s in self.actions)

    def _value(self, arg: Arg, raw: str, spec: ActionSpec) -> object:
        where = f"{spec.name}: argument {arg.name!r}"
        if arg.kind == "enum":
            value = _unquote(raw) if raw.startswith('"') else raw
            if value not in arg.values:
                raise ActionParseError(f"{where} is {value!r}, not one of {list(arg.values)}")
            return value
        if arg.kind == "str":
            if not (raw.startswith('"') and raw.endswith('"') and len(raw) >= 2):
                raise ActionParseError(f"{where} must be a quoted text, got {_clip(raw)!r}")
            value = _unquote(raw)
            if not value:
                raise ActionParseError(f"{where} is empty")
            self._check_length(arg, value, where)
            return value
        if arg.kind == "int":
            if not _INT.fullmatch(raw):
                raise ActionParseError(f"{where} must be an integer, got {_clip(raw)!r}")
            _check_range(arg, Decimal(raw), raw, spec)
            return int(raw)
        if arg.kind == "float":
            if not _float_form(arg.decimals).fullmatch(raw):
                raise ActionParseError(f"{where} must be a number of at most {arg.decimals} "
                                       f"decimals, got {_clip(raw)!r}")
            _check_range(arg, Decimal(raw), raw, spec)
            return float(raw) + 0.0                  # -0.0 → 0.0
        if raw not in ("true", "false"):
            raise ActionParseError(f"{where} must be true or false, got {_clip(raw)!r}")
        return raw == "true"


class SeenValues:
    """Enumerations filled from what the state has seen: one regex per enumeration, its first
    group is a value. Keeps the most recently seen `max_values` per name. Pure."""

    def __init__(self, patterns: Mapping[str, str], *, max_values: int = 64):
        if max_values < 1:
            raise ActionSpecError(f"max_values must be >= 1, got {max_values}")
        self.max_values = max_values
        self._patterns = {}
        for name, pattern in patterns.items():
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ActionSpecError(f"the pattern of ${name} is not a regex: {exc}") from None
            if compiled.groups < 1:
                raise ActionSpecError(f"the pattern of ${name} needs a group: the value")
            self._patterns[name] = compiled
        self._values: dict[str, OrderedDict] = {name: OrderedDict() for name in patterns}

    @classmethod
    def from_params(cls, items: Sequence[str], *, max_values: int = 64) -> "SeenValues":
        """From `name=regex` strings (ROS parameters are flat)."""
        patterns = {}
        for item in items:
            name, sep, pattern = item.partition("=")
            if not sep or not _NAME.fullmatch(name.strip()):
                raise ActionSpecError(f"expected `name=regex`, got {item!r}")
            patterns[name.strip()] = pattern
        return cls(patterns, max_values=max_values)

    def observe(self, text: str) -> None:
        for name, pattern in self._patterns.items():
            seen = self._values[name]
            for match in pattern.finditer(text):
                value = match.group(1)
                if not value or _STR_FORBIDDEN.search(value):
                    continue
                seen.pop(value, None)
                seen[value] = None
                while len(seen) > self.max_values:
                    seen.popitem(last=False)

    def values(self) -> dict[str, tuple[str, ...]]:
        return {name: tuple(sorted(seen)) for name, seen in self._values.items()}


# -- helpers --------------------------------------------------------------------------------------

def _parse_spec(text: str) -> ActionSpec:
    match = _SPEC.fullmatch(text)
    if match is None:
        raise ActionSpecError(f"action spec {text!r} is not `name(arg: type, ...)`")
    name, body = match.group(1), match.group(2).strip()
    args = []
    for part in _split_spec_args(body):
        arg_name, sep, kind = (s.strip() for s in part.partition(":"))
        if not sep or not _NAME.fullmatch(arg_name) or not kind:
            raise ActionSpecError(f"in {text!r}: argument {part!r} is not `name: type`")
        args.append(_make_arg(arg_name, kind, text))
    names = [a.name for a in args]
    if len(set(names)) != len(names):
        raise ActionSpecError(f"in {text!r}: argument names repeat")
    return ActionSpec(name, tuple(args))


def _split_spec_args(body: str) -> list[str]:
    """`a: int[-1,1], b: str`: the commas inside a bound's brackets do not split."""
    parts, current, depth = [], [], 0
    for ch in body:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return parts if body else []


def _make_arg(name: str, kind: str, where: str) -> Arg:
    if kind in ("str", "int", "float", "bool"):
        return Arg(name, kind)
    bounded = _BOUNDED.fullmatch(kind)
    if bounded is not None:
        return _bounded_arg(name, bounded.group(1), bounded.group(2), where)
    if "[" in kind or "]" in kind:
        raise ActionSpecError(f"in {where!r}: {kind!r} is not a bounded type; bounds go on "
                              "int[min,max], float[min,max] or str[..max] / str[min..max]")
    if kind.startswith("$"):
        if not _NAME.fullmatch(kind[1:]):
            raise ActionSpecError(f"in {where!r}: {kind!r} is not `$name`")
        return Arg(name, "enum", source=kind[1:])
    values = tuple(v.strip() for v in kind.split("|"))
    if any(not v for v in values):
        raise ActionSpecError(f"in {where!r}: enumeration {kind!r} has an empty value")
    for value in values:
        _check_enum_value(value, where)
    if len(set(values)) != len(values):
        raise ActionSpecError(f"in {where!r}: enumeration {kind!r} repeats a value")
    return Arg(name, "enum", values=values)


def _bounded_arg(name: str, kind: str, bounds: str, where: str) -> Arg:
    """`int[-180,180]`, `float[0,0.5]`, `str[..80]`, `str[4..80]`."""
    if kind == "str":
        match = _STR_BOUNDS.fullmatch(bounds)
        if match is None:
            raise ActionSpecError(f"in {where!r}: str[{bounds}] is not str[..max] or "
                                  "str[min..max] (lengths in characters)")
        least = int(match.group(1)) if match.group(1) is not None else 1
        return _length_arg(name, least, int(match.group(2)), f"in {where!r}: argument {name!r}")
    ends = [b.strip() for b in bounds.split(",")]
    if len(ends) != 2 or not all(_BOUND_NUMBER.fullmatch(b) for b in ends):
        raise ActionSpecError(f"in {where!r}: {kind}[{bounds}] is not {kind}[min,max] with two "
                              "plain decimal numbers (both ends inclusive)")
    if kind == "int" and any("." in b for b in ends):
        raise ActionSpecError(f"in {where!r}: {kind}[{bounds}] has a bound that is not an "
                              "integer; an int's bounds are integers (or use float[min,max])")
    return _range_arg(name, kind, Decimal(ends[0]), Decimal(ends[1]),
                      f"in {where!r}: argument {name!r}")


def _range_arg(name: str, kind: str, low: Decimal, high: Decimal, where: str) -> Arg:
    """An int or float argument with its range checked: ordered, inside what an answer can
    write, no more decimals than a float can carry."""
    if low > high:
        raise ActionSpecError(f"{where}: the minimum {low} is above the maximum {high}")
    if kind == "int":
        if any(b != b.to_integral_value() for b in (low, high)):
            raise ActionSpecError(f"{where}: an int's bounds must be integers, got "
                                  f"[{low}, {high}]")
        limit = Decimal(10) ** INT_DIGITS
        if any(abs(b) >= limit for b in (low, high)):
            raise ActionSpecError(f"{where}: an int's bounds must lie within "
                                  f"±{limit - 1} ({INT_DIGITS} digits), got [{low}, {high}]")
        return Arg(name, "int", low=_plain(low), high=_plain(high))
    limit = Decimal(10) ** FLOAT_INT_DIGITS
    if any(abs(b) >= limit for b in (low, high)):
        raise ActionSpecError(f"{where}: a float's bounds must lie within ±{limit} "
                              f"({FLOAT_INT_DIGITS} integer digits), got [{low}, {high}]")
    if any(_decimals(b) > MAX_FLOAT_DECIMALS for b in (low, high)):
        raise ActionSpecError(f"{where}: a float's bounds have at most {MAX_FLOAT_DECIMALS} "
                              f"decimals, got [{low}, {high}]")
    return Arg(name, "float", low=_plain(low), high=_plain(high))


def _length_arg(name: str, least: int, most: int, where: str) -> Arg:
    if least < 1 or most < 1:
        raise ActionSpecError(f"{where}: a text has at least 1 character, got a "
                              f"{'minimum' if least < 1 else 'maximum'} of "
                              f"{least if least < 1 else most}")
    if least > most:
        raise ActionSpecError(f"{where}: the minimum length {least} is above the maximum "
                              f"{most}")
    return Arg(name, "str", min_chars=least, max_chars=most)


def _plain(value: Decimal) -> Decimal:
    """The bound as it prints: no trailing zeros, no exponent, no negative zero (0.50 → 0.5,
    1E+2 → 100, -0 → 0)."""
    return Decimal(format(value.normalize(), "f")) + 0


def _decimals(value: Decimal) -> int:
    """Fraction digits a bound needs (trailing zeros add none: 0.50 needs 1)."""
    return max(0, -value.normalize().as_tuple().exponent)


def _float_form(decimals: int) -> re.Pattern:
    """How an answer may write a float: at most 6 integer digits and `decimals` decimals."""
    return _compiled(rf"-?[0-9]{{1,{FLOAT_INT_DIGITS}}}(\.[0-9]{{1,{decimals}}})?")


@functools.lru_cache(maxsize=16)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def _check_range(arg: Arg, value: Decimal, text: str, spec: ActionSpec) -> None:
    """A number inside its range, or, unbounded, inside what the grammar writes."""
    if arg.low is None:
        digits = INT_DIGITS if arg.kind == "int" else FLOAT_INT_DIGITS
        if abs(value) >= Decimal(10) ** digits:
            raise ActionParseError(f"{spec.name}: {arg.name} {_clip(text)} has more than "
                                   f"{digits} integer digits")
        return
    if not arg.low <= value <= arg.high:
        raise ActionParseError(f"{spec.name}: {arg.name} {_clip(text)} outside "
                               f"{arg.range_text()}")


def _check_enum_value(value: str, where: str) -> None:
    if _STR_FORBIDDEN.search(value) or "," in value or ")" in value or "(" in value:
        raise ActionSpecError(f"in {where}: value {value!r} holds a quote, backslash, comma, "
                              "parenthesis or control character")


def _spec_from_schema(branch: dict, i: int, max_str_chars: int) -> ActionSpec:
    props = branch.get("properties") if isinstance(branch, dict) else None
    name = ((props or {}).get("name") or {})
    name = name.get("const", (name.get("enum") or [None])[0])
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ActionSpecError(f"schema branch {i} has no `name` const that is an identifier")
    arg_props = (((props or {}).get("args") or {}).get("properties")) or {}
    args = []
    for arg_name, schema in arg_props.items():
        if not _NAME.fullmatch(arg_name) or not isinstance(schema, dict):
            raise ActionSpecError(f"{name}: argument {arg_name!r} is not an identifier")
        if "enum" in schema:
            values = tuple(str(v) for v in schema["enum"])
            for value in values:
                _check_enum_value(value, f"{name}.{arg_name}")
            args.append(Arg(arg_name, "enum", values=values))
            continue
        kind = {"string": "str", "integer": "int", "number": "float",
                "boolean": "bool"}.get(schema.get("type"))
        if kind is None:
            raise ActionSpecError(f"{name}: argument {arg_name!r} has type "
                                  f"{schema.get('type')!r}; use string, integer, number, "
                                  "boolean or an enum")
        args.append(_arg_from_schema(arg_name, kind, schema, f"{name}: argument {arg_name!r}",
                                     max_str_chars))
    return ActionSpec(name, tuple(args))


def _arg_from_schema(name: str, kind: str, schema: dict, where: str,
                     max_str_chars: int) -> Arg:
    """The bounds a schema gives: minimum/maximum (both), minLength/maxLength. A bound this
    vocabulary cannot hold is refused, never dropped."""
    unsupported = sorted({"exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern",
                          "format"} & set(schema))
    if unsupported:
        raise ActionSpecError(f"{where}: {', '.join(unsupported)} cannot be enforced here; "
                              "give the range with minimum and maximum (inclusive)")
    if kind in ("int", "float"):
        given = [schema.get(k) for k in ("minimum", "maximum")]
        if given == [None, None]:
            return Arg(name, kind)
        if None in given:
            raise ActionSpecError(f"{where}: give both minimum and maximum, or neither")
        wanted = int if kind == "int" else (int, float)
        if any(isinstance(v, bool) or not isinstance(v, wanted) or not math.isfinite(v)
               for v in given):
            raise ActionSpecError(f"{where}: minimum and maximum must be "
                                  f"{'integers' if kind == 'int' else 'finite numbers'}, "
                                  f"got {given}")
        low, high = (Decimal(repr(v)) for v in given)
        return _range_arg(name, kind, low, high, where)
    if kind == "str" and ("minLength" in schema or "maxLength" in schema):
        least, most = schema.get("minLength", 1), schema.get("maxLength", max_str_chars)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (least, most)):
            raise ActionSpecError(f"{where}: minLength and maxLength must be integers, got "
                                  f"{least!r}, {most!r}")
        least = max(least, 1)            # a text argument is never empty
        if (least, most) == (1, max_str_chars):
            return Arg(name, "str")
        return _length_arg(name, least, most, where)
    return Arg(name, kind)


def _arg_schema(arg: Arg, max_str_chars: int) -> dict:
    if arg.kind == "enum":
        return {"type": "string", "enum": list(arg.values)}
    if arg.kind == "str":
        if arg.max_chars is not None:
            return {"type": "string", "minLength": arg.min_chars, "maxLength": arg.max_chars}
        return {"type": "string", "minLength": 1, "maxLength": max_str_chars}
    schema: dict = {"type": {"int": "integer", "float": "number", "bool": "boolean"}[arg.kind]}
    if arg.low is not None:
        schema.update(minimum=_json_number(arg.low), maximum=_json_number(arg.high))
    return schema


def _json_number(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


def _json_type_fits(kind: str, value: object) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _split_args(body: str) -> list[str]:
    """Top-level comma-separated values; commas inside quotes do not split."""
    body = body.strip()
    if not body:
        return []
    parts, current, quoted = [], [], False
    for ch in body:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return parts


def _unquote(raw: str) -> str:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise ActionParseError(f"{_clip(raw)!r} is not a well-formed quoted text") from None
    if not isinstance(value, str):
        raise ActionParseError(f"{_clip(raw)!r} is not a quoted text")
    return value


def _render_enum(value: str) -> str:
    return value if _BARE.fullmatch(value) else json.dumps(value, ensure_ascii=False)


def _render_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


def _example_value(arg: Arg) -> str:
    """A value the argument takes (an example out of its own range would teach the model to
    break it)."""
    if arg.kind == "enum":
        return _render_enum(arg.values[0]) if arg.values else arg.name
    if arg.low is not None:
        typical = Decimal(1) if arg.kind == "int" else Decimal("0.5")
        return format(min(max(typical, arg.low), arg.high), "f")
    if arg.max_chars is not None:
        text = "on my way".ljust(arg.min_chars, ".")[:arg.max_chars]
        return json.dumps(text)
    return {"str": '"on my way"', "int": "1", "float": "0.5", "bool": "true"}[arg.kind]


def _gbnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _gbnf_str(min_chars: int, max_chars: int) -> str:
    """A quoted text of min_chars to max_chars characters, none a quote, a backslash or a
    control character."""
    return f'"\\"" [^"\\\\\\x00-\\x1f]{{{min_chars},{max_chars}}} "\\""'


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."
