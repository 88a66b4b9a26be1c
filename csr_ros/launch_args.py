"""What the launch files decide, as plain functions (the `launch` package is not needed to test
them, and is not on PyPI).

    given_overrides   launch arguments → node parameters, only for arguments that were given,
                      so a params file's value is never replaced by a launch default
    check_params_file a missing or broken params file stops the launch with a clear message
    bag_play_command  `ros2 bag play` with the replay launch's options

Pure: no launch, no rclpy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

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
        except ValueError:
            kind_word = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
            raise ConfigError(f"launch argument {argument}:={text!r} must be {kind_word} "
                              f"(it sets the parameter {name})") from None
        except ConfigError as exc:
            raise ConfigError(f"launch argument {argument}: {exc}") from None
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


def bag_play_command(bag: str, *, rate: str = "1.0", topics: str = "", start_offset_s: str = "",
                     delay_s: str = "", loop: bool = False, clock: bool = True) -> list[str]:
    """`ros2 bag play` with the options the replay launch offers ('' = not given).

    `topics`: space- or comma-separated names. `delay_s`: wait this long before playing, so
    the nodes are up and subscribed.
    """
    cmd = ["ros2", "bag", "play", bag, "--rate", rate]
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


def _split(text: str) -> list[str]:
    return [t for t in text.replace(",", " ").split() if t]


def _number(text: str, what: str) -> str:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"launch argument {what}:={text!r} must be a number of seconds") \
            from None
    if value < 0:
        raise ConfigError(f"launch argument {what}:={text!r} must be >= 0 seconds")
    return text

