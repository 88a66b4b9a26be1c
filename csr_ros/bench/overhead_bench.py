"""TTFT through the gateway against the same queries sent straight to the resource.

One conversation of N history tokens is held by a gateway session; each repeat asks a new last
user message of M dynamic tokens on each side, in alternating order (the two messages differ
only in their step number, so that a server caching whole prompts answers neither from the
other; the first, untimed repeat asks both the same message and checks the answers agree):

    direct    resource.query(request) on the session's primary, the request built by a
              CsrState holding the same messages (the same token ids: checked); TTFT is the
              resource's own figure, from the call to the first token
    gateway   an HTTP client (httpx, streaming) posts the whole conversation to
              /v1/chat/completions; TTFT from the send to the first streamed content

Both sides use the same resource and its cache, so the difference is what the gateway adds:
HTTP and JSON, the session's prefix check, tokenizing the dynamic part, the reconciler's
routing. Answers are `max_tokens` long (default 1): TTFT is the figure compared, and the
gateway streams each piece as it is decoded.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import time

import httpx

from csr_ros.errors import ConfigError
from csr_ros.gateway.app import ServerThread, build_app
from csr_ros.gateway.service import BackendFactory, Gateway, GatewayConfig
from csr_ros.layout import Layout
from csr_ros.servers import free_port
from csr_ros.state import CsrState

SESSION = "bench"
PROFILE = ("You are the policy of a home robot. The conversation is its log, oldest first; "
           "answer the last message with one action.")
ROOMS = ("kitchen", "hallway", "office", "bedroom", "bathroom", "garage")
OBJECTS = ("red cup", "keys", "book", "remote", "charger", "plant")


def history_messages(tokenizer, layout: Layout, n_tokens: int) -> list[dict]:
    """Alternating user/assistant messages until the static part holds >= n_tokens."""
    state = CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE)
    messages: list[dict] = []
    i = 0
    while state.n_static < n_tokens:
        room, obj = ROOMS[(i // 3) % len(ROOMS)], OBJECTS[(i * 5) % len(OBJECTS)]
        if i % 2 == 0:
            content = (f"[t={0.5 * i:.1f}s] odometry x={0.37 * (i % 29):.2f} "
                       f"y={0.21 * (i % 17):.2f} in the {room}; camera sees {obj} at "
                       f"{1 + i % 4}.{i % 10} m")
            message = {"role": "user", "content": content}
        else:
            message = {"role": "assistant", "content": f"go_to({room}) then look_for({obj})"}
        state.add(f"{message['role']}: {message['content']}")
        messages.append(message)
        i += 1
    return messages


def last_message(tokenizer, layout: Layout, m_tokens: int, query_no: int) -> str:
    """A user message whose dynamic part (`user: …` and the template's tail) is M tokens
    (where one-token words can pad it to that); a new step number first, so no two are
    alike."""
    words = ["now", "pick", "the", "next", "action", "for", "the", "patrol,", "the", "battery",
             "is", "fine", "and", "nobody", "asked", "for", "help", "yet."]
    text = f"step {query_no}:"
    k = 0
    while _dynamic_tokens(tokenizer, layout, text + " " + words[k % len(words)]) <= m_tokens:
        text += " " + words[k % len(words)]
        k += 1
    while _dynamic_tokens(tokenizer, layout, text) < m_tokens:
        text += " ok"
    return text


def _dynamic_tokens(tokenizer, layout: Layout, text: str) -> int:
    return len(tokenizer.encode_data(f"user: {text}")) + len(layout.tail_ids)


def run_bench(factory: BackendFactory, config: GatewayConfig, *, n_tokens: int = 4096,
              m_tokens: int = 32, repeats: int = 10, max_tokens: int = 1,
              progress=lambda message: None) -> dict:
    """The figures of `repeats` queries per side, and each pair (`rows`), on the backend
    `factory` makes for the session SESSION."""
    c = config.reconcile
    if n_tokens + m_tokens + c.reserve_tokens > c.max_context_tokens:
        raise ConfigError(f"--n {n_tokens} + --m {m_tokens} + --reserve-tokens do not fit in "
                          f"--max-context-tokens {c.max_context_tokens}")
    if n_tokens >= c.tau_mem_tokens:
        raise ConfigError(f"--n {n_tokens} must stay below --tau-mem {c.tau_mem_tokens}: the "
                          "bench measures queries, not evictions")
    backend = factory(SESSION)
    tokenizer = backend.tokenizer
    layout = Layout.from_tokenizer(tokenizer)
    history = history_messages(tokenizer, layout, n_tokens)
    system = [{"role": "system", "content": PROFILE}]
    mirror = CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE,
                      mode=backend.state_mode)
    for message in history:
        mirror.add(f"{message['role']}: {message['content']}")
    load_before = os.getloadavg()
    gateway = Gateway(lambda key: backend, config)
    port = free_port()
    rows: list[dict] = []
    try:
        with ServerThread(build_app(gateway), port) as server, \
                httpx.Client(base_url=server.url, timeout=httpx.Timeout(600.0)) as client:
            progress(f"loading {mirror.n_static} history tokens through the gateway")
            t0 = time.monotonic()
            _via_gateway(client, system + history, last_message(tokenizer, layout, m_tokens, 1),
                         max_tokens)
            load_s = time.monotonic() - t0
            reconciler = gateway.reconciler_of(SESSION)
            held = reconciler.accounting().static_ids
            if tuple(mirror.static_ids) != held:
                raise AssertionError("the gateway's state differs from the direct one's: "
                                     "the comparison would not be of the same queries")
            resource = reconciler.primary
            for query_no in range(1, repeats + 2):       # query 1 warms both paths
                sides = ("direct", "gateway") if query_no % 2 else ("gateway", "direct")
                row = {"query": query_no}
                for side in sides:
                    # query 1 asks both sides the same message (their answers must agree);
                    # then each side its own, so that a server that caches whole prompts
                    # (llama.cpp's one slot) never answers the second side from the first
                    step = 0 if query_no == 1 else 2 * query_no + (side == "gateway")
                    task = last_message(tokenizer, layout, m_tokens, step)
                    if side == "direct":
                        request = mirror.build_request(task=f"user: {task}")
                        result = resource.query(request, max_new_tokens=max_tokens)
                        row.update(direct_ttft_s=result.ttft_s, n_dynamic=request.n_dynamic,
                                   n_static=request.n_static, direct_text=result.text)
                    else:
                        row.update(_via_gateway(client, system + history, task, max_tokens))
                if query_no == 1:
                    same_answer = row["direct_text"] == row["gateway_text"]
                else:
                    rows.append(row)
                progress(f"query {query_no}: direct {row['direct_ttft_s'] * 1e3:.0f} ms, "
                         f"gateway {row['gateway_ttft_s'] * 1e3:.0f} ms")
            sessions = gateway.session_stats()
    finally:
        gateway.close()
    direct = [r["direct_ttft_s"] for r in rows]
    through = [r["gateway_ttft_s"] for r in rows]
    summary = {
        "n_history_tokens": rows[0]["n_static"], "m_dynamic_tokens": rows[0]["n_dynamic"],
        "repeats": len(rows), "max_tokens": max_tokens, "first_load_s": load_s,
        "direct_ttft_s_median": statistics.median(direct),
        "gateway_ttft_s_median": statistics.median(through),
        "gateway_server_ttft_s_median": statistics.median(r["gateway_server_ttft_s"]
                                                          for r in rows),
        "ratio_median": statistics.median(through) / statistics.median(direct),
        "paired_ratio_median": statistics.median(r["gateway_ttft_s"] / r["direct_ttft_s"]
                                                 for r in rows),
        "outside_reconciler_s_median": statistics.median(
            r["gateway_ttft_s"] - r["gateway_server_ttft_s"] for r in rows),
        "direct_ttft_s_min_max": [min(direct), max(direct)],
        "gateway_ttft_s_min_max": [min(through), max(through)],
        "cached_tokens": sorted({r["cached_tokens"] for r in rows}),
        "prompt_tokens": sorted({r["prompt_tokens"] for r in rows}),
        "same_answer": same_answer,
        "new_versions": sessions[0]["new_versions"] if sessions else None,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "rows": rows}
    return summary


def _via_gateway(client: httpx.Client, messages: list[dict], task: str,
                 max_tokens: int) -> dict:
    body = {"messages": messages + [{"role": "user", "content": task}],
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    started = time.monotonic()
    first_s = None
    text, usage, csr = "", None, None
    with client.stream("POST", "/v1/chat/completions", json=body,
                       headers={"X-Session-Id": SESSION}) as response:
        if response.status_code != 200:
            response.read()
            raise AssertionError(f"the gateway answered {response.status_code}: "
                                 f"{response.text}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            csr = event.get("csr", csr)
            usage = event.get("usage") or usage
            for choice in event["choices"]:
                piece = choice["delta"].get("content")
                if piece and first_s is None:
                    first_s = time.monotonic() - started
                text += piece or ""
    return {"gateway_ttft_s": first_s if first_s is not None else time.monotonic() - started,
            "gateway_server_ttft_s": csr["ttft_s"], "gateway_text": text,
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "prompt_tokens": usage["prompt_tokens"], "new_version": csr["new_version"]}


def format_summary(s: dict) -> str:
    ms = lambda v: f"{v * 1e3:.1f} ms"   # noqa: E731
    return "\n".join([
        f"gateway bench: N={s['n_history_tokens']} history tokens, M={s['m_dynamic_tokens']} "
        f"dynamic tokens, {s['repeats']} queries per side (interleaved), max_tokens "
        f"{s['max_tokens']}",
        f"  TTFT direct to the resource   median {ms(s['direct_ttft_s_median'])} "
        f"(min {ms(s['direct_ttft_s_min_max'][0])}, max {ms(s['direct_ttft_s_min_max'][1])})",
        f"  TTFT through the gateway      median {ms(s['gateway_ttft_s_median'])} "
        f"(min {ms(s['gateway_ttft_s_min_max'][0])}, max {ms(s['gateway_ttft_s_min_max'][1])})"
        f"; inside it, the reconciler's {ms(s['gateway_server_ttft_s_median'])}",
        f"  gateway / direct              {s['ratio_median']:.2f}x of the medians, "
        f"{s['paired_ratio_median']:.2f}x the median of each repeat's pair (goal: at most 1.2x)",
        f"  HTTP, JSON and the session check, outside the reconciler: median "
        f"{ms(s['outside_reconciler_s_median'])}",
        f"  usage: prompt_tokens {s['prompt_tokens']}, cached_tokens {s['cached_tokens']}; "
        f"same answer to the same message: {s['same_answer']}; new versions: "
        f"{s['new_versions']}",
        f"  load average before/after: {s['loadavg_before'][0]:.2f} / "
        f"{s['loadavg_after'][0]:.2f} on {s['cpu_count']} CPUs"])
