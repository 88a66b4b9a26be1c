#!/usr/bin/env bash
# Build this package the way an integrator does: `colcon build` of a workspace whose src/ holds
# the package, against the ROS 2 of a Python environment (the ros-jazzy-* wheels and colcon that
# `scripts/setup.sh --ros` installs; the venv itself is the ROS prefix). The workspace is
# build/colcon/ of this checkout (git-ignored): src/csr_ros is a copy of the package's files,
# the install is build/colcon/install/csr_ros (lib/csr_ros/<node>, share/csr_ros, the Python
# package with its generated interfaces). Skipped when none of those files has changed; after a
# change colcon builds again incrementally (the copy keeps the files' times).
#
#   bash scripts/build_colcon.sh [PYTHON]        (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(realpath -s "${1:-.venv/bin/python}")
prefix=$("$python" -c 'import sys; print(sys.prefix)')
colcon="$prefix/bin/colcon"
if [[ ! -d "$prefix/share/rosidl_default_generators" || ! -x "$colcon" ]]; then
  echo "no ROS 2 build tools or colcon under $prefix: run scripts/setup.sh --ros first" >&2
  exit 1
fi

ws=build/colcon
# The package as a clone has it: tracked files and new ones git does not ignore.
package_paths=(CMakeLists.txt package.xml msg srv action csr_ros bin launch config resource)
files=$( { git ls-files -co --exclude-standard -- "${package_paths[@]}" 2>/dev/null ||
          find "${package_paths[@]}" -type f -not -path '*/__pycache__/*'; } | sort)
stamp=$( { echo "$files" | tr '\n' '\0' | xargs -0 sha256sum; cat "$0";
           "$python" -c 'import sys; from importlib.metadata import version as v
print(sys.version, *(v(f"colcon-{p}") for p in ("core", "cmake", "ros")))';
           cat "$prefix/share/rclpy/package.xml"; } | sha256sum | cut -c1-16)
if [[ -f $ws/stamp && $(cat $ws/stamp) == "$stamp" ]]; then
  echo "colcon install up to date in $ws/install" >&2
  exit 0
fi
rm -f "$ws/stamp"
mkdir -p "$ws"
touch "$ws/COLCON_IGNORE"          # a colcon build of the repository must not crawl into it
# A copy, not the checkout itself: a venv inside the repository (.venv) would put the numpy
# include directory "inside the source directory", which CMake refuses in exported targets.
rm -rf "$ws/src"
mkdir -p "$ws/src/csr_ros"
echo "$files" | tar -cf - -T - | tar -xpf - -C "$ws/src/csr_ros"

export AMENT_PREFIX_PATH="$prefix" CMAKE_PREFIX_PATH="$prefix"
export PATH="$prefix/bin:$PATH"      # colcon and ament run the environment's python3
echo "colcon build of csr_ros into $ws/install (about 1 minute of CPU time the first time)" >&2
started=$(date +%s)
(
  cd "$ws"
  # The wheels' CMake exports name include directories of the machine that built them:
  # CMakeLists.txt drops those that do not exist here.
  "$colcon" --log-base log build --base-paths src --build-base build --install-base install \
    --parallel-workers 1 --event-handlers console_direct- console_cohesion- \
    --cmake-args -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DPython3_EXECUTABLE="$python" \
    > colcon.log 2>&1 || { tail -40 colcon.log >&2; exit 1; }
) || exit 1
echo "colcon build took $(( $(date +%s) - started )) s" >&2
echo "$stamp" > "$ws/stamp"
