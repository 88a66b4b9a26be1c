"""OpenAI tools as typed actions: a chat request's `tools`, `tool_choice` and `response_format`
become an action vocabulary, the grammar its answer is decoded under, and the way it is read.

    toolset = parse_tools(body["tools"])        # a Vocabulary: one action per function
    decoding = plan_decoding(toolset, body.get("tool_choice"), body.get("response_format"))
    toolset.profile_text()                      # the tool list, after the system message
    toolset.history_line(name, arguments)       # a past call, as the model decodes one

Each function becomes an action whose arguments are its parameters, in the schema's order;
what the grammar cannot guarantee is refused with GatewayRequestError before anything is
appended. `tool_choice` "auto" is one two-branch grammar, `root ::= call | text`. The
mapping of schemas to arguments, what is refused, the four tool choices and how a call
comes back: docs/gateway.md, "Tools as typed actions".

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from csr_ros.actions import OutputConstraint, Vocabulary
from csr_ros.errors import ActionParseError, ActionSpecError, GatewayRequestError
from csr_ros.gateway.answer import Decoding
from csr_ros.gateway.json_grammar import any_object_gbnf, schema_gbnf

#: the longest text argument a tool gets (a sentence for `say`)
MAX_STR_CHARS = 128
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_BOUND_KEYS = ("minimum", "maximum", "minLength", "maxLength")
_PARAMETER_KEYS = {"type", "enum", "const", "description", "title", "default", "examples",
                   *_BOUND_KEYS}
_SCHEMA_KEYS = {"type", "properties", "required", "additionalProperties", "title",
                "description", "$schema"}
_WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class ToolSet:
    """A request's functions as an action vocabulary, and their descriptions."""

    vocabulary: Vocabulary
    descriptions: tuple[str, ...]             # one per action, "" where none

    def profile_text(self) -> str:
        """The tool list the model reads after the system message (part of the fixed
        prefix: an agent that sends the same tools every time keeps its prefix)."""
        lines = []
        for spec, description in zip(self.vocabulary.actions, self.descriptions):
            line = f"- {spec.signature}"
            if description:
                line += f": {description}"
            if spec.args:
                line += f" ({'; '.join(a.describe() for a in spec.args)})"
            lines.append(line)
        quoted = any(a.kind == "str" for s in self.vocabulary.actions for a in s.args)
        return (f"Tools: to use one, answer with the call alone"
                f"{', texts in double quotes' if quoted else ''}, e.g. "
                f"{self.vocabulary.example()}.\n" + "\n".join(lines))

    def call_line(self, name: str, arguments: Any) -> str:
        """A past call as the grammar writes it; one that is not a call of these tools (it
        came from elsewhere) as its name and its arguments' JSON."""
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
            decision = json.dumps({"name": name, "args": args}, ensure_ascii=False)
            return self.vocabulary.call_text(self.vocabulary.parse_decision(decision))
        except (ActionParseError, json.JSONDecodeError, TypeError):
            return plain_call_line(name, arguments)


def plain_call_line(name: str, arguments: Any) -> str:
    """A call written without a vocabulary: `name(<arguments as compact JSON>)`."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f"{name}({arguments})"
    return f"{name}({json.dumps(arguments, ensure_ascii=False, separators=(',', ':'))})"


def parse_tools(tools: Any) -> ToolSet | None:
    """`tools` of a chat request → ToolSet (None for none); GatewayRequestError if it holds
    what cannot be honoured."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise GatewayRequestError("'tools' must be a list of {type: function, function: {...}}")
    branches, descriptions = [], []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or \
                not isinstance(tool.get("function"), Mapping):
            raise GatewayRequestError(f"{where} must be {{type: 'function', function: {{name, "
                                      "description, parameters}}}: only function tools are "
                                      "supported")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise GatewayRequestError(f"{where}.function.name must be an identifier of at most "
                                      f"64 characters (letters, digits, _), got {name!r}")
        arguments = _arguments(function.get("parameters"), f"{where}.function.parameters")
        branches.append({"properties": {"name": {"const": name},
                                        "args": {"properties": arguments}}})
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise GatewayRequestError(f"{where}.function.description must be a string")
        descriptions.append(_first_paragraph(description))
    try:
        # The action vocabulary's own JSON-schema reader: the same arguments as a robot's
        vocabulary = Vocabulary.from_json_schema({"anyOf": branches},
                                                 max_str_chars=MAX_STR_CHARS)
    except ActionSpecError as exc:
        raise GatewayRequestError(f"tools: {exc}") from None
    return ToolSet(vocabulary, tuple(descriptions))


def plan_decoding(tools: ToolSet | None, tool_choice: Any, response_format: Any) -> Decoding:
    """How the answer is decoded and read (docs/gateway.md, "Tools as typed actions")."""
    text_rules, text_root = _response_format(response_format)
    if tools is None:
        if tool_choice not in (None, "none"):
            raise GatewayRequestError(f"tool_choice {tool_choice!r} needs 'tools'")
        return _text(text_rules, text_root)
    choice = "auto" if tool_choice is None else tool_choice
    vocabulary = tools.vocabulary
    if choice == "none":
        return _text(text_rules, text_root)
    if choice == "required":
        return Decoding("call", vocabulary.constraint(), vocabulary)
    if choice == "auto":
        grammar = auto_grammar(vocabulary, text_rules, text_root)
        return Decoding("auto", OutputConstraint("grammar", grammar), vocabulary)
    name = _named_function(choice)
    (spec,) = [s for s in vocabulary.actions if s.name == name] or [None]
    if spec is None:
        raise GatewayRequestError(f"tool_choice names the function {name!r}, which is not in "
                                  f"'tools' ({', '.join(s.name for s in vocabulary.actions)})")
    one = Vocabulary((spec,), max_str_chars=vocabulary.max_str_chars)
    return Decoding("call", one.constraint(), one)


