"""Memory methods behind one interface, each answering from the same resource and model.

    method.begin(profile)            a new episode
    method.observe(observation)      one rendered history chunk, in time order
    method.prompt(task, suffix, question) -> (resource, request)
    method.end()                     the episode is over (the method's resources stay open)

`CsrMethod` ("csr", the project's own: the ASR reconciler over two resources), `WindowMethod`
("window", by tokens or by chunks), `Bm25Method` ("bm25") and `NoMemoryMethod` ("none"); what
each prompt holds and what a question costs: docs/eval.md, "Methods".

Every method records the chunks its last prompt held (`last_chunks`) and counts the chunks it
was given per observation (`seen`), for evidence coverage (`csr_ros.bench.eval.evidence`).
A question's static tokens reuse what the resource still caches: `PrefixCache` keeps the
longest reusable prefix (the committed run when the request extends it, else the profile) and
counts every token that had to be computed again ("recomputed").
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from csr_ros.chunks import ChunkPolicy
from csr_ros.errors import ConfigError
from csr_ros.bench.eval.episode import Observation
from csr_ros.eviction import make_policy
from csr_ros.layout import Layout
from csr_ros.state import Chunk, CsrState, Request

METHODS = ("csr", "window", "bm25", "none")


@dataclass(frozen=True)
class Prepared:
    """What a question costs before its answer: tokens reused from the resource's cache."""

    n_reused: int
    n_prompt: int

    @property
    def n_recomputed(self) -> int:
        return self.n_prompt - self.n_reused


class PrefixCache:
    """Keeps a resource's committed run the longest prefix of the next request it can be.

    Local engine: the committed run stays when the request extends it; otherwise the capsule
    of the profile (taken once per episode) is restored, in O(1), and the request's tokens
    after it are computed. OpenAI servers hold their own prefix cache; the client only forgets
    what it committed, and the reuse is counted as the longest common prefix with the previous
    prompt (what a prefix cache keeps), or the server's `cached_tokens` where it says.
    """

    def __init__(self, resource):
        self.resource = resource
        self.local = resource.capabilities.capsules
        self._prefix_ids: tuple[int, ...] = ()
        self._prefix_capsule = None
        self._last_ids: tuple[int, ...] = ()

    def begin(self, prefix_ids: Sequence[int], prefix_text: str | None) -> None:
        self._prefix_ids = tuple(prefix_ids)
        self._last_ids = ()
        self.resource.load(self._prefix_ids, prefix_text)
        if self.local:
            self._prefix_capsule = self.resource.engine.snapshot()
        self._last_ids = self._prefix_ids

    def prepare(self, request: Request) -> Prepared:
        static = request.static_ids
        committed = self.resource.committed_ids
        if static[:len(committed)] != committed:
            if self.local and static[:len(self._prefix_ids)] == self._prefix_ids:
                self.resource.engine.restore(self._prefix_capsule)
            else:
                self.resource.load(())     # local: a cold state; OpenAI: forget what was sent
        if self.local:
            n_reused = self.resource.n_committed
        else:
            n_reused = _common_prefix(self._last_ids, request.ids)
        self._last_ids = request.ids
        return Prepared(n_reused=n_reused, n_prompt=len(request.ids))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class _History:
    """Every chunk of the episode, tokenized once (the same splitting as the CSR state)."""

    def __init__(self, tokenizer, layout: Layout, profile: str, mode: str, policy: ChunkPolicy):
        self.state = CsrState(tokenizer=tokenizer, layout=layout, profile=profile, mode=mode,
                              policy=policy)

    def add(self, obs: Observation) -> list[Chunk]:
        return self.state.add(obs.text, source=obs.source, stamp_ns=obs.stamp_ns)

    @property
    def chunks(self) -> list[Chunk]:
        return self.state.chunks

    def view(self, chunks: list[Chunk]) -> CsrState:
        """A state of the same profile holding `chunks` (in the order given)."""
        s = self.state
        return CsrState(tokenizer=s.tokenizer, layout=s.layout, profile=s.profile, mode=s.mode,
                        policy=s.policy, next_seq=s.next_seq, chunks=list(chunks))


