"""Faults of a real server: killed mid-stream, down, back on the same port, too slow.

Every fault here is caused for real (the server process is killed with SIGKILL and restarted);
nothing is mocked.
"""

from __future__ import annotations

import threading

import pytest

from csr_ros.errors import ResourceError, ResourceTimeoutError, ResourceUnavailableError
from csr_ros.layout import Layout
from csr_ros.resources.openai import OpenAIOptions, OpenAIResource
from csr_ros.state import CsrState

pytestmark = pytest.mark.server

TASK = "Describe the warehouse in great detail."


def robot_state(resource: OpenAIResource, n_tokens: int) -> CsrState:
    tokenizer = resource.tokenizer
    state = CsrState(tokenizer, Layout.from_tokenizer(tokenizer), "You are a mobile robot.",
                     mode=resource.state_mode)
    i = 0
    while state.n_static < n_tokens:
        state.add(f"[odom] t={i} x={i * 0.1:.2f} v=0.25 m/s", source="odom", stamp_ns=i)
        i += 1
    return state


def snapshot(state: CsrState) -> tuple:
    return (state.version, state.next_seq, tuple(state.chunks), tuple(state.static_ids))


def no_eos(resource: OpenAIResource) -> dict:
    """Keep the model talking (so the stream is still open when the server dies)."""
    return {"logit_bias": {str(i): -100.0 for i in resource.tokenizer.eos_token_ids}}


def test_server_killed_mid_stream_raises_a_clear_error_loses_nothing_and_recovers(
        fresh_llama_server):
    server = fresh_llama_server
    resource = OpenAIResource(OpenAIOptions(server.url, name="r1", retries=1, backoff_s=0.05))
    resource.extra_body.update(no_eos(resource))
    state = robot_state(resource, 300)
    resource.load(state.static_ids, state.static_text)
    n_committed = resource.n_committed
    before = snapshot(state)

    killer = threading.Timer(1.5, server.kill)     # the prefix is warm: tokens are streaming by then
    killer.start()
    # "broke after N streamed pieces": the stream ended by the kill, not by 4000 tokens
    # decoded, which a wall-clock bound could only tell on a machine of known speed
    with pytest.raises(ResourceUnavailableError, match="broke after .* streamed pieces"):
        resource.query(state.build_request(task=TASK), max_new_tokens=4000)
    killer.join()
    assert snapshot(state) == before                 # nothing in the CsrState is lost
    assert resource.n_committed == n_committed       # a failed query commits nothing

    with pytest.raises(ResourceUnavailableError, match="cannot reach .* after 2 attempts"):
        resource.query(state.build_request(task=TASK), max_new_tokens=2)

    server.start()                                   # back on the same port, cache empty
    state.add("[cam] the aisle is clear", source="cam", stamp_ns=99)
    result = resource.query(state.build_request(task="Next action?"), max_new_tokens=3)
    assert result.n_generated >= 1 and result.ttft_s > 0
    assert resource.n_committed == state.n_static
    resource.close()


def test_a_server_slower_than_the_read_timeout_gives_a_timeout_error(fresh_llama_server):
    resource = OpenAIResource(OpenAIOptions(fresh_llama_server.url, read_timeout_s=0.05,
                                            retries=0))
    state = robot_state(resource, 1500)               # a cold prefill takes seconds here
    with pytest.raises(ResourceTimeoutError, match="did not answer in time|went silent"):
        resource.load(state.static_ids, state.static_text)
    assert resource.n_committed == 0
    resource.close()


def test_a_prefill_given_a_longer_deadline_than_the_read_timeout_waits_for_it(fresh_llama_server):
    """The reconciler's deadline for a warm-up follows its estimate of it; a server stopped for
    three read timeouts still finishes the load once it resumes, while a load without that
    deadline gives up after one (and a server that drops a gone client's work never would)."""
    import os
    import signal
    import time

    server = fresh_llama_server
    resource = OpenAIResource(OpenAIOptions(server.url, read_timeout_s=1.0, retries=0))
    small, state = robot_state(resource, 20), robot_state(resource, 300)
    resource.load(small.static_ids, small.static_text)       # the server is checked and warm
    os.kill(server.pid, signal.SIGSTOP)
    try:
        with pytest.raises(ResourceTimeoutError):
            resource.load(state.static_ids, state.static_text)
        done: dict = {}

        def load():
            try:
                done["result"] = resource.load(state.static_ids, state.static_text,
                                               timeout_s=300.0)
            except Exception as exc:          # the assertion below names it
                done["error"] = exc

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(3.0)                       # three read timeouts with the server stopped
        assert loader.is_alive() and not done, f"the load gave up early: {done}"
    finally:
        os.kill(server.pid, signal.SIGCONT)
    loader.join(300)
    assert "error" not in done, done.get("error")
    assert done["result"].n_committed == len(state.static_ids)
    assert resource.n_committed == len(state.static_ids)
    resource.close()


def test_a_server_that_comes_back_within_the_retries_answers_the_call(fresh_llama_server):
    server = fresh_llama_server
    resource = OpenAIResource(OpenAIOptions(server.url, retries=6, backoff_s=0.25))
    state = robot_state(resource, 100)
    server.kill()
    restarter = threading.Timer(0.3, server.start)   # connection refused until it is up again
    restarter.start()
    result = resource.query(state.build_request(task="Next action?"), max_new_tokens=2)
    restarter.join()
    assert result.n_generated >= 1
    resource.close()


def test_a_wrong_or_missing_api_key_is_refused_with_a_clear_message(llama_server_with_key,
                                                                    monkeypatch):
    monkeypatch.delenv("CSR_ROS_API_KEY", raising=False)
    with pytest.raises(ResourceUnavailableError, match="refused the API key"):
        OpenAIResource(OpenAIOptions(llama_server_with_key.url))
    with pytest.raises(ResourceUnavailableError, match="refused the API key"):
        OpenAIResource(OpenAIOptions(llama_server_with_key.url, api_key="wrong"))
    monkeypatch.setenv("CSR_ROS_API_KEY", "test-key")
    with OpenAIResource(OpenAIOptions(llama_server_with_key.url)) as resource:
        state = robot_state(resource, 60)
        assert resource.query(state.build_request(task="Next?"), max_new_tokens=1).ttft_s > 0


def test_every_fault_is_a_resource_error():
    assert issubclass(ResourceTimeoutError, ResourceError)
    assert issubclass(ResourceUnavailableError, ResourceError)
