"""`csr-ros gateway` as a real process on loopback, over real llama.cpp servers, with the
`openai` client package and with plain httpx."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from csr_ros.bench.client_bench import TOOLS, check_call, tool_requests
from csr_ros.servers import LOOPBACK, ManagedServer, free_port
from support.gateway_clients import follow_stream, leave_after_first_piece, wait_until_idle

pytestmark = [pytest.mark.server, pytest.mark.slow]
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

SYSTEM = {"role": "system", "content": "You are the policy of a home robot. Answer briefly."}


class GatewayProcess:
    """`csr-ros gateway` over the servers at `urls`; `env_key`: the API key it is given in
    $CSR_ROS_API_KEY (else it runs without one, whatever this environment holds)."""

    def __init__(self, urls: tuple[str, str], log_path: Path, *extra: str,
                 env_key: str | None = None):
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = log_path
        self.key = env_key
        env = {k: v for k, v in os.environ.items() if k != "CSR_ROS_API_KEY"}
        if env_key is not None:
            env["CSR_ROS_API_KEY"] = env_key
        self._server = ManagedServer(
            name=f"gateway:{self.port}", url=self.url, log_path=log_path, env=env,
            command=[sys.executable, "-P", "-m", "csr_ros.cli", "gateway", "--resource",
                     "openai", "--r1", urls[0], "--r2", urls[1], "--port", str(self.port),
                     "--max-context-tokens", "4096", "--tau-mem", "3072", *extra])

    def __enter__(self) -> "GatewayProcess":
        if self.key is None:
            self._server.start(timeout_s=120.0)
            return self
        self._server.launch()           # every route wants the key, /health too
        for _ in range(1200):
            try:
                if httpx.get(f"{self.url}/health", headers=self.auth()).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self._server.stop()
        raise AssertionError(f"the gateway did not start: {self.log()[-2000:]}")

    def __exit__(self, *exc) -> None:
        self._server.stop()

    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def client(self):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key or "unused",
                             max_retries=0, timeout=300.0)

    def sessions(self) -> dict:
        return {s["session"]: s for s in httpx.get(f"{self.url}/v1/csr/sessions",
                                                   headers=self.auth()).json()["sessions"]}

    def log(self) -> str:
        return self.log_path.read_text()


@pytest.fixture(scope="module")
def gateway(llama_server, tmp_path_factory):  # noqa: F811
    """One gateway over one llama.cpp server (R1 and R2 on the same server)."""
    log_path = tmp_path_factory.mktemp("gateway") / "gateway.log"
    with GatewayProcess((llama_server.url, llama_server.url), log_path) as process:
        yield process


def post(gateway, path: str, body: dict, session: str | None = None) -> httpx.Response:
    headers = {} if session is None else {"X-Session-Id": session}
    return httpx.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=300.0)


def test_the_openai_client_gets_the_cached_state_of_an_append_only_chat(gateway):
    client = gateway.client()
    messages = [SYSTEM, {"role": "user", "content": "Where is the red cup?"}]
    first = client.chat.completions.create(model="csr-ros", messages=messages, max_tokens=8,
                                           user="cached-chat")
    answer = first.choices[0].message.content
    assert answer and first.choices[0].finish_reason in ("stop", "length")
    assert first.model_extra["csr"]["new_version"] is True
    assert first.usage.completion_tokens >= 1
    messages += [{"role": "assistant", "content": answer},
                 {"role": "user", "content": "And where are the keys?"}]
    second = client.chat.completions.create(model="csr-ros", messages=messages, max_tokens=8,
                                            user="cached-chat")
    csr = second.model_extra["csr"]
    # the two messages the first answer added were appended; the first request's static part
    # (the profile) and then those chunks are what the resource held when it was asked
    assert csr["new_version"] is False and csr["version"] == 1
    assert csr["appended"] == 2 and csr["held"] == 0
    assert second.usage.prompt_tokens == csr["n_static"] + csr["n_dynamic"]
    assert second.usage.prompt_tokens_details.cached_tokens >= \
        first.model_extra["csr"]["n_static"]
    assert second.usage.prompt_tokens_details.cached_tokens <= csr["n_static"]
    messages += [{"role": "assistant", "content": second.choices[0].message.content},
                 {"role": "user", "content": "Thanks. What next?"}]
    third = client.chat.completions.create(model="csr-ros", messages=messages, max_tokens=8,
                                           user="cached-chat")
    assert third.model_extra["csr"]["held"] == 2 and third.model_extra["csr"]["appended"] == 2
    assert third.usage.prompt_tokens_details.cached_tokens >= csr["n_static"]
    assert gateway.sessions()["cached-chat"]["new_versions"] == 0
    assert gateway.sessions()["cached-chat"]["messages"] == 4


def test_a_streamed_chat_over_the_openai_client_carries_tokens_and_usage(gateway):
    client = gateway.client()
    messages = [SYSTEM, {"role": "user", "content": "Say hello to Ana."}]
    stream = client.chat.completions.create(model="csr-ros", messages=messages, max_tokens=8,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_headers={"X-Session-Id": "streamed"})
    events = list(stream)
    pieces = [e.choices[0].delta.content for e in events if e.choices and
              e.choices[0].delta.content]
    finishes = [e.choices[0].finish_reason for e in events if e.choices and
                e.choices[0].finish_reason]
    usage = events[-1].usage
    assert events[0].choices[0].delta.role == "assistant"
    assert pieces and finishes in (["stop"], ["length"])
    assert 1 <= len(pieces) <= usage.completion_tokens <= 8
    (first_csr,) = [e.model_extra["csr"] for e in events if "csr" in e.model_extra]
    assert events[-2].choices[0].finish_reason, "csr rides on the event that finishes"
    assert usage.prompt_tokens == first_csr["n_static"] + first_csr["n_dynamic"]
    messages += [{"role": "assistant", "content": "".join(pieces)},
                 {"role": "user", "content": "Now say goodbye."}]
    again = list(client.chat.completions.create(
        model="csr-ros", messages=messages, max_tokens=8, stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-Session-Id": "streamed"}))
    assert again[-1].usage.prompt_tokens_details.cached_tokens >= first_csr["n_static"]
    assert again[-2].model_extra["csr"]["new_version"] is False
    assert again[-2].model_extra["csr"]["appended"] == 2


COUNT = "Count from 1 to 300, one number after the other, separated by commas."


def test_streamed_pieces_reach_the_openai_client_while_the_server_still_decodes(gateway):
    client = gateway.client()
    stream = client.chat.completions.create(
        model="csr-ros", messages=[SYSTEM, {"role": "user", "content": COUNT}], max_tokens=64,
        stream=True, stream_options={"include_usage": True},
        extra_headers={"X-Session-Id": "live"})
    pieces, during, event = follow_stream(stream, lambda: gateway.sessions()["live"])
    # the order of events: a piece had arrived while the gateway was still decoding, and the
    # text it had decoded then was shorter than the answer that came after
    assert during["decoding"] is True and during["in_flight"] == 1
    assert during["decoded_chars"] < len("".join(pieces))
    assert len(pieces) > 8 and event.usage.completion_tokens >= len(pieces)
    after = gateway.sessions()["live"]
    assert after["decoding"] is False and after["decoded_chars"] == len("".join(pieces))


def test_a_client_that_disconnects_mid_stream_stops_the_decode_and_the_session_goes_on(
        gateway):
    messages = [SYSTEM, {"role": "user", "content": "Ana and Ben are in the kitchen."},
                {"role": "assistant", "content": "say(hello)"},
                {"role": "user", "content": COUNT}]
    body = {"messages": messages, "max_tokens": 200}
    leave_after_first_piece(gateway.url, body, {"X-Session-Id": "gone"})
    session = wait_until_idle(lambda: gateway.sessions()["gone"])
    assert session["cancelled"] == 1, "the decode stopped before its end"
    assert session["decoding"] is False and session["messages"] == 2
    full = post(gateway, "/v1/chat/completions", body, session="gone")
    assert full.status_code == 200, full.text
    csr = full.json()["csr"]
    # the session held what it had appended: the resend extends it, nothing is appended again
    assert not csr["new_version"] and csr["held"] == 2 and csr["appended"] == 0
    assert session["decoded_chars"] < len(full.json()["choices"][0]["message"]["content"])
    assert gateway.sessions()["gone"]["new_versions"] == 0


def test_a_client_that_breaks_the_prefix_starts_a_visible_new_version(gateway):
    history = [SYSTEM, {"role": "user", "content": "Go to the kitchen."},
               {"role": "assistant", "content": "go_to(kitchen)"}]
    body = {"messages": history + [{"role": "user", "content": "What do you see?"}],
            "max_tokens": 4}
    first = post(gateway, "/v1/chat/completions", body, session="breaker")
    assert first.status_code == 200, first.text
    assert first.headers["X-CSR-Version"] == "1"
    edited = [SYSTEM, {"role": "user", "content": "Go to the office."}] + history[2:]
    second = post(gateway, "/v1/chat/completions",
                  {"messages": edited + [{"role": "user", "content": "What do you see?"}],
                   "max_tokens": 4}, session="breaker")
    assert second.status_code == 200, second.text
    assert second.headers["X-CSR-New-Version"] == "1"
    assert second.headers["X-CSR-Version"] == "2"
    csr = second.json()["csr"]
    assert csr["new_version"] and "history message 0 differs" in csr["reason"]
    assert csr["appended"] == 2
    assert gateway.sessions()["breaker"]["new_versions"] == 1
    assert "session 'breaker': version 2 (history message 0 differs" in gateway.log()
    # the new version is held: resending it extends it again
    third = post(gateway, "/v1/chat/completions",
                 {"messages": edited + [{"role": "user", "content": "Anything else?"}],
                  "max_tokens": 4}, session="breaker")
    assert third.headers["X-CSR-New-Version"] == "0" and third.json()["csr"]["held"] == 2


def test_two_clients_at_once_get_two_sessions_with_their_own_state(gateway):
    conversations = {
        "robot-a": [SYSTEM, {"role": "user", "content": "Battery at 80 percent."},
                    {"role": "assistant", "content": "wait()"}],
        "robot-b": [SYSTEM, {"role": "user", "content": "Ana asks for the keys, which lie on "
                                                        "the hallway shelf next to the door."},
                    {"role": "assistant", "content": "go_to(hallway)"},
                    {"role": "user", "content": "Arrived in the hallway."},
                    {"role": "assistant", "content": "pick(keys)"}]}
    answers: dict[str, list[httpx.Response]] = {"robot-a": [], "robot-b": []}

    def converse(key: str) -> None:
        for turn in ("What now?", "And after that?"):
            body = {"messages": conversations[key] + [{"role": "user", "content": turn}],
                    "max_tokens": 4}
            if key == "robot-a":   # one client keys by header, the other by `user`
                response = post(gateway, "/v1/chat/completions", body, session=key)
            else:
                response = post(gateway, "/v1/chat/completions", {**body, "user": key})
            answers[key].append(response)

    threads = [threading.Thread(target=converse, args=(key,)) for key in conversations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    sessions = gateway.sessions()
    for key, history in conversations.items():
        first, second = answers[key]
        assert first.status_code == second.status_code == 200, (first.text, second.text)
        assert first.headers["X-CSR-Session"] == key
        assert second.json()["csr"]["new_version"] is False
        assert second.json()["csr"]["held"] == len(history) - 1
        assert sessions[key]["messages"] == len(history) - 1
        assert sessions[key]["new_versions"] == 0
    # each session's state holds its own history: the longer conversation, more tokens
    assert answers["robot-b"][1].json()["csr"]["n_static"] > \
        answers["robot-a"][1].json()["csr"]["n_static"]


def test_completions_over_httpx_stream_and_not_with_usage(gateway):
    prompt = "Robot log, oldest first.\nt=1 odom x=0.0 y=0.0\nt=2 camera: red cup\nNext action:"
    plain = post(gateway, "/v1/completions", {"prompt": prompt, "max_tokens": 4},
                 session="text")
    assert plain.status_code == 200, plain.text
    body = plain.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"]
    assert body["csr"]["appended"] == 2 and body["csr"]["new_version"]
    assert body["usage"]["prompt_tokens"] == body["csr"]["n_static"] + body["csr"]["n_dynamic"]
    longer = prompt.replace("Next action:", "t=3 lidar: clear\nNext action:")
    with httpx.stream("POST", f"{gateway.url}/v1/completions", timeout=300.0,
                      headers={"X-Session-Id": "text"},
                      json={"prompt": longer, "max_tokens": 4, "stream": True,
                            "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    import json

    events = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    csr = next(e["csr"] for e in events if "csr" in e)
    usage = events[-1]["usage"]
    assert text and csr["appended"] == 1 and csr["held"] == 2 and not csr["new_version"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= body["csr"]["n_static"]


def test_bad_requests_get_openai_style_errors_and_leave_the_session_as_it_was(gateway):
    good = {"messages": [SYSTEM, {"role": "user", "content": "Hello."}], "max_tokens": 2}
    assert post(gateway, "/v1/chat/completions", good, session="strict").status_code == 200
    before = gateway.sessions()["strict"]
    cases = [
        ({"messages": [{"role": "user", "content": ""}]}, "content is empty"),
        ({**good, "max_tokens": 100000}, "max_tokens must be an integer"),
        ({**good, "tools": [{"type": "function"}]}, "tools[0] must be {type: 'function'"),
        ({**good, "tools": TOOLS, "tool_choice": {"type": "function",
                                                  "function": {"name": "fly"}}},
         "names the function 'fly', which is not in 'tools'"),
        ({**good, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "string", "pattern": "^a"}}}},
         "uses ['pattern'], which the gateway cannot guarantee"),
        ({**good, "logprobs": True}, "unsupported request fields ['logprobs']"),
        ({**good, "model": "gpt-4"}, "serves the model 'csr-ros'"),
        ({**good, "n": 2}, "only n=1"),
        ({**good, "stop": [1]}, "'stop' must be"),
    ]
    for body, match in cases:
        response = post(gateway, "/v1/chat/completions", body, session="strict")
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert match in error["message"] and error["type"] == "invalid_request_error"
    raw = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{not json",
                     headers={"X-Session-Id": "strict"})
    assert raw.status_code == 400 and "not JSON" in raw.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="last message is from 'assistant'"):
        gateway.client().chat.completions.create(
            model="csr-ros", messages=[{"role": "assistant", "content": "hi"}],
            extra_headers={"X-Session-Id": "strict"})
    after = gateway.sessions()["strict"]
    assert (after["version"], after["messages"], after["new_versions"]) == \
        (before["version"], before["messages"], before["new_versions"])


def test_sessions_beyond_the_bound_close_the_least_recently_used(
        llama_server, tmp_path):  # noqa: F811
    with GatewayProcess((llama_server.url, llama_server.url), tmp_path / "gateway.log",
                        "--max-sessions", "2") as process:
        body = {"messages": [SYSTEM, {"role": "user", "content": "Hello."}], "max_tokens": 2}
        for key in ("one", "two", "one", "three"):
            assert post(process, "/v1/chat/completions", body, session=key).status_code == 200
        stats = httpx.get(f"{process.url}/v1/csr/sessions").json()
        assert sorted(s["session"] for s in stats["sessions"]) == ["one", "three"]
        assert stats["sessions_closed"] == 1 and stats["max_sessions"] == 2
        assert "session 'two' closed to make room for 'three'" in process.log()


def test_asr_evicts_in_the_background_behind_the_gateway_and_resends_still_extend(
        llama_server_pair, tmp_path):  # noqa: F811
    r1, r2 = llama_server_pair
    with GatewayProcess((r1.url, r2.url), tmp_path / "gateway.log", "--tau-mem", "384",
                        "--max-context-tokens", "2048", "--reserve-tokens", "128",
                        "--n-catchup", "16") as process:
        messages = [SYSTEM]
        versions = []
        for i in range(40):
            messages.append({"role": "user", "content": f"t={i}.0s odometry x={0.3 * i:.1f} "
                                                        f"y={0.2 * i:.1f}, camera sees the "
                                                        f"red cup at {1 + i % 3}.5 m"})
            response = post(process, "/v1/chat/completions",
                            {"messages": messages + [{"role": "user", "content": "Action?"}],
                             "max_tokens": 2}, session="asr")
            assert response.status_code == 200, response.text
            csr = response.json()["csr"]
            assert not csr["new_version"] or i == 0
            versions.append(csr["state_version"])
            rec = process.sessions()["asr"]["reconciler"]
            if rec["swaps"] >= 2:
                break
        session = process.sessions()["asr"]
        rec = session["reconciler"]
        assert rec["swaps"] >= 2, rec
        assert rec["fallbacks"] == 0 and rec["sync_evictions"] == 0
        assert session["new_versions"] == 0 and session["messages"] == len(messages) - 1
        assert versions == sorted(versions) and versions[-1] >= 1
        # the state holds fewer chunks than the transcript: old ones were evicted
        assert rec["n_chunks"] < session["messages"]


def test_a_new_session_while_every_session_is_busy_gets_429_and_nothing_is_closed(
        llama_server):  # noqa: F811
    """In-process gateway over the real server; its backend factory waits for an event, which
    holds the first session's request in flight for as long as the test needs."""
    from csr_ros.gateway.app import ServerThread, build_app
    from csr_ros.gateway.service import Backend, Gateway, GatewayConfig
    from csr_ros.reconcile.machine import ReconcileConfig
    from csr_ros.resources.factory import make_resource

    release = threading.Event()

    def factory(key: str) -> Backend:
        release.wait(120)
        resources = [make_resource("openai", url=llama_server.url, name=name)
                     for name in ("r1", "r2")]
        return Backend(resources, resources[0].tokenizer, resources[0].state_mode)

    gateway = Gateway(factory, GatewayConfig(ReconcileConfig(tau_mem_tokens=2048,
                                                             max_context_tokens=4096),
                                             max_sessions=1))
    body = {"messages": [SYSTEM, {"role": "user", "content": "Hello."}], "max_tokens": 2}
    held: list[httpx.Response] = []
    try:
        with ServerThread(build_app(gateway), free_port()) as server:
            first = threading.Thread(target=lambda: held.append(httpx.post(
                f"{server.url}/v1/chat/completions", json=body, timeout=300.0,
                headers={"X-Session-Id": "held"})))
            first.start()
            for _ in range(1200):       # until the first request is in flight (bounded)
                if any(s["in_flight"] for s in gateway.session_stats()):
                    break
                threading.Event().wait(0.05)
            busy = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60.0,
                              headers={"X-Session-Id": "other"})
            assert busy.status_code == 429, busy.text
            assert "all 1 sessions have a request in flight" in busy.json()["error"]["message"]
            assert gateway.sessions_closed == 0
            release.set()
            first.join(300)
            assert held[0].status_code == 200, held[0].text
            # the first session is idle now: the other one takes its place
            again = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300.0,
                               headers={"X-Session-Id": "other"})
            assert again.status_code == 200, again.text
            assert gateway.sessions_closed == 1
            assert [s["session"] for s in gateway.session_stats()] == ["other"]
    finally:
        release.set()
        gateway.close()


