"""CSR state: a fixed prefix, chunks appended in order, a small dynamic part per query.

    static  = head ⊕ tok(profile) ⊕ mid ⊕ x_0 ⊕ … ⊕ x_t        (append-only within a version)
    dynamic = tok(suffix) ⊕ tok(task) ⊕ tail                     (rebuilt every query)

Every chunk is tokenized exactly once, when it is appended, and keeps its token ids; a request
is the concatenation of stored ids. Eviction never mutates a state: it derives a new state of
the next version (`evicted`), which is what a secondary resource is warmed with.

Pure: no torch, no rclpy, no I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NewType

from csr_ros.chunks import ChunkPolicy, decode_text, fit_budget, guard_special_tokens, normalize
from csr_ros.errors import ChunkOrderError, ConfigError
from csr_ros.layout import Layout
from csr_ros.tokenizer import Tokenizer

Seq = NewType("Seq", int)
Version = NewType("Version", int)
QueryId = NewType("QueryId", int)

MODES = ("token", "text")


@dataclass(frozen=True)
class Chunk:
    seq: Seq
    source: str
    stamp_ns: int
    text: str                      # exactly as it enters the prompt (normalized, ends in "\n")
    token_ids: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Request:
    """One query, built against exactly one state version."""

    query_id: QueryId
    version: Version
    static_ids: tuple[int, ...]
    dynamic_ids: tuple[int, ...]
    i_star: int                    # first token that differs from the previous request
    last_seq: Seq | None           # newest chunk in the static part
    static_text: str | None = None  # text mode: the string a server tokenizes
    dynamic_text: str | None = None

    @property
    def ids(self) -> tuple[int, ...]:
        return self.static_ids + self.dynamic_ids

    @property
    def text(self) -> str | None:
        return None if self.static_text is None else self.static_text + self.dynamic_text

    @property
    def n_static(self) -> int:
        return len(self.static_ids)

    @property
    def n_dynamic(self) -> int:
        return len(self.dynamic_ids)


_query_ids = itertools.count(1)


@dataclass
class CsrState:
    tokenizer: Tokenizer
    layout: Layout
    profile: str
    mode: str = "token"
    policy: ChunkPolicy = field(default_factory=ChunkPolicy)
    version: Version = Version(0)
    next_seq: Seq = Seq(0)
    chunks: list[Chunk] = field(default_factory=list)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        profile = self._data_text(normalize(self.profile, what="profile"))
        self.prefix_text = self.layout.head_text + profile + self.layout.mid_text
        self.prefix_ids = (self.layout.head_ids + tuple(self.tokenizer.encode_data(profile))
                           + self.layout.mid_ids)
        self.static_ids: list[int] = list(self.prefix_ids)
        self._static_text: list[str] = [self.prefix_text]
        for chunk in self.chunks:
            self.static_ids.extend(chunk.token_ids)
            self._static_text.append(chunk.text)
        self._last_static_len = 0
        self._last_dynamic: tuple[int, ...] = ()

    # -- chunks ------------------------------------------------------------------------------

    def make_chunks(self, raw: str | bytes, *, source: str, stamp_ns: int) -> list[Chunk]:
        """Validate and tokenize one input (split into several chunks if the policy says so).

        Pure: the state is unchanged; raises a `ChunkError` with nothing appended.
        """
        body = self._data_text(normalize(decode_text(raw, self.policy)))
        pieces = fit_budget(body, self.tokenizer, self.policy)
        return [Chunk(seq=Seq(self.next_seq + i), source=source, stamp_ns=int(stamp_ns),
                      text=text, token_ids=tuple(ids))
                for i, (text, ids) in enumerate(pieces)]

    def append(self, chunk: Chunk) -> None:
        if chunk.seq != self.next_seq:
            msg = f"chunk seq {chunk.seq} arrived, expected {self.next_seq}: chunks must be gap-free"
            raise ChunkOrderError(msg)
        self.chunks.append(chunk)
        self.static_ids.extend(chunk.token_ids)
        self._static_text.append(chunk.text)
        self.next_seq = Seq(self.next_seq + 1)

    def add(self, raw: str | bytes, *, source: str = "", stamp_ns: int = 0) -> list[Chunk]:
        """make_chunks + append: the usual way to feed the state."""
        chunks = self.make_chunks(raw, source=source, stamp_ns=stamp_ns)
        for chunk in chunks:
            self.append(chunk)
        return chunks

    @property
    def n_static(self) -> int:
        return len(self.static_ids)

    @property
    def chunk_tokens(self) -> list[int]:
        return [c.n_tokens for c in self.chunks]

    @property
    def first_seq(self) -> Seq:
        """The seq of the oldest chunk held; `next_seq` where none is."""
        return self.chunks[0].seq if self.chunks else self.next_seq

    @property
    def static_text(self) -> str:
        return "".join(self._static_text)

    # -- eviction ----------------------------------------------------------------------------

    def evicted(self, n_drop: int) -> "CsrState":
        """The state of the next version without the `n_drop` oldest chunks."""
        assert 0 <= n_drop <= len(self.chunks), f"cannot drop {n_drop} of {len(self.chunks)} chunks"
        return CsrState(tokenizer=self.tokenizer, layout=self.layout, profile=self.profile,
                        mode=self.mode, policy=self.policy, version=Version(self.version + 1),
                        next_seq=self.next_seq, chunks=list(self.chunks[n_drop:]))

    # -- requests ----------------------------------------------------------------------------

    def build_request(self, *, task: str, suffix: str = "") -> Request:
        dynamic_text = ""
        if suffix.strip():
            dynamic_text += self._data_text(normalize(suffix, what="suffix"))
        dynamic_text += self._data_text(normalize(task, what="task")).rstrip("\n")
        dynamic_ids = tuple(self.tokenizer.encode_data(dynamic_text)) + self.layout.tail_ids
        static_ids = tuple(self.static_ids)
        request = Request(query_id=QueryId(next(_query_ids)), version=self.version,
                          static_ids=static_ids, dynamic_ids=dynamic_ids,
                          i_star=self._i_star(static_ids + dynamic_ids),
                          last_seq=self.chunks[-1].seq if self.chunks else None,
                          static_text=self.static_text if self.mode == "text" else None,
                          dynamic_text=dynamic_text + self.layout.tail_text
                          if self.mode == "text" else None)
        self._last_static_len, self._last_dynamic = len(static_ids), dynamic_ids
        return request

    def mark_prefilled(self) -> None:
        """The resource now holds exactly the static part (after a warm-up or catch-up)."""
        self._last_static_len, self._last_dynamic = self.n_static, ()

    def _i_star(self, ids: tuple[int, ...]) -> int:
        # Within one state object the static part only grows, so the previous static run is a
        # prefix of this one; only the previous dynamic run needs comparing. O(M), not O(N).
        start = self._last_static_len
        for i, old in enumerate(self._last_dynamic):
            if start + i >= len(ids) or ids[start + i] != old:
                return start + i
        return min(start + len(self._last_dynamic), len(ids))

    def _data_text(self, text: str) -> str:
        if self.mode == "text":
            return guard_special_tokens(text, self.tokenizer.special_tokens, self.policy)
        return text

