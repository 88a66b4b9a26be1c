"""What a decoded answer becomes for a client, on its own: the pieces a stream sends while the
answer is decoded (never one that may still change), and the message at the end."""

from __future__ import annotations

import json

import pytest

from csr_ros.actions import Vocabulary
from csr_ros.gateway.answer import AnswerStream, Decoding, settle

TOOLS = Vocabulary.parse(["go_to(room: kitchen|office)", "say(text: str)"])
AUTO = Decoding("auto", TOOLS.constraint(kind="grammar"), TOOLS)
CALL = Decoding("call", TOOLS.constraint(kind="grammar"), TOOLS)


@pytest.fixture(scope="module")
def tokenizer():
    from csr_ros.model_store import resolve_model_dir
    from csr_ros.tokenizer import HFTokenizer

    return HFTokenizer(resolve_model_dir(weights=False))


def texts_so_far(tokenizer, text: str) -> list[str]:
    """What a decoder hands on_text after each token of `text`."""
    ids = tokenizer.encode_data(text)
    return [tokenizer.decode(ids[:k]) for k in range(1, len(ids) + 1)]


def streamed(stream: AnswerStream, texts: list[str], final: str) -> list[str]:
    pieces = [stream.feed(t) for t in texts]
    return [p for p in pieces if p] + [stream.finish(final)]


def test_streamed_pieces_are_whole_characters_sent_as_the_tokens_come_and_join_to_the_answer(
        tokenizer):
    text = "go_to(kitchen) — the café 😀 is 3.5 m 𝔘 away"
    texts = texts_so_far(tokenizer, text)
    assert any(t.endswith("\ufffd") for t in texts), "the emoji takes more than one token"
    pieces = streamed(AnswerStream(Decoding.plain()), texts, text)
    assert "".join(pieces) == text
    assert len(pieces) > 5 and all(pieces[:-1]) and not any("\ufffd" in p for p in pieces)


def test_the_beginning_of_a_stop_string_waits_until_the_text_goes_another_way():
    stream = AnswerStream(Decoding.plain(), stop=("END",))
    assert stream.feed("go") == "go"
    assert stream.feed("go E") == " "
    assert stream.feed("go EN") == ""
    assert stream.feed("go ENTER") == "ENTER"
    # an answer cut at the stop string: the final text is what the resource returned
    stream = AnswerStream(Decoding.plain(), stop=("END",))
    assert [stream.feed(t) for t in ("ok", "ok E", "ok EN")] == ["ok", " ", ""]
    assert stream.finish("ok ") == ""


def test_in_auto_a_possible_call_waits_and_text_streams_once_it_is_not_one():
    stream = AnswerStream(AUTO)
    assert [stream.feed(t) for t in ("go", "go_", "go_to")] == ["", "", ""]
    assert stream.feed("go_to(") == "" and stream.feed("go_to(kitchen)") == ""
    text = AnswerStream(AUTO)
    assert [text.feed(t) for t in ("s", "sa", "sam", "same here")] == ["", "", "sam", "e here"]
    assert text.finish("same here.") == "."


def test_a_call_never_streams_as_content():
    stream = AnswerStream(CALL)
    assert [stream.feed(t) for t in ("say", "say(\"hi", "say(\"hi\")")] == ["", "", ""]


def test_a_complete_call_settles_into_a_tool_call_with_json_arguments():
    answer = settle(AUTO, 'say("on my way")', "stop")
    assert answer.content is None and answer.finish_reason == "tool_calls"
    call = answer.tool_call
    assert call.name == "say" and json.loads(call.arguments) == {"text": "on my way"}
    assert call.id.startswith("call_") and call.as_dict()["type"] == "function"
    assert settle(CALL, "go_to(office)", "length").tool_call.arguments == '{"room":"office"}'
    assert settle(AUTO, "say hi", "stop").tool_call is None
    assert settle(Decoding.plain(), "go_to(office)", "stop").content == "go_to(office)"


def test_a_call_cut_short_is_content_with_the_reason_never_a_call():
    answer = settle(CALL, 'say("on my', "length")
    assert answer.tool_call is None and answer.content == 'say("on my'
    assert answer.finish_reason == "length" and "incomplete" in answer.error
