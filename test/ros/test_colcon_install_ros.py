"""The package built as an integrator builds it: `colcon build` of a workspace holding this
package (scripts/build_colcon.sh, against the ROS 2 wheels and colcon in the venv), then node
entry points started from the install (`<install>/csr_ros/lib/csr_ros/<node>`, after sourcing
its setup.bash, which sets AMENT_PREFIX_PATH), outside the checkout, working on the graph. This
checks package.xml, CMakeLists.txt and the install layout, not the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rclpy.action import ActionClient
from std_msgs.msg import String

from csr_ros.action import Decide
from csr_ros.msg import StateChunk
from csr_ros.nodes.common import CHUNKS_QOS
from csr_ros.servers import free_port

from support.ros_graph import ROOT
from support.waiting import wait_for

pytestmark = [pytest.mark.ros, pytest.mark.slow]

WORKSPACE = ROOT / "build" / "colcon"
PREFIX = WORKSPACE / "install" / "csr_ros"
NODES = ("aggregator", "policy", "reconciler", "all_in_one")
SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


@pytest.fixture(scope="module")
def install() -> Path:
    """The colcon install of this checkout, built now (skipped when it is up to date)."""
    venv_bin = Path(sys.prefix) / "bin"
    if not (venv_bin / "colcon").exists():
        pytest.skip("colcon is not installed here: run `bash scripts/setup.sh --ros`")
    build = subprocess.run(["bash", str(ROOT / "scripts" / "build_colcon.sh"),
                            str(venv_bin / "python")], cwd=ROOT, capture_output=True,
                           text=True, timeout=1200)
    assert build.returncode == 0, build.stdout + build.stderr
    return WORKSPACE / "install"


class InstalledNode:
    """`source <install>/setup.bash && exec <install>/csr_ros/lib/csr_ros/<node> --ros-args ...`
    from a folder outside the checkout, with nothing of the checkout on PYTHONPATH."""

    def __init__(self, install: Path, node: str, *ros_args: str, cwd: Path):
        self.log_path = cwd / f"{node}.log"
        self._log = open(self.log_path, "w", encoding="utf-8")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "AMENT_PREFIX_PATH", "CSR_ROS_INTERFACES")}
        env.update(PATH=f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                   AMENT_PREFIX_PATH=sys.prefix,     # the wheels' prefix, underlay of the install
                   PYTHONUNBUFFERED="1")
        command = (f'source "{install}/setup.bash" && '
                   f'exec "{install}/csr_ros/lib/csr_ros/{node}" --ros-args '
                   + " ".join(f"'{a}'" for a in ros_args))
        self.proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env,
                                     stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    @property
    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def loaded_paths(self) -> str:
        """The files this process has mapped (its Python extension modules and libraries)."""
        return Path(f"/proc/{self.proc.pid}/maps").read_text()

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=15.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self._log.close()


def test_colcon_build_installs_the_nodes_the_interfaces_and_the_library(install):
    for node in NODES:
        exe = PREFIX / "lib" / "csr_ros" / node
        assert exe.is_file() and os.access(exe, os.X_OK), exe
    package = PREFIX / SITE / "csr_ros"
    for interfaces in ("msg", "srv", "action"):
        assert (package / interfaces / "__init__.py").is_file(), interfaces
    assert (package / "action" / "_decide.py").is_file()
    assert (package / "nodes" / "policy.py").is_file()         # the library, beside them
    share = PREFIX / "share" / "csr_ros"
    assert (share / "package.xml").is_file() and (share / "config" / "csr_ros.yaml").is_file()
    assert {p.name for p in (share / "launch").glob("*.launch.py")} >= {"all.launch.py"}
    # ament's index knows the package, so get_package_share_directory finds it
    assert (PREFIX / "share" / "ament_index" / "resource_index" / "packages" /
            "csr_ros").is_file()
    assert (install / "setup.bash").is_file() and (PREFIX / "share" / "csr_ros" /
                                                    "local_setup.bash").is_file()


def test_the_installed_aggregator_turns_a_message_into_a_chunk_on_the_graph(
        install, graph, tmp_path):
    config = PREFIX / "share" / "csr_ros" / "config" / "csr_ros.yaml"
    node = InstalledNode(install, "aggregator", "--params-file", str(config), cwd=tmp_path)
    try:
        probe = graph.node("csr_ros_colcon_probe")
        chunks: list = []
        probe.create_subscription(StateChunk, "csr/chunks", chunks.append, CHUNKS_QOS)
        speech = probe.create_publisher(String, "/speech/text", 10)
        wait_for(lambda: "aggregator" in probe.get_node_names(), timeout_s=120.0,
                 what=f"the installed aggregator on the graph:\n{node.output}")
        deadline = time.monotonic() + 60.0
        while not chunks and time.monotonic() < deadline:   # until it listens reliably
            speech.publish(String(data="please bring the red cup"))
            time.sleep(0.5)
        assert chunks, f"no chunk from the installed aggregator:\n{node.output}"
        assert chunks[0].source == "speech" and "please bring the red cup" in chunks[0].text
        # its interfaces and library are the install's, not this checkout's build
        maps = node.loaded_paths()
        assert f"{PREFIX}/lib/libcsr_ros__rosidl_typesupport_c.so" in maps
        assert str(ROOT / "build" / "interfaces") not in maps
    finally:
        code = node.stop()
    assert code == 0, node.output
    assert "Traceback" not in node.output, node.output


def test_the_installed_policy_answers_a_decide_goal_over_the_graph(install, graph, tmp_path):
    """No inference server listens on its URL: the goal comes back aborted with the reason,
    through the installed action type."""
    config = PREFIX / "share" / "csr_ros" / "config" / "csr_ros.yaml"
    nobody = f"http://127.0.0.1:{free_port()}"
    node = InstalledNode(install, "policy", "--params-file", str(config),
                         "-p", f"resource.r1_url:={nobody}", "-p", f"resource.r2_url:={nobody}",
                         "-p", "rate_hz:=0.1", cwd=tmp_path)
    try:
        probe = graph.node("csr_ros_colcon_probe")
        client = ActionClient(probe, Decide, "csr/decide")
        assert client.wait_for_server(timeout_sec=120.0), \
            f"no csr/decide from the installed policy:\n{node.output}"
        sent = client.send_goal_async(Decide.Goal(task="Say hello.", max_new_tokens=4))
        handle = wait_for(lambda: sent.done() and sent.result(), what="the goal's answer")
        assert handle.accepted
        result = handle.get_result_async()
        response = wait_for(lambda: result.done() and result.result(), timeout_s=60.0,
                            what="the goal's result")
        assert not response.result.success
        assert nobody in response.result.message or "connect" in response.result.message.lower()
    finally:
        code = node.stop()
    assert code == 0, node.output


def test_the_workspace_copy_holds_only_the_package_files(install):
    """The build copies the package as a clone has it: no venv, no build output inside."""
    src = WORKSPACE / "src" / "csr_ros"
    assert (src / "package.xml").is_file() and (src / "action" / "Decide.action").is_file()
    assert not (src / ".venv").exists() and not (src / "build").exists()
