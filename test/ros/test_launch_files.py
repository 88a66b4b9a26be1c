"""The launch files under `ros2 launch`, as an integrator runs them: launch, launch_ros and
ros2launch (jazzy) over the ROS 2 wheels, csr_ros from a colcon install (docs/ros.md, "Launch
files on the wheels", gives the steps). Those packages are not on PyPI, so these tests skip
with the reason where they are missing; the launch files' logic is tested without them in
test/test_launch_arguments.py.

Each launch runs in its own session, and Ctrl-C is SIGINT to the whole process group, as a
terminal sends it; "no node left" means no process of that group is alive.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def launch_missing() -> str | None:
    for module in ("launch", "launch_ros", "ros2launch", "rclpy"):
        if importlib.util.find_spec(module) is None:
            return (f"{module} is not importable: these tests need launch, launch_ros and "
                    "ros2launch (not on PyPI) and csr_ros built with colcon, sourced as "
                    "docs/ros.md 'Launch files on the wheels' says")
    if shutil.which("ros2") is None:
        return "no `ros2` command: source the workspace of docs/ros.md 'Launch files on the wheels'"
    from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

    try:
        get_package_share_directory("csr_ros")
    except PackageNotFoundError:
        return "csr_ros is not in AMENT_PREFIX_PATH: colcon build it and source install/setup.bash"
    return None

pytestmark = [pytest.mark.launch, pytest.mark.slow,
              pytest.mark.skipif(launch_missing() is not None, reason=str(launch_missing()))]


@pytest.fixture(scope="module", autouse=True)
def installed_launch_files_are_this_checkouts():
    """The launch files ros2 launch runs are the installed copies: they must be these."""
    from ament_index_python.packages import get_package_share_directory

    share = Path(get_package_share_directory("csr_ros")) / "launch"
    for path in sorted((ROOT / "launch").glob("*.launch.py")):
        installed = share / path.name
        assert installed.is_file() and installed.read_text() == path.read_text(), (
            f"{installed} is not this checkout's {path.name}: run colcon build again")


class Launch:
    """`ros2 launch csr_ros FILE ARGS...` in its own session, output in a log file."""

    def __init__(self, launch_file: str, *arguments: str, log: Path,
                 env: dict[str, str] | None = None):
        self.log_path = log
        self._log = open(log, "w", encoding="utf-8")
        self.proc = subprocess.Popen(["ros2", "launch", "csr_ros", launch_file, *arguments],
                                     stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.group = self.proc.pid

    @property
    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_output(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.output:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"ros2 launch exited with {self.proc.returncode} before "
                                     f"printing {text!r}:\n{self.output}")
            time.sleep(0.2)
        raise AssertionError(f"no {text!r} within {timeout_s} s:\n{self.output}")

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ros2 launch still ran after {timeout_s} s:\n"
                                 f"{self.output}") from None

    def interrupt(self, timeout_s: float = 60.0) -> int:
        """Ctrl-C: SIGINT to every process of the launch."""
        os.killpg(self.group, signal.SIGINT)
        return self.wait_exit(timeout_s)

    def left_running(self, timeout_s: float = 15.0) -> bool:
        """True when a process of the launch is still alive `timeout_s` after it exited."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.group, 0)
            except ProcessLookupError:
                return False
            time.sleep(0.2)
        return True

    def close(self) -> None:
        try:
            os.killpg(self.group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._log.close()


@pytest.fixture
def launched(tmp_path):
    runs: list[Launch] = []

    def start(launch_file: str, *arguments: str, env: dict[str, str] | None = None) -> Launch:
        run = Launch(launch_file, *arguments,
                     log=tmp_path / f"{launch_file}.{len(runs)}.log", env=env)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.close()


@pytest.fixture(scope="module")
def patrol_bag(tmp_path_factory) -> Path:
    bag = tmp_path_factory.mktemp("bags") / "patrol"
    subprocess.run([shutil.which("csr-ros") or "csr-ros", "patrol", str(bag), "--duration-s",
                    "20"], check=True, capture_output=True, timeout=120)
    return bag


def local_params(tmp_path: Path) -> Path:
    """The package's params file with one engine thread and a short prompt budget."""
    nodes = yaml.safe_load((ROOT / "config" / "csr_ros.yaml").read_text())
    for name in ("policy", "reconciler"):
        section = nodes[f"/**/{name}"]["ros__parameters"]
        section["context_tokens"] = 4096
        section.setdefault("resource", {})["threads"] = 1
    nodes["/**/reconciler"]["ros__parameters"]["tau_mem_tokens"] = 3000
    nodes["/**/policy"]["ros__parameters"]["max_new_tokens"] = 8
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(nodes))))
    return path


