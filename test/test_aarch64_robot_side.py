"""The robot side on aarch64: the parts of the aggregator and the policy node that need no rclpy,
run inside the arm64 Debian root file system of scripts/setup_aarch64.sh (csr_ros installed
with `pip install .`, no torch, no llama.cpp) under qemu, give what they give on x86.

Each case of support/aarch64_probe.py runs in this process and in the arm64 root file system,
and the two results are compared; the policy's case asks this session's x86 llama.cpp server
over loopback. Where the machine cannot run the root file system (not root, no binfmt_misc,
not built) the tests skip with the reason; in CI, or with CSR_ROS_REQUIRE_AARCH64=1 (set by
scripts/test.sh), such a skip fails (test/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from support.aarch64_probe import ANSWERS, BOUNDED, run

pytestmark = pytest.mark.aarch64

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup_aarch64.sh"
GUEST_MODEL, GUEST_TEST, GUEST_WORK = "/csr_ros_model", "/csr_ros_test", "/csr_ros_work"


class Arm64:
    """Runs probe cases inside the root file system, with the model's tokenizer files, test/
    and one work directory bound in."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir

    def run(self, name: str, args: dict, *, work: Path | None = None) -> dict:
        binds = [f"{self.model_dir}:{GUEST_MODEL}", f"{ROOT / 'test'}:{GUEST_TEST}"]
        if work is not None:
            binds.append(f"{work}:{GUEST_WORK}")
        command = ["bash", str(SETUP), "--run"]
        for bind in binds:
            command += ["--bind", bind]
        command += ["python", "-P", f"{GUEST_TEST}/support/aarch64_probe.py", name,
                    json.dumps({"model_dir": GUEST_MODEL, **args})]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{name} failed on arm64:\n{done.stderr[-3000:]}"
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["machine"] == "aarch64", out["machine"]
        return out["result"]


@pytest.fixture(scope="module")
def arm64():
    check = subprocess.run(["bash", str(SETUP), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"the arm64 root file system cannot run here: {check.stdout.strip()}")
    from csr_ros.model_store import resolve_model_dir

    return Arm64(resolve_model_dir(weights=False))


@pytest.fixture(scope="module")
def model_dir(arm64) -> str:
    return str(arm64.model_dir)


def test_the_aggregators_emitter_renders_the_same_chunks_on_aarch64_as_on_x86(arm64, model_dir):
    args = {"params_yaml": (ROOT / "config" / "csr_ros.yaml").read_text()}
    here = run("render", args)
    assert arm64.run("render", args) == here
    chunks = here["chunks"]
    reasons = {reason for _, _, reason, _, _ in chunks}
    assert {"first", "change", "event"} <= reasons, reasons
    assert 10 < len(chunks) < here["n_messages"] // 10      # deadbands held most of them back
    assert any("<|im_end|>" in text for *_, text in chunks)  # speech kept as it was said


def test_csr_state_on_aarch64_gives_the_same_token_ids_as_on_x86(arm64, model_dir):
    here = run("state", {"model_dir": model_dir})
    assert arm64.run("state", {}) == here
    (static1, _, _), (static2, _, i_star2) = here["requests"]
    assert static2[:len(static1)] == static1 and len(static2) > len(static1)
    assert i_star2 >= len(static1)
    assert len(here["chunk_tokens"]) == 6 and min(here["chunk_tokens"]) > 0


def test_typed_actions_with_bounds_decide_the_same_on_aarch64_as_on_x86(arm64):
    here = run("actions", {})
    assert arm64.run("actions", {}) == here
    valid = {text: ok for text, (ok, _, _) in zip(ANSWERS, here["decisions"])}
    assert [t for t, ok in valid.items() if ok] == [
        "wait()", "turn(90, true)", "drive(0.25)", "go_to(kitchen)", 'say("hello Ana")']
    errors = {text: error for text, (_, _, error) in zip(ANSWERS, here["decisions"])}
    assert "outside [" in errors["turn(720, false)"] and "outside [" in errors["drive(3)"]
    turn = here["json_schema"]["anyOf"][1]["properties"]["args"]["properties"]["degrees"]
    assert (turn["minimum"], turn["maximum"]) == (-180, 180)
    assert "an integer from -180 to 180" in here["describe"]


def test_a_chunk_log_written_on_aarch64_restarts_to_the_same_state_there_and_on_x86(
        arm64, model_dir, tmp_path):
    written = arm64.run("chunklog_write", {"path": f"{GUEST_WORK}/log", "stream": "arm64"},
                        work=tmp_path)
    assert written["version"] == 1 and written["seqs"] == list(range(2, 10))
    assert arm64.run("chunklog_restart", {"path": f"{GUEST_WORK}/log"}, work=tmp_path) == written
    assert run("chunklog_restart", {"path": str(tmp_path / "log"), "model_dir": model_dir}) \
        == written


def test_a_chunk_log_written_on_x86_restarts_to_the_same_state_on_aarch64(
        arm64, model_dir, tmp_path):
    written = run("chunklog_write", {"path": str(tmp_path / "log"), "stream": "x86",
                                     "model_dir": model_dir})
    assert arm64.run("chunklog_restart", {"path": f"{GUEST_WORK}/log"}, work=tmp_path) == written


def test_the_policy_on_aarch64_asks_the_x86_llama_cpp_server_and_gets_bounded_actions(
        arm64, llama_server):
    out = arm64.run("openai", {"url": llama_server.url})
    assert (out["server"], out["state_mode"]) == ("llama.cpp", "text")
    ranges = {"turn": ("degrees", -180, 180), "drive": ("speed_mps", 0, Decimal("0.5"))}
    assert [d["task"] for d in out["decisions"]] and all(d["constrained"]
                                                         for d in out["decisions"])
    for d in out["decisions"]:
        assert d["valid"], (d["task"], d["text"], d["error"])
        assert d["name"] in {s.split("(")[0] for s in BOUNDED[:3]}, d
        if d["name"] in ranges:
            arg, low, high = ranges[d["name"]]
            assert low <= Decimal(repr(d["args"][arg])) <= high, d
