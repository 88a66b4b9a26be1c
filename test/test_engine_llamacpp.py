"""The llama.cpp backend of the local resource: the embedded GGUF on llama.cpp, in process.

Real SmolLM2 GGUF, real llama.cpp (llama-cpp-python's low-level API), the project's tokenizer.
"""

from __future__ import annotations

import itertools
import json
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from support.robot_prompts import assert_bounds_hold, decide_pushed  # noqa: E402

from csr_ros.actions import Vocabulary  # noqa: E402
from csr_ros.demo_episode import Episode  # noqa: E402
from csr_ros.errors import (CapsuleError, CapsuleMismatchError, ConfigError,  # noqa: E402
                            ContextOverflowError, ResourceError, StaleCapsuleError)
from csr_ros.layout import Layout  # noqa: E402
from csr_ros.state import CsrState  # noqa: E402

pytestmark = pytest.mark.slow

OPEN = ["wait()", "look_around()", "go_to(room: kitchen|living_room|hallway|office|garage)",
        "pick(object: $objects)", "say(text: str)", "turn(degrees: int, fast: bool)"]
TASKS = ["Which action next?", "Alice asks you to say hello. Which action next?",
         "Fetch the apple. Which action next?"]


@pytest.fixture(scope="module")
def resource():
    from csr_ros.resources.local import LocalResource

    res = LocalResource("smollm2", name="r1", threads=1, max_context_tokens=2048,
                        backend="llamacpp")
    yield res
    res.close()


@pytest.fixture()
def engine(resource):
    yield resource.engine
    resource.engine.reset()


def _state(tokenizer, vocab: Vocabulary | None = None, n_chunks: int = 8) -> CsrState:
    profile = "You are the decision policy of a home service robot."
    if vocab is not None:
        profile += "\n" + vocab.describe()
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                     profile=profile)
    for item in itertools.islice(Episode(0).stream(), n_chunks):
        state.add(item.text, source=item.source)
    return state


@pytest.fixture()
def prompt(engine):
    request = _state(engine.tokenizer).build_request(task=TASKS[0])
    return list(request.static_ids), list(request.dynamic_ids)


def test_greedy_decoding_equals_llama_cpp_own_greedy_on_the_same_prompt(engine, prompt):
    from csr_ros.model_store import default_gguf_path

    static, dynamic = prompt
    engine.load(static)
    ours = engine.query(dynamic, 16, eos_ids=())
    reference = llama_cpp.Llama(model_path=str(default_gguf_path()), n_ctx=2048, n_batch=512,
                                n_threads=1, flash_attn=False, verbose=False)
    try:
        theirs = list(itertools.islice(
            reference.generate(static + dynamic, top_k=1, temp=0.0, reset=True), 16))
    finally:
        reference.close()
    assert list(ours.token_ids) == theirs
    assert ours.finish_reason == "length" and ours.ttft_s > 0 and ours.decode_s > 0


_WITHOUT_TORCH = """
import json, sys
sys.modules["torch"] = None               # any import of torch now fails
from csr_ros.actions import Vocabulary
from csr_ros.resources.local import LocalResource
from csr_ros.state import QueryId, Request, Version
static, dynamic = json.loads(sys.argv[1]), json.loads(sys.argv[2])
resource = LocalResource("smollm2", threads=1, max_context_tokens=2048, dtype="auto")
engine = resource.engine
engine.load(static)
out = engine.query(dynamic, 12, eos_ids=())
request = Request(query_id=QueryId(1), version=Version(0), static_ids=tuple(static),
                  dynamic_ids=tuple(dynamic), i_star=0, last_seq=None)
vocab = Vocabulary.parse(json.loads(sys.argv[3]))
answer = resource.query(request, max_new_tokens=24, constraint=vocab.constraint("grammar"))
capsule = engine.load_capsule(engine.save_capsule(engine.snapshot(), sys.argv[4]))
engine.reset()
engine.restore(capsule)
again = engine.query(dynamic, 12, eos_ids=())
print(json.dumps({"backend": resource.backend, "tokens": list(out.token_ids),
                  "answer": answer.text, "again": list(again.token_ids),
                  "torch": sys.modules["torch"]}))
"""


