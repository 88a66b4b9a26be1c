"""Where the judge's replies come from: an OpenAI-compatible server, or the local engine.

    OpenAIJudgeClient("http://127.0.0.1:8080", model=None)   # chat completions, temperature 0
    LocalJudgeClient("qwen2.5-coder-1.5b", threads=2)         # greedy, the model's chat template

Both answer `complete(system, user) -> reply` and carry a `name` the report prints. Thin
adapters: the protocol (prompt, reading the reply, the F1 fallback) is `csr_ros.bench.eval.judge`.
"""

from __future__ import annotations

import os

from csr_ros.errors import ConfigError, ResourceError, ResourceUnavailableError

API_KEY_ENV = "CSR_ROS_API_KEY"


def _base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"judge URL {url!r} must start with http:// or https://")
    return url[:-3] if url.endswith("/v1") else url


class OpenAIJudgeClient:
    """Chat completions on any OpenAI-compatible server (vLLM, SGLang, llama.cpp, a hosted
    API): greedy (temperature 0), `max_tokens` per reply. `model`: the served model's id when
    the server needs one (default: the first model it lists)."""

    def __init__(self, url: str, *, model: str | None = None, max_tokens: int = 16,
                 timeout_s: float = 300.0, api_key: str | None = None):
        import httpx

        if max_tokens < 1:
            raise ConfigError(f"judge max_tokens must be >= 1, got {max_tokens}")
        self.url = _base_url(url)
        self.max_tokens = int(max_tokens)
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self.model = model or self._served_model()
        self.name = f"{self.model} at {self.url}"

    def _served_model(self) -> str | None:
        import httpx

        try:
            response = self._http.get("/v1/models")
        except httpx.HTTPError as exc:
            raise ResourceUnavailableError(f"judge server {self.url} cannot be reached: "
                                           f"{exc}") from None
        if response.status_code != 200:
            return None
        entries = response.json().get("data") or []
        return str(entries[0]["id"]) if entries and "id" in entries[0] else None

    def complete(self, system: str, user: str) -> str:
        import httpx

        body = {"messages": [{"role": "system", "content": system},
                             {"role": "user", "content": user}],
                "temperature": 0.0, "max_tokens": self.max_tokens, "stream": False}
        if self.model:
            body["model"] = self.model
        try:
            response = self._http.post("/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise ResourceUnavailableError(f"judge server {self.url} failed: {exc}") from None
        if response.status_code != 200:
            raise ResourceError(f"judge server {self.url} answered {response.status_code}: "
                                f"{response.text[:300]}")
        choices = response.json().get("choices") or []
        if not choices:
            raise ResourceError(f"judge server {self.url} returned no choice")
        message = choices[0].get("message") or {}
        return str(message.get("content") or choices[0].get("text") or "")

    def close(self) -> None:
        self._http.close()


class LocalJudgeClient:
    """A model the local engine loads, greedy, in its own chat template (system and user
    message). The system message stays committed between replies; each question is prefilled
    and decoded in a scratch of it."""

    def __init__(self, model: str, *, threads: int | None = None, max_tokens: int = 16,
                 max_context_tokens: int | None = 4096):
        from csr_ros.layout import Layout
        from csr_ros.resources.local import LocalResource

        if max_tokens < 1:
            raise ConfigError(f"judge max_tokens must be >= 1, got {max_tokens}")
        self.model = model
        self.max_tokens = int(max_tokens)
        self.resource = LocalResource(model, name="judge", threads=threads,
                                      max_context_tokens=max_context_tokens)
        self.tokenizer = self.resource.engine.tokenizer
        self.layout = Layout.from_tokenizer(self.tokenizer)
        self.name = f"{model} (local engine)"

    def complete(self, system: str, user: str) -> str:
        from csr_ros.state import CsrState

        state = CsrState(tokenizer=self.tokenizer, layout=self.layout, profile=system)
        request = state.build_request(task=user)
        if self.resource.committed_ids != request.static_ids:
            self.resource.load(request.static_ids)
        return self.resource.query(request, max_new_tokens=self.max_tokens).text

    def close(self) -> None:
        self.resource.close()
