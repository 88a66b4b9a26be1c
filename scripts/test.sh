#!/usr/bin/env bash
# Set up everything (including llama.cpp's server for the HTTP tests), then run the tests.
# Extra arguments go to pytest. pytest's exit status is ours: "no tests collected" (5) fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --server
exec .venv/bin/python -m pytest -ra "$@"
