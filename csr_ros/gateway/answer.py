"""What a decoded answer becomes for the client: content pieces while it streams, then the
message (content, or a tool call) and its finish reason.

    decoding = Decoding.plain()                     # or tool_calls.plan_decoding(...)
    stream = AnswerStream(decoding, stop=("\\n\\n",))
    stream.feed(text_so_far) -> the content piece to send now ("" while it must wait)
    stream.finish(text) -> the rest of the content
    settle(decoding, text, finish_reason) -> Answer(content | tool_call, finish_reason)

A decoding is one of three modes:

    text   the answer is content (no tools, or tool_choice "none"; response_format's grammar
           may constrain it)
    call   the answer is one call, decoded under the tools' grammar (tool_choice "required"
           or a named function): nothing streams as content, the call comes whole at the end
    auto   the model chooses: an answer that begins with `name(` for one of the tools is a call
           (the grammar's call branch, which it must then complete), any other is content

The feed takes the answer's text so far (the resource's `on_text`) and sends only what can no
longer change: a character still missing bytes (U+FFFD at the end), the beginning of a stop
string, and in `auto` the beginning of an answer that may still become a call wait for the
next text. So the pieces sent always join to a prefix of the final content.

Pure: no sockets, no threads, no models.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Sequence

from csr_ros.actions import OutputConstraint, Vocabulary

MODES = ("text", "call", "auto")


@dataclass(frozen=True)
class Decoding:
    """How one request's answer is decoded and read back."""

    mode: str = "text"                          # MODES
    constraint: OutputConstraint | None = None  # what the resource decodes under, if anything
    vocabulary: Vocabulary | None = None        # the tools, as actions (call and auto)

    def __post_init__(self):
        assert self.mode in MODES, f"unknown decoding mode {self.mode!r}"
        assert self.mode == "text" or self.vocabulary is not None, "a call needs its tools"

    @classmethod
    def plain(cls) -> "Decoding":
        return cls()

    @property
    def call_starts(self) -> tuple[str, ...]:
        """How a call begins: `name(` for each tool."""
        if self.vocabulary is None or self.mode == "text":
            return ()
        return tuple(f"{spec.name}(" for spec in self.vocabulary.actions)

    def is_call(self, text: str) -> bool:
        """The answer (or its beginning) is a call, not content."""
        if self.mode == "call":
            return True
        return self.mode == "auto" and text.startswith(self.call_starts)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str                              # JSON, as OpenAI sends it

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Answer:
    """The assistant's message: content, or one call (then content is None)."""

    content: str | None
    tool_call: ToolCall | None
    finish_reason: str                          # stop | length | tool_calls
    error: str = ""                             # why a call-shaped answer is not a call


def settle(decoding: Decoding, text: str, finish_reason: str) -> Answer:
    """The message a decoded answer is: a call when it is one and complete, else content.

    A call the budget (max_tokens) or a stop string cut short is never returned as a call,
    since its arguments would not run: its text comes back as content, with the finish
    reason, and `error` says why.
    """
    if not decoding.is_call(text):
        return Answer(text, None, finish_reason)
    decision = decoding.vocabulary.decide(text, constrained=decoding.constraint is not None,
                                          finish_reason=finish_reason)
    if not decision.valid:
        return Answer(text, None, finish_reason, error=decision.error)
    action = decision.action
    return Answer(None, ToolCall(id=new_call_id(), name=action.name,
                                 arguments=action.arguments_json), "tool_calls")


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class AnswerStream:
    """Content pieces from the answer's text so far (see the module docstring)."""

    def __init__(self, decoding: Decoding, *, stop: Sequence[str] = ()):
        self.decoding = decoding
        self.stop = tuple(s for s in stop if s)
        self.sent = ""                  # the content sent so far

    def feed(self, text: str) -> str:
        """The piece to send now that the answer reads `text` ("" if none)."""
        if self._undecided(text) or self.decoding.is_call(text):
            return ""
        ready = self._ready(text)
        if len(ready) <= len(self.sent) or not ready.startswith(self.sent):
            # A decoder may re-read an earlier token differently once the next one is known;
            # whatever disagrees with what was sent waits for the final text.
            return ""
        piece = ready[len(self.sent):]
        self.sent = ready
        return piece

    def finish(self, text: str) -> str:
        """The content still to send once the answer is `text` (its final content)."""
        if not text.startswith(self.sent):
            return ""                   # see feed(); the message carries the final text
        piece = text[len(self.sent):]
        self.sent = text
        return piece

    def _undecided(self, text: str) -> bool:
        """`auto`: the text may still become a call."""
        return self.decoding.mode == "auto" and any(start.startswith(text)
                                                    for start in self.decoding.call_starts)

    def _ready(self, text: str) -> str:
        """`text` without what may still change: a partial character, a partial stop string."""
        text = text.rstrip("\ufffd")
        held = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:n]):
                    held = n
                    break
        return text[:len(text) - held]
