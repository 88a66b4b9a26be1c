"""The robot side as a robot installs it: .venv-robot (scripts/setup_robot.sh, which
`scripts/setup.sh --robot` runs in the test command) holds `pip install .` without the `local`
extra plus ROS 2 Jazzy's wheels, nothing else. Its aggregator and policy node, started from
that venv's Python outside this checkout, with a fresh model cache and only the model's
tokenizer files (what a robot is given), decide against a real llama.cpp server. torch,
transformers and llama.cpp are not installed there, and the node processes never import or
load them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from csr_ros.actions import Vocabulary
from csr_ros.msg import Action, PolicyDecision, StateChunk
from csr_ros.nodes.common import CHUNKS_QOS, DECISIONS_QOS
from csr_ros.srv import GetChunks

from support.ros_graph import ROOT, Graph, NodeProcess, call
from support.ros_nodes import recording_probe, say
from support.waiting import wait_for

pytestmark = [pytest.mark.ros, pytest.mark.server, pytest.mark.slow]

ROBOT_VENV = ROOT / ".venv-robot"
ROBOT_PYTHON = ROBOT_VENV / "bin" / "python"
ROBOT_INTERFACES = ROOT / "build" / "interfaces-robot" / "install"
#: What only the in-process engines need: none of it may be installed on the robot side.
ENGINE_ONLY = ("torch", "transformers", "llama_cpp", "llguidance", "gguf", "safetensors",
               "accelerate")
#: The environment a robot's shell has, nothing of this test run's venv or checkout.
PASSED_ON = ("HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "ROS_DOMAIN_ID",
             "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_STATIC_PEERS", "ROS_LOCALHOST_ONLY",
             "RMW_IMPLEMENTATION")
ACTIONS = ["wait()", "turn(degrees: int[-180,180])", "drive(speed_mps: float[0,0.5])",
           "say(text: str[..24])"]
SPEECH = {"sources": ["speech"],
          "source": {"speech": {"topic": "/test/speech", "type": "std_msgs/msg/String"}}}


@pytest.fixture(scope="module")
def robot_python() -> str:
    if not ROBOT_PYTHON.is_file() or not (ROBOT_INTERFACES / "lib").is_dir():
        pytest.skip("no robot-side venv: run `bash scripts/setup_robot.sh` (or "
                    "scripts/setup.sh --robot)")
    return str(ROBOT_PYTHON)


def robot_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in PASSED_ON}
    env.update(PATH=f"{ROBOT_VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin", PYTHONUNBUFFERED="1",
               CSR_ROS_INTERFACES=str(ROBOT_INTERFACES),
               CSR_ROS_CACHE=str(tmp_path / "empty_cache"))
    return env


def run_robot_python(robot_python: str, code: str, tmp_path: Path):
    return subprocess.run([robot_python, "-c", code], cwd=tmp_path, env=robot_env(tmp_path),
                          capture_output=True, text=True, timeout=120)


def test_the_robot_venv_has_no_engine_and_holds_this_checkouts_code(robot_python, tmp_path):
    for module in ENGINE_ONLY:
        done = run_robot_python(robot_python, f"import {module}", tmp_path)
        assert done.returncode != 0, f"{module} is importable on the robot side"
        assert f"No module named '{module}'" in done.stderr, done.stderr
    done = run_robot_python(robot_python, "import csr_ros, pathlib; "
                            "print(pathlib.Path(csr_ros.__file__).parent)", tmp_path)
    assert done.returncode == 0, done.stderr
    installed = Path(done.stdout.strip())
    assert installed.is_relative_to(ROBOT_VENV), installed        # a copy, not this checkout
    ours = {p.relative_to(ROOT / "csr_ros"): p.read_bytes()
            for p in (ROOT / "csr_ros").rglob("*.py")}
    theirs = {p.relative_to(installed): p.read_bytes() for p in installed.rglob("*.py")}
    differ = sorted(str(k) for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    assert not differ, (f"{ROBOT_VENV} holds another csr_ros than this checkout (run "
                        f"scripts/setup_robot.sh): {differ[:8]}")


def test_the_robot_sides_aggregator_and_policy_decide_against_a_llama_cpp_server(
        robot_python, llama_server, tmp_path):
    from csr_ros.model_store import TOKENIZER_FILES, resolve_model_dir

    model_dir = tmp_path / "model"                  # what a robot is given: no weights
    model_dir.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy2(resolve_model_dir(weights=False) / name, model_dir / name)
    params = tmp_path / "robot.yaml"
    params.write_text(yaml.safe_dump({
        "/**/aggregator": {"ros__parameters": SPEECH | {
            "chunk_log": str(tmp_path / "chunks.log")}},
        "/**/policy": {"ros__parameters": {
            "model": str(model_dir), "rate_hz": 1.0, "max_new_tokens": 24,
            "task": "The operator says: turn 720 degrees. Which action next?",
            "resource": {"r1_url": llama_server.url, "r2_url": llama_server.url},
            "actions": {"vocabulary": ACTIONS, "mode": "grammar"}}}}))
    graph = Graph()
    nodes = []
    try:
        probe = recording_probe(graph, "csr_ros_robot_probe",
                                chunks=(StateChunk, "csr/chunks", CHUNKS_QOS),
                                decisions=(PolicyDecision, "csr/decisions", DECISIONS_QOS),
                                actions=(Action, "csr/actions", DECISIONS_QOS))
        decisions, actions = probe.received["decisions"], probe.received["actions"]
        get_chunks = probe.create_client(GetChunks, "csr/get_chunks")
        for node in ("aggregator", "policy"):
            # -X importtime: every module the process imports, written to its log
            nodes.append(NodeProcess(node, "--params-file", str(params),
                                     log=tmp_path / f"{node}.log", python=robot_python,
                                     env=dict(robot_env(tmp_path), PYTHONPROFILEIMPORTTIME="1"),
                                     cwd=tmp_path))
        nodes[0].wait_output("aggregating", timeout_s=120.0)
        nodes[1].wait_output("deciding at", timeout_s=120.0)
        # Spoken once the aggregator's reliable subscription has matched this publisher (the
        # aggregator makes no second chunk of an unchanged text, so a resend cannot make up
        # for a lost first one); the chunks are read back from the aggregator's GetChunks
        # answer, which holds every chunk it made, whether or not csr/chunks has matched yet.
        texts = ["Ana: the hallway is clear", "Ana: turn around, 720 degrees"]
        say(probe, graph, texts)
        served = wait_for(
            lambda: (a := call(get_chunks, GetChunks.Request(start_seq=0), timeout_s=5.0))
            and len(a.chunks) == len(texts) and a.chunks,
            timeout_s=60.0, what="both chunks in the aggregator's GetChunks answer",
            context=nodes[0].tail)
        assert [c.text.endswith(t) for c, t in zip(served, texts)] == [True, True], \
            [c.text for c in served]
        last = served[-1].seq
        decided = wait_for(lambda: [d for d in decisions if d.last_seq >= last and d.valid],
                           timeout_s=300.0, what="a valid decision over both chunks",
                           context=nodes[1].tail)
        vocab = Vocabulary.parse(ACTIONS)
        for decision in decided:
            assert decision.constrained
            assert vocab.decide(decision.text, constrained=True).valid, decision.text
        assert all(vocab.decide(a.name + "(" + ", ".join(a.arg_values) + ")",
                                constrained=True).valid
                   for a in actions if a.name in ("turn", "drive"))
        for proc in nodes:
            maps = Path(f"/proc/{proc.proc.pid}/maps").read_text()
            assert proc.proc.poll() is None, proc.output
            imported = {line.rsplit("|", 1)[-1].strip().split(".")[0]
                        for line in proc.output.splitlines() if line.startswith("import time:")}
            assert "rclpy" in imported and "csr_ros" in imported, proc.output[-2000:]
            assert not set(ENGINE_ONLY) & imported, (proc.module, set(ENGINE_ONLY) & imported)
            assert not [m for m in ENGINE_ONLY if f"/{m}/" in maps or f"lib{m}" in maps], \
                proc.module
            # ROS's libraries from the robot's venv, none from this run's (which has torch)
            # (with the slash: "/x/.venv" is a prefix of "/x/.venv-robot")
            assert f"{ROBOT_VENV}/" in maps and f"{(ROOT / '.venv').resolve()}/" not in maps
        for proc in nodes:
            code, _ = proc.terminate(timeout_s=30.0)
            assert code == 0, proc.output[-3000:]
    finally:
        for proc in nodes:
            proc.stop()
        graph.close()


def test_a_robot_given_a_gguf_it_cannot_read_is_told_what_to_copy_instead(robot_python,
                                                                          tmp_path):
    """Extracting a tokenizer from a GGUF needs transformers, which the robot side lacks: the
    node stops with what to do, not a traceback."""
    from csr_ros.model_store import default_gguf_path

    proc = NodeProcess("policy", "-p", f"model:={default_gguf_path()}",
                       log=tmp_path / "policy.log", python=robot_python,
                       env=robot_env(tmp_path), cwd=tmp_path)
    assert proc.wait_exit(timeout_s=120.0) != 0
    assert "extracting it needs transformers" in proc.output, proc.output[-3000:]
    assert "csr-ros model path" in proc.output and "Traceback" not in proc.output
