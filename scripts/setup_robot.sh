#!/usr/bin/env bash
# The robot side as a robot computer installs it, in .venv-robot: `pip install .` without the
# `local` extra (so no torch, transformers or llama.cpp: the model runs on a server), ROS 2
# Jazzy from the PyPI wheels of scripts/ros-jazzy-wheels.txt, and this package's interfaces
# built against that venv into build/interfaces-robot (the nodes find them through
# CSR_ROS_INTERFACES=build/interfaces-robot/install). test/ros/test_robot_install_ros.py starts
# the aggregator and the policy node from it against a llama.cpp server.
#
#   bash scripts/setup_robot.sh        (scripts/setup.sh --robot runs it; PYTHON picks the base)
#
# Safe to run again: each step is skipped while what it depends on is unchanged (the wheel
# list; the package's sources; the interfaces' own stamp). pip's cache is used as usual.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
venv=.venv-robot
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
step() { printf '\n== %s\n' "$*" >&2; }

if [[ ! -x $venv/bin/python ]]; then
  step "creating $venv with $($PYTHON --version) (the robot side: no torch)"
  "$PYTHON" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet)
touch "$venv/COLCON_IGNORE"          # a colcon build of this repository must not crawl it

stamp=$venv/.csr_ros_ros_wheels
wheels=$(sha256sum < scripts/ros-jazzy-wheels.txt | cut -c1-16)
if [[ ! -f $stamp || $(cat "$stamp") != "$wheels" ]]; then
  step "installing ROS 2 Jazzy from PyPI wheels into $venv"
  "${pip[@]}" -r scripts/ros-jazzy-wheels.txt
  echo "$wheels" > "$stamp"
fi

# A copy, not an editable install: the nodes run what a robot would have installed. Built from
# a copy of the sources, so that setuptools' build/ leaves nothing stale in the checkout.
stamp=$venv/.csr_ros_package
sources=$( { find csr_ros -name '*.py' -print0 | sort -z | xargs -0 cat; cat setup.cfg setup.py; } \
           | sha256sum | cut -c1-16)
if [[ ! -f $stamp || $(cat "$stamp") != "$sources" ]]; then
  step "installing csr_ros into $venv (pip install ., no extras)"
  copy=$(mktemp -d)
  trap 'rm -rf "$copy"' EXIT
  cp -r setup.py setup.cfg README.md csr_ros "$copy/"
  "${pip[@]}" "$copy" && "${pip[@]}" --force-reinstall --no-deps "$copy"
  echo "$sources" > "$stamp"
fi

step "building the csr_ros interfaces for $venv into build/interfaces-robot"
bash scripts/build_interfaces.sh "$venv/bin/python" build/interfaces-robot

if "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "torch is importable in $venv: something the robot side installs pulled it in" >&2
  exit 1
fi