def test_a_dead_server_gets_503_keeps_the_messages_and_the_next_request_extends(
        fresh_llama_server, tmp_path):  # noqa: F811
    server = fresh_llama_server
    with GatewayProcess((server.url, server.url), tmp_path / "gateway.log") as process:
        history = [SYSTEM, {"role": "user", "content": "Go to the kitchen."}]
        first = post(process, "/v1/chat/completions",
                     {"messages": history, "max_tokens": 2}, session="fault")
        assert first.status_code == 200, first.text
        history += [{"role": "assistant", "content": "go_to(kitchen)"},
                    {"role": "user", "content": "Arrived. What now?"}]
        server.kill()
        failed = post(process, "/v1/chat/completions",
                      {"messages": history, "max_tokens": 2}, session="fault")
        assert failed.status_code == 503, failed.text
        error = failed.json()["error"]
        assert error["type"] == "server_error" and "the messages are kept" in error["message"]
        assert process.sessions()["fault"]["messages"] == 2
        server.start()
        again = post(process, "/v1/chat/completions",
                     {"messages": history, "max_tokens": 2}, session="fault")
        assert again.status_code == 200, again.text
        csr = again.json()["csr"]
        assert not csr["new_version"] and csr["held"] == 2 and csr["appended"] == 0
        assert process.sessions()["fault"]["new_versions"] == 0


