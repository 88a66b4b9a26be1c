"""Turning raw chunk input into the exact text that enters the prompt.

Documented policy (each step either succeeds or raises a `ChunkError`; nothing is dropped
silently):

1. bytes must be UTF-8: `invalid_utf8="reject"` raises `NonUtf8ChunkError` naming the offset;
   `"replace"` substitutes U+FFFD for the bad bytes and keeps the rest. A str must be
   encodable as UTF-8 too: a lone surrogate (what `surrogateescape` decoding leaves of a bad
   byte) is refused or replaced the same way, as neither the tokenizer nor the chunk log can
   take it.
2. Surrounding whitespace is stripped and one newline is appended, so a chunk is a line block
   and two chunks can never merge into one token at their boundary (text mode relies on it).
   An empty or whitespace-only chunk raises `EmptyChunkError`.
3. Text that spells a special token (``<|im_end|>``...): in token mode it is tokenized as
   plain text (see `Tokenizer.encode_data`); in text mode, where the server parses the string,
   `special_tokens="escape"` inserts U+2060 WORD JOINER after its first character (the text
   reads the same and can no longer match) and `"reject"` raises `SpecialTokenInChunkError`.
4. A chunk over `max_chunk_tokens`: `oversize="split"` cuts it at whitespace into several
   chunks that each fit, `"truncate"` keeps the head and appends a marker that says how many
   tokens were cut, `"reject"` raises `ChunkTooLargeError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from csr_ros.errors import (ChunkTooLargeError, ConfigError, EmptyChunkError, NonUtf8ChunkError,
                            SpecialTokenInChunkError)
from csr_ros.tokenizer import Tokenizer

WORD_JOINER = "\u2060"
_SURROGATES = re.compile("[\ud800-\udfff]")
TRUNCATION_MARKER = " …[truncated {n} tokens]"


@dataclass(frozen=True)
class ChunkPolicy:
    max_chunk_tokens: int = 1024
    oversize: str = "split"          # split | truncate | reject
    invalid_utf8: str = "reject"     # reject | replace
    special_tokens: str = "escape"   # escape | reject (text mode only)

    def __post_init__(self):
        _check_choice("oversize", self.oversize, ("split", "truncate", "reject"))
        _check_choice("invalid_utf8", self.invalid_utf8, ("reject", "replace"))
        _check_choice("special_tokens", self.special_tokens, ("escape", "reject"))
        if self.max_chunk_tokens < 8:
            raise ConfigError(f"max_chunk_tokens must be >= 8, got {self.max_chunk_tokens}")


def decode_text(raw: str | bytes, policy: ChunkPolicy) -> str:
    if isinstance(raw, str):
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError as exc:
            if policy.invalid_utf8 == "replace":
                return _SURROGATES.sub("\ufffd", raw)
            msg = (f"chunk text is not valid Unicode (character {exc.start}: a lone surrogate "
                   f"{raw[exc.start:exc.end]!r}); set invalid_utf8='replace' to keep it with "
                   "U+FFFD in its place")
            raise NonUtf8ChunkError(msg) from None
        return raw
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise NonUtf8ChunkError(f"chunk must be str or bytes, got {type(raw).__name__}")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        if policy.invalid_utf8 == "replace":
            return bytes(raw).decode("utf-8", errors="replace")
        msg = (f"chunk is not valid UTF-8 (byte {exc.start}: {bytes(raw)[exc.start:exc.end]!r}); "
               "set invalid_utf8='replace' to keep it with U+FFFD in place of the bad bytes")
        raise NonUtf8ChunkError(msg) from None


def normalize(text: str, *, what: str = "chunk") -> str:
    """Strip surrounding whitespace and end with exactly one newline."""
    body = text.strip()
    if not body:
        raise EmptyChunkError(f"{what} is empty (or only whitespace); nothing was appended")
    return body + "\n"


def guard_special_tokens(text: str, special_tokens: Sequence[str], policy: ChunkPolicy) -> str:
    """Text mode: make sure no special-token spelling reaches the server's parser."""
    found = [t for t in special_tokens if t and t in text]
    if not found:
        return text
    if policy.special_tokens == "reject":
        msg = (f"chunk spells special token(s) {found}; in text mode the server would parse "
               "them as control tokens (set special_tokens='escape' to keep the text)")
        raise SpecialTokenInChunkError(msg)
    for token in sorted(found, key=len, reverse=True):
        text = text.replace(token, token[0] + WORD_JOINER + token[1:])
    return text


def fit_budget(body: str, tokenizer: Tokenizer, policy: ChunkPolicy) -> list[tuple[str, list[int]]]:
    """Apply the oversize policy to a normalized chunk. Returns (text, token ids) pieces."""
    ids = tokenizer.encode_data(body)
    if len(ids) <= policy.max_chunk_tokens:
        return [(body, ids)]
    if policy.oversize == "reject":
        msg = (f"chunk has {len(ids)} tokens, over max_chunk_tokens={policy.max_chunk_tokens}; "
               "set oversize='split' or 'truncate' to keep it")
        raise ChunkTooLargeError(msg)
    if policy.oversize == "truncate":
        return [_truncate(body, len(ids), tokenizer, policy.max_chunk_tokens)]
    return _split(body, len(ids), tokenizer, policy.max_chunk_tokens)


def _truncate(body: str, n_tokens: int, tokenizer: Tokenizer, budget: int) -> tuple[str, list[int]]:
    keep_chars = len(body)
    while True:
        keep_chars = max(1, int(keep_chars * 0.9))
        head = body[:keep_chars].rstrip()
        kept_ids = tokenizer.encode_data(head)
        marker = TRUNCATION_MARKER.format(n=n_tokens - len(kept_ids))
        text = head + marker + "\n"
        ids = tokenizer.encode_data(text)
        if len(ids) <= budget:
            return text, ids


def _split(body: str, n_tokens: int, tokenizer: Tokenizer, budget: int) -> list[tuple[str, list[int]]]:
    """Greedy cut at whitespace; each piece is re-tokenized alone, as it will be stored."""
    pieces: list[tuple[str, list[int]]] = []
    rest = body.strip()
    chars_per_token = max(1.0, len(rest) / n_tokens)
    while rest:
        ids = tokenizer.encode_data(rest + "\n")
        if len(ids) <= budget:
            pieces.append((rest + "\n", ids))
            break
        cut = int(budget * chars_per_token)
        while True:
            cut = max(1, min(cut, len(rest) - 1))
            space = rest.rfind(" ", max(1, cut // 2), cut)
            end = space if space > 0 else cut
            head = rest[:end].strip()
            head_ids = tokenizer.encode_data(head + "\n") if head else []
            if head and len(head_ids) <= budget:
                break
            cut = int(cut * 0.8)
        pieces.append((head + "\n", head_ids))
        rest = rest[end:].strip()
    return pieces


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {choices}, got {value!r}")
