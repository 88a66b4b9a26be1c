"""Grammar-constrained decoding for the local engine, with llguidance.

    constraint = GrammarConstraint.compile(compiler, output_constraint)   # per query
    engine.query(dynamic_ids, max_new_tokens, constraint=constraint)

llguidance computes, for the parser state after the tokens so far, the set of tokens that keep
the answer inside the grammar (a bitmask over the vocabulary); the decoder sets every other
logit to -inf before sampling, so every answer parses. The mask is a numpy array, so both
backends use it (the llama.cpp one without torch). It reads the model's `tokenizer.json`
itself (Rust, no transformers), takes GBNF (the grammar llama.cpp's and vLLM's servers get),
JSON schemas and choice lists, and compiles lazily: a grammar whose enumerations change from
one decision to the next costs about a millisecond to set up.

`mask_s` and `n_masks` add up the time spent computing masks, so the per-token cost of
constraining can be reported next to the forward pass it rides on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from csr_ros.actions import OutputConstraint
from csr_ros.errors import ActionSpecError, ConfigError


class GrammarCompiler:
    """The vocabulary side of llguidance, built once per tokenizer (about 0.2 s)."""

    def __init__(self, tokenizer_json: str | Path, *, vocab_size: int,
                 eos_ids: Sequence[int]):
        try:
            import llguidance
        except ImportError:
            raise ConfigError("constrained decoding on the local engine needs llguidance: "
                              "pip install 'csr_ros[local]' (or llguidance==1.9.1)") from None
        self._llg = llguidance
        self.vocab_size = int(vocab_size)
        self.tokenizer = llguidance.LLTokenizer(str(tokenizer_json), n_vocab=self.vocab_size,
                                                eos_token=list(eos_ids) or None)
        self._grammars: dict[tuple, str] = {}

    def grammar(self, constraint: OutputConstraint) -> str:
        """llguidance's grammar for the constraint (cached: the same text compiles once)."""
        if constraint.kind == "json":
            key = ("json", json.dumps(constraint.json_schema, sort_keys=True))
        elif constraint.kind == "choice":
            key = ("choice",) + constraint.choices
        else:
            key = ("gbnf", constraint.grammar)
        grammar = self._grammars.get(key)
        if grammar is None:
            llg = self._llg
            try:
                if key[0] == "json":
                    # Compact JSON: flexible whitespace lets a small model pad with newlines
                    # until the budget ends.
                    grammar = llg.LLMatcher.grammar_from_json_schema(
                        constraint.json_schema,
                        overrides={"whitespace_flexible": False, "item_separator": ", ",
                                   "key_separator": ": "})
                elif key[0] == "choice":
                    grammar = llg.grammar_from("choice", json.dumps(list(constraint.choices)))
                else:
                    grammar = llg.grammar_from("gbnf", constraint.grammar)
            except ValueError as exc:
                raise ActionSpecError(f"llguidance cannot read the action grammar: {exc}") \
                    from None
            if len(self._grammars) > 256:
                self._grammars.clear()
            self._grammars[key] = grammar
        return grammar

    def compile(self, constraint: OutputConstraint) -> "GrammarConstraint":
        matcher = self._llg.LLMatcher(self.tokenizer, self.grammar(constraint), log_level=0)
        if matcher.is_error():
            raise ActionSpecError(f"the action grammar does not compile: {matcher.get_error()}")
        return GrammarConstraint(matcher, self.vocab_size)


class GrammarConstraint:
    """One answer's parser state; the decoder's `TokenConstraint`."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.mask_s = 0.0
        self.n_masks = 0

    def allowed(self, n_vocab: int) -> np.ndarray:
        """[n_vocab] bool: the tokens the grammar allows next (none past the tokenizer's
        vocabulary, where a model's logits row is padded)."""
        started = time.perf_counter()
        packed = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.zeros(n_vocab, dtype=np.bool_)
        bits = np.unpackbits(packed, bitorder="little")[:n_vocab]
        allowed[:len(bits)] = bits
        self.mask_s += time.perf_counter() - started
        self.n_masks += 1
        return allowed

    def forced(self) -> list[int]:
        """The tokens the grammar allows next with no alternative (llguidance's fast-forward:
        `(object: ` after `pick`), appended by the engine without sampling."""
        started = time.perf_counter()
        tokens = self.matcher.compute_ff_tokens()
        self.mask_s += time.perf_counter() - started
        return tokens

    def accept(self, token: int) -> bool:
        if not self.matcher.consume_token(int(token)):
            return True                          # cannot happen with the mask applied
        return self.matcher.is_stopped()
