"""Every vLLM code path of OpenAIResource against real vLLM servers (vLLM's CPU backend, two
servers shared by the whole session: test/support/vllm_server.py).

The first start compiles for minutes; the tests themselves are few and short, and what they
assert holds at any machine speed (cache hits, parsed answers, matching log-probabilities,
errors), never a time.
"""

from __future__ import annotations

import json
import subprocess
import threading
from types import SimpleNamespace

import pytest

from support.robot_prompts import BOUNDED_ACTIONS, assert_bounds_hold, decide_pushed
from support.vllm_server import BLOCK_SIZE, MODEL_NAME, _vllm_or_skip  # vllm_pair: conftest's

from csr_ros.actions import Vocabulary
from csr_ros.errors import ResourceUnavailableError
from csr_ros.bench.eval.scoring import ask, score_choices_local
from csr_ros.layout import Layout
from csr_ros.resources.openai import OpenAIOptions, OpenAIResource
from csr_ros.resources.remote_tokenizer import RemoteTokenizer
from csr_ros.state import CsrState

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SPECS = ["wait()", "look_around()", "go_to(room: kitchen|living_room|hallway|office)",
         "pick(object: $objects)", "say(text: str)", "turn(degrees: int, fast: bool)"]


def robot_state(resource: OpenAIResource, n_chunks: int = 40, profile: str = "You are a robot.",
                mode: str | None = None) -> CsrState:
    tok = resource.tokenizer
    state = CsrState(tok, Layout.from_tokenizer(tok), profile,
                     mode=mode or resource.state_mode)
    for i in range(n_chunks):
        state.add(f"[odom] t={i} x={i * 0.1:.2f} y={i * 0.05:.2f}; battery {95 - i % 7}%",
                  source="odom", stamp_ns=i)
    return state


