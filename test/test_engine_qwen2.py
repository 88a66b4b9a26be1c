"""The local engine on a Qwen2 model: Qwen2.5-Coder-0.5B-Instruct, the catalog's smaller model.

Qwen2 differs from the embedded SmolLM2 in what the lean forward and the prompt layout must get
right: q/k/v biases, an output head over a 151,936-token vocabulary, and its own ChatML template.
Runs where the model is prepared (`csr-ros model prepare qwen2.5-coder-0.5b`; scripts/setup.sh
--qwen does it); skipped otherwise, and failed instead under CSR_ROS_REQUIRE_QWEN=1
(scripts/test.sh).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from csr_ros.errors import ModelNotFoundError  # noqa: E402
from csr_ros.model_store import resolve_gguf  # noqa: E402
from support.engine_checks import (assert_capsule_restores_exactly,  # noqa: E402
                                   assert_greedy_matches_generate)

MODEL = "qwen2.5-coder-0.5b"

try:
    resolve_gguf(MODEL)
except ModelNotFoundError as error:
    if os.environ.get("CSR_ROS_REQUIRE_QWEN") == "1":
        raise
    pytest.skip(f"{error}", allow_module_level=True)


@pytest.fixture(scope="module")
def qwen_engine():
    from csr_ros.engine import TorchEngine

    engine = TorchEngine(MODEL, max_context_tokens=1024)
    yield engine
    engine.close()


@pytest.fixture
def qwen(qwen_engine):
    qwen_engine.reset()
    return qwen_engine


@pytest.fixture(scope="module")
def qwen_prompt(qwen_engine):
    """A real CSR prompt in Qwen's template: (static_ids, dynamic_ids)."""
    from support.robot_prompts import robot_prompt_ids

    return robot_prompt_ids(qwen_engine.tokenizer)


def test_qwens_chatml_template_splits_into_fixed_runs_around_the_system_and_user_messages(
        qwen_engine):
    from csr_ros.layout import Layout

    tokenizer = qwen_engine.tokenizer
    layout = Layout.from_tokenizer(tokenizer)
    assert layout.head_text == "<|im_start|>system\n"
    assert layout.mid_text == "<|im_end|>\n<|im_start|>user\n"
    assert layout.tail_text == "<|im_end|>\n<|im_start|>assistant\n"
    start, end = tokenizer.encode_template("<|im_start|>"), tokenizer.encode_template("<|im_end|>")
    assert len(start) == len(end) == 1
    assert layout.head_ids[0] == start[0] and layout.tail_ids[0] == end[0]
    assert end[0] in tokenizer.eos_token_ids
    # Chunk text that spells a control token stays text.
    assert end[0] not in tokenizer.encode_data("battery <|im_end|> low")


def test_qwen2_runs_on_the_lean_forward_with_its_qkv_biases(qwen):
    assert qwen.config.model_type == "qwen2" and qwen.forward_kind == "lean"
    attention = qwen.model.model.layers[0].self_attn
    assert attention.q_proj.bias is not None and attention.o_proj.bias is None
    with torch.inference_mode():
        assert bool(attention.k_proj.bias.abs().sum() > 0), "the biases must be the loaded ones"


def test_greedy_decoding_of_qwen2_on_the_lean_forward_matches_transformers_generate(
        qwen, qwen_prompt):
    assert qwen.precision == "torch.float32"
    assert_greedy_matches_generate(qwen, *qwen_prompt)


def test_the_lean_forward_of_qwen2_gives_transformers_logits_within_float32_rounding(
        qwen, qwen_prompt):
    static, dynamic = qwen_prompt
    prompt = list(static) + list(dynamic)
    qwen.extend(prompt)
    with torch.inference_mode():
        reference = qwen.model(torch.tensor([prompt])).logits[0, -1].float()
    # Fused q/k/v and gate/up matmuls add in another order: not bit-identical, but close, and
    # a missing bias would move the logits by whole units.
    assert torch.allclose(qwen.last_logits, reference, atol=2e-3, rtol=0)


def test_restoring_a_capsule_of_qwen2_is_byte_exact_and_decodes_identically(qwen, qwen_prompt):
    assert_capsule_restores_exactly(qwen, *qwen_prompt)


def test_a_fork_of_a_qwen2_engine_decodes_like_its_parent_and_stays_independent(qwen,
                                                                               qwen_prompt):
    static, dynamic = qwen_prompt
    qwen.extend(static)
    expected = qwen.query(dynamic, max_new_tokens=6).token_ids
    child = qwen.fork()
    try:
        assert child.model is qwen.model
        child.extend(dynamic)                   # the child moves on, the parent does not
        assert qwen.n_committed == len(static)
        assert qwen.query(dynamic, max_new_tokens=6).token_ids == expected
        child.restore(qwen.snapshot())
        assert child.query(dynamic, max_new_tokens=6).token_ids == expected
    finally:
        child.close()


def test_llama_cpp_tokenizes_qwen_prompts_as_the_converted_tokenizer_does(qwen_engine):
    """Token mode sends ids to a llama.cpp server of the same GGUF: both must agree."""
    llama_cpp = pytest.importorskip("llama_cpp")

    vocab = llama_cpp.Llama(model_path=str(resolve_gguf(MODEL)), vocab_only=True, verbose=False)
    tokenizer = qwen_engine.tokenizer
    texts = ["[t=1.5s] odom x=12345.67 y=-0.05 yaw=0.30; battery 95%; lidar min 1.40 m ahead",
             "Sighting: a red mug \U0001f375 in the kitchen \u2014 by the sink.\n\n  a\ttab",
             "the operator said: <|im_end|> go on",
             "What is the location of towel 1, cloth 2, soapbar 3 at step 76?"]
    for text in texts:
        assert tokenizer.encode_data(text) == vocab.tokenize(text.encode(), add_bos=False,
                                                             special=False), text
    run = "<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.encode_template(run) == vocab.tokenize(run.encode(), add_bos=False,
                                                            special=True)


def test_a_llama_cpp_server_of_the_catalog_name_is_checked_against_its_own_tokenizer(
        qwen_engine, tmp_path):
    """`serve llamacpp --model NAME` serves the joined GGUF under NAME, and an OpenAI resource
    asked for NAME reads NAME's tokenizer (the health check compares it with the server's)."""
    from csr_ros.resources.openai import OpenAIOptions, OpenAIResource
    from csr_ros.servers import free_port, llamacpp_servers

    pytest.importorskip("llama_cpp.server")
    (server,) = llamacpp_servers([free_port()], model=MODEL, n_ctx=2048, threads=1,
                                 alias=MODEL, log_dir=tmp_path)
    server.start(timeout_s=120.0)
    try:
        resource = OpenAIResource(OpenAIOptions(server.url, model=MODEL))
        info = resource.check_health()
        assert info.kind == "llama.cpp" and info.model == MODEL
        probe = "[t=3.0s] battery 93%; <|im_end|> said the operator"
        assert resource.tokenizer.encode_data(probe) == qwen_engine.tokenizer.encode_data(probe)
        assert resource.tokenizer.chat_template == qwen_engine.tokenizer.chat_template
    finally:
        server.stop()
