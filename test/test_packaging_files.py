"""The colcon package is consistent without building it: package.xml, CMakeLists.txt, the
interfaces, node executables, launch files and the shipped parameters agree with each other."""

from __future__ import annotations

import ast
import os
import py_compile
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rosbags.typesys import Stores, get_typestore, get_types_from_msg

from csr_ros.ros_params import SCHEMAS, validate_file

ROOT = Path(__file__).resolve().parents[1]
CMAKE = (ROOT / "CMakeLists.txt").read_text()


def cmake_paths(prefix: str) -> list[str]:
    pattern = rf"\b({prefix}/\w+\.{prefix})\b" if prefix in ("msg", "srv") else rf"\b({prefix}/\w+)"
    return sorted(set(re.findall(pattern, CMAKE)))


def test_package_xml_is_format_3_ament_cmake_and_an_interface_package():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.tag == "package" and root.get("format") == "3"
    assert root.findtext("name") == "csr_ros"
    assert root.find("export").findtext("build_type") == "ament_cmake"
    assert root.findtext("member_of_group") == "rosidl_interface_packages"
    deps = {e.text for e in root if e.tag.endswith("depend")}
    assert {"rosidl_default_generators", "rosidl_default_runtime", "builtin_interfaces", "rclpy",
            "diagnostic_msgs", "launch_ros"} <= deps
    # message types are resolved with importlib: nothing needs rosidl_runtime_py
    assert "rosidl_runtime_py" not in deps


def test_every_interface_in_cmakelists_exists_and_every_file_is_listed():
    listed = cmake_paths("msg") + cmake_paths("srv")
    on_disk = sorted(str(p.relative_to(ROOT)) for p in
                     list((ROOT / "msg").glob("*.msg")) + list((ROOT / "srv").glob("*.srv")))
    assert listed == on_disk
    assert "rosidl_generate_interfaces(${PROJECT_NAME}" in CMAKE


def test_the_library_is_installed_without_a_second_python_package_install():
    # rosidl installs the Python package csr_ros already; a second install breaks the build.
    assert "ament_python_install_package" not in re.sub(r"#.*", "", CMAKE)
    assert "install(DIRECTORY csr_ros/" in CMAKE
    assert "DESTINATION ${PYTHON_INSTALL_DIR}/${PROJECT_NAME}" in CMAKE
    assert (ROOT / "resource" / "csr_ros").is_file()


def test_node_executables_exist_are_executable_and_call_a_node_main():
    scripts = cmake_paths("bin")
    assert {"bin/aggregator", "bin/policy", "bin/reconciler", "bin/all_in_one"} == set(scripts)
    for script in scripts:
        path = ROOT / script
        assert os.access(path, os.X_OK), f"{script} is not executable"
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env python3"), script
        [module] = re.findall(r"from (csr_ros\.nodes\.\w+) import main", text)
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), module


def test_launch_files_compile_and_define_generate_launch_description(tmp_path):
    files = sorted((ROOT / "launch").glob("*.launch.py"))
    assert {f.name for f in files} == {"robot.launch.py", "server.launch.py", "all.launch.py",
                                       "replay.launch.py"}
    for path in files:
        py_compile.compile(str(path), cfile=str(tmp_path / (path.name + "c")), doraise=True)
        tree = ast.parse(path.read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description"
                   for n in tree.body), path.name
        executables = re.findall(r'executable="(\w+)"', path.read_text())
        assert all(f"bin/{e}" in cmake_paths("bin") for e in executables), path.name
    assert "install(DIRECTORY launch config" in CMAKE


def test_the_shipped_parameters_validate():
    types = get_typestore(Stores.ROS2_JAZZY).types
    nodes = validate_file(ROOT / "config" / "csr_ros.yaml",
                          resolve_type=lambda t: object if t.startswith("vision_msgs/")
                          else types[t])
    assert set(nodes) == set(SCHEMAS)


@pytest.fixture(scope="module")
def interfaces():
    """The package's messages and services, parsed by rosbags' real .msg parser."""
    store = get_typestore(Stores.ROS2_JAZZY)
    defs = {}
    for path in sorted((ROOT / "msg").glob("*.msg")):
        defs[f"csr_ros/msg/{path.stem}"] = path.read_text()
    for path in sorted((ROOT / "srv").glob("*.srv")):
        request, response = path.read_text().split("---")
        # rosbags names service parts as messages of their own
        defs[f"csr_ros/msg/{path.stem}_Request"] = request
        defs[f"csr_ros/msg/{path.stem}_Response"] = response
    types = {}
    for name, text in defs.items():
        types.update(get_types_from_msg(text, name))
    store.register(types)
    return {name: [f for f in store.types[name].__dataclass_fields__ if not f.startswith("__")]
            for name in defs}


def test_interfaces_parse_and_keep_their_documented_fields(interfaces):
    assert interfaces["csr_ros/msg/StateChunk"] == ["stamp", "seq", "source", "text",
                                                    "coalesced", "stream"]
    assert "stream" in interfaces["csr_ros/msg/GetChunks_Response"]
    assert "stream" in interfaces["csr_ros/msg/SwapEvent"]
    assert {"version", "primary", "primary_url", "evicted_before_seq", "caught_up_to_seq",
            "static_tokens", "warmup_s", "catchup_s", "catchup_rounds"} <= \
        set(interfaces["csr_ros/msg/SwapEvent"])
    assert {"query_id", "version", "task", "text", "ttft_s", "static_tokens", "dynamic_tokens",
            "cached_tokens"} <= set(interfaces["csr_ros/msg/PolicyDecision"])
    assert interfaces["csr_ros/msg/GetChunks_Request"] == ["start_seq", "end_seq", "max_chunks"]
    assert interfaces["csr_ros/msg/Query_Response"] == ["success", "message", "decision"]


def test_nodes_only_set_fields_that_the_interfaces_have(interfaces):
    """Every keyword the node code passes to a message constructor is a field of it."""
    constructors = {"StateChunk": "csr_ros/msg/StateChunk", "SwapEvent": "csr_ros/msg/SwapEvent",
                    "SwapEventMsg": "csr_ros/msg/SwapEvent",
                    "PolicyDecision": "csr_ros/msg/PolicyDecision",
                    "Action": "csr_ros/msg/Action"}
    checked = 0
    for path in sorted((ROOT / "csr_ros" / "nodes").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in constructors:
                fields = set(interfaces[constructors[node.func.id]])
                unknown = {k.arg for k in node.keywords} - fields
                assert not unknown, f"{path.name}:{node.lineno} sets {unknown}"
                checked += 1
    assert checked >= 4


def test_every_test_file_that_uses_the_vllm_servers_runs_in_the_one_vllm_unit():
    """Under the test command's two processes, the files that ask for the session's vLLM
    servers are one unit (test/support/run_units.py): two pairs would not fit in memory."""
    from support.run_units import VLLM_FILES, run_unit

    users = set()
    for path in sorted((ROOT / "test").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    {a.arg for a in node.args.args} & {"vllm_pair", "vllm_server"}:
                users.add(path.relative_to(ROOT).as_posix())
    assert users and users <= set(VLLM_FILES), sorted(users - set(VLLM_FILES))
    assert {run_unit(f"{f}::t") for f in users} == {"vllm"}
    assert run_unit("test/test_soak.py::t") == "test/test_soak.py"