# -- tools as typed actions --------------------------------------------------------------------

def calls_of(response) -> list[dict]:
    return [call.model_dump() for call in response.choices[0].message.tool_calls or ()]


def test_required_tool_calls_over_a_llamacpp_server_are_always_valid_and_stream_whole(gateway):
    client = gateway.client()
    system = {"role": "system", "content": "You are the assistant of a home robot."}
    for i, message in enumerate(tool_requests(16)):
        kwargs = dict(model="csr-ros", messages=[system, {"role": "user", "content": message}],
                      tools=TOOLS, tool_choice="required", user="tools")
        if i % 4:
            response = client.chat.completions.create(**kwargs)
            (call,) = calls_of(response)
            assert response.choices[0].finish_reason == "tool_calls"
            assert response.choices[0].message.content is None
        else:
            events = list(client.chat.completions.create(**kwargs, stream=True))
            deltas = [e.choices[0].delta for e in events if e.choices]
            assert not any(d.content for d in deltas), "a call never streams as content"
            (part,) = [tc for d in deltas for tc in d.tool_calls or ()]
            call = {"id": part.id, "type": part.type, "function": part.function.model_dump()}
            assert part.index == 0 and events[-1].choices[0].finish_reason == "tool_calls"
        assert check_call(call, TOOLS) == "", (message, call)
    assert gateway.sessions()["tools"]["new_versions"] == 0, "the tools stay in the prefix"


