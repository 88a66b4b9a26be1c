"""An in-process stand-in of a vLLM server for an httpx.MockTransport: ids in /v1/models with
owned_by "vllm" and max_model_len, /tokenize, streamed completions whose last event carries
usage.prompt_tokens_details.cached_tokens (whole blocks of 16 tokens); it records the
completion bodies it got. And a robot's state of forty odometry chunks for a resource's
tokenizer. Real vLLM servers: support/vllm_server.py."""

from __future__ import annotations

import json

import httpx

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


def robot_state(resource: OpenAIResource) -> CsrState:
    tok = resource.tokenizer
    state = CsrState(tok, Layout.from_tokenizer(tok), "You are a robot.", mode=resource.state_mode)
    for i in range(40):
        state.add(f"[odom] t={i} x={i * 0.1:.2f}", source="odom", stamp_ns=i)
    return state