class MemoryMethod:
    """Base: one resource, a fresh prompt per question (`select` picks the chunks)."""

    name = ""

    def __init__(self, resource, tokenizer, layout: Layout, *, mode: str = "token",
                 policy: ChunkPolicy | None = None):
        self.resource = resource
        self.tokenizer = tokenizer
        self.layout = layout
        self.mode = mode
        self.policy = policy or ChunkPolicy()
        self.cache = PrefixCache(resource)
        self.history: _History | None = None
        self.last_chunks: list[Chunk] = []
        self.seen: Counter = Counter()

    @property
    def budget(self) -> dict:
        return {}

    @property
    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.budget.items()]
        return " ".join([self.name] + parts)

    def begin(self, profile: str) -> None:
        self.history = _History(self.tokenizer, self.layout, profile, self.mode, self.policy)
        self.last_chunks, self.seen = [], Counter()
        state = self.history.state
        self.cache.begin(state.prefix_ids, state.prefix_text if self.mode == "text" else None)

    def observe(self, obs: Observation) -> list[Chunk]:
        chunks = self.history.add(obs)
        self.seen.update((c.source, c.stamp_ns) for c in chunks)
        return chunks

    def select(self, question: str) -> list[Chunk]:
        raise NotImplementedError

    def prompt(self, task: str, suffix: str, question: str) -> tuple[object, Request, Prepared]:
        chunks = self.select(question)
        self.last_chunks = list(chunks)
        request = self.history.view(chunks).build_request(task=task, suffix=suffix)
        return self.resource, request, self.cache.prepare(request)

    def end(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class NoMemoryMethod(MemoryMethod):
    name = "none"

    def select(self, question: str) -> list[Chunk]:
        return []


class WindowMethod(MemoryMethod):
    name = "window"

    def __init__(self, resource, tokenizer, layout, *, window_tokens: int | None = None,
                 window_chunks: int | None = None, **kw):
        if (window_tokens is None) == (window_chunks is None):
            raise ConfigError("a window holds window_tokens tokens or window_chunks chunks: "
                              "give one of them")
        if window_tokens is not None and window_tokens < 0:
            raise ConfigError(f"window_tokens must be >= 0, got {window_tokens}")
        if window_chunks is not None and window_chunks < 1:
            raise ConfigError(f"window_chunks must be >= 1, got {window_chunks}")
        super().__init__(resource, tokenizer, layout, **kw)
        self.window_tokens = None if window_tokens is None else int(window_tokens)
        self.window_chunks = None if window_chunks is None else int(window_chunks)

    @property
    def budget(self) -> dict:
        if self.window_chunks is not None:
            return {"window_chunks": self.window_chunks}
        return {"window_tokens": self.window_tokens}

    def select(self, question: str) -> list[Chunk]:
        if self.window_chunks is not None:
            return self.history.chunks[-self.window_chunks:]
        chosen, total = [], 0
        for chunk in reversed(self.history.chunks):
            if total + chunk.n_tokens > self.window_tokens:
                break
            chosen.append(chunk)
            total += chunk.n_tokens
        return chosen[::-1]


_WORD_SPLIT = re.compile(r"[^0-9a-z]+")


def bm25_text(text: str) -> str:
    """Lower case, every non-alphanumeric run (underscores, '/', '=') a space: `red_mug` and
    'red mug' match."""
    return _WORD_SPLIT.sub(" ", text.lower()).strip()


class Bm25Method(MemoryMethod):
    name = "bm25"

    def __init__(self, resource, tokenizer, layout, *, k: int, **kw):
        if k < 1:
            raise ConfigError(f"bm25 k must be >= 1, got {k}")
        super().__init__(resource, tokenizer, layout, **kw)
        self.k = int(k)
        self._index = None
        self._indexed = 0

    @property
    def budget(self) -> dict:
        return {"k": self.k}

    def begin(self, profile: str) -> None:
        super().begin(profile)
        self._index, self._indexed = None, 0

    def select(self, question: str) -> list[Chunk]:
        import bm25s

        chunks = self.history.chunks
        if not chunks:
            return []
        if self._index is None or self._indexed != len(chunks):
            # bm25s indexes a fixed corpus; re-indexing a few thousand chunks takes milliseconds
            corpus = bm25s.tokenize([bm25_text(c.text) for c in chunks], stopwords="en",
                                    show_progress=False)
            self._index = bm25s.BM25()
            self._index.index(corpus, show_progress=False)
            self._indexed = len(chunks)
        query = bm25s.tokenize([bm25_text(question)], stopwords="en", show_progress=False)
        if not query.vocab:
            return []
        k = min(self.k, len(chunks))
        docs, scores = self._index.retrieve(query, k=k, show_progress=False)
        picked = sorted(int(d) for d, s in zip(docs[0], scores[0]) if s > 0)
        return [chunks[i] for i in picked]


class CsrMethod:
    """CSR with ASR: the reconciler runs over two resources; questions go to the primary."""

    name = "csr"

    def __init__(self, resources: Sequence, tokenizer, layout: Layout, *, tau_mem_tokens: int,
                 max_context_tokens: int, eviction: str = "oldest_fraction",
                 eviction_params: dict | None = None, reserve_tokens: int = 256,
                 n_catchup_tokens: int = 64, mode: str = "token",
                 policy: ChunkPolicy | None = None):
        from csr_ros.reconcile.machine import ReconcileConfig

        if len(resources) != 2:
            raise ConfigError("csr needs two resources (primary and secondary for ASR)")
        self.resources = list(resources)
        self.tokenizer = tokenizer
        self.layout = layout
        self.mode = mode
        self.policy = policy or ChunkPolicy()
        self.eviction = eviction
        self.eviction_params = dict(eviction_params or {})
        if eviction == "oldest_fraction":
            self.eviction_params.setdefault("fraction", 0.5)
        self.evict = make_policy(eviction, **self.eviction_params)
        self.config = ReconcileConfig(tau_mem_tokens=int(tau_mem_tokens),
                                      max_context_tokens=int(max_context_tokens),
                                      reserve_tokens=int(reserve_tokens),
                                      n_catchup_tokens=int(n_catchup_tokens))
        self.reconciler = None
        self._last_ids: tuple[int, ...] = ()
        self.last_chunks: list[Chunk] = []
        self.seen: Counter = Counter()
        self.totals = {"swaps": 0, "fallbacks": 0, "evicted_chunks": 0}

    @property
    def budget(self) -> dict:
        params = ",".join(f"{k}={v}" for k, v in self.eviction_params.items())
        return {"tau_mem_tokens": self.config.tau_mem_tokens,
                "eviction": f"{self.eviction}({params})" if params else self.eviction}

    @property
    def label(self) -> str:
        return f"csr tau_mem={self.config.tau_mem_tokens}"

    def begin(self, profile: str) -> None:
        from csr_ros.reconcile.driver import Reconciler

        self.end()
        state = CsrState(tokenizer=self.tokenizer, layout=self.layout, profile=profile,
                         mode=self.mode, policy=self.policy)
        for resource in self.resources:
            resource.load(())
        self.reconciler = Reconciler(state, self.resources, self.config, policy=self.evict)
        self.reconciler.start(wait=True)
        self._last_ids = ()
        self.last_chunks, self.seen = [], Counter()

    def observe(self, obs: Observation) -> list[Chunk]:
        rec = self.reconciler
        chunks = rec.add_chunk(obs.text, source=obs.source, stamp_ns=obs.stamp_ns)
        self.seen.update((c.source, c.stamp_ns) for c in chunks)
        if rec.machine.reconciling:
            # On the robot the warm-up runs while new chunks keep arriving (viability, eq. 54);
            # a replay is much faster than the robot, so let it finish before the next chunk.
            rec.wait_idle()
        return chunks

    def prompt(self, task: str, suffix: str, question: str) -> tuple[object, Request, Prepared]:
        rec = self.reconciler
        rec.wait_idle()          # the eager extends of the newest chunks, as on an idle robot
        request = rec.machine.active.build_request(task=task, suffix=suffix)
        self.last_chunks = list(rec.machine.active.chunks)
        resource = rec.primary
        # Only a query routed through the machine may commit static tokens; after wait_idle the
        # primary holds the whole active static part (eager extends), so asking it directly
        # leaves the machine's view of every resource true.
        assert resource.committed_ids == request.static_ids, (
            f"{resource.name} holds {resource.n_committed} tokens, the active state "
            f"{request.n_static}: the reconciler was not idle")
        if resource.capabilities.capsules:
            n_reused = resource.n_committed
        else:
            n_reused = max(_common_prefix(self._last_ids, request.ids), resource.n_committed)
        self._last_ids = request.ids
        return resource, request, Prepared(n_reused=n_reused, n_prompt=len(request.ids))

    def end(self) -> dict:
        if self.reconciler is None:
            return {}
        snap = self.reconciler.snapshot()
        acc = self.reconciler.accounting()
        self.reconciler.close()
        self.reconciler = None
        info = {"swaps": int(snap.get("swaps", 0)), "fallbacks": int(snap.get("fallbacks", 0)),
                "evicted_chunks": len(acc.evicted_seqs)}
        for key, value in info.items():
            self.totals[key] += value
        return info

    def close(self) -> None:
        self.end()
