"""`dtype="auto"` chooses the local engine by measuring it (csr_ros.engine.calibration): the pure
choice and cache key, then the mechanism with the real engines. Nothing here asserts which
backend wins; the measured runs use a short history, one timed decision and few tokens."""

from __future__ import annotations

import json
import shutil

import pytest

from csr_ros.engine import calibration
from csr_ros.engine.calibration import Calibration, cache_key, cache_path, candidates, pick
from csr_ros.model_store import resolve_model_dir
from csr_ros.resources.local import LocalResource

QUICK = dict(threads=1, chunks=4, reps=1, max_new_tokens=4)


def _key(**changes):
    facts = dict(cpu_model="AMD EPYC (family 25, model 17)", flags=["avx2", "avx512_bf16"],
                 bf16_override="", threads=2, model_fingerprint="abc",
                 versions={"torch": "2.13.0", "llama_cpp_python": "0.3.36", "csr_ros": "0.1.0"})
    return cache_key(**{**facts, **changes})


def _figure(ttft_s, step_s, tokens):
    return {"decision_s": ttft_s + (tokens - 1) * step_s, "ttft_s": ttft_s,
            "decode_s_per_token": step_s, "tokens": tokens}


def test_each_machine_has_the_candidates_its_kernels_run_and_says_why_not_the_others():
    names = lambda have: [c.name for c in have]       # noqa: E731
    have, why = candidates(torch=True, native_bf16=True, fp16=True, llamacpp=True)
    assert names(have) == ["torch-bf16", "torch-fp32", "llamacpp"] and why == {}
    have, why = candidates(torch=True, native_bf16=False, fp16=True, llamacpp=False)
    assert names(have) == ["torch-fp32"] and have[0].decode_weights == "fp16"
    assert "bf16" in why["torch-bf16"] and "not installed" in why["llamacpp"]
    have, _ = candidates(torch=True, native_bf16=False, fp16=False, llamacpp=True)
    assert [c.decode_weights for c in have] == ["float", "auto"]      # ARM: no fp16 GEMM
    have, why = candidates(torch=False, native_bf16=False, fp16=False, llamacpp=True)
    assert names(have) == ["llamacpp"] and "torch is not installed" in why["torch-fp32"]


def test_the_fastest_decision_at_a_common_token_count_wins():
    # a quick first token loses to fast decode steps once both decode the same answer length
    figures = {"quick-start": _figure(0.05, 0.040, 8), "fast-steps": _figure(0.10, 0.020, 8)}
    assert pick(figures) == "fast-steps"
    # a candidate whose greedy answer happened to be short is not rewarded for it
    figures = {"short-answer": _figure(0.05, 0.050, 2), "fast-steps": _figure(0.10, 0.020, 9),
               "third": _figure(0.10, 0.030, 9)}
    assert min(figures, key=lambda n: figures[n]["decision_s"]) == "short-answer"
    assert pick(figures) == "fast-steps"


def test_a_cached_choice_is_read_only_under_the_key_it_was_made_under(tmp_path):
    key = _key()
    choice = Calibration(chosen="llamacpp", figures={"llamacpp": _figure(0.1, 0.02, 5)},
                         skipped={}, key=key, options={"backend": "llamacpp"},
                         measured_utc="2026-12-03T09:00:00Z", seconds=3.0)
    path = cache_path(tmp_path, key)
    path.write_text(json.dumps(choice.as_dict()))
    again = calibration.read_cached(path, key)
    assert again is not None and again.cached and again.chosen == "llamacpp"
    for other in (_key(cpu_model="Intel Xeon"), _key(flags=["avx2"]), _key(threads=1),
                  _key(bf16_override="0"), _key(model_fingerprint="def"),
                  _key(versions={"torch": "2.14.0", "llama_cpp_python": "0.3.36",
                                 "csr_ros": "0.1.0"})):
        assert other != key and cache_path(tmp_path, other) != path
        assert calibration.read_cached(path, other) is None      # the stored key differs
    path.write_text("{not json")
    assert calibration.read_cached(path, key) is None


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    directory = tmp_path_factory.mktemp("calibration")
    said: list[str] = []
    choice = calibration.calibrate("smollm2", directory=directory, progress=said.append, **QUICK)
    return directory, choice, said