def _cached_floor(n_tokens: int) -> int:
    """What vLLM can serve from its cache of an n-token prefix: whole blocks, and never the
    last token of a prompt (its logits must be computed)."""
    return ((n_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE


@pytest.mark.parametrize("prompt_mode", ["tokens", "text"])
def test_vllm_serves_the_static_prefix_from_its_cache_for_token_and_text_prompts(
        vllm_server, prompt_mode):
    with OpenAIResource(OpenAIOptions(vllm_server.url, prompt_mode=prompt_mode)) as resource:
        assert resource.info.kind == "vllm" and resource.info.model == MODEL_NAME
        state = robot_state(resource, mode="text" if prompt_mode == "text" else "token")
        resource.load(state.static_ids, state.static_text)
        n_loaded = state.n_static
        for step in range(2):
            state.add(f"[cam] step {step}: a box ahead", source="cam")
            request = state.build_request(task="What next?", suffix=f"now: t={step}")
            result = resource.query(request, max_new_tokens=4)
            assert result.finish_reason in ("stop", "length") and result.token_ids
            assert result.n_prompt == len(request.ids)        # the server read the same tokens
            assert result.cached_tokens is not None
            assert result.cached_tokens % BLOCK_SIZE == 0
            # Everything committed before this query is a prefix of it (invariant 1) and so
            # comes from the cache, up to the last partial block.
            assert _cached_floor(n_loaded) <= result.cached_tokens <= len(request.ids)
            n_loaded = state.n_static


def test_vllm_takes_warm_up_at_low_priority_next_to_queries(vllm_server):
    with OpenAIResource(OpenAIOptions(vllm_server.url,
                                      priority_scheduling=True)) as background, \
            OpenAIResource(OpenAIOptions(vllm_server.url)) as policy:
        state = robot_state(policy, n_chunks=120)
        errors: list[BaseException] = []

        def warm_up():
            try:
                background.load(state.static_ids)           # priority 10: after the queries
            except BaseException as exc:                    # noqa: BLE001 (re-raised below)
                errors.append(exc)

        worker = threading.Thread(target=warm_up)
        worker.start()
        small = robot_state(policy, n_chunks=3)
        answers = [policy.query(small.build_request(task=f"Query {i}?"), max_new_tokens=2)
                   for i in range(3)]
        worker.join(timeout=600)
        assert not worker.is_alive() and not errors, errors
        assert background.n_committed == state.n_static
        assert all(a.finish_reason in ("stop", "length") for a in answers)


def test_vllm_structured_outputs_give_only_parseable_actions_for_choice_grammar_and_json(
        vllm_server):
    with OpenAIResource(OpenAIOptions(vllm_server.url)) as resource:
        vocab = Vocabulary.parse(SPECS)
        bound = vocab.bind({"objects": ["apple", "keys", "red_mug"]})
        closed = Vocabulary.parse(["wait()", "look_around()", "go_to(room: kitchen|office)"])
        tok = resource.tokenizer
        decisions = []
        for voc, kind, expected in ((closed, None, "choice"), (bound, None, "grammar"),
                                    (bound, "json", "json")):
            constraint = voc.constraint(kind) if kind else voc.constraint()
            assert constraint.kind == expected
            resource.load(())                          # a new state: nothing committed
            assert expected in resource.structured_fields(constraint)["structured_outputs"]
            state = CsrState(tok, Layout.from_tokenizer(tok),
                             "You are the decision policy of a home robot.\n" + voc.describe(),
                             mode=resource.state_mode)
            state.add("[cam] a red mug on the kitchen table", source="cam")
            for task in ("What do you do next?", "The kitchen is dark. Next action?"):
                result = resource.query(state.build_request(task=task), max_new_tokens=48,
                                        constraint=constraint)
                assert result.constrained
                decision = voc.decide(result.text, constrained=True,
                                      finish_reason=result.finish_reason, max_new_tokens=48)
                assert decision.action is not None, (expected, result.text, decision.error)
                decisions.append(decision)
        assert len(decisions) == 6
        assert all(d.text.strip().startswith("{") for d in decisions[4:])   # the JSON form


@pytest.mark.parametrize("kind", ["grammar", "json"])
def test_vllm_structured_outputs_decode_only_in_range_under_the_bounds(vllm_server, kind):
    """vLLM's structured outputs (the `guidance` backend of config/vllm_cpu.yaml): pushed to
    turn 720 degrees and to drive at 3 m/s, the model answers in range; without the bounds it
    answers out of range, and decide() refuses that."""
    with OpenAIResource(OpenAIOptions(vllm_server.url)) as resource:
        assert_bounds_hold(decide_pushed(resource, resource.tokenizer, kind=kind,
                                         mode=resource.state_mode))


_XGRAMMAR_CHECK = """
import json, sys
import xgrammar
from xgrammar.testing import _is_grammar_accept_string
sent = json.loads(sys.argv[1])
grammar = xgrammar.Grammar.from_ebnf(sent["grammar"])
schema = xgrammar.Grammar.from_json_schema(json.dumps(sent["json"]), any_whitespace=False,
                                           separators=(", ", ": "))
print(json.dumps({"grammar": [_is_grammar_accept_string(grammar, t) for t in sent["calls"]],
                  "json": [_is_grammar_accept_string(schema, t) for t in sent["objects"]]}))
"""


def test_vllm_default_xgrammar_backend_holds_the_bounds_too():
    """A vLLM left on its default structured-output backend compiles the same grammar and
    schema with xgrammar: it must admit the ends of each range and nothing past them."""
    from csr_ros.servers import vllm_python

    _vllm_or_skip()
    vocab = Vocabulary.parse(BOUNDED_ACTIONS)
    calls = {"turn(-180)": True, "turn(180)": True, "turn(181)": False, "turn(720)": False,
             "turn(-0)": False, "drive(0.5)": True, "drive(0.25)": True, "drive(0.501)": False,
             "drive(3)": False}
    objects = {json.dumps({"name": "turn", "args": {"degrees": d}}): ok
               for d, ok in ((-180, True), (180, True), (181, False), (720, False))}
    sent = {"grammar": vocab.gbnf(), "json": vocab.json_schema(), "calls": list(calls),
            "objects": list(objects)}
    done = subprocess.run([vllm_python(), "-c", _XGRAMMAR_CHECK, json.dumps(sent)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert dict(zip(calls, seen["grammar"])) == calls
    assert dict(zip(objects, seen["json"])) == objects


def test_vllm_scores_choices_from_its_cache_as_the_local_engine_does(vllm_server, smollm2):
    choices = ["kitchen", "living room", "hallway", "office", "the garage door"]
    with OpenAIResource(OpenAIOptions(vllm_server.url)) as resource:
        state = robot_state(resource, n_chunks=20,
                            profile="You are a home robot. Answer with one room.")
        request = state.build_request(task="Where is the red mug? Answer with one room.")
        resource.load(request.static_ids)
        prompt = resource.prompt_of(request)
        resource.query(request, max_new_tokens=1)           # as eval does: TTFT, cache warm
        served = resource.choice_logprobs(prompt, choices)
        # The batch (one prompt per distinct choice prefix) read the cached prefix: vLLM
        # reports the last prompt's count, and a request that skipped the cache reports 0.
        assert resource.last_choice_cached_tokens is not None
        assert resource.last_choice_cached_tokens >= _cached_floor(len(prompt))
        answer = ask(resource, request, choices=choices, scoring="mean")  # as `csr-ros eval`
        local = SimpleNamespace(engine=smollm2, name="local")
        choice_ids = [list(smollm2.tokenizer.encode_data(c)) for c in choices]
        _, _, expected = score_choices_local(local, request, choice_ids)
    means = [sum(e) / len(e) for e in expected]
    assert answer.prediction == choices[max(range(len(choices)), key=means.__getitem__)]
    assert answer.choice_scores == pytest.approx(means, abs=2e-3)
    assert [len(s) for s in served] == [len(e) for e in expected]
    for got, want in zip(served, expected):
        assert got == pytest.approx(want, abs=2e-3)     # float32 both; kernels differ
    assert max(range(len(choices)), key=lambda i: sum(served[i])) == \
        max(range(len(choices)), key=lambda i: sum(expected[i]))


def test_vllm_gives_the_letter_and_letter_scores_the_float32_local_engine_gives(vllm_server,
                                                                           smollm2):
    """Label scoring, float32 both: vLLM scores the letters by logprob_token_ids from its
    cache, the local engine in one pass over the dynamic part; the same letter on every
    prompt."""
    from support.choice_prompts import lettered_prompts

    from csr_ros.resources.local import LocalResource

    local = LocalResource.from_engine(smollm2, name="local")
    letters = []
    with OpenAIResource(OpenAIOptions(vllm_server.url)) as resource:
        assert resource.state_mode == "token"
        for request, shown in lettered_prompts(resource.tokenizer, "token"):
            resource.load(request.static_ids)
            served = ask(resource, request, choices=shown, scoring="label")
            smollm2.load(request.static_ids)
            ours = ask(local, request, choices=shown, scoring="label",
                       tokenizer=smollm2.tokenizer)
            assert served.choice_scores == pytest.approx(ours.choice_scores, abs=2e-3)
            assert served.label == ours.label
            letters.append(ours.label)
    assert len(set(letters)) > 1, "every prompt got one letter: the check tells nothing"


def test_vllm_echoed_log_probabilities_of_the_converted_model_match_the_local_engine(
        vllm_server, smollm2):
    """The converted directory, served as it is: logits through vLLM equal the local engine's
    (a model served without its embedding gives -ln(49152) = -10.80 for every token)."""
    with OpenAIResource(OpenAIOptions(vllm_server.url)) as resource:
        state = robot_state(resource, n_chunks=6)
        request = state.build_request(task="Next?")
        prompt = list(request.ids)
        served = resource.echo_logprobs(prompt, " go to the kitchen")
    choice_ids = [list(smollm2.tokenizer.encode_data(" go to the kitchen"))]
    request_local = SimpleNamespace(static_ids=tuple(prompt), dynamic_ids=())
    _, _, (expected,) = score_choices_local(SimpleNamespace(engine=smollm2, name="local"),
                                            request_local, choice_ids)
    assert served == pytest.approx(expected, abs=2e-3)
    assert len(set(round(v, 2) for v in served)) > 1


def test_vllm_remote_tokenizer_splits_text_as_the_local_one(vllm_server, tokenizer):
    from csr_ros.model_store import resolve_model_dir

    texts = ["[odom] t=12 x=0.25 y=-1.50; ünïcode ✓ 中文", "<|im_start|>user\nhi<|im_end|>\n",
             "  two  spaces\tand a tab\n"]
    with RemoteTokenizer(vllm_server.url, model=MODEL_NAME,
                         model_dir=resolve_model_dir(weights=False)) as remote:
        assert remote.dialect == "vllm"
        for text in texts:
            assert remote.encode_template(text) == tokenizer.encode_template(text)
            assert remote.decode(tokenizer.encode_template(text)) == text
        assert remote.encode_data(texts[0]) == tokenizer.encode_data(texts[0])
    with OpenAIResource(OpenAIOptions(vllm_server.url, tokenizer="server")) as resource:
        state = robot_state(resource, n_chunks=5)
        assert resource.query(state.build_request(task="Next?"), max_new_tokens=2).token_ids


def test_vllm_server_killed_mid_stream_fails_the_query_and_serves_again_once_restarted(
        vllm_pair):
    server = vllm_pair[1]                                   # R2; restarted before returning
    with OpenAIResource(OpenAIOptions(server.url, read_timeout_s=120.0, retries=0,
                                      extra_body={"ignore_eos": True})) as resource:
        state = robot_state(resource, n_chunks=5)
        request = state.build_request(task="Tell a very long story.")
        resource.query(request, max_new_tokens=2)           # warm: the next stream starts fast
        killer = threading.Timer(1.0, server.kill)
        killer.start()
        try:
            with pytest.raises(ResourceUnavailableError, match="broke|cannot reach|ended"):
                resource.query(request, max_new_tokens=4000)   # minutes of decoding
        finally:
            killer.join()
            server.start()
        assert resource.n_committed == 0 or resource.committed_ids == tuple(request.static_ids)
        again = resource.query(request, max_new_tokens=3)
        assert len(again.token_ids) == 3 and again.finish_reason == "length"


def test_vllm_asr_demo_over_two_servers_swaps_loses_nothing_and_every_action_is_valid(
        vllm_pair, tmp_path):
    from csr_ros.cli import main

    r1, r2 = vllm_pair
    for server in (r1, r2):
        if not server.running:
            server.start()
    out = tmp_path / "demo.json"
    code = main(["demo", "--resource", "openai", "--r1", r1.url, "--r2", r2.url,
                 # One core per server: chunks at 0.5 Hz (about 20 tokens/s) leave a warm-up
                 # and its catch-up room to finish before the context fills.
                 "--cycles", "2", "--tau-mem", "500", "--chunk-rate-hz", "0.5",
                 "--rate-hz", "0.5",
                 "--duration-s", "900",   # a cap: servers too slow to cycle fail, never hang
                 "--max-context-tokens", "4096", "--reserve-tokens", "128",
                 "--json", str(out), "--no-progress"])
    summary = json.loads(out.read_text())
    assert code == 0
    assert summary["swaps"] >= 2
    assert summary["chunks_lost"] == 0 and summary["chunks_in_order"]
    assert summary["failed_queries"] == 0 and summary["decisions"] > 0
    assert summary["valid_actions"] == summary["decisions"], summary
