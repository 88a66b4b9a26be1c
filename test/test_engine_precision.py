"""The engine's fast paths: the lean llama forward against transformers' own, capsules exact in
every precision the engine offers, and how closely the fast precisions follow the fp32 reference.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from csr_ros.engine import TorchEngine, lean, precision  # noqa: E402
from csr_ros.errors import CapsuleMismatchError, ConfigError  # noqa: E402

# Every precision the engine offers on a CPU: (dtype, decode weights).
PRECISIONS = [("float32", "float"), ("bfloat16", "float"), ("float16", "float"),
              ("bfloat16", "int8"), ("bfloat16", "int4")] + \
    ([("float32", "fp16")] if lean.fp16_available() else [])      # fbgemm: x86 builds
PROMPT = [(i * 37 + 11) % 256 for i in range(300)]


@pytest.fixture(scope="module")
def tiny_llama_model():
    """A random llama (grouped-query attention, tied embeddings), fixed seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=512, initializer_range=0.1,
                         tie_word_embeddings=True, rope_theta=10000.0)
    return LlamaForCausalLM(config).eval()


def _tiny(model, **kwargs) -> TorchEngine:
    # The engine moves and casts a passed model in place: each engine gets its own copy.
    return TorchEngine(copy.deepcopy(model), max_context_tokens=512, prefill_chunk_tokens=64,
                       **kwargs)


def test_the_lean_forward_gives_the_logits_of_transformers_forward_in_float32(tiny_llama_model):
    lean, reference = _tiny(tiny_llama_model), _tiny(tiny_llama_model, forward="transformers")
    assert (lean.forward_kind, reference.forward_kind) == ("lean", "transformers")
    for engine in (lean, reference):
        engine.extend(PROMPT[:150])           # three blocks, the last one partial
        engine.extend(PROMPT[150:151])        # a single-token step
    assert torch.allclose(lean.last_logits, reference.last_logits, atol=1e-5, rtol=1e-5)
    ours = lean.query(PROMPT[151:170], max_new_tokens=12, eos_ids=())
    theirs = reference.query(PROMPT[151:170], max_new_tokens=12, eos_ids=())
    assert ours.token_ids == theirs.token_ids


def test_the_last_rows_of_a_lean_block_carry_the_logits_of_transformers_full_forward(
        tiny_llama_model):
    # The lean forward runs the last layer's attention and MLP for the rows that reach the output
    # head only; every row's K/V is still written, so later tokens see the whole block.
    engine = _tiny(tiny_llama_model)
    with torch.inference_mode():
        full = engine.model(torch.tensor([PROMPT[:40]])).logits[0]          # [40, V]
        for start, stop in ((0, 30), (30, 37), (37, 40)):     # causal from empty, then cached
            ids = torch.tensor(PROMPT[start:stop])
            engine.cache.begin_write(stop - start)
            rows = engine._lean.forward(ids, engine._buffers, start, n_logits=3)
            engine.cache.advance(stop - start)
            assert torch.allclose(rows, full[stop - 3:stop], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("dtype", "weights"), PRECISIONS)
def test_capsules_restore_byte_exact_and_decode_identically_in_every_precision(
        tiny_llama_model, dtype, weights):
    engine = _tiny(tiny_llama_model, dtype=dtype, decode_weights=weights)
    engine.extend(PROMPT[:200])
    capsule = engine.snapshot()
    taken = capsule.materialize()
    assert taken.kv[0][0].dtype == getattr(torch, dtype)
    live = engine.query(PROMPT[200:220], max_new_tokens=12, eos_ids=())
    engine.extend(PROMPT[200:260])
    engine.restore(capsule)
    again = engine.snapshot().materialize()
    assert torch.equal(taken.last_logits, again.last_logits)
    assert all(torch.equal(ka, kb) and torch.equal(va, vb)
               for (ka, va), (kb, vb) in zip(taken.kv, again.kv))
    assert engine.query(PROMPT[200:220], max_new_tokens=12, eos_ids=()).token_ids == live.token_ids
    child = engine.fork()
    assert child.query(PROMPT[200:220], max_new_tokens=12, eos_ids=()).token_ids == live.token_ids


