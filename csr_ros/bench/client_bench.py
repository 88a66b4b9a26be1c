"""What a client of the gateway sees, measured over HTTP: a streamed answer's first piece
against its last, and how often a tool call comes back valid.

    csr-ros gateway --bench stream    run_stream_bench: a long answer streamed, `repeats` times
    csr-ros gateway --bench tools     run_tools_bench: `n` tool requests, required then auto

Both start a gateway in this process (loopback, a free port) over the backend the factory
makes, and talk to it as a client does: httpx, the OpenAI wire format, server-sent events.

stream: each repeat asks for `max_tokens` tokens (a story the default model tells past any
budget) with a new last message, and times from the send to the first content piece and to the
last one. The gateway's `csr.ttft_s` is the reconciler's TTFT of the same query; the decode
time per token is (last - first) / (pieces - 1). A stream that follows the decode has its first
piece within TTFT plus a few tokens' decode; one sent once decoded has first ≈ last.

tools: the same robot tools every time (go_to(room), say(text), turn(degrees)), one session, a
new user message per request (the prefix holds: nothing is appended, only the dynamic part
changes). A call is valid when `check_call` finds it names one of the tools with arguments that
are a JSON object matching that tool's parameters; an answer that is content counts as no call
(for `auto`, the model's choice; `calls_cut_short` counts those that began a call the budget
ended, which the gateway returns as content, never as a call). Every fourth request streams,
so both paths are counted.

Warm-up (the session's first load) is left out of every figure.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import time
from typing import Any, Callable

import httpx

from csr_ros.gateway.app import ServerThread, build_app
from csr_ros.gateway.service import BackendFactory, Gateway, GatewayConfig
from csr_ros.servers import free_port

ROOMS = ("kitchen", "hallway", "office", "living room", "garage", "bedroom")
PEOPLE = ("Ana", "Ben", "Chen", "Dara")
#: ROS-flavoured tools, as an agent framework sends them (langchain-core's schema of typed
#: Python functions)
TOOLS = [
    {"type": "function", "function": {
        "name": "go_to", "description": "Drive the robot to a room.",
        "parameters": {"type": "object", "required": ["room"], "properties": {
            "room": {"type": "string", "enum": list(ROOMS)}}}}},
    {"type": "function", "function": {
        "name": "say", "description": "Say a sentence aloud through the speaker.",
        "parameters": {"type": "object", "required": ["text"], "properties": {
            "text": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "turn", "description": "Turn in place by some degrees (left is positive).",
        "parameters": {"type": "object", "required": ["degrees"], "properties": {
            "degrees": {"type": "integer", "minimum": -180, "maximum": 180}}}}},
]
SYSTEM = "You are the assistant of a home robot. Use the tools to act."
STORY = "Tell me a long story about a robot that patrols a warehouse at night. Part {n}."


def tool_requests(n: int) -> list[str]:
    """`n` user messages that ask for one of the tools' actions (or a question), varied."""
    forms = ("Please go to the {room}.", "Drive to the {room} now.",
             "Tell {person} that dinner is ready.", "Say good morning to {person}.",
             "Turn around, {person} is behind you.", "Turn left by {deg} degrees.",
             "{person} is waiting in the {room}; go there.", "What can you see right now?")
    out = []
    for i in range(n):
        form = forms[i % len(forms)]
        out.append(form.format(room=ROOMS[i % len(ROOMS)], person=PEOPLE[i % len(PEOPLE)],
                               deg=15 * (1 + i % 12)) + f" (request {i + 1})")
    return out


def check_call(call: Any, tools: list[dict]) -> str:
    """"" when `call` (an entry of a message's `tool_calls`) is a function call of one of
    `tools` whose arguments are a JSON object matching that function's parameters: every
    required property, no other, each of its type and in its enum; else what is wrong."""
    try:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if call["type"] != "function" or not call["id"]:
            return "not a function call with an id"
    except (KeyError, TypeError):
        return f"malformed call {call!r:.80}"
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    if name not in schemas:
        return f"{name!r} is not one of the tools"
    try:
        args = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return f"arguments are not JSON: {arguments!r:.80}"
    if not isinstance(args, dict):
        return "arguments are not a JSON object"
    properties = schemas[name].get("properties") or {}
    missing = [p for p in schemas[name].get("required", []) if p not in args]
    extra = [p for p in args if p not in properties]
    if missing or extra:
        return f"{name}: missing {missing}, unknown {extra}"
    for key, value in args.items():
        schema = properties[key]
        kind = schema.get("type")
        fits = {"string": isinstance(value, str),
                "integer": isinstance(value, int) and not isinstance(value, bool),
                "number": isinstance(value, (int, float)) and not isinstance(value, bool),
                "boolean": isinstance(value, bool)}.get(kind, True)
        if not fits:
            return f"{name}: {key}={value!r} is not {kind}"
        if "enum" in schema and value not in schema["enum"]:
            return f"{name}: {key}={value!r} is not one of {schema['enum']}"
        if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
            return f"{name}: {key} is longer than {schema['maxLength']}"
        if kind in ("integer", "number") and not \
                schema.get("minimum", value) <= value <= schema.get("maximum", value):
            return f"{name}: {key}={value!r} is outside [{schema.get('minimum')}, " \
                   f"{schema.get('maximum')}]"
    return ""


