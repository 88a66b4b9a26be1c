"""The package's layers, read from its source with `ast`: imports go one way (no circle, nothing
below the command line imports `tools/`), every command adapter stays thin, no two modules
share a file name, one percentile, and the heavy imports stay in their rooms (rclpy in the
nodes and the ROS run harnesses, torch at module level in the torch engine only)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "csr_ros"
TOOLS_MAX_LINES = 150
ROS_HARNESSES = {"harness/ros_demo.py", "harness/ros_graph.py", "bench/replay_graph.py",
                 "bench/watchdog_faults.py"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Absolute names of what `path` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else \
        module_name(path).rpartition(".")[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)
    return names


def owner(name: str) -> str | None:
    """The module of the package that `name` lives in (None outside the package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_the_packages_imports_form_no_circle():
    graph = {mod: {owner(n) for n in imported(path) if owner(n)} - {mod}
             for mod, path in MODULES.items()}
    # a package's __init__ that re-exports its modules is not a circle with them
    for mod in graph:
        graph[mod] = {dep for dep in graph[mod] if not mod.startswith(dep + ".")}
    graphlib.TopologicalSorter(graph).prepare()     # raises CycleError naming the circle


def test_only_the_command_line_imports_the_command_adapters():
    offenders = sorted(f"{mod} imports {name}" for mod, path in MODULES.items()
                       if not (mod.startswith("csr_ros.tools") or mod == "csr_ros.cli")
                       for name in imported(path) if name.startswith("csr_ros.tools"))
    assert offenders == []


def test_every_command_adapter_is_at_most_150_lines():
    long = {p.name: n for p in (PACKAGE / "tools").glob("*.py")
            if (n := len(p.read_text().splitlines())) > TOOLS_MAX_LINES}
    assert long == {}


def test_no_two_modules_share_a_file_name():
    seen: dict[str, list[str]] = {}
    for path in MODULES.values():
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_one_function_defines_a_percentile():
    defined = sorted(f"{path.relative_to(PACKAGE)}:{node.name}"
                     for path in MODULES.values()
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.FunctionDef) and node.name == "percentile")
    assert defined == ["stats.py:percentile"]


def test_rclpy_is_imported_by_the_nodes_and_the_ros_run_harnesses_only():
    users = {str(path.relative_to(PACKAGE)) for path in MODULES.values()
             if any(n == "rclpy" or n.startswith("rclpy.") for n in imported(path))}
    assert users, "the nodes import rclpy"
    assert {u for u in users if not u.startswith("nodes/") and u not in ROS_HARNESSES} == set()


def test_torch_is_imported_at_module_level_by_the_torch_engine_only():
    users = {str(path.relative_to(PACKAGE)) for path in MODULES.values()
             if any(n == "torch" or n.startswith("torch.")
                    for n in imported(path, top_level_only=True))}
    assert users, "the torch engine imports torch"
    assert {u for u in users if not u.startswith("engine/")} == set()
    assert "engine/llamacpp.py" not in users and "engine/decoder.py" not in users


def test_nothing_outside_the_benchmarks_and_the_command_line_imports_a_benchmark():
    offenders = sorted(f"{mod} imports {name}" for mod, path in MODULES.items()
                       if not mod.startswith(("csr_ros.bench", "csr_ros.tools"))
                       for name in imported(path) if name.startswith("csr_ros.bench"))
    assert offenders == []


# the ROS run harnesses' polls of what their graph observers saw, folded with those observers
def _reads_the_clock(node: ast.AST) -> bool:
    """`time.monotonic()`, `clock()`, or a name holding a deadline."""
    if isinstance(node, ast.Call):
        func = node.func
        return (isinstance(func, ast.Attribute) and func.attr == "monotonic") or \
            (isinstance(func, ast.Name) and func.id == "clock")
    return isinstance(node, ast.Name) and "deadline" in node.id


def _polls_a_deadline(loop: ast.While) -> bool:
    """A `while` loop that compares the clock (or a deadline) and sleeps (`time.sleep`, or an
    event's or a condition's `wait`)."""
    compares_clock = any(isinstance(n, ast.Compare)
                         and any(_reads_the_clock(o) for o in [n.left, *n.comparators])
                         for n in ast.walk(loop))
    calls = [n.func for n in ast.walk(loop)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    sleeps = any(f.attr == "wait" or (f.attr == "sleep" and isinstance(f.value, ast.Name)
                                      and f.value.id == "time") for f in calls)
    return compares_clock and sleeps


def test_one_function_polls_a_condition_until_a_deadline():
    pollers = sorted(f"{path.relative_to(PACKAGE)}:{node.name}"
                     for path in MODULES.values()
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and any(isinstance(loop, ast.While) and _polls_a_deadline(loop)
                             for loop in ast.walk(node)))
    assert sorted(set(pollers)) == ["waiting.py:wait_until"]
