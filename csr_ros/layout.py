"""Chat-template layout: render the template once with sentinels, keep fixed token runs.

    head ⊕ tok(profile) ⊕ mid ⊕ x_0 ⊕ … ⊕ x_t ⊕ tok(suffix) ⊕ tok(task) ⊕ tail

The profile is the system message; chunks, suffix and task are the user message. History is
never re-rendered through the template: re-rendering the whole conversation every query is
what breaks the prefix cache elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from csr_ros.errors import ConfigError
from csr_ros.tokenizer import Tokenizer, render_chat_template

_SYSTEM_SENTINEL = "\x00CSR_SYSTEM\x00"
_USER_SENTINEL = "\x00CSR_USER\x00"


@dataclass(frozen=True)
class Layout:
    """Fixed template runs, as text (for text mode) and as token ids (for token mode)."""

    head_text: str
    mid_text: str
    tail_text: str
    head_ids: tuple[int, ...]
    mid_ids: tuple[int, ...]
    tail_ids: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, *, use_chat_template: bool = True) -> "Layout":
        template = tokenizer.chat_template if use_chat_template else None
        if template is None:
            head, mid, tail = "", "\n", "\n"
        else:
            head, mid, tail = _split_rendered(template, tokenizer)
        return cls(head_text=head, mid_text=mid, tail_text=tail,
                   head_ids=tuple(tokenizer.encode_template(head)) if head else (),
                   mid_ids=tuple(tokenizer.encode_template(mid)),
                   tail_ids=tuple(tokenizer.encode_template(tail)))


def _split_rendered(template: str, tokenizer: Tokenizer) -> tuple[str, str, str]:
    messages = [{"role": "system", "content": _SYSTEM_SENTINEL},
                {"role": "user", "content": _USER_SENTINEL}]
    rendered = render_chat_template(template, messages, add_generation_prompt=True,
                                    bos_token=getattr(tokenizer, "bos_token", "") or "",
                                    eos_token=getattr(tokenizer, "eos_token", "") or "")
    if rendered.count(_SYSTEM_SENTINEL) != 1 or rendered.count(_USER_SENTINEL) != 1:
        msg = ("the chat template does not place a system and a user message verbatim; "
               "use use_chat_template=False for this model")
        raise ConfigError(msg)
    head, rest = rendered.split(_SYSTEM_SENTINEL)
    mid, tail = rest.split(_USER_SENTINEL)
    return head, mid, tail