def auto_grammar(vocabulary: Vocabulary, text_rules: str = "",
                 text_root: str | None = None) -> str:
    """root ::= call | text: the vocabulary's calls, or text that is not the beginning of one
    (`text_root`: a response format's rule instead, which never begins like a call)."""
    call_rules = vocabulary.gbnf()
    assert call_rules.startswith("root ::= "), "the action grammar's first rule is its root"
    rules = ["root ::= call | text", "call ::= " + call_rules[len("root ::= "):].rstrip("\n")]
    if text_root is not None:
        # JSON never begins with `name(`: the branches stay apart
        rules += [f"text ::= {text_root}", text_rules.rstrip("\n")]
    else:
        rules += _text_not_starting_with([f"{s.name}(" for s in vocabulary.actions])
    return "\n".join(rules) + "\n"


def _text_not_starting_with(starts: Sequence[str]) -> list[str]:
    """GBNF rules `text ::= …`: any non-empty text that begins neither with one of `starts`
    nor with whitespace. One rule per proper prefix of a start: a character no start
    continues with there leaves the starts behind (anything may follow), a character that
    completes a start is not allowed, and a text may end on a prefix (`go` is text)."""
    nodes: dict[str, str] = {"": "text"}
    rules = ["any ::= [^\\x00]"]
    pending = [""]
    while pending:
        prefix = pending.pop(0)
        nexts = sorted({s[len(prefix)] for s in starts if s.startswith(prefix)
                        and len(s) > len(prefix)})
        excluded = "".join(nexts) + (_WHITESPACE if not prefix else "")
        alternatives = [f"[^{_class_chars(excluded)}] any*"]
        for char in nexts:
            longer = prefix + char
            if longer in starts:
                continue                    # the call branch's
            if longer not in nodes:
                nodes[longer] = f"text-{len(nodes)}"
                pending.append(longer)
            alternatives.append(f"{json.dumps(char)} {nodes[longer]}")
        body = " | ".join(alternatives)
        rules.append(f"{nodes[prefix]} ::= " + (body if not prefix else f"( {body} )?"))
    return rules


def _class_chars(chars: str) -> str:
    """Characters escaped for a GBNF character class."""
    out = []
    for char in chars:
        out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\\": "\\\\", "]": "\\]",
                    "^": "\\^", "-": "\\-"}.get(char, char))
    return "".join(out)


def _text(rules: str, root: str | None) -> Decoding:
    if root is None:
        return Decoding("text")
    return Decoding("text", OutputConstraint("grammar", f"root ::= {root}\n{rules}"))


def _response_format(response_format: Any) -> tuple[str, str | None]:
    """(GBNF rules, root rule) of the response format; ("", None) for plain text."""
    if response_format is None:
        return "", None
    if not isinstance(response_format, Mapping):
        raise GatewayRequestError("'response_format' must be an object with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return "", None
    if kind == "json_object":
        return any_object_gbnf()
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            raise GatewayRequestError("response_format json_schema needs "
                                      "{json_schema: {name, schema: {...}}}")
        return schema_gbnf(spec["schema"], where="response_format.json_schema.schema")
    raise GatewayRequestError(f"response_format type {kind!r} is not supported: text, "
                              "json_object or json_schema")


def _named_function(choice: Any) -> str:
    if isinstance(choice, Mapping) and choice.get("type") == "function" and \
            isinstance(choice.get("function"), Mapping) and \
            isinstance(choice["function"].get("name"), str):
        return choice["function"]["name"]
    raise GatewayRequestError(f"tool_choice must be 'none', 'auto', 'required' or "
                              f"{{type: 'function', function: {{name}}}}, got {choice!r:.80}")


def _arguments(schema: Any, where: str) -> dict:
    """A function's parameters → the `args` properties of an action's JSON schema."""
    if schema is None:
        return {}
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        raise GatewayRequestError(f"{where} must be a JSON schema of type object")
    unknown = sorted(set(schema) - _SCHEMA_KEYS)
    if unknown:
        raise GatewayRequestError(f"{where} uses {unknown}: a tool's parameters are an object "
                                  "of plain properties here")
    properties = schema.get("properties") or {}
    if not isinstance(properties, Mapping):
        raise GatewayRequestError(f"{where}.properties must be an object")
    return {name: _argument(name, value, f"{where}.properties.{name}")
            for name, value in properties.items()}


def _argument(name: str, schema: Any, where: str) -> dict:
    if not isinstance(schema, Mapping):
        raise GatewayRequestError(f"{where} must be a schema object")
    if not _NAME.fullmatch(name):
        raise GatewayRequestError(f"{where}: a parameter name must be an identifier")
    unknown = sorted(set(schema) - _PARAMETER_KEYS)
    if unknown:
        raise GatewayRequestError(f"{where} uses {unknown}, which a tool call here cannot "
                                  "guarantee: parameters are strings, integers, numbers, "
                                  "booleans or string enums, with inclusive bounds")
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if values is not None:
        if not isinstance(values, list) or not values or \
                not all(isinstance(v, str) and v for v in values):
            raise GatewayRequestError(f"{where}: an enum here is a non-empty list of non-empty "
                                      "strings")
        return {"enum": values}
    # the type and the bounds are the vocabulary's to check, as for a robot's actions
    return {"type": schema.get("type"), **{k: schema[k] for k in _BOUND_KEYS if k in schema}}


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())