def test_a_tool_result_is_appended_and_the_next_turn_extends_the_session(gateway):
    client = gateway.client()
    messages = [SYSTEM, {"role": "user", "content": "Please go to the kitchen."}]
    first = client.chat.completions.create(model="csr-ros", messages=messages, tools=TOOLS,
                                           tool_choice={"type": "function",
                                                        "function": {"name": "go_to"}},
                                           user="loop")
    (call,) = calls_of(first)
    assert call["function"]["name"] == "go_to" and check_call(call, TOOLS) == ""
    room = json.loads(call["function"]["arguments"])["room"]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call["id"], "content": f"arrived: {room}"}]
    second = client.chat.completions.create(model="csr-ros", messages=messages, tools=TOOLS,
                                            tool_choice="none", max_tokens=16, user="loop")
    csr = second.model_extra["csr"]
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    # the user message and the call were appended; the tool's result was the dynamic part
    assert not csr["new_version"] and csr["appended"] == 2 and csr["held"] == 0
    messages += [{"role": "assistant", "content": second.choices[0].message.content},
                 {"role": "user", "content": "Now say hello."}]
    third = client.chat.completions.create(model="csr-ros", messages=messages, tools=TOOLS,
                                           tool_choice="required", user="loop")
    assert not third.model_extra["csr"]["new_version"]
    assert third.model_extra["csr"]["held"] == 2 and third.model_extra["csr"]["appended"] == 2
    assert third.usage.prompt_tokens_details.cached_tokens >= csr["n_static"]
    assert check_call(calls_of(third)[0], TOOLS) == ""
    assert gateway.sessions()["loop"]["new_versions"] == 0


