"""What the launch files decide, as plain functions (the `launch` package is not needed to test
them, and is not on PyPI).

    given_overrides   launch arguments → node parameters, only for arguments that were given,
                      so a params file's value is never replaced by a launch default
    check_params_file a missing or broken params file stops the launch with a clear message
    node_namespace    `namespace:=` → the nodes' namespace (one robot of several on a graph)
    robot_parameters  `robot_id:=` → the robot_id parameter, checked, only when given
    lifecycle_parameters `autostart:=` → the nodes' autostart parameter (true: active at once;
                      false: unconfigured, for the robot's lifecycle manager)
    aggregator_parameters `detections_type:=` → the type of the aggregator's detections source
                      (std_msgs/msg/String where vision_msgs is missing, as on the wheels)
    node_exit_reason  why the launch ends when one of its nodes exits: the node, how it ended,
                      and the error it reported (`error_lines`)
    check_bag         the replay launch's bag arguments, checked before any process starts
    choose_player     `player:=auto|rosbag2|csr`: which bag player the replay launch runs
    bag_play_command  `ros2 bag play` with the replay launch's options
    csr_play_command  `csr-ros replay BAG --play` with the same options (no rosbag2 needed)
    player_exit_reason why the launch stops when its bag player exits with an error

Pure: no launch, no rclpy (rosbag2_available only looks for the `ros2 bag` command). The launch
actions built from these decisions are in csr_ros.launch_actions.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import signal
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from csr_ros.errors import ConfigError

_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def _as_bool(text: str) -> bool:
    try:
        return _BOOL_WORDS[text.strip().lower()]
    except KeyError:
        raise ConfigError(f"{text!r} is not a boolean; write true or false") from None


_CONVERT: dict[type, Callable[[str], Any]] = {str: str, int: int, float: float, bool: _as_bool}


def given_overrides(arguments: Mapping[str, str],
                    parameters: Mapping[str, tuple[str, type]]) -> dict[str, Any]:
    """{parameter: typed value} for each launch argument in `parameters` that was given.

    `arguments`: launch argument → its text ('' when not given: every such argument is declared
    with an empty default). `parameters`: launch argument → (parameter name, its type).
    """
    out: dict[str, Any] = {}
    for argument, (name, kind) in parameters.items():
        text = arguments.get(argument, "")
        if text == "":
            continue
        try:
            out[name] = _CONVERT[kind](text)
        except ConfigError as exc:          # before ValueError: a ConfigError is one too
            raise ConfigError(f"launch argument {argument}:={text!r}: {exc} "
                              f"(it sets the parameter {name})") from None
        except ValueError:
            kind_word = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
            raise ConfigError(f"launch argument {argument}:={text!r} must be {kind_word} "
                              f"(it sets the parameter {name})") from None
    return out


def check_params_file(path: str) -> str:
    """`path` if it is a readable parameters file; else a ConfigError that says what to pass."""
    from csr_ros.ros_params import load_params_file

    if not path:
        raise ConfigError("params_file is empty; pass params_file:=/path/to/csr_ros.yaml")
    if not Path(path).is_file():
        raise ConfigError(f"params_file {path} does not exist; pass an existing file with "
                          "params_file:=FILE (the package's own is config/csr_ros.yaml)")
    load_params_file(path)
    return path


#: The launch arguments that make one robot of several, the same in every launch file that
#: starts a robot's nodes (declared with an empty default: not given).
ROBOT_ARGUMENTS = {
    "namespace": "ROS namespace of this robot's nodes, e.g. robot_a: their topics and services "
                 "move under it ('' = none, or the one an including launch file pushed)",
    "robot_id": "the robot's id: the routing key of its requests to servers behind a router, "
                "and in its diagnostics ('' = the params file's, else the namespace)",
}

_NAMESPACE_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def node_namespace(text: str) -> str | None:
    """The `namespace=` of the launch's nodes for `namespace:=TEXT`; None when not given, so a
    namespace pushed by a launch file that includes this one (PushRosNamespace) applies;
    '/' is the root namespace whatever was pushed.

    A relative name ('robot_a') goes under such a pushed namespace, an absolute one
    ('/robot_a') does not; launch_ros makes either absolute. The nodes' relative topics and
    services (`csr/chunks`, `csr/get_chunks`, ...) then live under it (/robot_a/csr/chunks).
    """
    name = text.strip()
    if name in ("", "/"):
        return name or None             # '/': the root namespace, whatever was pushed
    body = name[1:] if name.startswith("/") else name
    body = body[:-1] if body.endswith("/") else body
    if not all(_NAMESPACE_TOKEN.fullmatch(token) for token in body.split("/")):
        raise ConfigError(f"launch argument namespace:={text!r} is not a ROS namespace: names "
                          "of letters, digits and '_', none starting with a digit, separated "
                          "by single '/' (e.g. robot_a, /robot_a or /warehouse/robot_7)")
    return ("/" if name.startswith("/") else "") + body


#: The launch argument that decides how the nodes come up, in every launch file of nodes.
LIFECYCLE_ARGUMENTS = {
    "autostart": "true: each node configures and activates itself as it starts; false: the "
                 "nodes wait, unconfigured, for a lifecycle manager (ros2 lifecycle set, "
                 "nav2's lifecycle_manager)",
}


#: The launch argument that types the aggregator's `detections` source, in every launch file
#: that starts an aggregator: the PyPI wheels have no vision_msgs (the params file's type).
DETECTIONS_ARGUMENT = {
    "detections_type": "message type of /detections ('' = the params file's, vision_msgs/msg/"
                       "Detection2DArray); std_msgs/msg/String where vision_msgs is not "
                       "installed, as on the PyPI wheels (csr_ros.nodes.episode_publisher's)",
}


#: The launch arguments several launch files declare: name → (default, description). None as
#: params_file's default stands for the package's config/csr_ros.yaml (a launch substitution).
SHARED_ARGUMENTS: dict[str, tuple[str | None, str]] = {
    "params_file": (None, "ROS 2 parameters file of the csr_ros nodes"),
    "r1_url": ("", "URL of inference server R1 ('' = the params file's)"),
    "r2_url": ("", "URL of inference server R2 ('' = the params file's)"),
    "model": ("", "'smollm2' (the embedded default) or a model directory; on the robot side "
                  "only its tokenizer is read ('' = the params file's)"),
    "threads": ("", "CPU threads per local engine ('' = the params file's; 0 = default)"),
    "use_sim_time": ("", "true: follow /clock (a bag played with --clock)"),
    **{name: ("", text) for name, text in ROBOT_ARGUMENTS.items()},
    **{name: ("true", text) for name, text in LIFECYCLE_ARGUMENTS.items()},
    **{name: ("", text) for name, text in DETECTIONS_ARGUMENT.items()},
}


def node_parameters(arguments: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """What every node of a launch gets: the checked params file, and the robot's and the
    lifecycle's parameters from their launch arguments."""
    return (check_params_file(arguments["params_file"]),
            robot_parameters(arguments) | lifecycle_parameters(arguments))


