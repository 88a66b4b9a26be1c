"""A client's prompt, the CSR way: what is already held, what to append, what is dynamic.

An OpenAI client resends its whole conversation every time. The gateway keeps, per session,
the transcript it has appended as chunks, and splits each new prompt against it:

    chat:         [system…] m_0 m_1 … m_k  m_last
                   profile  ──── history ───  dynamic
    completions:  line_0  line_1 … line_k  line_last
                  profile  ───── history ──  dynamic

- A prompt *extends* the session when its profile is the one held and its history starts with
  every message held: only the messages after them are appended (`Plan.append`).
- Anything else starts a new version: a fresh state holding the prompt's whole history
  (`Plan.new_version`, with the reason).

How each message, tool call and tool result is written as a chunk, and what the model then
sees: docs/gateway.md, "What is a chunk and what is dynamic" and "New versions".

Pure: no sockets, no threads, no models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from csr_ros.errors import GatewayRequestError
from csr_ros.gateway.tool_calls import ToolSet, plain_call_line

SYSTEM_ROLES = ("system", "developer")
ROLES = SYSTEM_ROLES + ("user", "assistant", "tool")
MAX_SESSION_ID_CHARS = 128
DEFAULT_SESSION = "default"


@dataclass(frozen=True)
class Prompt:
    """A client's prompt split into the parts of a CSR state."""

    profile: str                   # the system message(s), or the gateway's default
    history: tuple[str, ...]       # one chunk text per earlier message, oldest first
    dynamic: str                   # the last message: this query's dynamic part
    kind: str = "chat"             # "chat" (chat template) | "text" (a completions prompt)


@dataclass(frozen=True)
class Plan:
    """What one prompt asks of a session: chunks to append, or a new version."""

    append: tuple[str, ...]        # chunk texts to append, in order
    dynamic: str
    new_version: bool
    reason: str = ""               # why a new version starts ("" when the prompt extends)
    n_held: int = 0                # history messages the session already holds and reuses


class Transcript:
    """The chunk texts one session has appended, in order, across ASR evictions.

    Eviction removes chunks from the model's state, not from the transcript: the client goes
    on resending those messages, and the prompt still extends the session.
    """

    def __init__(self) -> None:
        self.profile: str | None = None
        self.kind: str | None = None
        self.items: list[str] = []
        self.version = 0               # 1 for the session's first prompt, +1 per new version
        self.new_versions = 0          # versions started because a prompt broke the prefix

    def plan(self, prompt: Prompt) -> Plan:
        """Pure: compare the prompt with what is held; the transcript is unchanged."""
        if self.profile is None:
            reason = "the session's first prompt" if self.version == 0 else \
                "the session's previous version could not be built"
            return Plan(prompt.history, prompt.dynamic, True, reason)
        reason = self._break_reason(prompt)
        if reason:
            return Plan(prompt.history, prompt.dynamic, True, reason)
        n = len(self.items)
        return Plan(prompt.history[n:], prompt.dynamic, False, n_held=n)

    def start_version(self, prompt: Prompt, *, broke_prefix: bool) -> None:
        """A new version holds nothing yet; `appended` records each history message."""
        self.profile, self.kind = prompt.profile, prompt.kind
        self.items = []
        self.version += 1
        self.new_versions += int(broke_prefix)

    def forget(self) -> None:
        """Nothing is held any more (the version could not be built): the next prompt starts
        a new version, whatever it holds."""
        self.profile, self.kind, self.items = None, None, []

    def appended(self, text: str) -> None:
        """One chunk text reached the state (called after each successful append)."""
        assert self.profile is not None, "start a version before appending"
        self.items.append(text)

    def _break_reason(self, prompt: Prompt) -> str:
        if prompt.kind != self.kind:
            return f"a {prompt.kind} prompt follows {self.kind} prompts in this session"
        if prompt.profile != self.profile:
            return ("the system message (or the tools listed after it) differs from the one "
                    "the session holds")
        n = len(self.items)
        if len(prompt.history) < n:
            return (f"the history has {len(prompt.history)} messages, fewer than the {n} the "
                    "session holds")
        for i, (held, sent) in enumerate(zip(self.items, prompt.history)):
            if held != sent:
                return f"history message {i} differs from the one the session holds"
        return ""


# -- parsing requests -------------------------------------------------------------------------