# -- defect: a bad bag argument left the nodes it had started running ----------------------------

@pytest.mark.parametrize("argument", ["delay:=soon", "start_offset:=-3", "delay:=-1"])
def test_a_bad_bag_argument_stops_replay_launch_before_any_node_starts(launched, patrol_bag,
                                                                       argument):
    run = launched("replay.launch.py", f"bag:={patrol_bag}", argument)
    assert run.wait_exit(timeout_s=60.0) == 1, run.output
    name, value = argument.split(":=")
    assert f"{name}:={value!r}" in run.output, run.output
    assert "process started" not in run.output, run.output
    assert not run.left_running(), f"processes left running:\n{run.output}"


# -- defect: without rosbag2, the replay launch played nothing and said nothing ----------------

def test_replay_launch_plays_a_bag_with_the_csr_player_where_rosbag2_is_missing(
        launched, patrol_bag, tmp_path):
    """player:=auto on the wheels (no `ros2 bag`) plays with `csr-ros replay --play`: chunks
    reach csr/chunks; the player finishing leaves the nodes up; Ctrl-C stops everything."""
    if importlib.util.find_spec("ros2bag") is not None:
        pytest.skip("rosbag2 is installed here: player:=auto takes it")
    import rclpy
    from rclpy.node import Node

    from csr_ros.msg import StateChunk
    from csr_ros.nodes.common import CHUNKS_QOS

    rclpy.init()
    probe = Node("launch_probe")
    chunks = []
    probe.create_subscription(StateChunk, "csr/chunks", chunks.append, CHUNKS_QOS)
    try:
        run = launched("replay.launch.py", f"bag:={patrol_bag}", "rate:=2.0", "delay:=3",
                       f"params_file:={local_params(tmp_path)}")
        run.wait_output("[bag_player-3]: process has finished cleanly", timeout_s=120.0)
        deadline = time.monotonic() + 30.0
        while len(chunks) < 5 and time.monotonic() < deadline:
            rclpy.spin_once(probe, timeout_sec=0.2)
        assert len(chunks) >= 5, run.output
        assert "[bag_player-3] playing " in run.output and " at rate 2 " in run.output
        assert run.proc.poll() is None, "a player that finished must leave the nodes up"
        assert run.interrupt() == 0, run.output
        assert not run.left_running(), run.output
    finally:
        probe.destroy_node()
        rclpy.try_shutdown()


def test_ctrl_c_while_the_player_plays_is_a_clean_stop_not_the_players_error(launched,
                                                                             patrol_bag):
    run = launched("replay.launch.py", f"bag:={patrol_bag}", "player:=csr", "delay:=60")
    run.wait_output("[bag_player-3] playing ", timeout_s=120.0)
    assert run.interrupt() == 0, run.output
    assert "the bag player exited" not in run.output, run.output
    assert not run.left_running(), run.output


@pytest.mark.parametrize("localhost_only", ["", "1"])
def test_a_player_that_dies_stops_the_launch_with_its_error(launched, tmp_path, localhost_only):
    """With ROS_LOCALHOST_ONLY=1 rcl prints two deprecation warnings as each process starts;
    they were among the player's last lines, which the launch said instead of its error."""
    not_a_bag = tmp_path / "empty"
    not_a_bag.mkdir()
    run = launched("replay.launch.py", f"bag:={not_a_bag}", "player:=csr",
                   f"params_file:={local_params(tmp_path)}",
                   env={"ROS_LOCALHOST_ONLY": localhost_only} if localhost_only else None)
    assert run.wait_exit(timeout_s=120.0) == 1, run.output
    assert "the bag player exited with code 2: csr-ros replay: error: cannot read the bag" in \
        run.output, run.output
    assert not run.left_running(), run.output


