"""The two commands a fresh machine runs exist and set up before their job, CI runs the test
command itself, the README's and docs' links lead to files and headings that exist, and
docs/ros.md's launch steps name what launch needs and run as written."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_demo_and_test_scripts_set_up_first_and_then_run_their_job():
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    tests = (ROOT / "scripts" / "test.sh").read_text()
    for text in (demo, tests):
        assert text.startswith("#!/usr/bin/env bash\n")
        assert "set -euo pipefail" in text
    assert demo.index("bash scripts/setup.sh") < demo.index(".venv/bin/csr-ros demo")
    assert tests.index("bash scripts/setup.sh") < tests.index(".venv/bin/python -m pytest")


def test_ci_runs_the_test_command_and_nothing_else():
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[-1] == "exec bash scripts/test.sh"


def test_the_scripts_the_readme_tells_a_newcomer_to_run_exist():
    scripts = set(re.findall(r"bash (scripts/[\w.-]+\.sh)", (ROOT / "README.md").read_text()))
    assert {"scripts/demo.sh", "scripts/test.sh"} <= scripts
    for script in scripts:
        assert (ROOT / script).is_file(), script


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", markdown, flags=re.S),
                              re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_relative_link_in_the_readme_and_docs_leads_to_a_file_and_heading_that_exist():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue                                    # http(s), mailto: not checked here
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked.read_text()):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# -- docs/ros.md's launch steps -----------------------------------------------------------------

def test_the_ros_docs_say_what_launch_needs_and_nothing_stale():
    ros = (ROOT / "docs" / "ros.md").read_text()
    lack = ros[ros.index("**What the wheels lack**"):]
    lack = lack[:lack.index("\n- ")]
    for name in ("launch_ros", "ros2cli", "rosbag2", "composition_interfaces"):
        assert f"`{name}`" in lack, name
    assert "need `mode: text`" not in ros           # token mode sends text to llama.cpp
    assert "Launch files on the wheels" in ros


def test_each_shell_block_of_the_launch_steps_sets_the_variables_it_uses():
    """docs/ros.md, run as written: the shell that launches is a new one, so it must set $CSR,
    $VENV and $WS itself (they were set only in the build block), and the workspace is named
    one way ($WS), not four."""
    import re

    ros = (ROOT / "docs" / "ros.md").read_text()
    section = ros[ros.index("## Launch files on the wheels"):ros.index("## What runs where")]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 4, "the build (online, then offline), the environment, the commands"
    given = {"HOME", "PATH", "PYTHONPATH", "AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH"}
    shells = [blocks[0] + blocks[1], blocks[2] + blocks[3]]   # the build's, each run's
    for block in shells:
        code = re.sub(r"<<'EOF'\n.*?\nEOF\n", "\n", block, flags=re.S)   # the CMake heredoc
        code = re.sub(r"#.*", "", code)
        defined = set(re.findall(r"^([A-Z_]+)=", code, re.M)) | given | {"repo"}
        used = set(re.findall(r"\$\{?([A-Za-z_]+)", code))
        assert used <= defined, (used - defined, block)
        assert "~/launch_ws" not in block and "$HOME/launch_ws/" not in block, block



# -- every command the README and docs/ name -----------------------------------------------------

COMMAND = re.compile(r"(?:^|[`\s(])csr-ros\s+([a-z][a-z-]*)(?:\s+([a-z][a-z0-9_\\|-]*))?", re.M)
MODULE = re.compile(r"python3? -m (csr_ros(?:\.[a-z_]+)+)(?![.<\w])")


def _documented_commands() -> list[tuple[str, ...]]:
    """Each `csr-ros COMMAND [SUBCOMMAND]` of the README and docs/: SUBCOMMAND where the word
    after the command is one of its subcommands (`model prepare`, `serve vllm|llamacpp`)."""
    import argparse
    import importlib

    from csr_ros.cli import SUBCOMMANDS

    named: set[tuple[str, ...]] = set()
    for doc in DOCS:
        for command, word in COMMAND.findall(doc.read_text()):
            if command not in SUBCOMMANDS:
                continue                  # prose ("csr-ros is ...") or a placeholder (COMMAND)
            named.add((command,))
            parser = argparse.ArgumentParser()
            importlib.import_module(f"csr_ros.tools.{SUBCOMMANDS[command][0]}") \
                .add_arguments(parser)
            choices = {c for a in parser._actions if not a.option_strings and a.choices
                       for c in a.choices}             # subparsers and positional choices
            named.update((command, w) for w in word.split("\\|") if w in choices)
    return sorted(named)


def _documented_modules() -> list[str]:
    return sorted({m for doc in DOCS for m in MODULE.findall(doc.read_text())})


def test_the_docs_name_the_commands_of_every_room():
    commands = {c[0] for c in _documented_commands()}
    assert {"demo", "bench", "soak", "eval", "fleet", "gateway", "serve", "replay"} <= commands
    assert ("model", "prepare") in _documented_commands()


@pytest.mark.parametrize("command", _documented_commands(), ids=" ".join)
def test_every_csr_ros_command_the_docs_name_answers_help_with_exit_0(command):
    done = subprocess.run([sys.executable, "-m", "csr_ros.cli", *command, "--help"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


@pytest.mark.parametrize("module", _documented_modules())
def test_every_python_module_the_docs_run_exists_and_a_benchmark_answers_help(module):
    assert importlib.util.find_spec(module) is not None, module
    if module.startswith("csr_ros.nodes."):
        return                           # a node: it starts on --ros-args, not on --help
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
