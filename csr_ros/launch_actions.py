"""Launch actions the launch files share: their common arguments, and a node process that exits
while the launch runs ends the launch, naming the node and the error it reported.

    declare("params_file", "namespace", ...)   → DeclareLaunchArgument of each (SHARED_ARGUMENTS)
    node(args, "policy", parameters)           → the node in the launch's namespace, watched
    watched(node_action, "policy")             → [node_action, what ends the launch when it exits]

The decisions (what the reason says, which lines are the error) are csr_ros.launch_args's,
tested without launch; this module only wires them to launch's events. It imports `launch`,
which is not on PyPI: only the launch files import it.
"""

from __future__ import annotations

from collections import deque

from launch.actions import DeclareLaunchArgument, OpaqueFunction, RegisterEventHandler, \
    TimerAction
from launch.event_handlers import OnProcessExit, OnProcessIO
from launch.substitutions import PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from csr_ros.errors import CsrError
from csr_ros.launch_args import SHARED_ARGUMENTS, node_exit_reason, node_namespace

OUTPUT_LINES = 200         # a process's latest lines kept to find its error in
SHUTDOWN_GRACE_S = 2.0     # a node gone while launch was not shutting down, checked after this


class NodeExited(CsrError):
    """A node process ended while the launch ran: launch logs this, stops the others and
    exits 1."""


def declare(*names: str) -> list:
    """The shared launch arguments `names`, in that order."""
    actions = []
    for name in names:
        default, description = SHARED_ARGUMENTS[name]
        if default is None:        # params_file: the package's own parameters file
            default = PathJoinSubstitution([FindPackageShare("csr_ros"), "config",
                                            "csr_ros.yaml"])
        actions.append(DeclareLaunchArgument(name, default_value=default,
                                             description=description))
    return actions


def node(args, executable: str, parameters: list, *, name: str | None = None) -> list:
    """A csr_ros node process in the launch's namespace, its output on the screen, watched.
    `name` None keeps the names the code gives (all_in_one holds two nodes)."""
    action = Node(package="csr_ros", executable=executable, name=name, output="screen",
                  namespace=node_namespace(args["namespace"]), parameters=parameters)
    return watched(action, name or executable)


def watched(node_action, name: str) -> list:
    """`node_action` and the handlers that end the launch when its process exits while the
    launch is not shutting down (a node is never expected to end on its own)."""
    lines: deque[str] = deque(maxlen=OUTPUT_LINES)

    def heard(event):
        lines.extend(event.text.decode(errors="replace").splitlines())

    def exited(event, launch_context):
        if launch_context.is_shutdown:     # stopped with the rest (Ctrl-C, another's exit)
            return None
        reason = node_exit_reason(name, event.returncode, list(lines))

        def decide(context):
            if context.is_shutdown:
                return None
            raise NodeExited(reason)       # launch logs it, stops the others, exits 1
        # A terminal's Ctrl-C signals the whole process group: a node may be gone before
        # launch has begun its own shutdown. Decide once launch has had the time to.
        return [TimerAction(period=SHUTDOWN_GRACE_S, actions=[OpaqueFunction(function=decide)])]

    return [node_action,
            RegisterEventHandler(OnProcessIO(target_action=node_action, on_stdout=heard,
                                             on_stderr=heard)),
            RegisterEventHandler(OnProcessExit(target_action=node_action, on_exit=exited))]
