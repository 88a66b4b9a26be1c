"""A JSON schema as a GBNF grammar: what `response_format` decodes under, on every backend.

    rules, root = schema_gbnf({"type": "object", "properties": {...}})
    grammar = f"root ::= {root}\n" + rules          # the grammar of that schema alone

One grammar for every backend, as the action grammar is (csr_ros/actions.py): the local engine
compiles it with llguidance, llama.cpp's server takes it in `grammar`, vLLM in
`structured_outputs.grammar`. Every rule is named `json-…`, so it sits next to the action
grammar's rules in one grammar (tool_choice "auto" with a response format).

What it writes is compact JSON (`", "` and `": "` between items, no other whitespace), every
property of an object in the schema's order (optional ones too: the value is still valid), and
nothing the schema does not name. The keywords it reads:

    type (one or a list), enum, const, anyOf, $ref to #/$defs or #/definitions,
    object: properties, required, additionalProperties
    array: items, minItems, maxItems
    string: minLength, maxLength
    annotations (title, description, default, examples, ...) are ignored

A schema that asks for anything else (a pattern, a format, numeric bounds, oneOf, ...) is
refused with GatewayRequestError naming the keyword and where it is, since the answer could
not be guaranteed to match it.

Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from csr_ros.errors import GatewayRequestError

PREFIX = "json"
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                "deprecated", "readOnly", "writeOnly", "strict", "$defs", "definitions"}
_BY_TYPE = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"minLength", "maxLength"},
    "integer": set(), "number": set(), "boolean": set(), "null": set(),
}
_COMMON = {"type", "enum", "const", "anyOf", "$ref"}
_MAX_REPEAT = 10_000

# Fixed rules: JSON's scalars and any value (for `{}`, an untyped property, json_object).
_BASE = f"""{PREFIX}-value ::= {PREFIX}-object | {PREFIX}-array | {PREFIX}-string | \
{PREFIX}-number | "true" | "false" | "null"
{PREFIX}-object ::= "{{" ( {PREFIX}-string ": " {PREFIX}-value \
( ", " {PREFIX}-string ": " {PREFIX}-value )* )? "}}"
{PREFIX}-array ::= "[" ( {PREFIX}-value ( ", " {PREFIX}-value )* )? "]"
{PREFIX}-string ::= "\\"" {PREFIX}-char* "\\""
{PREFIX}-char ::= [^"\\\\\\x00-\\x1f] | "\\\\" ( ["\\\\/bfnrt] | "u" [0-9a-fA-F]{{4}} )
{PREFIX}-integer ::= "-"? ( "0" | [1-9] [0-9]{{0,15}} )
{PREFIX}-number ::= {PREFIX}-integer ( "." [0-9]{{1,16}} )? ( [eE] [-+]? [0-9]{{1,3}} )?
"""
_SCALARS = {"integer": f"{PREFIX}-integer", "number": f"{PREFIX}-number",
            "boolean": '( "true" | "false" )', "null": '"null"'}


def schema_gbnf(schema: Any, *, where: str = "the schema") -> tuple[str, str]:
    """(GBNF rules, the rule name of a value of `schema`); `where` names it in errors."""
    writer = _Writer(schema, where)
    root = writer.rule(schema, "")
    return _BASE + "".join(writer.rules), root


def any_object_gbnf() -> tuple[str, str]:
    """(GBNF rules, the rule name) of any JSON object: response_format json_object."""
    return _BASE, f"{PREFIX}-object"


def literal(value: Any) -> str:
    """`value` as compact JSON, as a GBNF string literal."""
    return _gbnf_string(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")))


class _Writer:
    def __init__(self, document: Any, where: str):
        self.document = document
        self.where = where
        self.rules: list[str] = []
        self._refs: dict[str, str] = {}

    def rule(self, schema: Any, path: str, *, ref: str | None = None) -> str:
        """The name of a new rule for the values of `schema` (for `ref`: named before its body
        is written, so that a recursive reference finds it)."""
        index = len(self.rules)
        name = f"{PREFIX}-r{index}"
        self.rules.append("")                   # the slot is this rule's; its body adds more
        if ref is not None:
            self._refs[ref] = name
        self.rules[index] = f"{name} ::= {self.body(schema, path)}\n"
        return name

    def body(self, schema: Any, path: str) -> str:
        if schema is True or schema == {}:
            return f"{PREFIX}-value"
        if not isinstance(schema, dict):
            self.refuse(path, f"is {json.dumps(schema)[:40]}, not a schema object")
        kind = schema.get("type")
        allowed = _COMMON | _ANNOTATIONS
        for name in ([kind] if isinstance(kind, str) else kind or []):
            allowed |= _BY_TYPE.get(name, set())
        unknown = sorted(set(schema) - allowed)
        if unknown:
            self.refuse(path, f"uses {unknown}, which the gateway cannot guarantee")
        if "$ref" in schema:
            return self.ref(schema["$ref"], path)
        if "const" in schema:
            return literal(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                self.refuse(path, "has an enum that is not a non-empty list")
            return " | ".join(literal(v) for v in values)
        if "anyOf" in schema:
            branches = schema["anyOf"]
            if not isinstance(branches, list) or not branches:
                self.refuse(path, "has an anyOf that is not a non-empty list")
            return " | ".join(self.rule(b, f"{path}.anyOf[{i}]")
                              for i, b in enumerate(branches))
        if isinstance(kind, list):       # each type with the keywords that apply to it
            return " | ".join(self.rule({**{key: value for key, value in schema.items()
                                            if key in _BY_TYPE.get(k, ())}, "type": k},
                                        f"{path}(type {k})") for k in kind)
        if kind is None:
            return f"{PREFIX}-value"
        if kind in _SCALARS:
            return _SCALARS[kind]
        if kind == "string":
            return self.string(schema, path)
        if kind == "array":
            return self.array(schema, path)
        if kind == "object":
            return self.object(schema, path)
        self.refuse(path, f"has type {kind!r}, not one of JSON schema's types")

    def object(self, schema: dict, path: str) -> str:
        properties = schema.get("properties")
        if properties is None:
            if schema.get("additionalProperties") is False:
                return '"{}"'
            return f"{PREFIX}-object"
        if not isinstance(properties, dict):
            self.refuse(path, "has properties that are not an object")
        if not properties:
            return '"{}"'
        parts = []
        for i, (key, value) in enumerate(properties.items()):
            sep = "" if i == 0 else '", " '
            parts.append(f"{sep}{literal(key)} \": \" {self.rule(value, f'{path}.{key}')}")
        return '"{" ' + " ".join(parts) + ' "}"'

    def array(self, schema: dict, path: str) -> str:
        item = self.rule(schema.get("items", True), f"{path}[]")
        low = self.count(schema, "minItems", 0, path)
        high = schema.get("maxItems")
        high = None if high is None else self.count(schema, "maxItems", 0, path)
        if high is not None and high < low:
            self.refuse(path, f"has maxItems {high} < minItems {low}")
        if high == 0:
            return '"[]"'
        more = f"( \", \" {item} )" + _repeat(max(low - 1, 0), None if high is None
                                                else high - 1)
        items = f"{item} {more}"
        return f'"[" {items} "]"' if low > 0 else f'"[" ( {items} )? "]"'

    def string(self, schema: dict, path: str) -> str:
        low = self.count(schema, "minLength", 0, path)
        high = schema.get("maxLength")
        high = None if high is None else self.count(schema, "maxLength", 0, path)
        if high is not None and high < low:
            self.refuse(path, f"has maxLength {high} < minLength {low}")
        return f'"\\"" {PREFIX}-char{_repeat(low, high)} "\\""'

    def ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")):
            self.refuse(path, f"has $ref {ref!r}: only #/$defs/... and #/definitions/... are "
                              "read")
        if ref not in self._refs:
            section, name = ref[2:].split("/", 1)
            target = (self.document.get(section) or {}).get(name) \
                if isinstance(self.document, dict) else None
            if target is None:
                self.refuse(path, f"has $ref {ref!r}, which the schema does not define")
            self.rule(target, f" ({ref})", ref=ref)
        return self._refs[ref]

    def count(self, schema: dict, key: str, low: int, path: str) -> int:
        value = schema.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or \
                not low <= value <= _MAX_REPEAT:
            self.refuse(path, f"has {key} {value!r}: an integer {low}..{_MAX_REPEAT} is read")
        return value

    def refuse(self, path: str, what: str):
        raise GatewayRequestError(f"{self.where}{path} {what}")


def _repeat(low: int, high: int | None) -> str:
    if high is None:
        return "*" if low == 0 else ("+" if low == 1 else f"{{{low},}}")
    if (low, high) == (0, 1):
        return "?"
    return f"{{{low},{high}}}"


def _gbnf_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
