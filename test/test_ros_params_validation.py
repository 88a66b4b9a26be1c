"""Parameter schemas: defaults, typed values, sources, parameter files, QoS matching."""

from __future__ import annotations

from pathlib import Path

import pytest
from rosbags.typesys import Stores, get_typestore

from csr_ros.errors import ActionSpecError, ConfigError
from csr_ros.ros_params import (POLICY, SCHEMAS, check_params_files, load_params_file,
                                match_publishers, params_files_in_args, parse_params_yaml,
                                type_problem, validate, validate_file)

CONFIG = Path(__file__).resolve().parents[1] / "config" / "csr_ros.yaml"
SCAN = {"sources": ["scan"], "source.scan.topic": "/scan",
        "source.scan.type": "sensor_msgs/msg/LaserScan"}


def rosbags_resolver():
    types = get_typestore(Stores.ROS2_JAZZY).types

    def resolve(type_name: str):
        if type_name.startswith("vision_msgs/"):   # not in rosbags' store; a real robot has it
            return object
        return types[type_name]
    return resolve


def test_every_parameter_has_a_description_and_a_typed_default():
    for node, specs in SCHEMAS.items():
        names = [s.name for s in specs]
        assert len(names) == len(set(names)), node
        for spec in specs:
            assert spec.description, spec.name
            assert spec.kind in (bool, int, float, str, list), spec.name


def test_defaults_are_applied_and_valid():
    params = validate("policy", {})
    assert params["rate_hz"] == 2.0
    assert params["resource.kind"] == "openai"
    assert {s.name for s in POLICY} <= set(params)


def test_an_integer_for_a_float_parameter_is_rejected_with_the_fix():
    with pytest.raises(ConfigError, match=r"policy: rate_hz must be a float: write 2.0, not 2"):
        validate("policy", {"rate_hz": 2})


def test_rate_must_be_a_positive_frequency():
    with pytest.raises(ConfigError, match=r"policy: rate_hz must be > 0, got 0.0"):
        validate("policy", {"rate_hz": 0.0})


def test_bounded_actions_validate_and_a_bad_bound_stops_the_node_with_the_reason():
    bounded = ["wait()", "turn(degrees: int[-180,180])", "say(text: str[..80])"]
    for node in ("policy", "reconciler"):
        params = validate(node, {"actions.vocabulary": bounded})
        assert params["actions.vocabulary"] == bounded
    with pytest.raises(ActionSpecError, match=r"policy: .* the minimum 180 is above the "
                                              r"maximum -180"):
        validate("policy", {"actions.vocabulary": ["turn(degrees: int[180,-180])"]})


def test_unknown_parameter_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) 'rate_hertz' "
                                          r"\(did you mean 'rate_hz'\?\)"):
        validate("policy", {"rate_hertz": 2.0})


def test_choice_parameters_list_the_choices():
    with pytest.raises(ConfigError, match=r"mode must be one of \['token', 'text'\], got 'tokens'"):
        validate("reconciler", {"mode": "tokens"})


def test_sources_become_source_configs_with_render_options():
    params = validate("aggregator", SCAN | {"source.scan.period_s": 0.5,
                                            "source.scan.fields": "ranges, header.stamp",
                                            "float_digits": 2})
    [scan] = params["sources"]
    assert (scan.name, scan.topic, scan.type_name, scan.label, scan.period_s) == \
        ("scan", "/scan", "sensor_msgs/msg/LaserScan", "scan", 0.5)
    assert scan.render.fields == ("ranges", "header.stamp")
    assert scan.render.float_digits == 2


def test_aggregator_without_sources_says_how_to_add_them():
    with pytest.raises(ConfigError, match=r"aggregator: sources is missing"):
        validate("aggregator", {})


def test_source_without_type_is_a_missing_key():
    with pytest.raises(ConfigError, match=r"aggregator: source.scan.type is missing"):
        validate("aggregator", {"sources": ["scan"], "source.scan.topic": "/scan"})


def test_described_source_missing_from_the_list_is_reported():
    values = SCAN | {"source.odom.topic": "/odom", "source.odom.type": "nav_msgs/msg/Odometry"}
    with pytest.raises(ConfigError, match=r"source.odom.\* is described but 'odom' is not in"):
        validate("aggregator", values)


def test_misspelled_source_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown parameter 'source.scan.perod_s' "
                                          r"\(did you mean 'source.scan.period_s'\?\)"):
        validate("aggregator", SCAN | {"source.scan.perod_s": 1.0})


def test_unknown_message_type_is_reported_with_the_likely_cause():
    values = SCAN | {"source.scan.type": "sensor_msgs/msg/LazerScan"}
    with pytest.raises(ConfigError, match=r"message type 'sensor_msgs/msg/LazerScan' is not "
                                          r"available .*workspace sourced"):
        validate("aggregator", values, resolve_type=rosbags_resolver())