@pytest.mark.parametrize(("dtype", "weights"), [p for p in PRECISIONS if p[1] != "float"])
def test_a_saved_capsule_of_quantized_decode_weights_restores_only_into_the_same_precision(
        tiny_llama_model, tmp_path, dtype, weights):
    engine = _tiny(tiny_llama_model, dtype=dtype, decode_weights=weights)
    engine.extend(PROMPT[:120])
    live = engine.query(PROMPT[120:130], max_new_tokens=8, eos_ids=())
    path = engine.save_capsule(engine.snapshot(), tmp_path / "q.capsule")
    same = _tiny(tiny_llama_model, dtype=dtype, decode_weights=weights)
    same.restore(same.load_capsule(path))
    assert same.query(PROMPT[120:130], max_new_tokens=8, eos_ids=()).token_ids == live.token_ids
    other = _tiny(tiny_llama_model, dtype=dtype)
    with pytest.raises(CapsuleMismatchError, match=f"{weights}-decode"):
        other.restore(other.load_capsule(path))


def test_the_hybrid_model_runs_transformers_forward_and_refuses_quantized_decode_weights(
        tiny_hybrid_model):
    engine = TorchEngine(copy.deepcopy(tiny_hybrid_model), max_context_tokens=512, dtype="auto")
    assert engine.forward_kind == "transformers" and engine.decode_weights == "float"
    with pytest.raises(ConfigError, match="needs the lean forward"):
        TorchEngine(copy.deepcopy(tiny_hybrid_model), max_context_tokens=512, dtype="bfloat16",
                    decode_weights="int4")
    with pytest.raises(ConfigError, match="forward='lean' does not run this model"):
        TorchEngine(copy.deepcopy(tiny_hybrid_model), max_context_tokens=512, forward="lean")


def test_quantized_decode_weights_need_bfloat16_activations(tiny_llama_model):
    with pytest.raises(ConfigError, match="bfloat16 activations"):
        _tiny(tiny_llama_model, dtype="float32", decode_weights="int4")
    with pytest.raises(ConfigError, match="decode_weights must be one of"):
        _tiny(tiny_llama_model, decode_weights="int3")
    with pytest.raises(ConfigError, match="float32 activations"):
        _tiny(tiny_llama_model, dtype="bfloat16", decode_weights="fp16")


def test_a_cpu_told_it_has_no_bf16_takes_the_float32_path_of_auto(tiny_llama_model, monkeypatch):
    monkeypatch.setenv("CSR_ROS_CPU_BF16", "0")
    assert not precision.native_bf16()
    engine = _tiny(tiny_llama_model, dtype="auto")
    assert engine.precision in ("torch.float32+fp16-decode", "torch.float32")


