"""The lean forward on small random Qwen2 models: q/k/v biases, tied and untied heads.

Runs everywhere (no download). The biases are drawn large on purpose: transformers initializes
them to zero, and a forward that dropped them would then agree with one that adds them.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from csr_ros.engine import TorchEngine  # noqa: E402
from csr_ros.engine import lean  # noqa: E402

PROMPT = [(i * 53 + 7) % 256 for i in range(90)]


def _tiny_qwen2(*, tied: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    config = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=0.1,
                         tie_word_embeddings=tied)
    config._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("tied", [True, False], ids=["tied_head", "untied_head"])
def test_the_lean_forward_of_a_biased_qwen2_decodes_as_transformers_generate(tied):
    model = _tiny_qwen2(tied=tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    with torch.inference_mode():
        reference_logits = model(torch.tensor([PROMPT])).logits[0, -1]
        reference = model.generate(torch.tensor([PROMPT]), max_new_tokens=10, min_new_tokens=10,
                                   do_sample=False)[0, len(PROMPT):].tolist()
    engine = TorchEngine(model, max_context_tokens=256)
    assert engine.forward_kind == "lean"
    engine.extend(PROMPT[:60])
    assert list(engine.query(PROMPT[60:], max_new_tokens=10, eos_ids=()).token_ids) == reference
    engine.extend(PROMPT[60:])
    assert torch.allclose(engine.last_logits, reference_logits.float(), atol=1e-4, rtol=0)


def test_the_q_k_v_biases_change_what_the_lean_forward_computes():
    biased = TorchEngine(_tiny_qwen2(tied=True), max_context_tokens=256)
    model = _tiny_qwen2(tied=True)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.zero_()
    unbiased = TorchEngine(model, max_context_tokens=256)
    biased.extend(PROMPT)
    unbiased.extend(PROMPT)
    assert (biased.last_logits - unbiased.last_logits).abs().max() > 0.01


def test_a_model_the_lean_forward_cannot_run_falls_back_with_its_reason_logged(tiny_hybrid_model,
                                                                              caplog):
    reason = lean.unsupported_reason(tiny_hybrid_model)
    assert reason is not None
    with caplog.at_level(logging.INFO, logger="csr_ros.engine.torch_engine"):
        engine = TorchEngine(tiny_hybrid_model, max_context_tokens=128)
    assert engine.forward_kind == "transformers"
    assert any(reason in record.getMessage() for record in caplog.records)


def test_int8_decode_steps_of_a_biased_qwen2_add_the_biases():
    """A decode step on int8 weights stays near the float block forward of the same token (0.04
    here); without the q/k/v biases the same step is 0.3 away."""
    engine = TorchEngine(_tiny_qwen2(tied=False), dtype="bfloat16", decode_weights="int8",
                         max_context_tokens=256)
    engine.extend(PROMPT)
    token, pos = torch.tensor([5]), engine.n_committed
    with torch.inference_mode():
        block = engine._lean.forward(token, engine._buffers, pos, step=False).float()
        step = engine._lean.forward(token, engine._buffers, pos, step=True).float()
    assert (step - block).abs().max() < 0.15