def test_player_rosbag2_where_it_is_missing_is_a_clear_error(launched, patrol_bag):
    if importlib.util.find_spec("ros2bag") is not None:
        pytest.skip("rosbag2 is installed here")
    run = launched("replay.launch.py", f"bag:={patrol_bag}", "player:=rosbag2")
    assert run.wait_exit(timeout_s=60.0) == 1, run.output
    assert "`ros2 bag` is not installed here" in run.output, run.output
    assert "process started" not in run.output


# -- defect: Ctrl-C while all_in_one loads its models was escalated to SIGTERM -----------------

def test_ctrl_c_while_all_in_one_loads_its_models_stops_every_node_cleanly(launched, tmp_path):
    run = launched("all.launch.py", f"params_file:={local_params(tmp_path)}")
    run.wait_output("loading the model", timeout_s=120.0)
    assert run.interrupt() == 0, run.output
    out = run.output
    assert "started: v" not in out, "the interrupt should have come during the model load"
    assert "SIGTERM" not in out and "exit code -15" not in out, out
    assert out.count("process has finished cleanly") == 2, out
    assert "cannot schedule new futures" not in out and "Traceback" not in out, out
    assert not run.left_running(), out


# -- defect: server.launch.py and robot.launch.py on the same llama.cpp servers -----------------

@pytest.mark.server
def test_robot_and_server_launch_on_shared_llama_cpp_servers_complete_every_decision(
        launched, llama_server_pair, tmp_path):
    """The reconciler extends R1 with every chunk while the policy decides on it: no decision
    may end short ("incomplete: the budget of 48 tokens ended") because the server cut a
    stream to serve the other client."""
    import rclpy
    from rclpy.node import Node
    from std_msgs.msg import String

    from csr_ros.msg import PolicyDecision
    from csr_ros.nodes.common import DECISIONS_QOS

    r1, r2 = llama_server_pair
    urls = [f"r1_url:={r1.url}", f"r2_url:={r2.url}"]
    rclpy.init()
    probe = Node("launch_probe")
    decisions: list = []
    probe.create_subscription(PolicyDecision, "csr/decisions", decisions.append, DECISIONS_QOS)
    speech = probe.create_publisher(String, "/speech/text", 10)
    try:
        server = launched("server.launch.py", *urls)
        robot = launched("robot.launch.py", *urls)
        server.wait_output("started: v", timeout_s=180.0)
        deadline = time.monotonic() + 300.0
        said = 0
        while len(decisions) < 12 and time.monotonic() < deadline:
            speech.publish(String(data=f"operator: check room {said % 7} and report"))
            said += 1
            end = time.monotonic() + 2.0              # a chunk (an extend of R1) every 2 s
            while time.monotonic() < end:
                rclpy.spin_once(probe, timeout_sec=0.05)
        incomplete = [d.error for d in decisions if d.error.startswith("incomplete")]
        invalid = [d.error for d in decisions if not d.valid]
        print(f"\n{len(decisions)} decisions, {len(invalid)} invalid, {said} chunks sent")
        assert not incomplete, incomplete
        assert not invalid, invalid
        assert len(decisions) >= 12, robot.output
        # a stream the server cut is a failed query now, never published: none either
        assert "query failed" not in robot.output, robot.output
        assert {d.version for d in decisions} and max(d.last_seq for d in decisions) > 0
        for name, run in (("robot", robot), ("server", server)):
            started_s = time.monotonic()
            assert run.interrupt() == 0, run.output
            print(f"{name}.launch.py stopped {time.monotonic() - started_s:.1f} s after Ctrl-C")
    finally:
        probe.destroy_node()
        rclpy.try_shutdown()


# -- several robots: one namespace each -------------------------------------------------------