def test_a_json_schema_response_format_comes_back_as_json_of_that_schema(gateway):
    schema = {"type": "object", "properties": {
        "room": {"type": "string", "enum": ["kitchen", "office"]},
        "urgent": {"type": "boolean"}, "steps": {"type": "integer"}}, "required": ["room"]}
    response = gateway.client().chat.completions.create(
        model="csr-ros", user="json", max_tokens=48,
        messages=[SYSTEM, {"role": "user", "content": "Where should the robot go next?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "plan",
                                                                "schema": schema}})
    value = json.loads(response.choices[0].message.content)
    assert set(value) == {"room", "urgent", "steps"} and value["room"] in ("kitchen", "office")
    assert isinstance(value["urgent"], bool) and isinstance(value["steps"], int)


# -- the API key -------------------------------------------------------------------------------

def test_the_api_key_is_refused_or_accepted_on_every_route(llama_server, tmp_path):
    with GatewayProcess((llama_server.url, llama_server.url), tmp_path / "gateway.log",
                        env_key="robot-key") as process:
        body = {"messages": [SYSTEM, {"role": "user", "content": "Hello."}], "max_tokens": 2}
        for headers, match in (({}, "needs its API key"),
                               ({"Authorization": "Bearer wrong"}, "not this gateway's"),
                               ({"Authorization": "robot-key"}, "needs its API key")):
            for method, path in (("GET", "/health"), ("GET", "/v1/models"),
                                 ("GET", "/v1/csr/sessions"),
                                 ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")):
                refused = httpx.request(method, f"{process.url}{path}", headers=headers,
                                        json=body)
                assert refused.status_code == 401, (path, headers, refused.text)
                assert match in refused.json()["error"]["message"]
                assert refused.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{process.url}/v1", api_key="wrong",
                          max_retries=0).models.list()
        answer = process.client().chat.completions.create(model="csr-ros", **body)
        assert answer.choices[0].message.content
        assert [m.id for m in process.client().models.list()] == ["csr-ros"]
        assert process.sessions()["default"]["messages"] == 0    # /v1/csr/sessions, keyed


