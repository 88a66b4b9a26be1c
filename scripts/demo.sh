#!/usr/bin/env bash
# Set up everything, then run the main job on the embedded default model: a synthetic robot
# episode with asynchronous state reconciliation over two in-process resources.
# Extra arguments go to `csr-ros demo` (see `csr-ros demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p out
exec .venv/bin/csr-ros demo --json out/demo.json --plot out/demo.png "$@"