@pytest.mark.parametrize("launch_file, argument, said", [
    ("robot.launch.py", "namespace:=robot-a", "namespace:='robot-a' is not a ROS namespace"),
    ("server.launch.py", "robot_id:=robot a", "robot_id:='robot a' cannot name a robot"),
    ("all.launch.py", "namespace:=7robot", "namespace:='7robot' is not a ROS namespace")])
def test_a_bad_namespace_or_robot_id_stops_the_launch_before_any_node_starts(
        launched, launch_file, argument, said):
    run = launched(launch_file, argument)
    assert run.wait_exit(timeout_s=60.0) == 1, run.output
    assert said in run.output, run.output
    assert "process started" not in run.output, run.output
    assert not run.left_running(), run.output


def namespaced_params(tmp_path: Path, r1_url: str, r2_url: str) -> Path:
    """The package's params file with the speech source relative (speech/text → the robot's
    own /robot_k/speech/text), short answers and the servers of the test."""
    nodes = yaml.safe_load((ROOT / "config" / "csr_ros.yaml").read_text())
    nodes["/**/aggregator"]["ros__parameters"]["source"]["speech"]["topic"] = "speech/text"
    for name in ("policy", "reconciler"):
        section = nodes[f"/**/{name}"]["ros__parameters"]
        section["context_tokens"] = 4096
        section["resource"].update(r1_url=r1_url, r2_url=r2_url)
    nodes["/**/reconciler"]["ros__parameters"]["tau_mem_tokens"] = 3000
    nodes["/**/policy"]["ros__parameters"]["max_new_tokens"] = 16
    path = tmp_path / "namespaced.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(nodes))))
    return path


@pytest.mark.server
def test_two_robots_launched_in_two_namespaces_share_the_servers_and_keep_apart(
        launched, llama_server_pair, tmp_path):
    """server.launch.py and robot.launch.py with namespace:=robot_a and namespace:=robot_b
    (robot_b with robot_id:=), all four on the same two llama.cpp servers: every node is in
    its robot's namespace, each robot's speech reaches only its own chunks and decisions,
    and each robot's diagnostics carry its robot id."""
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.node import Node
    from std_msgs.msg import String

    from csr_ros.msg import PolicyDecision, StateChunk
    from csr_ros.nodes.common import CHUNKS_QOS, DECISIONS_QOS, DIAGNOSTICS_QOS

    r1, r2 = llama_server_pair
    params = f"params_file:={namespaced_params(tmp_path, r1.url, r2.url)}"
    ids = {"robot_a": "robot_a", "robot_b": "dock.robot-b"}
    rclpy.init()
    probe = Node("launch_probe")
    chunks = {robot: [] for robot in ids}
    decisions = {robot: [] for robot in ids}
    speech = {}
    statuses: dict[str, dict[str, str]] = {}
    for robot in ids:
        probe.create_subscription(StateChunk, f"/{robot}/csr/chunks", chunks[robot].append,
                                  CHUNKS_QOS)
        probe.create_subscription(PolicyDecision, f"/{robot}/csr/decisions",
                                  decisions[robot].append, DECISIONS_QOS)
        speech[robot] = probe.create_publisher(String, f"/{robot}/speech/text", 10)
    probe.create_subscription(
        DiagnosticArray, "/diagnostics",
        lambda msg: statuses.update({s.name: {kv.key: kv.value for kv in s.values}
                                     for s in msg.status}), DIAGNOSTICS_QOS)
    runs = []
    try:
        for robot in ids:
            extra = [] if ids[robot] == robot else [f"robot_id:={ids[robot]}"]
            runs.append(launched("server.launch.py", params, f"namespace:={robot}", *extra))
            runs.append(launched("robot.launch.py", params, f"namespace:={robot}", *extra))
        for run in runs[::2]:
            run.wait_output("started: v", timeout_s=180.0)
        deadline = time.monotonic() + 300.0
        said = 0
        while time.monotonic() < deadline and not all(
                [d for d in decisions[robot] if d.last_seq >= 2] for robot in ids):
            for robot in ids:
                speech[robot].publish(String(data=f"{robot} operator: check room {said}"))
            said += 1
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                rclpy.spin_once(probe, timeout_sec=0.05)
        names = set(probe.get_node_names_and_namespaces())
        for robot in ids:
            assert {("aggregator", f"/{robot}"), ("policy", f"/{robot}"),
                    ("reconciler", f"/{robot}")} <= names, names
            other = next(r for r in ids if r != robot)
            texts = " | ".join(c.text for c in chunks[robot])
            assert f"{robot} operator" in texts and f"{other} operator" not in texts, texts
            assert [d for d in decisions[robot] if d.last_seq >= 2]
            assert max(d.last_seq for d in decisions[robot]) <= max(c.seq for c in chunks[robot])
            for node in ("aggregator", "policy", "reconciler"):
                assert statuses.get(f"csr_ros: {robot}/{node}", {}).get("robot_id") == \
                    ids[robot], (robot, node, statuses)
        for run in runs:
            assert run.interrupt() == 0, run.output
    finally:
        probe.destroy_node()
        rclpy.try_shutdown()