def test_a_gateway_beyond_loopback_without_a_key_refuses_to_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CSR_ROS_API_KEY"}
    run = subprocess.run([sys.executable, "-P", "-m", "csr_ros.cli", "gateway", "--host",
                          "0.0.0.0", "--port", str(free_port()), "--resource", "openai",
                          "--r1", "http://127.0.0.1:9", "--r2", "http://127.0.0.1:9"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--host 0.0.0.0 serves beyond this machine: give an API key" in run.stderr
    assert "--insecure-no-auth" in run.stderr


def test_the_client_benches_report_streamed_pieces_and_valid_tool_calls(llama_server, tmp_path):
    common = ["--resource", "openai", "--r1", llama_server.url, "--r2", llama_server.url,
              "--max-context-tokens", "4096", "--tau-mem", "3072"]
    stream_json, tools_json = tmp_path / "stream.json", tmp_path / "tools.json"
    for args, out in ((["--bench", "stream", "--repeats", "2", "--bench-max-tokens", "16"],
                       stream_json),
                      (["--bench", "tools", "--requests", "6", "--tool-choices", "required"],
                       tools_json)):
        run = subprocess.run([sys.executable, "-P", "-m", "csr_ros.cli", "gateway", *args,
                              *common, "--json", str(out)], capture_output=True, text=True,
                             timeout=1200)
        assert run.returncode == 0, run.stderr[-3000:]
    stream = json.loads(stream_json.read_text())
    assert stream["repeats"] == 2 and stream["completion_tokens"] == [16]
    assert all(r["pieces"] > 1 and r["server_ttft_s"] > 0 for r in stream["rows"])
    tools = json.loads(tools_json.read_text())["choices"]["required"]
    assert tools["requests"] == tools["calls"] == tools["valid_calls"] == 6
    assert tools["content_answers"] == 0 and tools["invalid"] == []
