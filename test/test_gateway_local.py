"""`csr-ros gateway --bench` over the default model's local engines in worker processes: the
gateway's session holds the same tokens as a state built straight from the messages, reports
the engine's cached tokens, and answers as the engine does when asked directly."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Literal

import pytest
from support.gateway_clients import follow_stream, leave_after_first_piece, wait_until_idle

pytestmark = pytest.mark.slow
pytest.importorskip("torch")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def test_the_gateway_bench_compares_the_same_queries_through_it_and_straight_to_the_engine(
        tmp_path):
    out = tmp_path / "gateway.json"
    run = subprocess.run(
        [sys.executable, "-P", "-m", "csr_ros.cli", "gateway", "--bench", "--n", "256",
         "--m", "32", "--repeats", "2", "--threads", "1", "--max-context-tokens", "2048",
         "--tau-mem", "1024", "--json", str(out)],
        capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gateway / direct" in run.stdout
    s = json.loads(out.read_text())
    n, m = s["n_history_tokens"], s["m_dynamic_tokens"]
    assert n >= 256 and m == 32 and s["repeats"] == 2 == len(s["rows"])
    # the local engine holds the whole history: every query reuses all of it
    assert s["cached_tokens"] == [n] and s["prompt_tokens"] == [n + m]
    assert all(r["n_static"] == n and r["n_dynamic"] == m for r in s["rows"])
    assert s["same_answer"] is True and s["new_versions"] == 0
    assert all(r["gateway_ttft_s"] > 0 and r["direct_ttft_s"] > 0 for r in s["rows"])
    assert s["ratio_median"] == pytest.approx(s["gateway_ttft_s_median"]
                                              / s["direct_ttft_s_median"])


# -- a gateway on the default model's local engines, as a client sees it ------------------------

KEY = "local-test-key"
SYSTEM = {"role": "system", "content": "You are the assistant of a home robot."}
COUNT = "Count from 1 to 300, one number after the other, separated by commas."


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """An in-process gateway (loopback, API key) over local engines in worker processes."""
    from csr_ros.gateway.app import ServerThread, build_app
    from csr_ros.gateway.service import Gateway, GatewayConfig, backend_factory
    from csr_ros.reconcile.machine import ReconcileConfig
    from csr_ros.servers import free_port

    factory = backend_factory("local", model="smollm2", threads=1, max_context_tokens=2048,
                              tau_mem_tokens=1024)
    gateway = Gateway(factory, GatewayConfig(ReconcileConfig(tau_mem_tokens=1024,
                                                             max_context_tokens=2048),
                                             max_sessions=2))
    try:
        with ServerThread(build_app(gateway, api_key=KEY), free_port()) as server:
            yield server, gateway
    finally:
        gateway.close()


def client_of(local):
    import openai

    server, _ = local
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0,
                         timeout=600.0)


def session(local, key: str) -> dict:
    _, gateway = local
    return {s["session"]: s for s in gateway.session_stats()}[key]


def test_streamed_pieces_reach_the_openai_client_while_the_local_engine_still_decodes(local):
    stream = client_of(local).chat.completions.create(
        model="csr-ros", messages=[SYSTEM, {"role": "user", "content": COUNT}], max_tokens=64,
        stream=True, stream_options={"include_usage": True}, user="live")
    pieces, during, event = follow_stream(stream, lambda: session(local, "live"))
    # a piece was in the client's hands while the engine, in its worker process, had decoded
    # less than the answer that came after it
    assert during["decoding"] is True and during["decoded_chars"] < len("".join(pieces))
    assert len(pieces) > 8 and event.usage.completion_tokens >= len(pieces)
    assert session(local, "live")["decoded_chars"] == len("".join(pieces))


def test_a_client_that_disconnects_stops_the_decode_in_the_worker_process(local):
    server, _ = local
    messages = [SYSTEM, {"role": "user", "content": "Ana and Ben are in the kitchen."},
                {"role": "assistant", "content": "Hello Ana and Ben."},
                {"role": "user", "content": COUNT}]
    body = {"messages": messages, "max_tokens": 200, "user": "live"}
    before = session(local, "live")
    leave_after_first_piece(server.url, body, {"Authorization": f"Bearer {KEY}"})
    after = wait_until_idle(lambda: session(local, "live"))
    assert after["cancelled"] == before["cancelled"] + 1, "the decode stopped before its end"
    assert after["messages"] == 2 and not after["decoding"]
    # the worker's engine rolled back to its committed boundary: the resend extends the
    # session, and answers as a decode that was never stopped
    full = client_of(local).chat.completions.create(model="csr-ros", messages=messages,
                                                    max_tokens=200, user="live")
    csr = full.model_extra["csr"]
    assert not csr["new_version"] and csr["held"] == 2 and csr["appended"] == 0
    assert full.usage.prompt_tokens_details.cached_tokens == csr["n_static"]
    assert after["decoded_chars"] < len(full.choices[0].message.content)


def test_required_tool_calls_on_the_default_model_are_always_valid(local):
    from csr_ros.bench.client_bench import TOOLS, check_call, tool_requests

    client = client_of(local)
    for i, message in enumerate(tool_requests(24)):
        kwargs = dict(model="csr-ros", messages=[SYSTEM, {"role": "user", "content": message}],
                      tools=TOOLS, tool_choice="required", user="robot-1")
        if i % 3:
            response = client.chat.completions.create(**kwargs)
            (call,) = response.choices[0].message.tool_calls
            call = call.model_dump()
            assert response.choices[0].finish_reason == "tool_calls"
        else:
            events = list(client.chat.completions.create(**kwargs, stream=True))
            (part,) = [tc for e in events if e.choices for tc in e.choices[0].delta.tool_calls
                       or ()]
            call = {"id": part.id, "type": part.type, "function": part.function.model_dump()}
        assert check_call(call, TOOLS) == "", (message, call)


def test_langchain_parses_the_calls_and_a_two_step_agent_loop_runs(local):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    server, _ = local
    ran: list[tuple[str, dict]] = []

    @tool
    def go_to(room: Literal["kitchen", "hallway", "office"]) -> str:
        """Drive the robot to a room."""
        ran.append(("go_to", {"room": room}))
        return f"arrived in the {room}"

    @tool
    def say(text: str) -> str:
        """Say a sentence aloud."""
        ran.append(("say", {"text": text}))
        return "said"

    tools = {t.name: t for t in (go_to, say)}
    llm = ChatOpenAI(base_url=f"{server.url}/v1", api_key=KEY, model="csr-ros", max_tokens=48,
                     max_retries=0, default_headers={"X-Session-Id": "langchain"})
    act = llm.bind_tools(list(tools.values()), tool_choice="required")
    messages = [SystemMessage("You are a home robot."),
                HumanMessage("Ana asks you to come to the kitchen.")]
    call = act.invoke(messages)
    assert isinstance(call, AIMessage) and len(call.tool_calls) == 1
    assert not call.invalid_tool_calls and call.tool_calls[0]["id"].startswith("call_")
    assert call.tool_calls[0]["name"] in tools
    messages.append(call)
    result = tools[call.tool_calls[0]["name"]].invoke(call.tool_calls[0])
    assert isinstance(result, ToolMessage) and ran == [(call.tool_calls[0]["name"],
                                                        call.tool_calls[0]["args"])]
    messages.append(result)
    final = llm.bind_tools(list(tools.values()), tool_choice="none").invoke(messages)
    assert final.content and not final.tool_calls
    held = session(local, "langchain")
    assert held["new_versions"] == 0 and held["messages"] == 2, "the loop stayed append-only"
    # streamed, LangChain puts the call back together from its chunks
    chunks = list(act.stream(messages[:2]))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert len(merged.tool_calls) == 1 and merged.tool_calls[0]["name"] in tools


def test_the_langchain_agent_of_the_docs_runs_as_a_user_would_copy_it(local):
    import os
    import re
    from pathlib import Path

    server, gateway = local
    doc = (Path(__file__).parents[1] / "docs" / "gateway.md").read_text()
    marker = "<!-- test/test_gateway_local.py runs this block"
    code = re.search(r"```python\n(.*?)```", doc[doc.index(marker):], re.S).group(1)
    assert "http://127.0.0.1:8000/v1" in code
    code = code.replace("http://127.0.0.1:8000/v1", f"{server.url}/v1")
    before = {s["session"]: s for s in gateway.session_stats()}.get("robot-1")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "CSR_ROS_API_KEY": KEY})
    assert run.returncode == 0, run.stderr[-3000:]
    call_line, answer = run.stdout.splitlines()[:2]
    assert re.fullmatch(r"go_to \{'room': '(kitchen|hallway|office)'\}|say \{'text': '.+'\}",
                        call_line), call_line
    assert answer.strip()
    after = session(local, "robot-1")
    assert after["messages"] == 2
    assert after["version"] == (before["version"] + 1 if before else 1), \
        "one version for the snippet's conversation; its second request extended it"