def test_replay_launch_with_a_namespace_feeds_that_robots_nodes_from_the_bag(
        launched, patrol_bag, tmp_path):
    """namespace:=robot_a reaches the included robot launch: the bag's (absolute) topics
    become chunks on /robot_a/csr/chunks, and nothing is published on /csr/chunks."""
    import rclpy
    from rclpy.node import Node

    from csr_ros.msg import StateChunk
    from csr_ros.nodes.common import CHUNKS_QOS

    rclpy.init()
    probe = Node("launch_probe")
    chunks = {"/robot_a/csr/chunks": [], "/csr/chunks": []}
    for topic, got in chunks.items():
        probe.create_subscription(StateChunk, topic, got.append, CHUNKS_QOS)
    try:
        run = launched("replay.launch.py", f"bag:={patrol_bag}", "player:=csr", "rate:=2.0",
                       "delay:=3", "namespace:=robot_a", f"params_file:={local_params(tmp_path)}")
        run.wait_output("[bag_player-3]: process has finished cleanly", timeout_s=120.0)
        deadline = time.monotonic() + 30.0
        while len(chunks["/robot_a/csr/chunks"]) < 5 and time.monotonic() < deadline:
            rclpy.spin_once(probe, timeout_sec=0.2)
        assert len(chunks["/robot_a/csr/chunks"]) >= 5, run.output
        assert not chunks["/csr/chunks"]
        names = set(probe.get_node_names_and_namespaces())
        assert {("aggregator", "/robot_a"), ("policy", "/robot_a")} <= names, names
        assert run.interrupt() == 0, run.output
        assert not run.left_running(), run.output
    finally:
        probe.destroy_node()
        rclpy.try_shutdown()


def test_all_launch_with_a_namespace_puts_both_processes_nodes_under_it(launched, tmp_path):
    """all_in_one's two nodes (reconciler and policy, named in the code) and the aggregator
    land in /robot_a; Ctrl-C during the model load still stops everything cleanly."""
    import rclpy
    from rclpy.node import Node

    rclpy.init()
    probe = Node("launch_probe")
    try:
        run = launched("all.launch.py", "namespace:=robot_a",
                       f"params_file:={local_params(tmp_path)}")
        run.wait_output("loading the model", timeout_s=120.0)
        wanted = {("aggregator", "/robot_a"), ("reconciler", "/robot_a"), ("policy", "/robot_a")}
        deadline = time.monotonic() + 30.0
        while not wanted <= set(probe.get_node_names_and_namespaces()) and \
                time.monotonic() < deadline:
            rclpy.spin_once(probe, timeout_sec=0.2)
        names = set(probe.get_node_names_and_namespaces())
        assert wanted <= names, names
        assert not {("aggregator", "/"), ("reconciler", "/"), ("policy", "/")} & names, names
        assert run.interrupt() == 0, run.output
        assert not run.left_running(), run.output
    finally:
        probe.destroy_node()
        rclpy.try_shutdown()


# -- managed nodes: autostart, and a node that dies ------------------------------------------

def _pid_of(run: Launch, process: str) -> int:
    """The pid launch printed for `process` (e.g. 'policy-2')."""
    import re

    match = re.search(rf"\[{re.escape(process)}\]: process started with pid \[(\d+)\]",
                      run.output)
    assert match, run.output
    return int(match.group(1))


