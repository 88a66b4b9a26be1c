"""The gateway's session logic on its own: prompts in, appends / dynamic part / new version out."""

from __future__ import annotations

import pytest

from csr_ros.errors import GatewayRequestError
from csr_ros.gateway.session import (DEFAULT_SESSION, Prompt, Transcript, lru_victim,
                                     parse_chat, parse_completion_prompt, session_key)

SYSTEM = {"role": "system", "content": "You are the policy of a home robot."}


def chat(*turns: tuple[str, str]) -> Prompt:
    messages = [SYSTEM] + [{"role": role, "content": content} for role, content in turns]
    return parse_chat(messages, default_profile="unused")


def held(transcript: Transcript, prompt: Prompt) -> None:
    """What the service does with a plan: start a version if asked, then append."""
    plan = transcript.plan(prompt)
    if plan.new_version:
        transcript.start_version(prompt, broke_prefix=transcript.profile is not None)
    for text in plan.append:
        transcript.appended(text)


def test_a_chat_splits_into_profile_history_chunks_and_the_last_message_as_dynamic():
    prompt = chat(("user", "where is the cup?"), ("assistant", "go_to(kitchen)"),
                  ("user", "and now?"))
    assert prompt.profile == SYSTEM["content"]
    assert prompt.history == ("user: where is the cup?", "assistant: go_to(kitchen)")
    assert prompt.dynamic == "user: and now?"
    assert prompt.kind == "chat"


def test_a_chat_without_a_system_message_gets_the_default_profile():
    prompt = parse_chat([{"role": "user", "content": "hello"}], default_profile="Be brief.")
    assert (prompt.profile, prompt.history, prompt.dynamic) == ("Be brief.", (), "user: hello")


def test_text_parts_and_names_are_rendered_into_the_message_line():
    prompt = parse_chat([{"role": "user", "name": "ana", "content": [
        {"type": "text", "text": "bring "}, {"type": "text", "text": "the cup"}]},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "  now  "}],
        default_profile="p")
    assert prompt.history == ("user (ana): bring the cup", "assistant: ok")
    assert prompt.dynamic == "user: now"


def test_the_first_prompt_is_a_new_version_that_appends_the_whole_history():
    transcript = Transcript()
    prompt = chat(("user", "a"), ("assistant", "b"), ("user", "c"))
    plan = transcript.plan(prompt)
    assert plan.new_version and plan.reason == "the session's first prompt"
    assert plan.append == ("user: a", "assistant: b") and plan.dynamic == "user: c"
    held(transcript, prompt)
    assert (transcript.version, transcript.new_versions) == (1, 0)


def test_a_resent_conversation_appends_only_the_messages_the_session_does_not_hold():
    transcript = Transcript()
    held(transcript, chat(("user", "a"), ("assistant", "b"), ("user", "c")))
    plan = transcript.plan(chat(("user", "a"), ("assistant", "b"), ("user", "c"),
                                ("assistant", "d"), ("user", "e")))
    assert not plan.new_version and plan.reason == ""
    assert plan.append == ("user: c", "assistant: d")
    assert plan.dynamic == "user: e" and plan.n_held == 2


def test_the_same_history_with_a_new_last_message_appends_nothing():
    transcript = Transcript()
    held(transcript, chat(("user", "a"), ("assistant", "b"), ("user", "c")))
    plan = transcript.plan(chat(("user", "a"), ("assistant", "b"), ("user", "other")))
    assert not plan.new_version and plan.append == () and plan.dynamic == "user: other"


def test_planning_leaves_the_transcript_unchanged():
    transcript = Transcript()
    held(transcript, chat(("user", "a"), ("assistant", "b"), ("user", "c")))
    before = (transcript.profile, list(transcript.items), transcript.version)
    transcript.plan(chat(("user", "x"), ("user", "y")))
    assert (transcript.profile, transcript.items, transcript.version) == before