def test_auto_picks_bf16_with_int4_decode_where_the_cpu_has_native_bf16_else_fp16_decode(
        tiny_llama_model):
    engine = _tiny(tiny_llama_model, dtype="auto")
    if precision.native_bf16():
        assert engine.precision == "torch.bfloat16+int4-decode"
    elif lean.fp16_available():
        assert engine.precision == "torch.float32+fp16-decode"
    else:
        assert engine.precision == "torch.float32"
    facts = precision.describe()
    assert facts["native_bf16"] == precision.native_bf16()
    assert facts["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


# How closely each fast precision follows the fp32 reference on the real model, teacher-forced:
# the reference's and the fast engine's top-1 next token at every position of a real text, fed
# one token at a time (so decode steps use the decode weights). Measured on SmolLM2 over the 120
# positions after the first 60 tokens of TEACHER_FORCED_TEXT; the bounds sit below the measured
# values (see docs/engine.md). The text is fixed: the floors hold for it, not for any text.
AGREEMENT_FLOOR = {("bfloat16", "float"): 0.9, ("bfloat16", "int8"): 0.88,
                   ("bfloat16", "int4"): 0.88,
                   **({("float32", "fp16"): 0.95} if lean.fp16_available() else {})}


TEACHER_FORCED_TEXT = Path(__file__).resolve().parent / "data" / "teacher_forced_text.md"


@pytest.fixture(scope="module")
def reference_steps(smollm2_engine, text_ids):
    return _teacher_forced_top1(smollm2_engine, text_ids)


@pytest.fixture(scope="module")
def text_ids(smollm2_engine):
    ids = smollm2_engine.tokenizer.encode_data(TEACHER_FORCED_TEXT.read_text())
    assert len(ids) >= 180, f"{TEACHER_FORCED_TEXT.name} is too short: {len(ids)} tokens"
    return ids[:180]


def _teacher_forced_top1(engine, ids, start=60):
    engine.reset()
    engine.extend(ids[:start])
    tops = [int(engine.last_logits.argmax())]
    for token in ids[start:-1]:
        engine.extend([token])
        tops.append(int(engine.last_logits.argmax()))
    engine.reset()
    return tops


@pytest.mark.parametrize(("dtype", "weights"), sorted(AGREEMENT_FLOOR))
def test_fast_precisions_follow_the_fp32_reference_top1_on_real_text(
        reference_steps, text_ids, dtype, weights):
    engine = TorchEngine("smollm2", max_context_tokens=1024, dtype=dtype, decode_weights=weights)
    try:
        ours = _teacher_forced_top1(engine, text_ids)
    finally:
        engine.close()
    agreement = sum(a == b for a, b in zip(ours, reference_steps)) / len(reference_steps)
    assert agreement >= AGREEMENT_FLOOR[(dtype, weights)], f"top-1 agreement {agreement:.3f}"


def test_decode_threads_apply_to_decode_steps_only_and_change_no_token(tiny_llama_model):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        plain = _tiny(tiny_llama_model, dtype="bfloat16", decode_weights="int4")
        single = _tiny(tiny_llama_model, dtype="bfloat16", decode_weights="int4", decode_threads=1)
        assert _tiny(tiny_llama_model, dtype="auto").decode_threads is None   # as `threads`
        for engine in (plain, single):
            engine.extend(PROMPT[:100])
        ours = single.query(PROMPT[100:120], max_new_tokens=10, eos_ids=())
        assert torch.get_num_threads() == 2
        assert ours.token_ids == plain.query(PROMPT[100:120], max_new_tokens=10,
                                             eos_ids=()).token_ids
        with pytest.raises(ConfigError, match="decode_threads must be >= 1"):
            _tiny(tiny_llama_model, decode_threads=0)
    finally:
        torch.set_num_threads(before)


def test_decode_attention_splits_only_long_histories_and_only_to_balance_the_threads():
    assert lean.decode_kv_parts(n_kv=3, threads=1, n_keys=8000) == 1
    assert lean.decode_kv_parts(n_kv=3, threads=2, n_keys=1024) == 1       # short: not worth it
    assert lean.decode_kv_parts(n_kv=3, threads=2, n_keys=4096) == 2       # 6 items on 2 threads
    assert lean.decode_kv_parts(n_kv=3, threads=4, n_keys=8192) == 4       # 12 on 4
    assert lean.decode_kv_parts(n_kv=3, threads=4, n_keys=2048) == 2       # parts >= 1024 keys
    assert lean.decode_kv_parts(n_kv=4, threads=2, n_keys=8000) == 1       # balanced already


@pytest.mark.parametrize("end", [2048, 4096, 4099, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_decode_attention_equals_sdpa_over_the_same_buffers(end, dtype):
    torch.manual_seed(end)
    n_kv, groups, head_dim, max_len = 3, 3, 64, 6000
    keys_buf, values_buf = (torch.randn(n_kv, max_len, head_dim).to(dtype) for _ in range(2))
    grouped = torch.randn(n_kv, groups, head_dim).to(dtype)
    want = torch.nn.functional.scaled_dot_product_attention(
        grouped[None].float(), keys_buf[None, :, :end].float(), values_buf[None, :, :end].float(),
        scale=head_dim ** -0.5)[0]
    for parts in (2, 3, 4):
        got = lean.split_attention(grouped, keys_buf, values_buf, end, parts, head_dim ** -0.5)
        assert got.shape == grouped.shape and got.dtype == dtype
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        assert torch.allclose(got.float(), want, atol=tolerance, rtol=tolerance), parts