def lifecycle_parameters(arguments: Mapping[str, str]) -> dict[str, Any]:
    """{'autostart': bool} for `autostart:=` (true when not given)."""
    text = arguments.get("autostart", "") or "true"
    try:
        return {"autostart": _as_bool(text)}
    except ConfigError:
        raise ConfigError(f"launch argument autostart:={text!r} is not a boolean; write true "
                          "or false") from None


def aggregator_parameters(arguments: Mapping[str, str]) -> dict[str, Any]:
    """{'source.detections.type': 'pkg/msg/Name'} for `detections_type:=` when given, else {}
    (the params file's type holds)."""
    from csr_ros.render.plain import normalize_type_name

    text = arguments.get("detections_type", "").strip()
    if not text:
        return {}
    try:
        return {"source.detections.type": normalize_type_name(text)}
    except ConfigError as exc:
        raise ConfigError(f"launch argument detections_type:={text!r}: {exc}") from None


def robot_parameters(arguments: Mapping[str, str]) -> dict[str, Any]:
    """{'robot_id': ...} for `robot_id:=` when given and valid, else {} (the params file's
    value, or the node's default: its namespace without the leading slash)."""
    from csr_ros.ros_params import check_robot_id

    given = given_overrides(arguments, {"robot_id": ("robot_id", str)})
    if given:
        check_robot_id(given["robot_id"],
                       where=f"launch argument robot_id:={given['robot_id']!r}")
    return given