@pytest.mark.parametrize("prompt, reason", [
    (chat(("user", "A"), ("assistant", "b"), ("user", "c")), "history message 0 differs"),
    (chat(("user", "a"), ("assistant", "B"), ("user", "c")), "history message 1 differs"),
    (chat(("user", "c")), "the history has 0 messages, fewer than the 2"),
    (parse_chat([{"role": "system", "content": "another robot"}, {"role": "user", "content": "a"},
                 {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
                default_profile=""), "the system message (or the tools listed after it) differs"),
    (parse_completion_prompt(f"{SYSTEM['content']}\nuser: a\nassistant: b\nuser: c"),
     "a text prompt follows chat prompts"),
])
def test_a_prompt_that_does_not_extend_the_session_starts_a_new_version_with_the_reason(
        prompt, reason):
    transcript = Transcript()
    held(transcript, chat(("user", "a"), ("assistant", "b"), ("user", "c")))
    plan = transcript.plan(prompt)
    assert plan.new_version and reason in plan.reason
    assert plan.append == prompt.history and plan.n_held == 0
    held(transcript, prompt)
    assert (transcript.version, transcript.new_versions) == (2, 1)
    assert tuple(transcript.items) == prompt.history


def test_a_completions_prompt_is_taken_line_by_line():
    prompt = parse_completion_prompt("Robot log.\n  t=1 odom  \n\nt=2 camera\nNext action:")
    assert prompt == Prompt(profile="Robot log.", history=("t=1 odom", "t=2 camera"),
                            dynamic="Next action:", kind="text")
    assert parse_completion_prompt(["a\nb"]) == Prompt("a", (), "b", "text")


@pytest.mark.parametrize("prompt", ["one line only", "\n\n", [1, 2, 3], ["a\nb", "c\nd"], None])
def test_a_completions_prompt_that_cannot_be_split_is_refused(prompt):
    with pytest.raises(GatewayRequestError):
        parse_completion_prompt(prompt)


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"role": "robot", "content": "x"}], "role must be one of"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
     "last message is from 'assistant'"),
    ([SYSTEM], "only system messages"),
    ([{"role": "user", "content": "   "}], "content is empty"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "not a text part"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
      {"role": "user", "content": "x"}], r"tool_calls\[0\] must be \{id, type"),
    ([{"role": "assistant", "content": None, "tool_calls": "go_to"},
      {"role": "user", "content": "x"}], "tool_calls must be a list"),
    ([{"role": "user", "content": "x", "tool_calls": [{"id": "1"}]}],
     "only an assistant's message has them"),
    (["just a string"], "must be an object"),
])
def test_malformed_messages_are_refused_with_a_clear_error(messages, match):
    with pytest.raises(GatewayRequestError, match=match):
        parse_chat(messages, default_profile="p")


def test_the_session_key_is_the_header_then_the_user_field_then_the_default():
    assert session_key({"x-session-id": "robot-1"}, {"user": "ana"}) == "robot-1"
    assert session_key({}, {"user": "ana"}) == "ana"
    assert session_key({}, {}) == DEFAULT_SESSION
    for bad in ("", "x" * 129, "tab\there", 7):
        with pytest.raises(GatewayRequestError, match="session id"):
            session_key({}, {"user": bad})


def test_the_least_recently_used_idle_session_is_the_one_closed():
    assert lru_victim(["a", "b", "c"], busy=set()) == "a"
    assert lru_victim(["a", "b", "c"], busy={"a"}) == "b"
    assert lru_victim(["a", "b"], busy={"a", "b"}) is None


def test_a_version_that_could_not_be_built_makes_the_next_prompt_start_one_again():
    transcript = Transcript()
    prompt = chat(("user", "a"), ("assistant", "b"), ("user", "c"))
    held(transcript, prompt)
    transcript.forget()
    plan = transcript.plan(prompt)
    assert plan.new_version and plan.append == prompt.history
    assert plan.reason == "the session's previous version could not be built"


def test_an_agents_calls_and_tool_results_are_chunks_and_its_loop_stays_append_only():
    from csr_ros.gateway.tool_calls import parse_tools

    tools = parse_tools([{"type": "function", "function": {
        "name": "go_to", "description": "Drive to a room.",
        "parameters": {"type": "object", "properties": {
            "room": {"type": "string", "enum": ["kitchen", "living room"]}}}}}])
    call = {"id": "call_1", "type": "function",
            "function": {"name": "go_to", "arguments": '{"room": "living room"}'}}
    turn = [SYSTEM, {"role": "user", "content": "Go to the living room."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "arrived"}]
    first = parse_chat(turn, default_profile="unused", tools=tools)
    assert first.profile.startswith(SYSTEM["content"] + "\n\nTools: ")
    assert "- go_to(room): Drive to a room." in first.profile
    assert first.history == ("user: Go to the living room.",
                             'assistant: go_to("living room")')
    assert first.dynamic == "tool (go_to): arrived"
    transcript = Transcript()
    held(transcript, first)
    turn += [{"role": "assistant", "content": "I am in the living room."},
             {"role": "user", "content": "Thanks."}]
    plan = transcript.plan(parse_chat(turn, default_profile="unused", tools=tools))
    assert not plan.new_version and plan.n_held == 2
    assert plan.append == ("tool (go_to): arrived", "assistant: I am in the living room.")
    # other tools are another profile: a new version, and it says why
    other = parse_chat(turn, default_profile="unused", tools=None)
    assert "tools listed after it" in transcript.plan(other).reason


def test_calls_with_content_several_calls_and_unknown_results_are_written_plainly():
    calls = [{"id": "a", "type": "function", "function": {"name": "look", "arguments": "{}"}},
             {"id": "b", "type": "function",
              "function": {"name": "say", "arguments": '{"text": "hi"}'}}]
    prompt = parse_chat([{"role": "user", "content": "x"},
                         {"role": "assistant", "content": "Let me see.", "tool_calls": calls},
                         {"role": "tool", "tool_call_id": "b", "content": "said"},
                         {"role": "tool", "tool_call_id": "zzz", "content": ""}],
                        default_profile="p")
    assert prompt.history == ("user: x", 'assistant: Let me see. look({}); say({"text":"hi"})',
                              "tool (say): said")
    assert prompt.dynamic == "tool:"