def test_the_llamacpp_backend_runs_a_real_query_where_torch_cannot_be_imported(engine, prompt,
                                                                               tmp_path):
    static, dynamic = prompt
    actions = ["wait()", "look_around()", "go_to(room: kitchen|hallway)"]
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, json.dumps(static),
                           json.dumps(dynamic), json.dumps(actions),
                           str(tmp_path / "state.capsule")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    engine.load(static)
    assert seen["backend"] == "llamacpp"          # dtype="auto" without torch
    assert seen["tokens"] == list(engine.query(dynamic, 12, eos_ids=()).token_ids)
    assert seen["again"] == seen["tokens"] and seen["torch"] is None
    assert Vocabulary.parse(actions).decide(seen["answer"], constrained=True,
                                            finish_reason="stop").valid, seen["answer"]


def test_a_query_rolls_back_to_exactly_the_committed_state(engine, resource, prompt):
    from csr_ros.engine.llamacpp import LlamaCppEngine

    static, dynamic = prompt
    engine.load(static)
    before = engine.last_logits
    for task in TASKS[1:]:
        engine.query(engine.tokenizer.encode_data(task) + dynamic, 12, eos_ids=())
    memory = llama_cpp.llama_get_memory(engine._ctx)
    assert llama_cpp.llama_memory_seq_pos_max(memory, 0) == len(static) - 1
    assert engine.committed_ids == tuple(static)
    assert bool((engine.last_logits == before).all())
    fresh = LlamaCppEngine("smollm2", threads=1, max_context_tokens=2048)
    try:
        fresh.load(static)
        assert engine.query(dynamic, 12, eos_ids=()).token_ids == \
            fresh.query(dynamic, 12, eos_ids=()).token_ids
        assert bool((engine.last_logits == fresh.last_logits).all())
    finally:
        fresh.close()


def test_what_on_token_raises_stops_the_decode_and_the_state_rolls_back(engine, prompt):
    from csr_ros.errors import QueryCancelledError

    static, dynamic = prompt
    engine.load(static)
    whole = engine.query(dynamic, 12, eos_ids=())
    seen: list[int] = []

    def on_token(n_tokens: int) -> None:
        seen.append(n_tokens)
        if n_tokens >= 3:
            raise QueryCancelledError(f"cancelled after {n_tokens} tokens")

    with pytest.raises(QueryCancelledError):
        engine.query(dynamic, 12, eos_ids=(), on_token=on_token)
    assert seen == [1, 2, 3]
    assert engine.committed_ids == tuple(static)
    assert engine.query(dynamic, 12, eos_ids=()).token_ids == whole.token_ids


def test_load_extend_and_commit_inside_a_query_match_one_cold_prefill(engine, prompt):
    static, dynamic = prompt
    engine.load(static)
    cold = engine.query(dynamic, 12, eos_ids=())
    cold_logits = engine.last_logits
    third = len(static) // 3
    engine.load(static[:third])
    engine.extend(static[third:2 * third])
    stepwise = engine.query(dynamic, 12, eos_ids=(), commit_ids=static[2 * third:])
    assert stepwise.n_committed == len(static) - 2 * third
    assert engine.committed_ids == tuple(static)
    assert stepwise.token_ids == cold.token_ids
    assert float(np.abs(engine.last_logits - cold_logits).max()) < 1e-3


def test_grammar_constrained_typed_actions_parse(resource):
    vocab = Vocabulary.parse(OPEN, max_str_chars=16)
    bound = vocab.bind({"objects": ["apple", "red_mug", "keys"]})
    state = _state(resource.engine.tokenizer, vocab)
    resource.load(state.build_request(task="x").static_ids)
    for task in TASKS:
        request = state.build_request(task=task)
        result = resource.query(request, max_new_tokens=32,
                                constraint=bound.constraint("grammar"))
        decision = bound.decide(result.text, constrained=result.constrained,
                                finish_reason=result.finish_reason)
        assert decision.valid, (task, result.text, decision.error)
        assert result.finish_reason == "stop" and result.mask_s > 0
    assert resource.engine.committed_ids == tuple(state.build_request(task="x").static_ids)


