"""The checks that hold for every model on the torch engine, run on SmolLM2 by the engine tests
and on Qwen2 by test/test_engine_qwen2.py."""

from __future__ import annotations

import torch


def assert_same_state(a, b) -> None:
    """Every tensor of two materialized capsules is equal, bit for bit."""
    assert (a.n_tokens, a.token_ids, a.layer_types) == (b.n_tokens, b.token_ids, b.layer_types)
    assert torch.equal(a.last_logits, b.last_logits)
    assert sorted(a.linear_state) == sorted(b.linear_state)
    for name in a.linear_state:
        assert torch.equal(a.linear_state[name], b.linear_state[name]), name
    assert len(a.kv) == len(b.kv)
    for (ka, va), (kb, vb) in zip(a.kv, b.kv):
        assert torch.equal(ka, kb) and torch.equal(va, vb)


def assert_greedy_matches_generate(engine, static, dynamic, n_tokens: int = 8) -> None:
    """The engine's greedy answer to a CSR query is transformers' generate() on the prompt."""
    engine.extend(static)
    ours = engine.query(dynamic, max_new_tokens=n_tokens, eos_ids=())
    with torch.inference_mode():
        out = engine.model.generate(torch.tensor([list(static) + list(dynamic)]),
                                    max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                                    do_sample=False)
    assert list(ours.token_ids) == out[0, len(static) + len(dynamic):].tolist()


def assert_capsule_restores_exactly(engine, static, dynamic) -> None:
    """A capsule taken after `static`, restored after the engine moved on, gives the same
    tensors bit for bit and the same greedy answer."""
    engine.extend(static)
    capsule = engine.snapshot()
    taken = capsule.materialize()
    live = engine.query(dynamic, max_new_tokens=6)
    engine.extend(dynamic)                       # move on: more committed tokens
    engine.restore(capsule)                      # O(1) for K/V
    assert_same_state(taken, engine.snapshot().materialize())
    assert engine.query(dynamic, max_new_tokens=6).token_ids == live.token_ids