@pytest.mark.slow
def test_every_candidate_this_machine_has_is_measured_on_a_decision(calibrated):
    directory, choice, said = calibrated
    have, _ = calibration.machine_candidates()
    assert set(choice.figures) | set(choice.skipped) >= {c.name for c in have}
    assert set(choice.figures) == {c.name for c in have}       # none failed to load here
    for name, figure in choice.figures.items():
        assert figure["decision_s"] >= figure["ttft_s"] > 0, name
        assert figure["tokens"] >= 1 and figure["n_dynamic"] > 0, name
        assert any(line.startswith(f"loading {name}") for line in said), said
    assert not choice.cached and choice.chosen in choice.figures
    assert choice.options == {c.name: c for c in have}[choice.chosen].options()
    assert "calibrated" in choice.summary() and choice.chosen in choice.summary()
    assert calibration.read_cached(cache_path(directory, choice.key), choice.key) is not None


@pytest.mark.slow
def test_a_cached_choice_is_used_without_measuring_again(calibrated):
    directory, first, _ = calibrated
    said: list[str] = []
    again = calibration.calibrate("smollm2", directory=directory, progress=said.append, **QUICK)
    assert again.cached and said == []
    assert (again.chosen, again.figures) == (first.chosen, first.figures)
    options, how = calibration.resolve("smollm2", dtype="auto", threads=1, directory=directory)
    if len(calibration.machine_candidates()[0]) > 1:
        assert options == first.options and how["how"] == "calibrated" and how["cached"]


@pytest.mark.slow
def test_a_cached_choice_made_under_another_key_is_measured_again(calibrated, tmp_path):
    directory, first, _ = calibrated
    path = cache_path(tmp_path, first.key)
    shutil.copy(cache_path(directory, first.key), path)
    stale = json.loads(path.read_text())
    stale["key"]["versions"]["torch"] = "0.0.1"        # as if measured under another torch
    path.write_text(json.dumps(stale))
    cheapest = calibration.machine_candidates()[0][-1].name
    said: list[str] = []
    again = calibration.calibrate("smollm2", directory=tmp_path, progress=said.append,
                                  only=[cheapest], **QUICK)
    assert not again.cached and set(again.figures) == {cheapest}
    assert any(line.startswith(f"loading {cheapest}") for line in said)
    assert json.loads(path.read_text())["key"] == first.key    # the stale one is replaced


@pytest.mark.slow
def test_a_backend_or_dtype_that_is_asked_for_wins_over_the_calibration(calibrated):
    directory, _, _ = calibrated
    for asked in (dict(dtype="float32"), dict(dtype=None), dict(dtype="auto", forward="lean"),
                  dict(dtype="auto", decode_weights="int8"), dict(dtype="auto", device="cuda")):
        options, how = calibration.resolve("smollm2", directory=directory, threads=1, **asked)
        assert options["backend"] == "torch" and how["how"] == "set", asked
    resource = LocalResource("smollm2", threads=1, max_context_tokens=512, dtype="auto",
                             backend="llamacpp")
    try:
        assert resource.backend == "llamacpp" and resource.engine_choice["how"] == "set"
        assert resource.engine_choice["precision"] == resource.engine.precision
    finally:
        resource.close()


@pytest.mark.slow
def test_a_backend_that_fails_to_load_is_left_out_with_its_reason(tmp_path):
    # A Hugging Face directory: torch loads it; llama.cpp wants a GGUF and cannot.
    model_dir = str(resolve_model_dir("smollm2"))
    said: list[str] = []
    choice = calibration.calibrate(model_dir, directory=tmp_path, progress=said.append,
                                   only=["torch-fp32", "llamacpp"], **QUICK)
    assert set(choice.figures) == {"torch-fp32"} and choice.chosen == "torch-fp32"
    if "llamacpp" in {c.name for c in calibration.machine_candidates()[0]}:
        assert choice.skipped["llamacpp"].startswith("ModelNotFoundError")
        assert ".gguf" in choice.skipped["llamacpp"]
        assert any("llamacpp left out" in line for line in said)
        assert "llamacpp left out (ModelNotFoundError" in choice.summary()
    else:
        assert "not installed" in choice.skipped["llamacpp"]
