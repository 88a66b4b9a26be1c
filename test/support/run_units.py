"""What each of the test command's processes runs as a whole (pytest -n 2, test/conftest.py):
a file, or all the files that use the session's vLLM servers; the longest first."""

from __future__ import annotations

#: Test files by their time in a full run on a 2-core AMD EPYC (2026-12-07), the longest first,
#: in seconds: soak 505, the vLLM files 500 together, the demos 182 and 172, ... Each test
#: process takes the next file when it is nearly done with its own, so the long ones start
#: first and the run does not end on one long file while the other process idles. Files not
#: named here follow in their own order.
LONGEST_FILES_FIRST = (
    "test/test_vllm_router_fleet.py", "test/test_soak.py", "test/test_demo_runs.py",
    "test/test_actions_demo.py", "test/test_demo_openai.py", "test/test_engine_llamacpp.py",
    "test/test_gateway_local.py", "test/test_gateway_http.py",
    "test/test_actions_local_decoding.py", "test/test_bench_report.py",
    "test/test_reconcile_process_resource.py", "test/test_eval_harness.py",
    "test/ros/test_nodes_ros_all_in_one.py", "test/ros/test_colcon_install_ros.py",
    "test/ros/test_policy_keep_up_ros.py", "test/test_openai_faults.py",
    "test/test_engine_qwen2.py", "test/test_reconcile_faults_local.py",
    "test/ros/test_lifecycle_ros.py", "test/test_engine_precision.py",
    "test/test_eval_scoring.py", "test/test_eval_choice_scoring.py",
    "test/ros/test_aggregator_ros.py", "test/ros/test_nodes_ros_demo.py",
    "test/ros/test_watchdog_ros.py", "test/ros/test_reconciler_ros.py",
    "test/test_actions_servers.py", "test/test_aarch64_robot_side.py",
)

#: The files that use the session's two vLLM servers (about 9 GB, the fixtures vllm_pair and
#: vllm_server): one process runs them all, so there is never a second pair.
#: test/test_packaging_files.py checks that this names every such file.
VLLM_FILES = ("test/test_vllm_router_fleet.py", "test/test_vllm_server.py")


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def run_unit(nodeid: str) -> str:
    """What one test process runs as a whole: the test's file, or all the vLLM files."""
    file = file_of(nodeid)
    return "vllm" if file in VLLM_FILES else file
