"""Typed actions through servers: llama.cpp's `grammar` (a real server) and vLLM's structured
outputs (the in-process stand-in of support/vllm_like_server.py, answering as vLLM
documents).

vLLM's documented request fields (docs.vllm.ai, features/structured_outputs): since 0.10.2
`structured_outputs` holds exactly one of `choice` (a list of strings), `json` (a JSON schema),
`regex` or `grammar` (an EBNF/GBNF grammar); before it, `guided_choice`, `guided_json`,
`guided_regex`, `guided_grammar` at the top level (removed in 0.12, silently ignored there).
"""

from __future__ import annotations

import json

import httpx
import pytest

from support.robot_prompts import BOUNDED_ACTIONS, assert_bounds_hold, decide_pushed
from support.vllm_like_server import VllmLikeServer, robot_state

from csr_ros.actions import Vocabulary
from csr_ros.errors import ConfigError
from csr_ros.layout import Layout
from csr_ros.resources.openai import OpenAIOptions, OpenAIResource
from csr_ros.state import CsrState

SPECS = ["wait()", "look_around()", "go_to(room: kitchen|living_room|hallway|office)",
         "pick(object: $objects)", "say(text: str)", "turn(degrees: int, fast: bool)"]
VLLM_STRUCTURED_KEYS = {"choice", "json", "regex", "grammar"}
VLLM_GUIDED_KEYS = {"guided_choice", "guided_json", "guided_regex", "guided_grammar"}


class VersionedVllm(VllmLikeServer):
    """The stand-in, also answering GET /version as vLLM does."""

    def __init__(self, tokenizer, version: str | None):
        super().__init__(tokenizer)
        self.version = version

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/version" and self.version is not None:
            return httpx.Response(200, json={"version": self.version})
        return super().__call__(request)


def _vllm(tokenizer, version, **options) -> tuple[VersionedVllm, OpenAIResource]:
    server = VersionedVllm(tokenizer, version)
    resource = OpenAIResource(OpenAIOptions("http://127.0.0.1:8001", **options),
                              transport=httpx.MockTransport(server))
    return server, resource


def _check_structured_outputs(body: dict) -> tuple[str, object]:
    """The body follows vLLM >= 0.10.2's documented shape; returns (key, value)."""
    assert not VLLM_GUIDED_KEYS & set(body), "old guided_* fields next to structured_outputs"
    fields = body["structured_outputs"]
    assert isinstance(fields, dict) and len(fields) == 1 and set(fields) <= VLLM_STRUCTURED_KEYS
    ((key, value),) = fields.items()
    if key == "choice":
        assert isinstance(value, list) and all(isinstance(c, str) for c in value)
    elif key == "json":
        assert isinstance(value, dict)
        json.dumps(value)
    else:
        assert isinstance(value, str) and value.strip()
    return key, value