def parse_chat(messages: Any, *, default_profile: str, tools: ToolSet | None = None) -> Prompt:
    """`messages` of a /v1/chat/completions body → Prompt (GatewayRequestError if malformed);
    `tools` (the request's) are listed in the profile and write the history's calls."""
    if not isinstance(messages, list) or not messages:
        raise GatewayRequestError("'messages' must be a non-empty list of {role, content}")
    called: dict[str, str] = {}                # tool_call_id -> function name, so far
    parsed = [_message(i, m, tools, called) for i, m in enumerate(messages)]
    n_system = 0
    while n_system < len(parsed) and parsed[n_system][0] in SYSTEM_ROLES:
        n_system += 1
    system = [content for _, _, content in parsed[:n_system]]
    rest = parsed[n_system:]
    if not rest:
        raise GatewayRequestError("'messages' holds only system messages: add a user message")
    role, _, _ = rest[-1]
    if role not in ("user", "tool"):
        msg = (f"the last message is from {role!r}: the gateway answers a user (or tool) "
               "message; continuing an assistant message is not supported")
        raise GatewayRequestError(msg)
    profile = "\n".join(system) if system else default_profile
    if tools is not None:
        profile += "\n\n" + tools.profile_text()
    lines = tuple(_line(role, name, content) for role, name, content in rest)
    return Prompt(profile=profile, history=lines[:-1], dynamic=lines[-1])


def parse_completion_prompt(prompt: Any) -> Prompt:
    """`prompt` of a /v1/completions body → Prompt, line by line.

    The first line is the profile, the last the dynamic part, each line between a chunk.
    Lines are taken without their surrounding whitespace; blank lines do not reach the model.
    """
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        msg = ("'prompt' must be one string (token-id lists and batches of prompts are not "
               "supported)")
        raise GatewayRequestError(msg)
    lines = [line.strip() for line in prompt.split("\n")]
    lines = [line for line in lines if line]
    if len(lines) < 2:
        msg = ("a completions prompt needs at least two non-blank lines: the first is the fixed "
               "prefix, the last the dynamic part, each line between a chunk")
        raise GatewayRequestError(msg)
    return Prompt(profile=lines[0], history=tuple(lines[1:-1]), dynamic=lines[-1], kind="text")


def session_key(headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
    """The session a request belongs to: the `X-Session-Id` header, else the body's `user`."""
    key = headers.get("x-session-id")
    if key is None:
        key = body.get("user")
    if key is None:
        return DEFAULT_SESSION
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_SESSION_ID_CHARS \
            or not key.isprintable():
        msg = (f"the session id (X-Session-Id or 'user') must be 1-{MAX_SESSION_ID_CHARS} "
               f"printable characters, got {key!r:.80}")
        raise GatewayRequestError(msg)
    return key


def lru_victim(keys_oldest_first: Sequence[str], busy: set[str]) -> str | None:
    """The least recently used session without a request in flight, or None if all are busy."""
    for key in keys_oldest_first:
        if key not in busy:
            return key
    return None


def _message(i: int, message: Any, tools: ToolSet | None,
             called: dict[str, str]) -> tuple[str, str | None, str]:
    if not isinstance(message, Mapping):
        raise GatewayRequestError(f"messages[{i}] must be an object with 'role' and 'content'")
    role = message.get("role")
    if role not in ROLES:
        raise GatewayRequestError(f"messages[{i}].role must be one of {ROLES}, got {role!r}")
    calls = message.get("tool_calls")
    if calls and role != "assistant":
        raise GatewayRequestError(f"messages[{i}] has tool_calls: only an assistant's message "
                                  "has them")
    content = message.get("content")
    content = "" if content is None and (calls or role == "tool") else \
        _content_text(i, content)
    if calls:
        written = "; ".join(_call_line(i, j, call, tools, called)
                            for j, call in enumerate(_list(i, calls)))
        content = f"{content.strip()} {written}" if content.strip() else written
    if not content.strip() and role != "tool":
        raise GatewayRequestError(f"messages[{i}].content is empty: nothing to append")
    name = message.get("name")
    if name is not None and (not isinstance(name, str) or "\n" in name):
        raise GatewayRequestError(f"messages[{i}].name must be a one-line string")
    if role == "tool" and name is None:
        name = called.get(message.get("tool_call_id"))    # None: a result of no known call
    return role, name, content


def _list(i: int, calls: Any) -> list:
    if not isinstance(calls, list):
        raise GatewayRequestError(f"messages[{i}].tool_calls must be a list")
    return calls


def _call_line(i: int, j: int, call: Any, tools: ToolSet | None,
               called: dict[str, str]) -> str:
    """One call of an assistant's message, as the model reads it; its id is remembered for
    the tool message that answers it."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or \
            not function["name"]:
        raise GatewayRequestError(f"messages[{i}].tool_calls[{j}] must be {{id, type: "
                                  "'function', function: {name, arguments}}")
    name, arguments = function["name"], function.get("arguments") or "{}"
    if isinstance(call.get("id"), str):
        called[call["id"]] = name
    if tools is None:
        return plain_call_line(name, arguments)
    return tools.call_line(name, arguments)


def _content_text(i: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                msg = (f"messages[{i}].content[{j}] is not a text part: only text content is "
                       "supported")
                raise GatewayRequestError(msg)
            texts.append(part["text"])
        return "".join(texts)
    raise GatewayRequestError(f"messages[{i}].content must be a string or a list of text parts")


def _line(role: str, name: str | None, content: str) -> str:
    who = role if not name else f"{role} ({name})"
    return f"{who}: {content.strip()}".rstrip()

