"""csr_ros: cached state representation, asynchronous state reconciliation and execution-state
capsules for LLM policies on ROS 2 robots.

The pure parts (state, layout, chunks, eviction, reconcile, render) import neither torch nor
rclpy; the local engine imports torch; the node modules and the ROS run harnesses
(csr_ros.harness) import rclpy.

Where the generated interfaces come from (`csr_ros.msg`, `csr_ros.srv`, `csr_ros.action`)
---------------------------------------------------------------------------------------
rosidl generates them into a Python package that is also named `csr_ros`. This source package
has no `msg/` or `srv/`, and whichever `csr_ros` comes first on `sys.path` hides the other
(`python -m pytest` from the repository root puts this one first). So this package extends its
own `__path__` (the list of folders Python searches for its submodules) with:

1. the interfaces that `scripts/setup.sh --ros` builds into `build/interfaces/` of this checkout
   (or under the prefix named by `CSR_ROS_INTERFACES`), and
2. any other `csr_ros` folder on `sys.path` that holds generated `msg/` (a colcon install that
   was sourced).

Only `msg/`, `srv/`, `action/` and the type-support extension modules live there; every other
module is still this folder's. For (1), the build's own libraries are not on the loader's path
(`LD_LIBRARY_PATH` is fixed when the process starts, and rclpy opens type support by library
name), so they are loaded by full path the first time `csr_ros.msg` or `csr_ros.srv` is
imported; a sourced colcon install sets the loader's path itself. Nothing happens, and nothing
is loaded, where no interfaces were built (a plain `pip install`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__version__ = "0.1.0"

#: Where scripts/setup.sh --ros installs the generated interfaces of this checkout.
INTERFACES_PREFIX = Path(os.environ.get("CSR_ROS_INTERFACES") or
                         Path(__file__).resolve().parent.parent / "build" / "interfaces" /
                         "install")


def _generated_package_dirs() -> list[Path]:
    """Every other `csr_ros` package folder with generated msg/, the build of this checkout
    first."""
    here = Path(__file__).resolve().parent
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [INTERFACES_PREFIX / "lib" / version / "site-packages" / "csr_ros"]
    candidates += [Path(entry or ".") / "csr_ros" for entry in sys.path]
    found: list[Path] = []
    for candidate in candidates:
        try:
            if (candidate / "msg" / "__init__.py").is_file() and \
                    candidate.resolve() != here and candidate.resolve() not in found:
                found.append(candidate.resolve())
        except OSError:
            continue
    return found


class _LoadBuiltLibraries:
    """A finder that claims nothing: on the first import of csr_ros.msg / .srv / .action it loads
    the libraries of build/interfaces by full path, so that rclpy's `dlopen` by name finds
    them already loaded."""

    def __init__(self, lib_dir: Path):
        self.lib_dir = lib_dir
        self.done = False

    def find_spec(self, fullname, path=None, target=None):
        if not self.done and fullname in ("csr_ros.msg", "csr_ros.srv", "csr_ros.action"):
            self.done = True
            import ctypes

            for library in sorted(self.lib_dir.glob("libcsr_ros__*.so")):
                try:
                    ctypes.CDLL(str(library))
                except OSError as exc:      # e.g. ROS's own libraries are not installed here
                    raise ImportError(f"cannot load {library}: {exc}") from exc
        return None


def _extend_path() -> None:
    dirs = _generated_package_dirs()
    __path__.extend(str(d) for d in dirs if str(d) not in __path__)  # noqa: F821 (package)
    lib_dir = INTERFACES_PREFIX / "lib"
    if dirs and dirs[0].is_relative_to(INTERFACES_PREFIX.resolve()) and \
            not any(isinstance(f, _LoadBuiltLibraries) for f in sys.meta_path):
        sys.meta_path.insert(0, _LoadBuiltLibraries(lib_dir))


_extend_path()