@pytest.mark.parametrize("kind", ["grammar", "json"])
def test_a_model_pushed_out_of_range_decodes_only_in_range_under_the_bounds(resource, kind):
    """The llguidance mask on llama.cpp's logits: turn(720) and drive(3) without the bounds
    (refused by decide()), values in range under them."""
    assert_bounds_hold(decide_pushed(resource, resource.engine.tokenizer, kind=kind))


def _one_by_one(engine, dynamic: list[int], option: list[int], end_id: int) -> float:
    """An option's log-probability from the committed state, one token per decode."""
    with engine.scratch():
        engine.extend(dynamic)
        total = 0.0
        for token in option + [end_id]:
            total += float(engine.last_logprobs()[token])
            engine.extend([token])
    return total


def test_closed_choice_scores_in_one_batch_agree_with_scoring_each_option_alone(engine, prompt):
    static, dynamic = prompt
    tokenizer = engine.tokenizer
    engine.load(static)
    end_id = tokenizer.eos_token_ids[0]
    # Shared prefixes (the trie) and an option that is a prefix of another (the end token).
    options = [tokenizer.encode_data(t)
               for t in ("go_to(kitchen)", "go_to(kit)", "go_to", "wait()", "look_around()")]
    batch = engine.score_options(dynamic, options, end_id=end_id)
    assert engine.committed_ids == tuple(static)
    assert batch.n_forward_tokens < len(dynamic) + sum(len(o) + 1 for o in options)
    alone = [engine.score_options(dynamic, [o], end_id=end_id).logprobs[0] for o in options]
    assert batch.logprobs == pytest.approx(alone, abs=1e-6)
    # Token by token: single-token decodes run other CPU kernels than batches, so the logits
    # differ in their last digits and a sum over an option by up to a few tenths of a nat.
    stepwise = [_one_by_one(engine, dynamic, o, end_id) for o in options]
    assert batch.logprobs == pytest.approx(stepwise, abs=0.5)
    assert max(range(len(options)), key=batch.logprobs.__getitem__) == \
        max(range(len(options)), key=stepwise.__getitem__)
    assert engine.committed_ids == tuple(static)


def test_more_options_than_one_batch_of_sequences_are_scored_in_several(engine, prompt):
    from csr_ros.engine.llamacpp import OPTION_SEQUENCES

    static, dynamic = prompt
    engine.load(static)
    options = [engine.tokenizer.encode_data(f"pick(item_{i})")
               for i in range(OPTION_SEQUENCES + 5)]
    batch = engine.score_options(dynamic, options)
    alone = [engine.score_options(dynamic, [o]).logprobs[0] for o in options]
    # A batch of a hundred rows may run other CPU kernels than one of a dozen (last digits).
    assert batch.logprobs == pytest.approx(alone, abs=0.1)
    assert max(range(len(options)), key=batch.logprobs.__getitem__) == \
        max(range(len(options)), key=alone.__getitem__)
    assert engine.committed_ids == tuple(static)


def test_a_closed_choice_through_the_resource_returns_the_best_scored_option(resource):
    vocab = Vocabulary.parse(["wait()", "look_around()", "go_to(room: kitchen|hallway)"])
    state = _state(resource.engine.tokenizer, vocab, n_chunks=8)
    request = state.build_request(task=TASKS[0])
    resource.load(request.static_ids)
    constraint = vocab.constraint("choice")
    result = resource.query(request, max_new_tokens=16, constraint=constraint)
    assert result.text in constraint.choices
    assert result.text == constraint.choices[max(range(len(constraint.choices)),
                                                 key=result.choice_logprobs.__getitem__)]
    assert vocab.decide(result.text, constrained=True, finish_reason="stop").valid