def test_malformed_message_type_is_reported():
    with pytest.raises(ConfigError, match=r"source.scan.type: message type 'LaserScan' is not "
                                          r"of the form"):
        validate("aggregator", SCAN | {"source.scan.type": "LaserScan"})


def test_two_sources_on_one_topic_are_rejected():
    values = SCAN | {"sources": ["scan", "scan2"], "source.scan2.topic": "/scan",
                     "source.scan2.type": "sensor_msgs/msg/LaserScan"}
    with pytest.raises(ConfigError, match=r"topic '/scan' is listed by two sources"):
        validate("aggregator", values)


def test_bad_yaml_reports_line_and_column():
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+, column \d+: expected ',' or ']'"):
        parse_params_yaml("policy:\n  ros__parameters:\n    rate_hz: [2.0\n")


def test_yaml_without_ros_parameters_is_rejected():
    with pytest.raises(ConfigError, match=r"'policy' has no `ros__parameters:` section"):
        parse_params_yaml("policy:\n  rate_hz: 2.0\n")


def test_nested_yaml_flattens_to_dotted_names_and_wildcards_resolve_to_the_node():
    nodes = parse_params_yaml("/**/policy:\n  ros__parameters:\n    resource:\n"
                              "      kind: local\n    rate_hz: 4.0\n")
    assert nodes == {"policy": {"resource.kind": "local", "rate_hz": 4.0}}


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read parameters file"):
        load_params_file(tmp_path / "nope.yaml")


def test_the_shipped_config_validates_for_all_three_nodes():
    nodes = validate_file(CONFIG, resolve_type=rosbags_resolver())
    assert set(nodes) == {"aggregator", "policy", "reconciler"}
    sources = {s.name: s for s in nodes["aggregator"]["sources"]}
    assert sources["task"].instant and not sources["scan"].instant
    assert sources["scan"].type_name == "sensor_msgs/msg/LaserScan"


def test_qos_follows_the_publishers_like_ros2_topic_echo():
    choice = match_publishers([(True, True), (True, True)])
    assert (choice.reliable, choice.transient_local, choice.matched) == (True, True, True)
    choice = match_publishers([(True, True), (False, True)])
    assert (choice.reliable, choice.transient_local) == (False, True)
    choice = match_publishers([(True, False), (True, True)])
    assert (choice.reliable, choice.transient_local) == (True, False)


def test_qos_without_publishers_is_reliable_so_a_first_message_is_not_lost():
    # a best-effort subscriber drops what arrives before it has discovered the publisher
    # (`ros2 topic pub --once`); a best-effort publisher that appears later is resubscribed to
    choice = match_publishers([])
    assert (choice.reliable, choice.transient_local, choice.matched) == (True, False, False)


# -- what a refusal says: the right name, a string for a number, a quote, a missing file --------

def test_a_source_without_publishers_is_subscribed_reliably():
    assert match_publishers([]).reliable


def test_a_typo_in_a_parameter_name_is_refused_with_the_right_name():
    with pytest.raises(ConfigError, match=r"'rate_hzz' \(did you mean 'rate_hz'\?\)"):
        validate("policy", {"rate_hzz": 2.0})
    with pytest.raises(ConfigError, match=r"'max_new_token' \(did you mean 'max_new_tokens'"):
        validate("policy", {"max_new_token": 4})


def test_a_source_entry_not_listed_in_sources_is_refused():
    values = {"sources": ["speech"], "source.speech.topic": "/s",
              "source.speech.type": "std_msgs/msg/String", "source.odom.topic": "/odom"}
    with pytest.raises(ConfigError, match=r"source.odom.\* is described but 'odom' is not"):
        validate("aggregator", values)
    values = {"sources": ["speech"], "source.speech.topic": "/s",
              "source.speech.type": "std_msgs/msg/String", "source.speech.period": 1.0}
    with pytest.raises(ConfigError, match=r"did you mean 'source.speech.period_s'"):
        validate("aggregator", values)


def test_a_string_for_a_float_parameter_says_it_is_a_string():
    rate = next(s for s in POLICY if s.name == "rate_hz")
    problem = type_problem(rate, "fast")
    assert "'fast' is a string, not a number" in problem and "write 2.0" not in problem
    assert "write 2.0, not 2" in type_problem(rate, 2)
    assert "unquoted" in type_problem(rate, "2.0")
    assert type_problem(rate, 2.0) is None


def test_a_number_for_a_string_parameter_says_to_quote_it():
    task = next(s for s in POLICY if s.name == "task")
    assert 'quote it ("5")' in type_problem(task, 5)


def test_a_missing_params_file_on_the_command_line_is_a_clear_error(tmp_path):
    args = ["policy", "--ros-args", "--params-file", str(tmp_path / "nope.yaml"), "-r", "a:=b"]
    assert params_files_in_args(args) == [str(tmp_path / "nope.yaml")]
    with pytest.raises(ConfigError, match=r"parameters file .*nope.yaml does not exist"):
        check_params_files(args)
    check_params_files(["policy", "--ros-args", "--params-file", str(CONFIG)])
