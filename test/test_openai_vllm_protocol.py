"""The vLLM code path of OpenAIResource, on vLLM's wire format.

vLLM needs a GPU, so a real vLLM server runs only where one is (the `gpu` test at the end, with
CSR_ROS_VLLM_URL pointing at `csr-ros serve vllm`). Here an in-process transport answers as vLLM
documents it (ids in /v1/models with owned_by "vllm" and max_model_len, /tokenize, streamed
completions whose last event carries usage.prompt_tokens_details.cached_tokens), so that the
request bodies and the parsing are checked on every CPU run. Tokenization is the real SmolLM2
tokenizer.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest

from csr_ros.errors import ResourceUnavailableError
from csr_ros.layout import Layout
from csr_ros.resources.openai import OpenAIResource
from csr_ros.state import CsrState
from csr_ros.tokenizer import HFTokenizer


class VllmLikeServer:
    """Answers like `vllm serve --enable-prompt-tokens-details`; records completion bodies."""

    def __init__(self, tokenizer: HFTokenizer, *, max_model_len: int = 32768):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.bodies: list[dict] = []
        self.cached_prompt: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "policy", "object": "model", "owned_by": "vllm",
                 "max_model_len": self.max_model_len}]})
        if request.url.path == "/tokenize":
            body = json.loads(request.content)
            ids = self.tokenizer.encode_template(body["prompt"])
            return httpx.Response(200, json={"count": len(ids), "tokens": ids,
                                             "max_model_len": self.max_model_len})
        if request.url.path == "/v1/completions":
            return self._completion(json.loads(request.content))
        return httpx.Response(404, json={"detail": "Not Found"})

    def _completion(self, body: dict) -> httpx.Response:
        self.bodies.append(body)
        prompt = body["prompt"]
        cached = 0
        for a, b in zip(self.cached_prompt, prompt):
            if a != b:
                break
            cached += 1
        cached -= cached % 16                      # vLLM caches whole blocks of 16 tokens
        self.cached_prompt = list(prompt)
        out_ids = [28, 29, 30][: body["max_tokens"]]
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out_ids),
                 "total_tokens": len(prompt) + len(out_ids),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        if not body.get("stream"):
            return httpx.Response(200, json={"choices": [{"text": "x", "finish_reason": "length"}],
                                             "usage": usage})
        events = [{"choices": [{"index": 0, "text": self.tokenizer.decode([t]), "token_ids": [t],
                                "finish_reason": "length" if i == len(out_ids) - 1 else None}]}
                  for i, t in enumerate(out_ids)]
        events.append({"choices": [], "usage": usage})
        lines = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=lines.encode(),
                              headers={"content-type": "text/event-stream"})


def make(server: VllmLikeServer, **options) -> OpenAIResource:
    return OpenAIResource("http://127.0.0.1:8001", transport=httpx.MockTransport(server),
                          **options)


def robot_state(resource: OpenAIResource) -> CsrState:
    tok = resource.tokenizer
    state = CsrState(tok, Layout.from_tokenizer(tok), "You are a robot.", mode=resource.state_mode)
    for i in range(40):
        state.add(f"[odom] t={i} x={i * 0.1:.2f}", source="odom", stamp_ns=i)
    return state


def test_vllm_gets_token_id_prompts_and_reports_its_context(tokenizer):
    server = VllmLikeServer(tokenizer)
    resource = make(server)
    assert (resource.info.kind, resource.info.model, resource.max_context_tokens) == \
        ("vllm", "policy", 32768)
    assert resource.state_mode == "token"
    state = robot_state(resource)
    request = state.build_request(task="next?")
    resource.query(request, max_new_tokens=3)
    assert server.bodies[-1]["prompt"] == list(request.ids)


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


def test_priority_is_not_sent_unless_the_server_schedules_by_priority(tokenizer):
    server = VllmLikeServer(tokenizer)
    resource = make(server)
    resource.load(robot_state(resource).static_ids)
    assert "priority" not in server.bodies[-1]       # vLLM rejects it under the default FCFS


def test_query_streams_with_usage_and_returns_the_server_cache_hits_next_to_i_star(tokenizer):
    server = VllmLikeServer(tokenizer)
    resource = make(server)
    state = robot_state(resource)
    resource.load(state.static_ids)
    request = state.build_request(task="next?")
    result = resource.query(request, max_new_tokens=3)
    body = server.bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True
    assert result.token_ids == (28, 29, 30)
    assert result.cached_tokens == state.n_static - state.n_static % 16
    assert result.n_prompt == len(request.ids)
    assert result.finish_reason == "length"


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


@pytest.mark.gpu
@pytest.mark.skipif(not os.environ.get("CSR_ROS_VLLM_URL"),
                    reason="set CSR_ROS_VLLM_URL to a `csr-ros serve vllm` server (needs a GPU)")
def test_a_real_vllm_server_reports_cache_hits_for_a_csr_query():
    url = os.environ["CSR_ROS_VLLM_URL"]
    with OpenAIResource(url, priority_scheduling=True,
                        model_dir=os.environ.get("CSR_ROS_VLLM_MODEL_DIR")) as resource:
        state = robot_state(resource)
        resource.load(state.static_ids, state.static_text)
        state.add("[cam] box", source="cam")
        result = resource.query(state.build_request(task="next?"), max_new_tokens=4)
        assert result.cached_tokens is not None and result.cached_tokens > 0
