"""The local engine and the `local` resource on the real SmolLM2 model (CPU) and a tiny hybrid."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from csr_ros.errors import ConfigError, ContextOverflowError, StateMismatchError  # noqa: E402
from csr_ros.state import QueryId, Request, Version  # noqa: E402
from support.engine_checks import assert_greedy_matches_generate  # noqa: E402


def _request(static, dynamic) -> Request:
    return Request(query_id=QueryId(1), version=Version(0), static_ids=tuple(static),
                   dynamic_ids=tuple(dynamic), i_star=0, last_seq=None)


def _same_state(a, b) -> bool:
    """Two materialized capsules hold identical tensors and ids."""
    if a.token_ids != b.token_ids or a.n_tokens != b.n_tokens:
        return False
    if (a.last_logits is None) != (b.last_logits is None):
        return False
    if a.last_logits is not None and not torch.equal(a.last_logits, b.last_logits):
        return False
    if set(a.linear_state) != set(b.linear_state):
        return False
    if not all(torch.equal(a.linear_state[k], b.linear_state[k]) for k in a.linear_state):
        return False
    return all(torch.equal(ka, kb) and torch.equal(va, vb)
               for (ka, va), (kb, vb) in zip(a.kv, b.kv))


def test_a_query_leaves_the_committed_state_unchanged(smollm2, robot_prompt):
    static, dynamic = robot_prompt
    smollm2.extend(static)
    before = smollm2.snapshot().materialize()
    first = smollm2.query(dynamic, max_new_tokens=4)
    after = smollm2.snapshot().materialize()
    assert _same_state(before, after)
    assert smollm2.n_committed == len(static)
    assert smollm2.query(dynamic, max_new_tokens=4).token_ids == first.token_ids


def test_a_query_leaves_the_recurrent_state_of_a_hybrid_model_unchanged(tiny_hybrid):
    tiny_hybrid.extend(list(range(1, 120)))
    before = tiny_hybrid.snapshot().materialize()
    tiny_hybrid.query([7, 8, 9, 10], max_new_tokens=6)
    assert _same_state(before, tiny_hybrid.snapshot().materialize())
    assert before.linear_state, "the hybrid model must carry conv/recurrent state"


def test_a_csr_query_with_extension_decodes_like_a_cold_prefill_of_the_same_prompt(
        smollm2, robot_prompt):
    static, dynamic = robot_prompt
    smollm2.extend(static[:-40])
    csr = smollm2.query(dynamic, max_new_tokens=6, commit_ids=static[-40:])
    assert csr.n_committed == 40 and smollm2.n_committed == len(static)
    smollm2.reset()
    cold = smollm2.query(list(static) + list(dynamic), max_new_tokens=6)
    assert csr.token_ids == cold.token_ids
    assert csr.ttft_s > 0 and csr.decode_s >= 0


def test_csr_and_cold_prefill_agree_on_the_hybrid_model(tiny_hybrid, tiny_hybrid_model):
    from csr_ros.engine import TorchEngine

    prompt = [(i * 37) % 256 for i in range(300)]
    tiny_hybrid.extend(prompt[:250])
    csr = tiny_hybrid.query(prompt[250:], max_new_tokens=8)
    cold = TorchEngine(tiny_hybrid_model, max_context_tokens=512).query(prompt, max_new_tokens=8)
    assert csr.token_ids == cold.token_ids


def test_greedy_decoding_on_the_lean_forward_matches_transformers_generate(smollm2,
                                                                           robot_prompt):
    assert smollm2.forward_kind == "lean" and smollm2.precision == "torch.float32"
    assert_greedy_matches_generate(smollm2, *robot_prompt)


def test_extending_past_the_context_maximum_is_refused_before_any_compute(smollm2):
    smollm2.extend([100] * 1000)
    before = smollm2.snapshot()
    with pytest.raises(ContextOverflowError, match="max_context_tokens=1024"):
        smollm2.extend([100] * 25)
    with pytest.raises(ContextOverflowError, match="nothing was computed"):
        smollm2.query([100] * 20, max_new_tokens=5)
    assert smollm2.n_committed == 1000
    smollm2.restore(before)   # still fresh: nothing was written
    assert smollm2.query([100] * 20, max_new_tokens=4).finish_reason in ("stop", "length")


def test_an_empty_extend_is_refused(smollm2):
    with pytest.raises(ConfigError, match="is empty"):
        smollm2.extend([])


def test_token_ids_outside_the_vocabulary_are_refused_and_nothing_changes(smollm2):
    smollm2.extend([1, 2, 3])
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        smollm2.extend([5, smollm2.vocab_size])
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        smollm2.query([-1], max_new_tokens=2)
    with pytest.raises(ConfigError, match="integer token ids"):
        smollm2.extend(["hello"])
    assert smollm2.committed_ids == (1, 2, 3)


def test_a_query_needs_a_positive_token_budget(smollm2):
    smollm2.extend([1, 2, 3])
    with pytest.raises(ConfigError, match="max_new_tokens"):
        smollm2.query([4], max_new_tokens=0)


def test_both_backends_are_engines_and_make_engine_builds_either_by_name(smollm2):
    pytest.importorskip("llama_cpp")
    from csr_ros.engine import Engine, make_engine

    gguf = make_engine("smollm2", backend="llamacpp", threads=1, max_context_tokens=256)
    try:
        assert isinstance(smollm2, Engine) and isinstance(gguf, Engine)
        assert (smollm2.backend, gguf.backend) == ("torch", "llamacpp")
        assert gguf.query(gguf.tokenizer.encode_data("The robot"), 2).n_dynamic > 0
    finally:
        gguf.close()
    with pytest.raises(ConfigError, match="backend must be one of"):
        make_engine("smollm2", backend="onnx")


def test_a_stop_string_cuts_the_answer_before_it(smollm2, robot_prompt):
    static, dynamic = robot_prompt
    smollm2.extend(static)
    full = smollm2.query(dynamic, max_new_tokens=8, eos_ids=())
    assert full.finish_reason == "length" and len(full.token_ids) == 8
    cut_token = smollm2.tokenizer.decode(full.token_ids[2:3])
    assert cut_token.strip(), "need a visible token to stop on"
    stopped = smollm2.query(dynamic, max_new_tokens=8, stop=[cut_token], eos_ids=())
    assert stopped.finish_reason == "stop"
    assert cut_token not in stopped.text
    assert full.text.startswith(stopped.text)
    assert len(stopped.token_ids) <= 3


def test_an_eos_token_ends_decoding_with_reason_stop(smollm2, robot_prompt):
    static, dynamic = robot_prompt
    smollm2.extend(static)
    first = smollm2.query(dynamic, max_new_tokens=1).token_ids[0]
    ended = smollm2.query(dynamic, max_new_tokens=8, eos_ids=[first])
    assert ended.token_ids == (first,) and ended.finish_reason == "stop" and ended.text == ""


def test_the_local_resource_extends_the_static_tail_inside_the_query(robot_prompt):
    from csr_ros.resources.base import Resource
    from csr_ros.resources.factory import make_resource

    static, dynamic = robot_prompt
    resource = make_resource("local", model="smollm2", name="r1", max_context_tokens=1024)
    try:
        assert isinstance(resource, Resource)
        assert resource.extend([]).n_committed == 0
        loaded = resource.load(static[:-30])
        assert loaded.n_tokens == loaded.n_committed == len(static) - 30
        result = resource.query(_request(static, dynamic), max_new_tokens=3)
        assert result.n_extended == 30 and result.cached_tokens == len(static) - 30
        assert result.n_prompt == len(static) + len(dynamic) and result.resource == "r1"
        assert resource.committed_ids == tuple(static)
        again = resource.query(_request(static, dynamic), max_new_tokens=3)
        assert again.n_extended == 0 and again.token_ids == result.token_ids
        with pytest.raises(StateMismatchError, match="first difference at token 5"):
            resource.query(_request(static[:5] + (static[5] + 1,) + static[6:], dynamic),
                           max_new_tokens=2)
        with pytest.raises(StateMismatchError, match="fewer than"):
            resource.query(_request(static[:10], dynamic), max_new_tokens=2)
    finally:
        resource.close()


def test_a_load_that_extends_the_held_run_prefills_only_the_rest_and_decodes_like_a_cold_one(
        robot_prompt):
    from csr_ros.resources.factory import make_resource

    static, dynamic = robot_prompt
    resource = make_resource("local", model="smollm2", name="r2", max_context_tokens=1024,
                             dtype="float32", backend="torch")
    try:
        assert resource.load(static[:-50]).n_tokens == len(static) - 50
        reloaded = resource.load(static)
        assert (reloaded.n_tokens, reloaded.n_committed) == (50, len(static))
        assert resource.committed_ids == tuple(static)
        warm = resource.query(_request(static, dynamic), max_new_tokens=6)
        assert resource.load(static).n_tokens == 0       # already held: nothing to prefill
        diverged = static[:10] + (static[10] + 1,) + static[11:]
        assert resource.load(diverged).n_tokens == len(static)   # not a start of it: cold
        assert resource.committed_ids == tuple(diverged)
        resource.load(())
        assert resource.load(static).n_tokens == len(static)
        cold = resource.query(_request(static, dynamic), max_new_tokens=6)
        assert warm.token_ids == cold.token_ids
    finally:
        resource.close()


def test_unknown_layer_types_are_refused_with_a_clear_error():
    from csr_ros.engine.cache import BufferCache

    class Config:
        layer_types = ["sliding_attention"]
        num_hidden_layers = 1
        num_key_value_heads = 1
        num_attention_heads = 1
        hidden_size = 8
        head_dim = 8

    with pytest.raises(ConfigError, match="not supported by the local engine"):
        BufferCache(Config(), max_len=8, dtype=torch.float32, device=torch.device("cpu"))


def test_kv_buffers_are_written_in_place_and_never_reallocated(tiny_hybrid):
    def addresses():
        return [(layer.keys.data_ptr(), layer.values.data_ptr())
                for _, layer in tiny_hybrid.cache.attention_layers()]

    before = addresses()
    tiny_hybrid.extend(list(range(1, 200)))
    capsule = tiny_hybrid.snapshot().materialize()
    tiny_hybrid.query([3, 4, 5], max_new_tokens=5)
    tiny_hybrid.restore(capsule)
    assert addresses() == before
    assert tiny_hybrid.cache.max_len == 512 and tiny_hybrid.n_committed == 199


@pytest.mark.gpu
def test_the_engine_restores_byte_exact_on_cuda(tiny_hybrid_model):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import copy

    from csr_ros.engine import TorchEngine

    # The engine moves a passed model to its device in place: give it its own copy.
    engine = TorchEngine(copy.deepcopy(tiny_hybrid_model), device="cuda", dtype="float32",
                         max_context_tokens=512)
    engine.extend(list(range(1, 150)))
    capsule = engine.snapshot()
    taken = capsule.materialize()
    live = engine.query([9, 8, 7], max_new_tokens=8)
    engine.extend(list(range(150, 200)))
    engine.restore(capsule)
    again = engine.snapshot().materialize()
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(taken.kv, again.kv))
    assert all(torch.equal(taken.linear_state[k], again.linear_state[k])
               for k in taken.linear_state)
    assert engine.query([9, 8, 7], max_new_tokens=8).token_ids == live.token_ids
