"""vLLM's wire format, for the faults a real vLLM server cannot be made to show.

Every vLLM code path runs against real vLLM servers in test/test_vllm_server.py. What stays
here is what those cannot show on demand: a server that serves another model (its tokenizer
disagrees), one whose context is too short for tau_mem, a stream that ends without a
finish_reason (a server giving up on a request), and the exact request bodies (what is *not*
sent, e.g. no `priority` to a server without priority scheduling, which vLLM would refuse).
An in-process transport answers as vLLM does (support/vllm_like_server.py: ids in /v1/models
with owned_by "vllm" and max_model_len, /tokenize, streamed completions whose last event
carries usage.prompt_tokens_details.cached_tokens). Tokenization is the real SmolLM2 tokenizer.
"""

from __future__ import annotations

import json

import httpx
import pytest

from support.vllm_like_server import VllmLikeServer, robot_state

from csr_ros.errors import ResourceUnavailableError
from csr_ros.resources.base import Capabilities
from csr_ros.resources.openai import OpenAIOptions, OpenAIResource


def make(server: VllmLikeServer, **options) -> OpenAIResource:
    return OpenAIResource(OpenAIOptions("http://127.0.0.1:8001", **options),
                          transport=httpx.MockTransport(server))


def test_warm_up_and_catch_up_are_prefill_only_and_low_priority(tokenizer):
    server = VllmLikeServer(tokenizer)
    resource = make(server, priority_scheduling=True, prefill_priority=10)
    state = robot_state(resource)
    resource.load(state.static_ids)
    n = state.n_static
    state.add("[cam] box", source="cam")
    resource.extend(state.static_ids[n:])
    resource.query(state.build_request(task="next?"), max_new_tokens=3)
    load, extend, query = server.bodies
    assert (load["max_tokens"], load["priority"], load.get("stream")) == (1, 10, None)
    assert extend["prompt"] == list(state.static_ids) and extend["priority"] == 10
    assert "priority" not in query                   # queries keep the default, 0 (earliest)


def test_a_server_resource_declares_log_probabilities_and_a_routing_key_with_a_robot_id(
        tokenizer):
    assert make(VllmLikeServer(tokenizer)).capabilities == Capabilities(echo_logprobs=True)
    keyed = make(VllmLikeServer(tokenizer), robot_id="robot_1")
    assert keyed.capabilities == Capabilities(echo_logprobs=True, routing_key=True)
    keyed.load(robot_state(keyed).static_ids, version=4)
    assert keyed.last_routing_key == keyed.routing_key == "robot_1/v4"


def test_priority_is_not_sent_unless_the_server_schedules_by_priority(tokenizer):
    server = VllmLikeServer(tokenizer)
    resource = make(server)
    resource.load(robot_state(resource).static_ids)
    assert "priority" not in server.bodies[-1]       # vLLM rejects it under the default FCFS


def test_a_local_tokenizer_that_disagrees_with_the_server_is_refused(tokenizer):
    class OtherModel(VllmLikeServer):
        def __call__(self, request):
            if request.url.path == "/tokenize":
                return httpx.Response(200, json={"tokens": [1, 2, 3], "count": 3})
            return super().__call__(request)

    with pytest.raises(ResourceUnavailableError, match="splits text differently"):
        make(OtherModel(tokenizer))


def test_the_context_check_reads_max_model_len(tokenizer):
    with pytest.raises(ResourceUnavailableError, match="context of 4096 tokens"):
        make(VllmLikeServer(tokenizer, max_model_len=4096), tau_mem_tokens=4000)


class GivesUpMidStream(VllmLikeServer):
    """Streams two tokens, then `[DONE]` with no finish_reason (or with `finish_reason`)."""

    def __init__(self, tokenizer, finish_reason=None):
        super().__init__(tokenizer)
        self.finish_reason = finish_reason

    def _completion(self, body: dict) -> httpx.Response:
        if not body.get("stream"):
            return super()._completion(body)
        events = [{"choices": [{"index": 0, "text": "go", "token_ids": [28],
                                "finish_reason": None}]},
                  {"choices": [{"index": 0, "text": "_to(", "token_ids": [29],
                                "finish_reason": self.finish_reason}]}]
        lines = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=lines.encode(),
                              headers={"content-type": "text/event-stream"})


@pytest.mark.parametrize("finish_reason", [None, "abort"])
def test_a_stream_that_ends_without_stop_or_length_is_a_server_error_not_a_spent_budget(
        tokenizer, finish_reason):
    resource = make(GivesUpMidStream(tokenizer, finish_reason))
    request = robot_state(resource).build_request(task="next?")
    with pytest.raises(ResourceUnavailableError, match="neither 'stop' nor 'length'"):
        resource.query(request, max_new_tokens=16)
    assert resource.n_committed == 0                 # a failed call commits nothing


def test_a_decision_that_the_server_gave_up_on_is_an_error_of_the_server_never_an_action():
    from csr_ros.actions import Vocabulary

    vocab = Vocabulary.parse(["wait()", "look_around()"])
    decision = vocab.decide("wait()", constrained=True, finish_reason="abort")
    assert decision.action is None and decision.error.startswith("server error")
    assert "budget" not in decision.error
    assert vocab.decide("wait()", constrained=True, finish_reason="length").action is not None