def bag_play_command(bag: str, *, rate: str = "1.0", topics: str = "", start_offset_s: str = "",
                     delay_s: str = "", loop: bool = False, clock: bool = True) -> list[str]:
    """`ros2 bag play` with the options the replay launch offers ('' = not given).

    `topics`: space- or comma-separated names. `delay_s`: wait this long before playing, so
    the nodes are up and subscribed; 0 is no wait (rosbag2 refuses `--delay 0`: it takes only
    values above 0).
    """
    if delay_s and float(_number(delay_s, "delay")) <= 0:
        delay_s = ""
    return _play_command(["ros2", "bag", "play", bag], rate=rate, topics=topics,
                         start_offset_s=start_offset_s, delay_s=delay_s, loop=loop, clock=clock)


def csr_play_command(bag: str, *, rate: str = "1.0", topics: str = "", start_offset_s: str = "",
                     delay_s: str = "", loop: bool = False, clock: bool = True) -> list[str]:
    """`csr-ros replay BAG --play` (rclpy, no rosbag2) with the same options as
    bag_play_command."""
    return _play_command(["csr-ros", "replay", bag, "--play"], rate=rate, topics=topics,
                         start_offset_s=start_offset_s, delay_s=delay_s, loop=loop, clock=clock)


def _play_command(player: list[str], *, rate: str, topics: str, start_offset_s: str,
                  delay_s: str, loop: bool, clock: bool) -> list[str]:
    cmd = [*player, "--rate", _rate(rate)]
    if clock:
        cmd.append("--clock")
    names = _split(topics)
    if names:
        cmd += ["--topics", *names]
    if start_offset_s:
        cmd += ["--start-offset", _number(start_offset_s, "start_offset")]
    if delay_s:
        cmd += ["--delay", _number(delay_s, "delay")]
    if loop:
        cmd.append("--loop")
    return cmd


PLAYERS = ("auto", "rosbag2", "csr")


def rosbag2_available() -> bool:
    """True when `ros2 bag` exists here: the ros2 command and its bag verb (package ros2bag).
    The PyPI wheels have neither; a ROS 2 install with launch but without rosbag2 has only the
    first, and `ros2 bag` then fails with "invalid choice: 'bag'"."""
    return shutil.which("ros2") is not None and importlib.util.find_spec("ros2bag") is not None


def choose_player(requested: str, *, rosbag2: bool) -> str:
    """'rosbag2' or 'csr' for `player:=`: auto takes rosbag2 where `ros2 bag` exists, else the
    rclpy player of `csr-ros replay --play`. Asking for rosbag2 where it is missing is an error
    before anything starts, not a launch whose nodes wait for a bag that never plays."""
    if requested not in PLAYERS:
        raise ConfigError(f"launch argument player:={requested!r} must be one of "
                          f"{', '.join(PLAYERS)}")
    if requested == "auto":
        return "rosbag2" if rosbag2 else "csr"
    if requested == "rosbag2" and not rosbag2:
        raise ConfigError("player:=rosbag2, but `ros2 bag` is not installed here (no rosbag2, "
                          "as with the PyPI wheels); use player:=csr (`csr-ros replay --play`) "
                          "or install ros-$ROS_DISTRO-rosbag2")
    return requested


