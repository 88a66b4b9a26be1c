"""Tokenizers as the CSR state sees them: text in, token ids out, data never control.

`encode_data` tokenizes untrusted text (chunks, tasks): a string that spells a special
token such as ``<|im_end|>`` becomes ordinary text tokens, never the control token.
`encode_template` tokenizes the fixed template runs, where special tokens are meant.

`HFTokenizer` reads a Hugging Face ``tokenizer.json`` with the `tokenizers` library (Rust,
no torch) and renders chat templates with jinja2 as transformers does, so the robot side of
the system needs neither torch nor transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, Sequence

from csr_ros.errors import ModelNotFoundError


class Tokenizer(Protocol):
    """What the CSR state needs from a tokenizer."""

    def encode_data(self, text: str) -> list[int]: ...

    def encode_template(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    @property
    def special_tokens(self) -> tuple[str, ...]: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def chat_template(self) -> str | None: ...


class HFTokenizer:
    """A `tokenizers.Tokenizer` loaded from a model directory.

    Two encoder instances: one that honours special tokens (template runs) and one that
    treats them as text (data). `tokenizers` keeps that switch on the instance.
    """

    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer as _RustTokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            msg = f"no tokenizer.json in {model_dir}: pass a Hugging Face model directory"
            raise ModelNotFoundError(msg)
        self._template = _RustTokenizer.from_file(str(path))
        self._data = _RustTokenizer.from_file(str(path))
        self._data.encode_special_tokens = True
        config = _read_json(model_dir / "tokenizer_config.json")
        template_file = model_dir / "chat_template.jinja"
        if template_file.is_file():
            self.chat_template: str | None = template_file.read_text(encoding="utf-8")
        else:
            self.chat_template = config.get("chat_template")
        added = self._template.get_added_tokens_decoder()
        self.special_tokens = tuple(tok.content for _, tok in sorted(added.items()) if tok.special)
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        eos = {self._template.token_to_id(t) for t in (self.eos_token, "<|endoftext|>") if t}
        generation = _read_json(model_dir / "generation_config.json").get("eos_token_id")
        if isinstance(generation, int):
            eos.add(generation)
        elif isinstance(generation, list):
            eos.update(generation)
        self.eos_token_ids = tuple(sorted(i for i in eos if i is not None))
        self.vocab_size = self._template.get_vocab_size(with_added_tokens=True)

    def encode_data(self, text: str) -> list[int]:
        return self._data.encode(text, add_special_tokens=False).ids

    def encode_template(self, text: str) -> list[int]:
        return self._template.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._template.decode(list(ids), skip_special_tokens=False)


def render_chat_template(template: str, messages: list[dict], *, add_generation_prompt: bool,
                         bos_token: str = "", eos_token: str = "") -> str:
    """Render a Hugging Face chat template the way transformers does (sandboxed jinja2)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_template_error
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt,
                                            bos_token=bos_token, eos_token=eos_token)


def _raise_template_error(message: str):
    from csr_ros.errors import ConfigError

    raise ConfigError(f"chat template refused the messages: {message}")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _token_text(token) -> str | None:
    if isinstance(token, dict):
        return token.get("content")
    return token