def test_a_capsule_restores_and_forks_to_the_exact_live_state(engine, prompt):
    static, dynamic = prompt
    engine.load(static)
    live = engine.query(dynamic, 12, eos_ids=())
    capsule = engine.snapshot()
    engine.extend(dynamic)
    engine.query(dynamic, 4)
    engine.restore(capsule)
    assert engine.committed_ids == tuple(static)
    assert engine.query(dynamic, 12, eos_ids=()).token_ids == live.token_ids
    child = engine.fork()
    try:
        engine.load(dynamic)             # the parent moves on; the child keeps its copy
        assert child.committed_ids == tuple(static)
        assert child.query(dynamic, 12, eos_ids=()).token_ids == live.token_ids
    finally:
        child.close()
    engine.restore(capsule)
    assert engine.query(dynamic, 12, eos_ids=()).token_ids == live.token_ids
    restored = pickle.loads(pickle.dumps(capsule))     # leaves the process with its bytes
    assert restored.is_materialized and restored.n_tokens == len(static)
    engine.reset()
    engine.restore(restored)
    assert engine.query(dynamic, 12, eos_ids=()).token_ids == live.token_ids


def test_a_closed_engine_and_its_resource_refuse_work_with_an_error_and_the_process_lives(
        engine, prompt):
    """A node's worker can hold a query for a resource its node has just closed: it once
    reached llama_decode with a NULL context and ended the process (SIGSEGV)."""
    from csr_ros.resources.local import LocalResource

    static, dynamic = prompt
    child = engine.fork()
    child.load(static)
    child.close()
    for call in (lambda: child.query(dynamic, 4), lambda: child.extend(dynamic),
                 lambda: child.load(static), child.snapshot, child.reset):
        with pytest.raises(ResourceError, match="closed"):
            call()
    request = _state(engine.tokenizer).build_request(task=TASKS[0])
    resource = LocalResource.from_engine(engine.fork(), name="r9")
    resource.load(request.static_ids)
    resource.close()
    with pytest.raises(ResourceError, match="r9 was closed"):
        resource.query(request, max_new_tokens=4)
    with pytest.raises(ResourceError, match="r9 was closed"):
        resource.extend(dynamic)
    engine.load(static)                  # the engine they were forked from is untouched
    assert len(engine.query(dynamic, 4).token_ids) >= 1


def test_an_attached_capsule_whose_slot_was_reused_is_refused_as_stale(engine, prompt):
    static, _ = prompt
    engine.load(static)
    oldest = engine.snapshot()
    kept = [engine.snapshot() for _ in range(engine.capsule_slots)]
    with pytest.raises(StaleCapsuleError, match="slot was reused"):
        engine.restore(oldest)
    engine.restore(kept[-1])
    assert engine.committed_ids == tuple(static)
    del kept, oldest                     # capsules nobody holds give their cells back
    engine.reset()
    memory = llama_cpp.llama_get_memory(engine._ctx)
    assert all(llama_cpp.llama_memory_seq_pos_max(memory, slot) == -1
               for slot in range(1, 1 + engine.capsule_slots))


def test_a_saved_capsule_loads_into_a_fresh_engine_and_decodes_the_same(engine, prompt,
                                                                         tmp_path):
    from csr_ros.engine.llamacpp import LlamaCppEngine
    from csr_ros.engine.torch_engine import TorchCapsule

    static, dynamic = prompt
    engine.load(static)
    live = engine.query(dynamic, 12, eos_ids=())
    path = engine.save_capsule(engine.snapshot(), tmp_path / "state.capsule")
    other = LlamaCppEngine("smollm2", threads=1, max_context_tokens=2048)
    try:
        other.restore(other.load_capsule(path))
        assert other.committed_ids == tuple(static)
        assert other.query(dynamic, 12, eos_ids=()).token_ids == live.token_ids
    finally:
        other.close()
    (tmp_path / "junk.capsule").write_bytes(b"not a capsule")
    with pytest.raises(CapsuleError, match="not a readable capsule"):
        engine.load_capsule(tmp_path / "junk.capsule")
    torch_capsule = TorchCapsule(fingerprint=engine.fingerprint, n_tokens=0, token_ids=(),
                                 layer_types=(), dtype="torch.float32", linear_state={},
                                 last_logits=None, kv=())
    with pytest.raises(CapsuleMismatchError, match="backend='torch'"):
        engine.restore(torch_capsule)
    torch_capsule.save(tmp_path / "torch.capsule")
    with pytest.raises(CapsuleMismatchError, match="torch engine"):
        engine.load_capsule(tmp_path / "torch.capsule")


