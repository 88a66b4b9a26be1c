"""Several robots on one graph, without ROS: the robot_id parameter, the namespace:= and
robot_id:= launch arguments (csr_ros/launch_args.py) and what the launch files and nodes
declare. The rclpy half, two namespaced robots on one graph, is
test/ros/test_nodes_ros_namespaces.py; the launch files under `ros2 launch` are in
test/ros/test_launch_files.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from csr_ros.errors import ConfigError
from csr_ros.launch_args import ROBOT_ARGUMENTS, SHARED_ARGUMENTS, node_namespace, \
    robot_parameters
from csr_ros.ros_params import (MAX_ROBOT_ID_CHARS, SCHEMAS, check_robot_id, robot_id_for,
                                validate)

ROOT = Path(__file__).resolve().parents[1]
ROBOT_LAUNCH_FILES = ("robot.launch.py", "all.launch.py", "server.launch.py",
                      "replay.launch.py")


def test_robot_id_defaults_to_the_namespace_without_its_leading_slash():
    assert robot_id_for("", "/robot_a") == "robot_a"
    assert robot_id_for("", "/warehouse/robot_7") == "warehouse/robot_7"
    assert robot_id_for("", "/") == ""                  # the root namespace: no robot id
    assert robot_id_for("dock-3.east", "/robot_a") == "dock-3.east"   # the parameter wins


@pytest.mark.parametrize("bad", ["robot a", "robot_a\r\nX-Injected: 1", "röbot", "-robot",
                                 "/robot_a", '"robot_a"', "robot;a",
                                 "r" * (MAX_ROBOT_ID_CHARS + 1)])
def test_a_robot_id_that_cannot_travel_in_an_http_header_is_refused_saying_what_is_allowed(bad):
    with pytest.raises(ConfigError, match=r"it travels in an HTTP header .* only letters, "
                                          r"digits, '_', '-', '\.' and '/'"):
        check_robot_id(bad)
    for node in SCHEMAS:                       # every node refuses it, naming itself
        with pytest.raises(ConfigError, match=rf"^{node}: robot_id .* cannot name a robot"):
            validate(node, {"robot_id": bad, "sources": ["s"],
                            "source.s.topic": "/s", "source.s.type": "std_msgs/msg/String"}
                     if node == "aggregator" else {"robot_id": bad})


def test_every_node_that_names_a_robot_declares_robot_id_empty_by_default():
    for node in ("aggregator", "policy", "reconciler"):
        spec = next(s for s in SCHEMAS[node] if s.name == "robot_id")
        assert spec.default == "" and "namespace" in spec.description, node
    assert validate("policy", {"robot_id": "warehouse/robot-7"})["robot_id"] == \
        "warehouse/robot-7"


@pytest.mark.parametrize("text, namespace", [
    ("", None), ("  ", None), ("/", "/"), ("robot_a", "robot_a"), ("/robot_a", "/robot_a"),
    ("/robot_a/", "/robot_a"), ("warehouse/robot_7", "warehouse/robot_7")])
def test_the_namespace_argument_keeps_relative_and_absolute_names_apart(text, namespace):
    """Relative: under a namespace an including launch file pushed; absolute: not; not given:
    None, so the pushed one (or none) applies."""
    assert node_namespace(text) == namespace


@pytest.mark.parametrize("bad", ["robot-a", "7robot", "/robot_a//x", "robot a", "~/robot",
                                 "robot.a"])
def test_a_namespace_argument_that_is_not_a_ros_namespace_stops_the_launch_saying_why(bad):
    with pytest.raises(ConfigError, match=rf"namespace:={re.escape(repr(bad))} is not a ROS "
                                          r"namespace: names of letters, digits and '_'"):
        node_namespace(bad)


def test_the_robot_id_argument_sets_the_parameter_only_when_given_and_checks_it():
    assert robot_parameters({"robot_id": ""}) == {}
    assert robot_parameters({}) == {}
    assert robot_parameters({"robot_id": "robot-7"}) == {"robot_id": "robot-7"}
    with pytest.raises(ConfigError, match=r"launch argument robot_id:='robot 7' cannot name"):
        robot_parameters({"robot_id": "robot 7"})


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", "") == name or getattr(n.func, "attr", "") == name)]


def test_every_launch_file_that_starts_a_robots_nodes_takes_namespace_and_robot_id():
    for argument in ROBOT_ARGUMENTS:                  # '' = the params file's, or none
        assert SHARED_ARGUMENTS[argument][0] == ""
    for name in ROBOT_LAUNCH_FILES:
        tree = ast.parse((ROOT / "launch" / name).read_text())
        declared = {c.args[0].value for c in _calls(tree, "DeclareLaunchArgument")} | \
            {a.value for c in _calls(tree, "declare") for a in c.args}
        assert set(ROBOT_ARGUMENTS) <= declared, name
        # every node goes through launch_actions.node, which puts it in the namespace
        assert _calls(tree, "Node") == [], name
        if name == "replay.launch.py":      # it includes robot or all, forwarding both
            text = (ROOT / "launch" / name).read_text()
            assert '"namespace": args["namespace"]' in text and \
                '"robot_id": args["robot_id"]' in text
            continue
        assert _calls(tree, "node"), name
    shared = ast.parse((ROOT / "csr_ros" / "launch_actions.py").read_text())
    (made,) = _calls(shared, "Node")
    namespace = next(k.value for k in made.keywords if k.arg == "namespace")
    assert ast.unparse(namespace) == "node_namespace(args['namespace'])"


def test_the_nodes_topics_and_services_are_relative_so_a_namespace_moves_them():
    """Every topic and service name a node takes from its parameters is relative
    (csr/chunks → /robot_a/csr/chunks); the only absolute name the nodes use is
    /diagnostics, which every robot shares, as diagnostic_aggregator expects."""
    for node in ("aggregator", "policy", "reconciler"):
        for spec in SCHEMAS[node]:
            if spec.name.startswith(("topics.", "services.")):
                assert not spec.default.startswith("/"), (node, spec.name, spec.default)
    absolute = set()
    for module in ("aggregator", "policy", "reconciler", "managed"):   # managed: their base
        source = (ROOT / "csr_ros" / "nodes" / f"{module}.py").read_text()
        absolute |= set(re.findall(r'create_(?:publisher|subscription|service|client)\(\s*'
                                   r'\w+,\s*"(/[^"]*)"', source))
    assert absolute == {"/diagnostics"}


def test_a_robots_own_section_after_the_shared_one_overrides_only_what_it_sets():
    """`/**/aggregator` for every robot, then `/robot_b/aggregator` with robot_b's odometry
    topic: read (and checked by `csr-ros check-params`) as rclpy gives it to /robot_b's node,
    the shared values with the later section's on top."""
    from csr_ros.ros_params import parse_params_yaml

    text = """
/**/aggregator:
  ros__parameters:
    sources: [odom]
    source: {odom: {topic: odom, type: nav_msgs/msg/Odometry}}
/robot_b/aggregator:
  ros__parameters:
    robot_id: warehouse.robot-b
    source: {odom: {topic: /robot_b/wheel_odom}}
"""
    params = parse_params_yaml(text)["aggregator"]
    assert params == {"sources": ["odom"], "source.odom.topic": "/robot_b/wheel_odom",
                      "source.odom.type": "nav_msgs/msg/Odometry",
                      "robot_id": "warehouse.robot-b"}
    assert validate("aggregator", params)["sources"][0].topic == "/robot_b/wheel_odom"
