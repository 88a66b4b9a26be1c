#!/usr/bin/env bash
# Build this package's ROS 2 interfaces (msg/, srv/, action/) with plain CMake against the ROS 2
# of a Python environment (the ros-jazzy-* wheels that `scripts/setup.sh --ros` installs, whose
# prefix is the venv itself), into build/interfaces/ of this checkout. csr_ros/__init__.py finds
# them there, however Python is started. Skipped when nothing it depends on has changed.
#
#   bash scripts/build_interfaces.sh [PYTHON [OUT]]   (default: .venv/bin/python build/interfaces)
#
# Another venv's ROS needs its own build (the generated libraries link against the ROS
# libraries of the prefix they were built with): scripts/setup_robot.sh builds .venv-robot's
# into build/interfaces-robot, found through CSR_ROS_INTERFACES=build/interfaces-robot/install.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
out=${2:-build/interfaces}
prefix=$("$python" -c 'import sys; print(sys.prefix)')
if [[ ! -d "$prefix/share/rosidl_default_generators" ]]; then
  echo "no ROS 2 build tools under $prefix: run scripts/setup.sh --ros first" >&2
  exit 1
fi

# Everything the generated code depends on: the interface files, the build files, the Python
# version and the ROS installation (its rclpy version).
stamp=$( { cat msg/*.msg srv/*.srv action/*.action CMakeLists.txt package.xml;
           "$python" -c 'import sys; print(sys.version)';
           cat "$prefix/share/rclpy/package.xml"; } | sha256sum | cut -c1-16)
if [[ -f $out/stamp && $(cat $out/stamp) == "$stamp" ]]; then
  echo "interfaces up to date in $out" >&2
  exit 0
fi
rm -rf "$out"
mkdir -p "$out/src"
touch "$out/COLCON_IGNORE"          # a colcon build of the repository must not crawl into it
# CMake configures a copy of the package's build inputs: a venv inside the repository
# (.venv) would otherwise put the numpy include directory "inside the source directory",
# which CMake refuses in the exported targets of the generated package.
cp -r CMakeLists.txt package.xml msg srv action "$out/src/"
export AMENT_PREFIX_PATH="$prefix"  # ament looks up the installed type supports through it
jobs=$(( $(nproc) < 2 ? 1 : 2 ))
echo "building the csr_ros interfaces into $out (about 40 s on 2 cores)" >&2
# RPATH $ORIGIN: the libraries and Python extension modules find each other without
# LD_LIBRARY_PATH (lib/ and lib/pythonX.Y/site-packages/csr_ros/ are three levels apart).
cmake -S "$out/src" -B "$out/cmake" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
  -DCSR_ROS_INTERFACES_ONLY=ON -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_INSTALL_PREFIX="$PWD/$out/install" -DPython3_EXECUTABLE="$("$python" -c 'import sys; print(sys.executable)')" \
  -DCMAKE_INSTALL_RPATH='$ORIGIN;$ORIGIN/../../..' > "$out/cmake.log" 2>&1 \
  || { tail -40 "$out/cmake.log" >&2; exit 1; }
cmake --build "$out/cmake" -j "$jobs" >> "$out/cmake.log" 2>&1 \
  || { tail -40 "$out/cmake.log" >&2; exit 1; }
cmake --install "$out/cmake" >> "$out/cmake.log" 2>&1 || { tail -40 "$out/cmake.log" >&2; exit 1; }
CSR_ROS_INTERFACES="$PWD/$out/install" "$python" -c 'from csr_ros.msg import StateChunk
from csr_ros.srv import GetChunks; from csr_ros.action import Decide' \
  || { echo "the built interfaces do not import" >&2; exit 1; }
echo "$stamp" > "$out/stamp"