@pytest.mark.server
def test_autostart_false_leaves_every_node_unconfigured_for_a_lifecycle_manager(
        launched, llama_server_pair, tmp_path):
    """server.launch.py and robot.launch.py with autostart:=false: the three nodes wait,
    unconfigured, deciding nothing; a lifecycle manager's transitions (the lifecycle_msgs
    services) bring them up, and decisions come."""
    from support.ros_graph import Graph, Lifecycle
    from support.waiting import wait_for

    from csr_ros.msg import PolicyDecision
    from csr_ros.nodes.common import DECISIONS_QOS

    r1, r2 = llama_server_pair
    urls = [f"r1_url:={r1.url}", f"r2_url:={r2.url}", "autostart:=false"]
    graph = Graph()
    try:
        probe = graph.node("launch_probe")
        decisions = []
        probe.create_subscription(PolicyDecision, "csr/decisions", decisions.append,
                                  DECISIONS_QOS)
        server = launched("server.launch.py", *urls)
        robot = launched("robot.launch.py", *urls)
        managers = {name: Lifecycle(probe, f"/{name}")
                    for name in ("reconciler", "aggregator", "policy")}
        assert {name: m.state() for name, m in managers.items()} == dict.fromkeys(
            managers, "unconfigured")
        time.sleep(3.0)
        assert not decisions
        assert "waiting for a lifecycle manager (autostart is false)" in robot.output
        for name in ("reconciler", "aggregator", "policy"):       # as a manager brings a stack up
            assert managers[name].change("configure"), name
            assert managers[name].change("activate"), name
            assert managers[name].state() == "active"
        wait_for(lambda: decisions, 300.0, "a decision")
        for run in (robot, server):
            assert run.interrupt() == 0, run.output
            assert "the node process" not in run.output, run.output
    finally:
        graph.close()


@pytest.mark.server
def test_a_node_killed_under_launch_ends_the_launch_naming_it_and_how_it_ended(
        launched, llama_server_pair, tmp_path):
    """A node that dies is never left dead in a launch that goes on: the launch ends (rc 1),
    naming the node, how it ended and the error it reported; the other nodes stop."""
    r1, r2 = llama_server_pair
    run = launched("robot.launch.py", f"r1_url:={r1.url}", f"r2_url:={r2.url}")
    run.wait_output("[policy]: deciding at", timeout_s=180.0)
    os.kill(_pid_of(run, "policy-2"), signal.SIGKILL)
    assert run.wait_exit(timeout_s=60.0) == 1, run.output
    assert "the node process policy was killed by signal 9 (SIGKILL) while the launch ran" in \
        run.output, run.output
    assert "[aggregator-1]: process has finished cleanly" in run.output, run.output
    assert not run.left_running(), run.output


def test_a_node_that_cannot_start_ends_the_launch_with_its_error(launched, tmp_path):
    """A policy whose params file asks for a safe action that is not in its vocabulary: its
    configure fails, autostart gives up (exit 2) and the launch says why."""
    nodes = yaml.safe_load((ROOT / "config" / "csr_ros.yaml").read_text())
    nodes["/**/policy"]["ros__parameters"]["safe_action"] = "hover()"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(json.loads(json.dumps(nodes))))
    run = launched("robot.launch.py", f"params_file:={params}")
    assert run.wait_exit(timeout_s=180.0) == 1, run.output
    assert "the node process policy exited with code 2 while the launch ran" in run.output
    assert "[policy] error: policy: safe_action 'hover()' is not an action of the vocabulary" \
        in run.output, run.output
    assert not run.left_running(), run.output


def test_ctrl_c_ends_a_launch_of_managed_nodes_cleanly_not_as_a_node_that_died(launched,
                                                                             tmp_path):
    run = launched("robot.launch.py", "autostart:=false")
    run.wait_output("[policy]: unconfigured: waiting for a lifecycle manager", timeout_s=120.0)
    assert run.interrupt() == 0, run.output
    assert "the node process" not in run.output, run.output
    assert not run.left_running(), run.output
