#!/usr/bin/env bash
# The robot side on aarch64, under emulation: an arm64 Debian bookworm root file system (Python
# 3.11, Raspberry Pi OS's userland) built with Debian's debootstrap and qemu-user-static, with
# csr_ros installed as setup_robot.sh installs it (`pip install .`, no extras: no torch, no
# llama.cpp) into /opt/csr_ros, a venv inside it, with pytest. No ROS: the ROS 2 wheels on PyPI
# are x86_64 only. test/test_aarch64_robot_side.py runs the robot-side parts inside it.
#
#   bash scripts/setup_aarch64.sh                  build or update (setup.sh --aarch64 runs it)
#   bash scripts/setup_aarch64.sh --check          say why it cannot run here; status 1 if so
#   bash scripts/setup_aarch64.sh --run [--bind HOST:GUEST]... CMD...
#                                                  run CMD inside (its own mount namespace)
#
# Needs root (chroot, mount) and binfmt_misc; qemu-user-static and debootstrap come from apt.
# The root file system is cached in $CSR_ROS_AARCH64_ROOT (default
# ${CSR_ROS_CACHE:-~/.cache/csr_ros}/aarch64-bookworm): a rerun redoes only what changed (the
# package's sources), in seconds. The Debian mirror is the one apt uses here.
set -euo pipefail
cd "$(dirname "$0")/.."

root=${CSR_ROS_AARCH64_ROOT:-${CSR_ROS_CACHE:-$HOME/.cache/csr_ros}/aarch64-bookworm}
base_spec="bookworm minbase python3,python3-venv,ca-certificates"
venv=/opt/csr_ros
binfmt=/proc/sys/fs/binfmt_misc
step() { printf '\n== %s\n' "$*" >&2; }

why_not() {   # why the root file system cannot run here, or nothing
  if [[ $(id -u) != 0 ]]; then echo "needs root (chroot, mount)"; return; fi
  if [[ ! -e $binfmt/qemu-aarch64 ]]; then
    echo "qemu-aarch64 is not registered in binfmt_misc (bash scripts/setup_aarch64.sh)"; return
  fi
  if [[ ! -f $root/.csr_ros_package ]]; then
    echo "no arm64 root file system at $root (bash scripts/setup.sh --aarch64)"
  fi
}

if [[ ${1:-} == --check ]]; then
  reason=$(why_not)
  [[ -z $reason ]] || { echo "$reason"; exit 1; }
  exit 0
fi

if [[ ${1:-} == --run ]]; then
  shift
  if [[ -z ${CSR_ROS_AARCH64_NS:-} ]]; then   # mounts made below vanish with the namespace
    CSR_ROS_AARCH64_NS=1 exec unshare --mount --propagation private bash "$0" --run "$@"
  fi
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  while [[ ${1:-} == --bind ]]; do
    host=${2%%:*} guest=${2#*:}
    mkdir -p "$root$guest"
    mount --bind "$host" "$root$guest"
    shift 2
  done
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 \
    PATH=$venv/bin:/usr/bin:/bin "$@"
fi

[[ $# == 0 ]] || { echo "usage: scripts/setup_aarch64.sh [--check | --run CMD...]" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "setup_aarch64.sh needs root (chroot, mount)" >&2; exit 1; }

if [[ ! -x /usr/bin/qemu-aarch64-static || ! -x /usr/sbin/debootstrap ]]; then
  step "installing qemu-user-static and debootstrap from apt"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    qemu-user-static debootstrap >/dev/null
fi
# In a container nothing registers binfmt formats at boot: mount binfmt_misc and register
# qemu-aarch64 with Debian's own line (flag F: the interpreter works inside a chroot).
[[ -e $binfmt/register ]] || mount binfmt_misc -t binfmt_misc "$binfmt"
if [[ ! -e $binfmt/qemu-aarch64 ]]; then
  step "registering qemu-aarch64 in binfmt_misc"
  cat /usr/lib/binfmt.d/qemu-aarch64.conf > "$binfmt/register"
fi

if [[ ! -f $root/.csr_ros_base || $(cat "$root/.csr_ros_base") != "$base_spec" ]]; then
  # The first Debian (not security) archive in apt's sources, deb822 or one-line format.
  mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
           | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -1 | tr -d ' ' || true)
  mirror=${CSR_ROS_DEBIAN_MIRROR:-${mirror:-http://deb.debian.org/debian}}
  step "building an arm64 Debian bookworm root file system from $mirror (about 4 minutes)"
  rm -rf "$root" "$root.tmp"
  mkdir -p "$(dirname "$root")"
  read -r suite variant include <<< "$base_spec"
  debootstrap --arch=arm64 --variant="$variant" --include="$include" "$suite" "$root.tmp" \
    "$mirror" > "$root.tmp.log" 2>&1 \
    || { tail -20 "$root.tmp.log" >&2; exit 1; }
  rm -f "$root.tmp.log"
  echo "$base_spec" > "$root.tmp/.csr_ros_base"
  mv "$root.tmp" "$root"
fi

run() { bash "$0" --run "$@"; }
if [[ ! -x $root$venv/bin/python ]]; then
  step "creating $venv inside with $(run python3 --version)"
  run python3 -m venv "$venv"
fi

# A copy of the sources, as setup_robot.sh installs them; pytest for the tests run inside.
stamp=$root/.csr_ros_package
sources=$( { find csr_ros -name '*.py' -print0 | sort -z | xargs -0 cat; cat setup.cfg setup.py; } \
           | sha256sum | cut -c1-16)
if [[ ! -f $stamp || $(cat "$stamp") != "$sources" ]]; then
  step "installing csr_ros into the arm64 $venv (pip install ., no extras; about a minute)"
  rm -rf "$root/tmp/csr_ros-src"
  mkdir -p "$root/tmp/csr_ros-src"
  cp -r setup.py setup.cfg README.md csr_ros "$root/tmp/csr_ros-src/"
  # pip there trusts this machine's CA bundle: where a proxy re-signs HTTPS, the root's fails
  cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$root/etc/ssl/host-ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/host-ca-certificates.crt\n' > "$root/etc/pip.conf"
  pip=(pip install --quiet --disable-pip-version-check --use-pep517)
  run pip uninstall --quiet --yes csr_ros 2>/dev/null || true   # same version, new sources
  run "${pip[@]}" /tmp/csr_ros-src pytest==9.2.0
  rm -rf "$root/tmp/csr_ros-src"
  if run python -c 'import torch' 2>/dev/null; then
    echo "torch is importable in the arm64 $venv: something the robot side installs pulled it in" >&2
    exit 1
  fi
  echo "$sources" > "$stamp"
fi
echo "arm64 robot side ready in $root: $(run python -c 'import platform, csr_ros; print(platform.machine(), "csr_ros", csr_ros.__version__)')" >&2
