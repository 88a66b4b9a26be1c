"""Execution-state capsules: byte-exact restore, token-identical decoding, the KV-only ablation,
staleness, fork, and the on-disk round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from csr_ros.engine import TorchEngine  # noqa: E402
from csr_ros.errors import CapsuleError, CapsuleMismatchError, StaleCapsuleError  # noqa: E402
from support.engine_checks import assert_capsule_restores_exactly, assert_same_state  # noqa: E402

HYBRID_PROMPT = [(i * 37 + 11) % 256 for i in range(260)]


def test_restoring_a_capsule_is_byte_exact_and_decodes_identically_on_smollm2(smollm2,
                                                                              robot_prompt):
    assert_capsule_restores_exactly(smollm2, *robot_prompt)


def test_restoring_a_capsule_is_byte_exact_on_the_hybrid_model(tiny_hybrid):
    tiny_hybrid.extend(HYBRID_PROMPT[:200])
    capsule = tiny_hybrid.snapshot()
    taken = capsule.materialize()
    assert any(name.startswith("recurrent.") for name in taken.linear_state)
    assert any(name.startswith("conv.") for name in taken.linear_state)
    live = tiny_hybrid.query(HYBRID_PROMPT[200:220], max_new_tokens=12)
    tiny_hybrid.extend(HYBRID_PROMPT[200:260])
    tiny_hybrid.restore(capsule)
    assert_same_state(taken, tiny_hybrid.snapshot().materialize())
    assert tiny_hybrid.query(HYBRID_PROMPT[200:220], max_new_tokens=12).token_ids == live.token_ids


def test_restoring_only_the_kv_diverges_on_the_hybrid_model_and_the_capsule_does_not(tiny_hybrid):
    tiny_hybrid.extend(HYBRID_PROMPT[:200])
    capsule = tiny_hybrid.snapshot()
    live = tiny_hybrid.query(HYBRID_PROMPT[200:220], max_new_tokens=12)
    tiny_hybrid.extend(HYBRID_PROMPT[200:260])   # recurrent/conv state moves on to 260 tokens
    # Ablation: put back the attention K/V only (the length pointer); keep the newer
    # linear-attention state, as a KV-only cache restore would.
    tiny_hybrid.cache.truncate(capsule.n_tokens)
    kv_only = tiny_hybrid.query(HYBRID_PROMPT[200:220], max_new_tokens=12)
    assert kv_only.token_ids != live.token_ids
    tiny_hybrid.restore(capsule)
    assert tiny_hybrid.query(HYBRID_PROMPT[200:220], max_new_tokens=12).token_ids == live.token_ids


def test_a_saved_capsule_restores_byte_exact_into_a_fresh_engine(tiny_hybrid, tiny_hybrid_model,
                                                                  tmp_path):
    tiny_hybrid.extend(HYBRID_PROMPT[:180])
    capsule = tiny_hybrid.snapshot()
    live = tiny_hybrid.query(HYBRID_PROMPT[180:200], max_new_tokens=10)
    path = tiny_hybrid.save_capsule(capsule, tmp_path / "state.capsule")
    fresh = TorchEngine(tiny_hybrid_model, max_context_tokens=512)
    loaded = fresh.load_capsule(path)
    assert loaded.is_materialized and loaded.fingerprint == tiny_hybrid.fingerprint
    assert_same_state(capsule.materialize(), loaded)
    fresh.restore(loaded)
    assert fresh.n_committed == 180 and fresh.committed_ids == tuple(HYBRID_PROMPT[:180])
    assert_same_state(capsule.materialize(), fresh.snapshot().materialize())
    assert fresh.query(HYBRID_PROMPT[180:200], max_new_tokens=10).token_ids == live.token_ids


_RESUME = """
import json, sys
from csr_ros.engine import TorchEngine
engine = TorchEngine("smollm2", max_context_tokens=1024)
engine.restore(engine.load_capsule(sys.argv[1]))
out = engine.query(json.loads(sys.argv[2]), max_new_tokens=4)
print(json.dumps({"n": engine.n_committed, "tokens": list(out.token_ids)}))
"""


def test_a_restarted_process_resumes_from_a_saved_capsule_without_prefill(smollm2, robot_prompt,
                                                                          tmp_path):
    static, dynamic = robot_prompt
    smollm2.extend(static)
    live = smollm2.query(dynamic, max_new_tokens=4)
    path = smollm2.snapshot().save(tmp_path / "smollm2.capsule")
    done = subprocess.run([sys.executable, "-c", _RESUME, str(path), json.dumps(list(dynamic))],
                          capture_output=True, text=True, timeout=300, check=True)
    resumed = json.loads(done.stdout.strip().splitlines()[-1])
    assert resumed == {"n": len(static), "tokens": list(live.token_ids)}


def test_a_capsule_of_another_model_is_refused(smollm2, tiny_hybrid, tmp_path):
    smollm2.extend([1, 2, 3, 4])
    capsule = smollm2.snapshot()
    with pytest.raises(CapsuleMismatchError, match="made by model .* but this engine runs model"):
        tiny_hybrid.restore(capsule)
    path = capsule.save(tmp_path / "smollm2.capsule")
    with pytest.raises(CapsuleMismatchError, match="only restores into an engine of the same"):
        tiny_hybrid.load_capsule(path)
    assert tiny_hybrid.n_committed == 0


def test_a_file_that_is_not_a_capsule_is_refused(tiny_hybrid, tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(CapsuleError, match="is not a csr_ros capsule"):
        tiny_hybrid.load_capsule(tmp_path / "other.safetensors")
    with pytest.raises(CapsuleError, match="no capsule file"):
        tiny_hybrid.load_capsule(tmp_path / "missing.capsule")


def test_a_capsule_into_overwritten_history_is_stale(tiny_hybrid):
    tiny_hybrid.extend(HYBRID_PROMPT[:100])
    early = tiny_hybrid.snapshot()
    tiny_hybrid.extend(HYBRID_PROMPT[100:160])
    late = tiny_hybrid.snapshot()
    kept = late.materialize()
    tiny_hybrid.query(HYBRID_PROMPT[160:170], max_new_tokens=3)  # writes past 160 only
    tiny_hybrid.restore(early)
    tiny_hybrid.restore(late)                    # nothing overwritten yet: both still valid
    tiny_hybrid.restore(early)
    tiny_hybrid.extend([5, 6, 7])                # overwrites positions 100.. of `late`
    with pytest.raises(StaleCapsuleError, match="position 100 of its K/V was overwritten"):
        tiny_hybrid.restore(late)
    assert tiny_hybrid.n_committed == 103
    tiny_hybrid.restore(early)                   # below the overwrite: still valid
    tiny_hybrid.restore(kept)                    # a materialized copy survives anything
    assert_same_state(kept, tiny_hybrid.snapshot().materialize())


def test_a_reset_and_load_make_every_longer_capsule_stale(tiny_hybrid):
    tiny_hybrid.extend(HYBRID_PROMPT[:50])
    capsule = tiny_hybrid.snapshot()
    tiny_hybrid.load(HYBRID_PROMPT[50:80])
    with pytest.raises(StaleCapsuleError):
        tiny_hybrid.restore(capsule)
    with pytest.raises(StaleCapsuleError):
        capsule.save("/nonexistent/never-written.capsule")


def test_a_fork_is_independent_and_shares_the_weights(tiny_hybrid):
    tiny_hybrid.extend(HYBRID_PROMPT[:150])
    child = tiny_hybrid.fork()
    assert child.model is tiny_hybrid.model and child.cache is not tiny_hybrid.cache
    assert_same_state(tiny_hybrid.snapshot().materialize(), child.snapshot().materialize())
    parent_answer = tiny_hybrid.query(HYBRID_PROMPT[150:170], max_new_tokens=8)
    child.extend(HYBRID_PROMPT[150:200])
    child.reset()
    child.extend([1, 2, 3])
    assert tiny_hybrid.n_committed == 150
    again = tiny_hybrid.query(HYBRID_PROMPT[150:170], max_new_tokens=8)
    assert again.token_ids == parent_answer.token_ids


def test_a_capsule_of_a_fork_restores_into_its_parent(tiny_hybrid):
    tiny_hybrid.extend(HYBRID_PROMPT[:80])
    child = tiny_hybrid.fork()
    child.extend(HYBRID_PROMPT[80:120])
    tiny_hybrid.restore(child.snapshot())        # copied across engines
    assert tiny_hybrid.committed_ids == tuple(HYBRID_PROMPT[:120])
    assert_same_state(child.snapshot().materialize(), tiny_hybrid.snapshot().materialize())


def test_scratch_rolls_back_everything_done_inside_it(tiny_hybrid):
    tiny_hybrid.extend(HYBRID_PROMPT[:60])
    before = tiny_hybrid.snapshot().materialize()
    with tiny_hybrid.scratch():
        tiny_hybrid.extend(HYBRID_PROMPT[60:90])
        tiny_hybrid.query([1, 2], max_new_tokens=2)
    assert_same_state(before, tiny_hybrid.snapshot().materialize())


def test_a_capsule_of_the_empty_state_restores_to_empty(tiny_hybrid, tmp_path):
    empty = tiny_hybrid.snapshot()
    path = empty.save(tmp_path / "empty.capsule")
    tiny_hybrid.extend(HYBRID_PROMPT[:40])
    tiny_hybrid.restore(empty)
    assert tiny_hybrid.n_committed == 0 and tiny_hybrid.last_logits is None
    tiny_hybrid.extend(HYBRID_PROMPT[:40])
    tiny_hybrid.restore(tiny_hybrid.load_capsule(path))
    assert tiny_hybrid.n_committed == 0 and tiny_hybrid.cache.linear_state() == {}
    with pytest.raises(Exception, match="at least one prompt token"):
        tiny_hybrid.query([], max_new_tokens=1)


def test_a_pickled_capsule_carries_its_kv_and_restores_elsewhere(tiny_hybrid, tiny_hybrid_model):
    import pickle

    tiny_hybrid.extend(HYBRID_PROMPT[:90])
    capsule = tiny_hybrid.snapshot()
    copy = pickle.loads(pickle.dumps(capsule))
    assert copy.is_materialized and not capsule.is_materialized
    assert_same_state(capsule.materialize(), copy)
    other = TorchEngine(tiny_hybrid_model, max_context_tokens=512)
    other.restore(copy)
    assert other.committed_ids == tuple(HYBRID_PROMPT[:90])
