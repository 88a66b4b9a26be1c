"""Shared fixtures. Keep each one small; append new fixtures below the existing ones.

What only the ROS tests need (rclpy, a graph, probes) is in test/ros/conftest.py; what every
test needs, and what must hold for the processes any test starts, is here."""

from __future__ import annotations

import os

import pytest

from csr_ros.ros_domain import SLOT_ENV as DOMAIN_SLOT_ENV, free_ros_domain
from support.ros_check import ros_missing
from support.run_units import LONGEST_FILES_FIRST, file_of, run_unit
# The session's two vLLM servers, defined once here: a session fixture imported into several
# test modules is one fixture per module, and each module's pair stayed up to the end of the
# session (two pairs at once, about 9 GB, ran the CI machine out of memory).
from support.vllm_server import vllm_pair, vllm_server  # noqa: E402,F401  (fixtures)
# The same for the llama.cpp servers: one session server for every module that asks for it
# (imported into ten modules, it was ten servers, each up to the session's end).
from support.llama_server import (fresh_llama_server, llama_server,  # noqa: E402,F401
                                  llama_server_pair, llama_server_with_key)

# -- ROS 2: an isolated graph per run, and no silent skips where ROS is expected ---------------

#: In CI, or when the test script asks for it, the ROS tests must run: a missing rclpy or
#: missing generated interfaces fails the run instead of skipping those tests.
ROS_REQUIRED = (os.environ.get("CI", "").lower() == "true"
                or os.environ.get("CSR_ROS_REQUIRE_ROS", "") not in ("", "0"))
#: The same for the arm64 root file system (test_aarch64_robot_side.py, scripts/setup_aarch64.sh).
AARCH64_REQUIRED = (os.environ.get("CI", "").lower() == "true"
                    or os.environ.get("CSR_ROS_REQUIRE_AARCH64", "") not in ("", "0"))


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")   # "gw0", "gw1", ... under pytest -n N
    if worker is not None:
        # Test processes that start side by side pick their domains from disjoint sets.
        os.environ[DOMAIN_SLOT_ENV] = f"{int(worker[2:])}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"
    # A random unused domain and localhost-only discovery: the nodes of this run (and the
    # processes it starts, which inherit the environment) never meet another run's or a robot's.
    os.environ["ROS_DOMAIN_ID"] = str(free_ros_domain())
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"


def pytest_sessionstart(session):
    if ROS_REQUIRED:
        why = ros_missing()
        if why is not None:
            pytest.exit(f"ROS is required here (CI or CSR_ROS_REQUIRE_ROS=1) but {why}",
                        returncode=1)


# -- Two test processes (scripts/test.sh runs pytest -n 2 --dist loadfile) -----------------------

def pytest_collection_modifyitems(config, items):
    """Under pytest -n N, the longest units first (each worker collects the same order)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    rank: dict[str, tuple[int, int]] = {}    # a unit's: its longest file's place, first item
    for index, item in enumerate(items):
        file = file_of(item.nodeid)
        place = LONGEST_FILES_FIRST.index(file) if file in LONGEST_FILES_FIRST \
            else len(LONGEST_FILES_FIRST)
        unit = run_unit(item.nodeid)
        rank[unit] = min(rank.get(unit, (place, index)), (place, index))
    items.sort(key=lambda item: rank[run_unit(item.nodeid)])


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:              # pytest-xdist is not installed: one process, nothing to do
    pass
else:
    class _RunUnitScheduling(LoadScopeScheduling):
        """--dist loadfile, with the vLLM files as one unit. (xdist's loadgroup marks do not
        reach the scheduler under pytest 9.2, whose node ids no longer read `_nodeid`.)"""

        def _split_scope(self, nodeid: str) -> str:
            return run_unit(nodeid)

    def pytest_xdist_make_scheduler(config, log):
        return _RunUnitScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if ROS_REQUIRED and report.skipped and not hasattr(report, "wasxfail") \
            and item.get_closest_marker("ros") is not None:
        report.outcome = "failed"
        report.longrepr = f"a ROS test was skipped where ROS is required: {report.longrepr}"
    if AARCH64_REQUIRED and report.skipped and item.get_closest_marker("aarch64") is not None:
        report.outcome = "failed"
        report.longrepr = (f"an aarch64 test was skipped where they are required: "
                           f"{report.longrepr}")


@pytest.fixture(scope="session")
def smollm2_engine():
    """The embedded default model loaded once per session (fp32, CPU, 1024-token buffers).

    Tests that use it directly must leave it as they found it or call `reset()` first; the
    function-scoped `smollm2` fixture does that for them.
    """
    pytest.importorskip("torch")
    from csr_ros.engine import TorchEngine

    engine = TorchEngine("smollm2", max_context_tokens=1024)
    yield engine
    engine.close()


@pytest.fixture
def smollm2(smollm2_engine):
    """The session's SmolLM2 engine with an empty committed state."""
    smollm2_engine.reset()
    return smollm2_engine


@pytest.fixture(scope="session")
def tiny_hybrid_model():
    """A random qwen3_next model (linear-attention and full-attention layers), fixed seed.

    Weights are drawn wider than the default (initializer_range=0.1) so the recurrent state
    visibly steers greedy decoding; with seed 2 the KV-only ablation diverges at every token.
    """
    torch = pytest.importorskip("torch")
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()   # the CPU fallback kernels announce themselves
    torch.manual_seed(2)
    config = Qwen3NextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, max_position_embeddings=1024, initializer_range=0.1,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"])
    config._attn_implementation = "sdpa"
    return Qwen3NextForCausalLM(config).eval()


@pytest.fixture
def tiny_hybrid(tiny_hybrid_model):
    """A fresh engine over the shared tiny hybrid weights (cheap: 512-token buffers)."""
    from csr_ros.engine import TorchEngine

    return TorchEngine(tiny_hybrid_model, max_context_tokens=512)


@pytest.fixture(scope="session")
def robot_prompt(smollm2_engine):
    """A real CSR prompt for SmolLM2: (static_ids, dynamic_ids) from rendered robot chunks."""
    from support.robot_prompts import robot_prompt_ids

    return robot_prompt_ids(smollm2_engine.tokenizer)


@pytest.fixture(scope="session")
def tokenizer():
    """The real SmolLM2 tokenizer (no weights needed)."""
    from csr_ros.model_store import resolve_model_dir
    from csr_ros.tokenizer import HFTokenizer

    return HFTokenizer(resolve_model_dir(weights=False))


@pytest.fixture(scope="session")
def layout(tokenizer):
    """SmolLM2's chat template split once into its fixed head, mid and tail runs."""
    from csr_ros.layout import Layout

    return Layout.from_tokenizer(tokenizer)


@pytest.fixture
def resources(smollm2):
    """The recall evaluation's resources over the session's SmolLM2 engine, closed after."""
    from csr_ros.bench.eval.run import EvalResources

    resources = EvalResources.local(engine=smollm2)
    yield resources
    resources.close()