def _compiles_under_llguidance(kind: str, value) -> None:
    """vLLM's `guidance` backend is llguidance: what we send must compile there."""
    llg = pytest.importorskip("llguidance")
    from csr_ros.model_store import resolve_model_dir

    tok = llg.LLTokenizer(str(resolve_model_dir(weights=False) / "tokenizer.json"))
    if kind == "grammar":
        grammar = llg.grammar_from("gbnf", value)
    elif kind == "json":
        grammar = llg.LLMatcher.grammar_from_json_schema(value)
    else:
        grammar = llg.grammar_from("choice", json.dumps(value))
    matcher = llg.LLMatcher(tok, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()


@pytest.mark.parametrize("version", ["0.11.0", "0.24.1", None])
def test_vllm_gets_structured_outputs_for_choice_grammar_and_json(tokenizer, version):
    server, resource = _vllm(tokenizer, version)
    vocab = Vocabulary.parse(SPECS).bind({"objects": ["apple", "keys"]})
    closed = Vocabulary.parse(SPECS[:4]).bind({"objects": ["apple", "keys"]})
    request = robot_state(resource).build_request(task="next?")
    for constraint, key in ((closed.constraint(), "choice"), (vocab.constraint(), "grammar"),
                            (vocab.constraint("json"), "json")):
        result = resource.query(request, max_new_tokens=16, constraint=constraint)
        assert result.constrained
        sent_key, value = _check_structured_outputs(server.bodies[-1])
        assert sent_key == key
        if key == "choice":
            assert value == list(closed.choices())
        _compiles_under_llguidance(key, value)


@pytest.mark.parametrize("version", ["0.11.0", "0.9.2"])
def test_vllm_gets_the_bounds_in_its_grammar_and_json_schema(tokenizer, version):
    server, resource = _vllm(tokenizer, version)
    vocab = Vocabulary.parse(BOUNDED_ACTIONS)
    request = robot_state(resource).build_request(task="next?")
    sent = {}
    for kind in ("grammar", "json"):
        resource.query(request, max_new_tokens=16, constraint=vocab.constraint(kind))
        body = server.bodies[-1]
        if version == "0.11.0":
            key, value = _check_structured_outputs(body)
        else:
            ((key, value),) = ((k[len("guided_"):], v) for k, v in body.items()
                               if k.startswith("guided_"))
        assert key == kind
        _compiles_under_llguidance(key, value)
        sent[key] = value
    assert sent["grammar"] == vocab.gbnf() and "a1-0-p3-0lh" in sent["grammar"]
    turn = next(b for b in sent["json"]["anyOf"]
                if b["properties"]["name"]["const"] == "turn")
    assert turn["properties"]["args"]["properties"]["degrees"] == \
        {"type": "integer", "minimum": -180, "maximum": 180}


def test_vllm_before_0_10_2_gets_the_guided_fields(tokenizer):
    server, resource = _vllm(tokenizer, "0.9.2")
    vocab = Vocabulary.parse(SPECS).bind({"objects": ["apple"]})
    closed = Vocabulary.parse(SPECS[:3])
    request = robot_state(resource).build_request(task="next?")
    for constraint, key in ((closed.constraint(), "guided_choice"),
                            (vocab.constraint(), "guided_grammar"),
                            (vocab.constraint("json"), "guided_json")):
        resource.query(request, max_new_tokens=16, constraint=constraint)
        body = server.bodies[-1]
        assert "structured_outputs" not in body
        assert VLLM_GUIDED_KEYS & set(body) == {key}


def test_the_structured_api_can_be_chosen_and_an_unknown_server_gets_none(tokenizer):
    server, resource = _vllm(tokenizer, "0.9.2", structured_api="structured_outputs")
    vocab = Vocabulary.parse(SPECS[:3])
    request = robot_state(resource).build_request(task="next?")
    resource.query(request, max_new_tokens=8, constraint=vocab.constraint())
    assert _check_structured_outputs(server.bodies[-1])[0] == "choice"

    _, none = _vllm(tokenizer, "0.11.0", structured_api="none")
    result = none.query(robot_state(none).build_request(task="next?"), max_new_tokens=8,
                        constraint=vocab.constraint())
    assert not result.constrained
    with pytest.raises(ConfigError, match="structured_api"):
        _vllm(tokenizer, "0.11.0", structured_api="outlines")


def test_every_action_decoded_by_llama_cpp_with_the_grammar_parses(llama_server):  # noqa: F811
    resource = OpenAIResource(OpenAIOptions(llama_server.url))
    try:
        tok = resource.tokenizer
        vocab = Vocabulary.parse(SPECS, max_str_chars=16)
        bound = vocab.bind({"objects": ["apple", "keys", "red_mug"]})
        state = CsrState(tok, Layout.from_tokenizer(tok),
                         "You are the decision policy of a home robot.\n" + vocab.describe(),
                         mode=resource.state_mode)
        for i in range(12):
            state.add(f"[t={i}s camera] apple at ({i * 0.1:.1f}, 1.0); keys at (2.0, 0.5)",
                      source="camera")
        names = set()
        for task in ("Which action next?", "Say hello to Alice. Which action next?",
                     "Turn around fast. Which action next?", "Go to the kitchen.",
                     "Pick up the apple."):
            constraint = bound.constraint()
            result = resource.query(state.build_request(task=task), max_new_tokens=32,
                                    constraint=constraint)
            decision = bound.decide(result.text, constrained=result.constrained,
                                    finish_reason=result.finish_reason)
            assert result.constrained
            assert decision.valid, (task, result.text, decision.error)
            names.add(decision.action.name)
        assert len(names) >= 2, names
    finally:
        resource.close()


def test_llama_cpp_gets_the_grammar_for_a_closed_list_too(llama_server):  # noqa: F811
    resource = OpenAIResource(OpenAIOptions(llama_server.url))
    try:
        vocab = Vocabulary.parse(SPECS[:3])
        constraint = vocab.constraint()
        assert constraint.kind == "choice"
        assert resource.structured_fields(constraint) == {"grammar": vocab.gbnf()}
        tok = resource.tokenizer
        state = CsrState(tok, Layout.from_tokenizer(tok), "Robot.\n" + vocab.describe(),
                         mode=resource.state_mode)
        state.add("[t=0s] Bob says: come to the office", source="speech")
        result = resource.query(state.build_request(task="Which action next?"),
                                max_new_tokens=16, constraint=constraint)
        assert result.text in constraint.choices
    finally:
        resource.close()


@pytest.mark.parametrize("kind", ["grammar", "json"])
def test_llama_cpp_decodes_only_in_range_under_the_bounds(llama_server, kind):  # noqa: F811
    """llama.cpp's own grammar engine (the server's `grammar`; the JSON constraint travels as
    the same grammar): pushed to turn 720 degrees and to drive at 3 m/s, the model answers in
    range; without the bounds it answers turn(720) and drive(3), which decide() refuses."""
    resource = OpenAIResource(OpenAIOptions(llama_server.url))
    try:
        assert_bounds_hold(decide_pushed(resource, resource.tokenizer, kind=kind,
                                         mode=resource.state_mode))
    finally:
        resource.close()