def run_stream_bench(factory: BackendFactory, config: GatewayConfig, *, max_tokens: int = 64,
                     repeats: int = 5, api_key: str | None = None,
                     progress: Callable[[str], None] = lambda message: None) -> dict:
    """First and last streamed piece of `repeats` answers of `max_tokens` tokens."""
    rows = []
    with _serving(factory, config, api_key) as (client, gateway):
        progress("warm-up: the session's first load and one answer (not timed)")
        _stream(client, STORY.format(n=0), max_tokens)
        for n in range(1, repeats + 1):
            row = _stream(client, STORY.format(n=n), max_tokens)
            rows.append(row)
            progress(f"answer {n}: first piece {row['first_piece_s'] * 1e3:.0f} ms, last "
                     f"{row['last_piece_s'] * 1e3:.0f} ms, {row['pieces']} pieces, "
                     f"{row['completion_tokens']} tokens")
    med = lambda key: statistics.median(r[key] for r in rows)   # noqa: E731
    return {"bench": "stream", "max_tokens": max_tokens, "repeats": len(rows),
            "first_piece_s_median": med("first_piece_s"),
            "last_piece_s_median": med("last_piece_s"),
            "server_ttft_s_median": med("server_ttft_s"),
            "decode_s_per_token_median": med("decode_s_per_token"),
            "first_after_ttft_s_median": med("first_after_ttft_s"),
            "first_after_ttft_tokens_median": med("first_after_ttft_tokens"),
            "completion_tokens": sorted({r["completion_tokens"] for r in rows}),
            **_machine(), "rows": rows}


def run_tools_bench(factory: BackendFactory, config: GatewayConfig, *, n: int = 100,
                    choices: tuple[str, ...] = ("required", "auto"), max_tokens: int = 64,
                    api_key: str | None = None,
                    progress: Callable[[str], None] = lambda message: None) -> dict:
    """`n` tool requests per tool_choice; how many came back a call, and how many valid."""
    figures = {}
    with _serving(factory, config, api_key) as (client, gateway):
        progress("warm-up: the session's first load (not timed)")
        _ask_tools(client, "Hello.", "required", max_tokens, stream=False)
        for choice in choices:
            calls = valid = content = cut = 0
            invalid: list[str] = []
            started = time.monotonic()
            for i, message in enumerate(tool_requests(n)):
                answer = _ask_tools(client, message, choice, max_tokens, stream=i % 4 == 3)
                for call in answer["tool_calls"]:
                    calls += 1
                    why = check_call(call, TOOLS)
                    valid += not why
                    if why:
                        invalid.append(why)
                content += not answer["tool_calls"]
                cut += bool(answer["not_a_call"])
                if (i + 1) % 25 == 0:
                    progress(f"{choice}: {i + 1}/{n} requests, {calls} calls, {valid} valid")
            figures[choice] = {"requests": n, "calls": calls, "valid_calls": valid,
                               "content_answers": content, "calls_cut_short": cut,
                               "invalid": invalid[:10],
                               "seconds": time.monotonic() - started}
        sessions = gateway.session_stats()
    return {"bench": "tools", "tools": [t["function"]["name"] for t in TOOLS],
            "max_tokens": max_tokens,
            "new_versions": sessions[0]["new_versions"] if sessions else None,
            "choices": figures, **_machine()}


