#!/usr/bin/env bash
# Set up everything, then run the main job on the embedded default model: a synthetic robot
# episode with asynchronous state reconciliation over two in-process resources.
# Extra arguments go to `csr-ros demo` (see `csr-ros demo --help`). With --ros the episode runs
# through a real ROS 2 graph (ROS 2 Jazzy from PyPI wheels is set up first, x86_64 Linux) and
# the results go to out/demo_ros.json and out/demo_ros.png.
set -euo pipefail
cd "$(dirname "$0")/.."
name=demo
setup=()
for arg in "$@"; do
  if [[ $arg == --ros ]]; then name=demo_ros; setup=(--ros); fi
done
bash scripts/setup.sh "${setup[@]}"
mkdir -p out
exec .venv/bin/csr-ros demo --json "out/$name.json" --plot "out/$name.png" "$@"