def test_a_restart_resumes_from_the_chunk_logs_llamacpp_capsule_and_prefills_only_the_rest(
        resource, tmp_path):
    from csr_ros.chunklog import resume, save_capsule

    state = _state(resource.engine.tokenizer, n_chunks=4)
    resource.load(state.static_ids)
    n_capsule = save_capsule(resource, tmp_path / "r1.capsule")
    for item in itertools.islice(Episode(1).stream(), 3):      # logged after the capsule
        state.add(item.text, source=item.source)
    resource.engine.reset()                                     # the "crash"
    resumed = resume(resource, state, tmp_path / "r1.capsule")
    assert resumed.n_from_capsule == n_capsule > 0
    assert resumed.n_prefilled == len(state.static_ids) - n_capsule
    assert resource.committed_ids == tuple(state.static_ids)


def test_a_query_past_the_context_raises_context_overflow_and_keeps_the_state(engine, prompt):
    static, dynamic = prompt
    engine.load(static)
    room = engine.max_context_tokens - len(static) - len(dynamic)
    with pytest.raises(ContextOverflowError, match="max_context_tokens=2048"):
        engine.query(dynamic, room + 1)
    with pytest.raises(ContextOverflowError):
        engine.extend(static * (engine.max_context_tokens // len(static) + 1))
    assert engine.committed_ids == tuple(static)
    assert len(engine.query(dynamic, 4, eos_ids=()).token_ids) == 4


def test_a_tokenizer_that_disagrees_with_the_gguf_vocabulary_is_refused(engine, tmp_path):
    from csr_ros.engine.llamacpp import LlamaCppEngine
    from csr_ros.tokenizer import HFTokenizer

    shutil.copytree(engine.model_dir, tmp_path / "tok", ignore=shutil.ignore_patterns(
        "*.safetensors"))
    path = tmp_path / "tok" / "tokenizer.json"
    spec = json.loads(path.read_text())
    vocab = spec["model"]["vocab"]
    vocab["robot"], vocab["Ġthe"] = vocab["Ġthe"], vocab["robot"]      # two ids swapped
    path.write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match="disagree"):
        LlamaCppEngine("smollm2", threads=1, max_context_tokens=256,
                       tokenizer=HFTokenizer(tmp_path / "tok"))


def test_the_llamacpp_backend_refuses_torch_settings_and_unknown_backends():
    from csr_ros.resources.factory import make_resource

    with pytest.raises(ConfigError, match="dtype='float32'"):
        make_resource("local", backend="llamacpp", dtype="float32")
    with pytest.raises(ConfigError, match="backend must be one of"):
        make_resource("local", backend="onnx")


def test_the_reconciler_swaps_two_llamacpp_resources_with_no_chunk_lost(resource, tokenizer,
                                                                         layout):
    from csr_ros.reconcile.driver import Reconciler
    from csr_ros.reconcile.machine import ReconcileConfig
    from csr_ros.resources.process import ProcessResource

    # The secondary in a worker process, built there from plain keyword values.
    r2 = ProcessResource("local", name="r2", model="smollm2", threads=1, background_threads=1,
                         max_context_tokens=1024, backend="llamacpp")
    config = ReconcileConfig(tau_mem_tokens=320, max_context_tokens=1024, reserve_tokens=96,
                             n_catchup_tokens=0)
    profile = "You are a home robot. Answer with one action: wait, look, go(room)."
    state = CsrState(tokenizer=tokenizer, layout=layout, profile=profile)
    resource.engine.reset()
    n_chunks = 0
    try:
        with Reconciler(state, [resource, r2], config) as rec:
            rec.start(timeout_s=120)
            for i in range(400):
                if rec.machine.counters.swaps >= 2:
                    break
                rec.add_chunk(f"t={i * 0.5:.1f}s robot in room {i % 4}; sees cup_{i % 7}; "
                              f"item {i}", source="episode", stamp_ns=i)
                n_chunks += 1
                if i % 4 == 0:
                    assert rec.query("Which action next?", max_new_tokens=3).ok
                if i % 8 == 0:
                    assert rec.wait_idle(timeout_s=120)
            assert rec.wait_idle(timeout_s=120)
            counters = rec.machine.counters
            assert rec.primary.committed_ids == tuple(rec.machine.active.static_ids)
            outcome = rec.query("Which action next?", max_new_tokens=3)
            assert outcome.ok and outcome.result.n_extended == 0
    finally:
        r2.close()
    assert counters.swaps >= 2 and counters.fallbacks == 0
    assert counters.chunks_in == n_chunks
    kept = {c.seq for c in rec.machine.active.chunks}
    assert kept and max(kept) == n_chunks - 1 and kept == set(range(min(kept), n_chunks))


def _gguf_with_a_plain_end_token(source, target) -> str:
    """A copy of `source` whose <|endoftext|> is typed NORMAL, not CONTROL: llama.cpp then says
    `control-looking token: ... was not control-type` as it loads it (the notice the 1.5B Qwen's
    '</s>' gives), and corrects the type itself."""
    from gguf import GGUFReader

    shutil.copyfile(source, target)
    reader = GGUFReader(target, "r+")
    tokens = reader.fields["tokenizer.ggml.tokens"]
    types = reader.fields["tokenizer.ggml.token_type"]
    texts = [bytes(tokens.parts[i]).decode() for i in tokens.data]
    end = texts.index("<|endoftext|>")
    types.parts[types.data[end]][0] = 1                     # NORMAL
    reader.data.flush()
    return f"{end:6d} '<|endoftext|>'"


def test_llama_cpp_model_metadata_notices_are_info_once_per_model_never_errors(tmp_path,
                                                                                caplog):
    from csr_ros.engine.llamacpp import _Model
    from csr_ros.model_store import resolve_gguf

    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    token = _gguf_with_a_plain_end_token(resolve_gguf("smollm2"), first)
    shutil.copyfile(first, second)
    with caplog.at_level("DEBUG", logger="csr_ros.engine.llamacpp"):
        for path in (first, first, second):       # the real llama.cpp load, its log callback
            _Model(path)                            # freed again at once
    notices = [r for r in caplog.records if "control-looking token" in r.getMessage()]
    assert [(r.levelname, r.getMessage().split(": ")[0]) for r in notices] == [
        ("INFO", f"llama.cpp, loading {p.name}") for p in (first, second)]
    assert all(f"control-looking token: {token} was not control-type" in r.getMessage()
               for r in notices)
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


def test_llama_cpp_errors_log_at_error_and_its_other_warnings_at_warning(caplog):
    from csr_ros.engine.llamacpp import _route_log    # as llama.cpp's log callback calls it

    with caplog.at_level("DEBUG", logger="csr_ros.engine.llamacpp"):
        _route_log(4, b"llama_decode: failed to decode, ret = -3\n", None)
        _route_log(3, b"llama_context: n_batch is less than GGML_KQ_MASK_PAD\n", None)
        _route_log(2, b"print_info: file format = GGUF V3 (latest)\n", None)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "llama.cpp: llama_decode: failed to decode, ret = -3"),
        ("WARNING", "llama.cpp: llama_context: n_batch is less than GGML_KQ_MASK_PAD")]