def format_stream(s: dict) -> str:
    ms = lambda v: f"{v * 1e3:.0f} ms"   # noqa: E731
    return "\n".join([
        f"gateway stream bench: {s['repeats']} streamed answers of max_tokens {s['max_tokens']} "
        f"(completion tokens {s['completion_tokens']})",
        f"  first content piece  median {ms(s['first_piece_s_median'])} after the send",
        f"  last content piece   median {ms(s['last_piece_s_median'])}",
        f"  the reconciler's TTFT {ms(s['server_ttft_s_median'])}; decode "
        f"{ms(s['decode_s_per_token_median'])} per token; the first piece came "
        f"{ms(s['first_after_ttft_s_median'])} after TTFT "
        f"({s['first_after_ttft_tokens_median']:.2f} tokens' decode)",
        _load_line(s)])


def format_tools(s: dict) -> str:
    lines = [f"gateway tools bench: tools {', '.join(s['tools'])}; max_tokens "
             f"{s['max_tokens']}; new versions {s['new_versions']}"]
    for choice, f in s["choices"].items():
        share = f"{100.0 * f['valid_calls'] / f['calls']:.0f}%" if f["calls"] else "no call"
        lines.append(f"  tool_choice={choice:<9} {f['requests']} requests: {f['calls']} calls, "
                     f"{f['valid_calls']} valid ({share}), {f['content_answers']} answered "
                     f"in words ({f['calls_cut_short']} of them a call cut short by "
                     f"max_tokens), {f['seconds']:.0f} s")
        lines += [f"    invalid: {why}" for why in f["invalid"]]
    lines.append(_load_line(s))
    return "\n".join(lines)


class _serving:
    """A gateway on loopback over `factory`, and an httpx client of it."""

    def __init__(self, factory: BackendFactory, config: GatewayConfig, api_key: str | None):
        self.gateway = Gateway(factory, config)
        self.server = ServerThread(build_app(self.gateway, api_key=api_key), free_port())
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def __enter__(self):
        self.server.__enter__()
        self.client = httpx.Client(base_url=self.server.url, timeout=httpx.Timeout(600.0),
                                   headers={**self.headers, "X-Session-Id": "bench"})
        return self.client, self.gateway

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.server.__exit__(*exc)
        self.gateway.close()


def _stream(client: httpx.Client, message: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": message}],
            "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    started = time.monotonic()
    times: list[float] = []
    csr, usage = None, None
    for event in _events(client, body):
        for choice in event.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                times.append(time.monotonic() - started)
        csr = event.get("csr", csr)
        usage = event.get("usage") or usage
    if not times:
        raise AssertionError("the stream held no content")
    decode = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    return {"first_piece_s": times[0], "last_piece_s": times[-1], "pieces": len(times),
            "completion_tokens": usage["completion_tokens"], "server_ttft_s": csr["ttft_s"],
            "decode_s_per_token": decode, "first_after_ttft_s": times[0] - csr["ttft_s"],
            "first_after_ttft_tokens": (times[0] - csr["ttft_s"]) / decode if decode else 0.0}


def _ask_tools(client: httpx.Client, message: str, choice: str, max_tokens: int, *,
               stream: bool) -> dict:
    body = {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": message}],
            "tools": TOOLS, "tool_choice": choice, "max_tokens": max_tokens}
    if not stream:
        response = client.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            raise AssertionError(f"the gateway answered {response.status_code}: "
                                 f"{response.text}")
        answer = response.json()
        message = answer["choices"][0]["message"]
        return {"tool_calls": message.get("tool_calls") or [], "content": message["content"],
                "not_a_call": answer["csr"].get("not_a_call", "")}
    calls: dict[int, dict] = {}
    content, csr = "", {}
    for event in _events(client, {**body, "stream": True}):
        csr = event.get("csr", csr)
        for choice_event in event.get("choices") or ():
            delta = choice_event.get("delta") or {}
            content += delta.get("content") or ""
            for part in delta.get("tool_calls") or ():     # accumulated as clients do
                call = calls.setdefault(part["index"], {"id": "", "type": "function",
                                                        "function": {"name": "",
                                                                     "arguments": ""}})
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    return {"tool_calls": [calls[i] for i in sorted(calls)], "content": content,
            "not_a_call": csr.get("not_a_call", "")}


def _events(client: httpx.Client, body: dict):
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise AssertionError(f"the gateway answered {response.status_code}: "
                                 f"{response.text}")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    raise AssertionError(f"the stream ended with an error: {event['error']}")
                yield event


def _machine() -> dict:
    return {"loadavg": os.getloadavg(), "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def _load_line(s: dict) -> str:
    return f"  load average at the end: {s['loadavg'][0]:.2f} on {s['cpu_count']} CPUs"