def check_bag(arguments: Mapping[str, str], *, rosbag2: bool) -> list[str]:
    """Every bag argument of the replay launch checked, and the player's command line; a
    ConfigError names the first bad one. Called before any node starts, so a bad argument
    leaves no node running. `rosbag2`: whether `ros2 bag` exists here (rosbag2_available)."""
    bag = arguments.get("bag", "")
    if not bag:
        raise ConfigError("bag is empty; pass bag:=/path/to/rosbag2_directory")
    if not Path(bag).exists():
        raise ConfigError(f"bag:={bag} does not exist")
    player = choose_player(arguments.get("player", "auto") or "auto", rosbag2=rosbag2)
    if player == "csr" and shutil.which("csr-ros") is None:
        raise ConfigError("player:=csr needs the csr-ros command, which is not on PATH: put the "
                          "bin folder of the environment that has csr_ros on PATH")
    build = bag_play_command if player == "rosbag2" else csr_play_command
    return build(bag, rate=arguments.get("rate", "1.0") or "1.0",
                 topics=arguments.get("topics", ""),
                 start_offset_s=arguments.get("start_offset", ""),
                 delay_s=arguments.get("delay", ""),
                 loop=_as_bool(arguments.get("loop", "false") or "false"))


# How csr_ros programs and Python report their own errors, as opposed to what else they
# print: argparse's `prog: error: ...` (csr-ros), the nodes' `[name] error: ...` (common.run),
# a ROS log line at ERROR or FATAL, and the last line of a Python traceback.
_ERROR_LINE = re.compile(
    r"^(\S+: error: |\[[^\]]+\] error: |\[(ERROR|FATAL)\] \[[0-9.]+\] \[[^\]]*\]: "
    r"|[A-Za-z_][\w.]*(Error|Exception|Interrupt)(: |$))")
# A ROS log line below ERROR: rcl's deprecation warnings, a node's infos.
_ROS_LOG_LINE = re.compile(r"^\[(DEBUG|INFO|WARN)\] \[[0-9.]+\] \[[^\]]*\]: ")
MAX_REASON_LINES = 3


def error_lines(output_lines: Sequence[str]) -> list[str]:
    """The lines in which a process reported its own error (the latest MAX_REASON_LINES);
    without any, its last lines that are not ROS log lines below ERROR (rcl's deprecation
    warnings at start-up are not why a process ended)."""
    lines = [line.strip() for line in output_lines if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    if errors:
        return errors[-MAX_REASON_LINES:]
    return [line for line in lines if not _ROS_LOG_LINE.match(line)][-MAX_REASON_LINES:]


def _how_it_ended(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


def _what_it_said(output_lines: Sequence[str]) -> str:
    errors = error_lines(output_lines)
    if errors:
        return ": " + " | ".join(errors)
    if any(line.strip() for line in output_lines):
        return " (it reported no error)"
    return " (it printed nothing)"


def player_exit_reason(returncode: int | None, output_lines: Sequence[str]) -> str | None:
    """Why the replay launch stops when its bag player exits (None: it finished, exit 0; the
    nodes stay up). The reason is the error the player reported (`error_lines`)."""
    if returncode == 0:
        return None
    return f"the bag player exited with code {returncode}{_what_it_said(output_lines)}"


def node_exit_reason(name: str, returncode: int | None, output_lines: Sequence[str]) -> str:
    """Why the launch ends when node process `name` exits while the launch runs (a node is
    never expected to end on its own, exit code 0 included): the node, how it ended and the
    error it reported."""
    return (f"the node process {name} {_how_it_ended(returncode)} while the launch ran; the "
            "launch ends with it (nothing restarts a node: docs/ros.md, 'When a node dies')"
            + _what_it_said(output_lines))


def _split(text: str) -> list[str]:
    return [t for t in text.replace(",", " ").split() if t]


def _rate(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"launch argument rate:={text!r} must be a number") from None
    if not value > 0:
        raise ConfigError(f"launch argument rate:={text!r} must be > 0")
    return text


def _number(text: str, what: str) -> str:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"launch argument {what}:={text!r} must be a number of seconds") \
            from None
    if value < 0:
        raise ConfigError(f"launch argument {what}:={text!r} must be >= 0 seconds")
    return text

