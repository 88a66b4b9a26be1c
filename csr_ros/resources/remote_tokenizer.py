"""The server's own tokenizer behind the `Tokenizer` protocol, over HTTP.

Use it when the client must tokenize exactly as the server does and has no copy of the
tokenizer files (or cannot trust its copy to match). Two server dialects:

- vLLM: ``POST /tokenize {"prompt", "add_special_tokens": false}`` → ``{"tokens"}``,
  ``POST /detokenize {"tokens"}`` → ``{"prompt"}``.
- llama-cpp-python: ``POST /extras/tokenize {"input"}`` → ``{"tokens"}`` (always parses special
  tokens; adds BOS when the model asks for it, which is stripped here),
  ``POST /extras/detokenize {"tokens"}`` → ``{"text"}``.

Neither endpoint can tokenize a special-token *spelling* as plain text, which is what
`encode_data` promises (invariant 6, no injection through data). So `encode_data` refuses text
that spells a known special token with `SpecialTokenInChunkError`. In text mode the CSR state
escapes such spellings before they reach the tokenizer, so this never fires there; in token
mode use a local tokenizer for untrusted text.

The server tells nothing about special tokens, EOS ids or the chat template, so those come from
the model directory's JSON files (`tokenizer_config.json`, `chat_template.jinja`,
`generation_config.json`, the added-token list of `tokenizer.json`), read as plain JSON, or
from the constructor.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

import httpx

from csr_ros.errors import ConfigError, ResourceUnavailableError, SpecialTokenInChunkError

log = logging.getLogger(__name__)

DIALECTS = ("vllm", "llama-cpp-python")


class RemoteTokenizer:
    def __init__(self, url: str, *, dialect: str = "auto", model: str | None = None,
                 model_dir: str | Path | None = None, special_tokens: Sequence[str] | None = None,
                 eos_token_ids: Sequence[int] | None = None, chat_template: str | None = None,
                 api_key: str | None = None, timeout_s: float = 30.0,
                 client: httpx.Client | None = None):
        self.url = url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # trust_env=False: a proxy variable in the environment must never reroute this traffic.
        self._client = client or httpx.Client(base_url=self.url, headers=headers,
                                              timeout=timeout_s, trust_env=False)
        self._owns_client = client is None
        meta = _read_metadata(Path(model_dir)) if model_dir is not None else {}
        self.special_tokens = tuple(special_tokens if special_tokens is not None
                              else meta.get("special_tokens", ()))
        self.eos_token_ids = tuple(eos_token_ids if eos_token_ids is not None
                              else meta.get("eos_token_ids", ()))
        self.chat_template = chat_template if chat_template is not None \
            else meta.get("chat_template")
        self.bos_token = meta.get("bos_token")
        self.eos_token = meta.get("eos_token")
        if special_tokens is None and not self.special_tokens:
            log.warning("RemoteTokenizer(%s) knows no special tokens: pass model_dir= so that "
                        "data text spelling a control token is refused", self.url)
        self.dialect = detect_dialect(self._client) if dialect == "auto" else dialect
        if self.dialect not in DIALECTS:
            raise ConfigError(f"tokenizer dialect must be 'auto' or one of {DIALECTS}, "
                              f"got {dialect!r}")
        # llama-cpp-python prepends BOS when the model wants one; the protocol's encoders
        # never add it (the template head carries it), so learn it once and strip it.
        self._added_bos: tuple[int, ...] = ()
        if self.dialect == "llama-cpp-python":
            self._added_bos = tuple(self._tokenize(""))

    # -- the Tokenizer protocol -----------------------------------------------------------

    def encode_data(self, text: str) -> list[int]:
        found = [t for t in self.special_tokens if t and t in text]
        if found:
            msg = (f"text spells special token(s) {found}; a server-side tokenizer would parse "
                   "them as control tokens. Use the state's text mode (it escapes them) or a "
                   "local tokenizer for this data")
            raise SpecialTokenInChunkError(msg)
        return self._tokenize(text)

    def encode_template(self, text: str) -> list[int]:
        return self._tokenize(text)

    def decode(self, ids: Sequence[int]) -> str:
        if self.dialect == "vllm":
            body = self._post("/detokenize", {"tokens": list(ids), **self._model_field()})
            return body["prompt"]
        return self._post("/extras/detokenize", {"tokens": list(ids)})["text"]

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> "RemoteTokenizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- HTTP ----------------------------------------------------------------------------

    def _tokenize(self, text: str) -> list[int]:
        if self.dialect == "vllm":
            body = self._post("/tokenize", {"prompt": text, "add_special_tokens": False,
                                            **self._model_field()})
            return list(body["tokens"])
        ids = list(self._post("/extras/tokenize", {"input": text})["tokens"])
        n_bos = len(self._added_bos)
        if n_bos and tuple(ids[:n_bos]) == self._added_bos:
            ids = ids[n_bos:]
        return ids

    def _model_field(self) -> dict:
        return {"model": self.model} if self.model else {}

    def _post(self, path: str, payload: dict) -> dict:
        try:
            response = self._client.post(path, json=payload)
        except httpx.TimeoutException as exc:
            raise ResourceUnavailableError(f"tokenize at {self.url}{path} timed out: {exc}") from None
        except httpx.HTTPError as exc:
            msg = f"cannot reach the tokenizer at {self.url}{path}: {type(exc).__name__}: {exc}"
            raise ResourceUnavailableError(msg) from None
        if response.status_code != 200:
            msg = f"{self.url}{path} answered HTTP {response.status_code}: {response.text[:300]}"
            raise ResourceUnavailableError(msg)
        return response.json()


def detect_dialect(client: httpx.Client) -> str:
    """vLLM names itself in /v1/models (owned_by); llama-cpp-python answers /extras/tokenize."""
    try:
        models = client.get("/v1/models")
        if models.status_code == 200 and any(m.get("owned_by") == "vllm"
                                             for m in models.json().get("data", [])):
            return "vllm"
        probe = client.post("/extras/tokenize", json={"input": "a"})
    except httpx.HTTPError as exc:
        msg = f"cannot reach {client.base_url} to find its tokenize endpoint: {exc}"
        raise ResourceUnavailableError(msg) from None
    if probe.status_code == 200:
        return "llama-cpp-python"
    msg = (f"{client.base_url} offers no tokenize endpoint this client knows "
           f"(tried vLLM /tokenize and llama-cpp-python /extras/tokenize); "
           "use a local tokenizer (tokenizer='local')")
    raise ConfigError(msg)


def _read_metadata(model_dir: Path) -> dict:
    """Special tokens, EOS ids and chat template from a model directory's small JSON files."""
    config = _read_json(model_dir / "tokenizer_config.json")
    added = config.get("added_tokens_decoder") or {
        # newer transformers keep the added tokens only in tokenizer.json (read as plain JSON)
        str(tok["id"]): tok for tok in _read_json(model_dir / "tokenizer.json").get("added_tokens", [])}
    special = tuple(tok["content"] for _, tok in sorted(added.items(), key=lambda kv: int(kv[0]))
                    if tok.get("special"))
    template_file = model_dir / "chat_template.jinja"
    template = (template_file.read_text(encoding="utf-8") if template_file.is_file()
                else config.get("chat_template"))
    eos_ids = {int(k) for k, tok in added.items()
               if tok.get("content") in (_text(config.get("eos_token")), "<|endoftext|>")}
    generation = _read_json(model_dir / "generation_config.json").get("eos_token_id")
    if isinstance(generation, int):
        eos_ids.add(generation)
    elif isinstance(generation, list):
        eos_ids.update(generation)
    return {"special_tokens": special, "eos_token_ids": tuple(sorted(eos_ids)),
            "chat_template": template, "bos_token": _text(config.get("bos_token")),
            "eos_token": _text(config.get("eos_token"))}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _text(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token
