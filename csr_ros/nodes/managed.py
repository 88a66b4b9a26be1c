"""What makes a csr_ros node trustworthy on a robot: callbacks that never end the process
(`GuardedCallbacks`), and the managed (lifecycle) node (`ManagedNode`) whose transitions call
the node's hooks:

    unconfigured ──configure──▶ inactive ──activate──▶ active
         ▲   ◀──cleanup──────────┘  ◀──deactivate───────┘
         └── on_error (a hook raised something other than a CsrError): release()

    configure()   parameters read and checked, clients, chunk log, publishers, services
    activate()    subscriptions delivering, timers deciding (publishers are enabled first)
    deactivate()  stop working (publishers are disabled after it: the policy publishes its
                  safe action in it)
    release()     everything configure made, closed (cleanup, shutdown, on_error, exit)

Parameters are declared from the node's schema (`declare_schema`), checked by configure
(`checked_params`), and a set while the node runs goes through `ros_params.check_change`
(`parameters_changed` applies what it takes). Failed transitions, `autostart`, guarded
callbacks, parameter sets and /diagnostics in every state: docs/ros.md, "Managed nodes
(lifecycle)", "Parameters" and "Diagnostics".
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from rcl_interfaces.msg import SetParametersResult

from csr_ros import ros_params
from csr_ros.errors import ConfigError, CsrError
from csr_ros.node_logic.callback_faults import CallbackFaults
from csr_ros.node_logic.health import ERROR, OK, WARN
from csr_ros.node_logic.transitions import TransitionRecord
from csr_ros.nodes.common import (DIAGNOSTICS_QOS, declare, read_params, status_name,
                                  with_undeclared)
from csr_ros.ros_params import ParamSpec

LEVELS = {OK: DiagnosticStatus.OK, WARN: DiagnosticStatus.WARN, ERROR: DiagnosticStatus.ERROR}
SUCCESS = TransitionCallbackReturn.SUCCESS
FAILURE = TransitionCallbackReturn.FAILURE


class GuardedCallbacks:
    """Mixin for an rclpy Node: the callbacks of the timers, subscriptions and services it
    creates after `start_guard()` cannot end the process (rclpy's executor re-raises a
    callback's exception out of spin). Goes before the Node class in the bases."""

    faults: CallbackFaults | None = None
    callbacks_stopped = False

    def start_guard(self) -> None:
        self.faults = CallbackFaults()

    def stop_callbacks(self) -> None:
        """The process is stopping: from now on the guarded callbacks return at once (what a
        callback returns on error, `on_error`, for those that must answer), so handlers the
        executor still has queued run out quickly (common.drain_callbacks)."""
        self.callbacks_stopped = True

    def guarded(self, callback: Callable, *, on_error: Callable[..., Any] | None = None,
                where: str | None = None) -> Callable:
        """`callback` that catches what it raises: logged, counted and reported; it returns
        `on_error(exc, *args)` then (None without one)."""
        if callback is None or self.faults is None or getattr(callback, "_csr_guarded", False):
            return callback
        name = where or _callback_name(callback)

        def guarded_callback(*args):
            if self.callbacks_stopped:
                return None if on_error is None else on_error(_STOPPING, *args)
            try:
                return callback(*args)
            except Exception as exc:  # noqa: BLE001 - the node goes on; said and counted
                self.callback_failed(name, exc)
                return None if on_error is None else on_error(exc, *args)
        guarded_callback._csr_guarded = True
        guarded_callback.__name__ = name
        return guarded_callback

    def callback_failed(self, where: str, exc: BaseException) -> None:
        if not self.context.ok():
            return           # shutting down: entities go away under running callbacks
        error = f"{type(exc).__name__}: {exc}"
        said = self.faults.record(where, error, time.monotonic())
        if said == "traceback":
            self.get_logger().error(f"{where} raised (the node goes on; the next ones are "
                                    f"counted on /diagnostics):\n{traceback.format_exc()}")
        elif said == "line":
            self.get_logger().error(self.faults.line(where, error))

    # rclpy's own entities made in Node.__init__ (parameter services) come before
    # start_guard() and are left as they are
    def create_timer(self, timer_period_sec, callback, *args, **kwargs):
        return super().create_timer(timer_period_sec, self.guarded(callback), *args, **kwargs)

    def create_subscription(self, msg_type, topic, callback, *args, **kwargs):
        return super().create_subscription(msg_type, topic, self.guarded(callback), *args,
                                           **kwargs)

    def create_service(self, srv_type, srv_name, callback, *args, **kwargs):
        return super().create_service(srv_type, srv_name,
                                      self.guarded(callback, on_error=_failed_response), *args,
                                      **kwargs)


_STOPPING = CsrError("the node is shutting down")


def _callback_name(callback) -> str:
    func = getattr(callback, "func", callback)          # functools.partial
    return getattr(func, "__name__", type(func).__name__)


def _failed_response(exc: BaseException, request, response):
    """A service whose callback raised still answers: not successful, with the exception."""
    if hasattr(response, "success"):
        response.success = False
    if hasattr(response, "message"):
        response.message = f"the service failed: {type(exc).__name__}: {exc}"
    return response


class ManagedNode(GuardedCallbacks, LifecycleNode):
    """Base of the aggregator, policy and reconciler nodes (see the module docstring).
    Subclasses declare their parameters in __init__, implement the four hooks and
    `work_status`, and call `bring_up()` last."""

    def __init__(self, node_name: str, **kwargs):
        super().__init__(node_name, **kwargs)
        self.start_guard()
        self.record = TransitionRecord()
        self.transition_error: CsrError | None = None   # why the last transition failed
        self.exit_error: CsrError | None = None   # autostart gave up at run time: exit 2
        self.robot_id = ""
        self.schema_node = ""                      # 'aggregator', 'policy' or 'reconciler'
        self.specs: list[ParamSpec] = []
        self.param_problems: dict[str, str] = {}  # given values that could not be declared
        self.params: dict[str, Any] = {}           # what configure read (and later sets)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics",
                                                     DIAGNOSTICS_QOS)
        # on the steady clock: with use_sim_time, /clock may stop or go back
        self.diagnostics_timer = self.create_timer(
            1.0, self.diagnostics_callback, callback_group=MutuallyExclusiveCallbackGroup(),
            clock=Clock(clock_type=ClockType.STEADY_TIME))

    # -- the hooks ----------------------------------------------------------------------------

    def configure(self) -> None:
        raise NotImplementedError

    def activate(self) -> None:
        raise NotImplementedError

    def deactivate(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def work_status(self, now_s: float) -> tuple[int, str, list[tuple[str, str]]]:
        """(level, message, key/values) of the node's work, while it is configured."""
        raise NotImplementedError

    def check_changes(self, changes: dict[str, Any]) -> None:
        """Raise a CsrError to refuse run-time changes the schema alone allows (a hook)."""

    def parameters_changed(self, changes: dict[str, Any]) -> None:
        """Run-time parameters that were set, already in `self.params` (a hook)."""

    # -- parameters ---------------------------------------------------------------------------

    def declare_schema(self, node: str, specs: list[ParamSpec]) -> None:
        """Declare the parameters of `specs` (also later, e.g. the aggregator's sources)."""
        self.schema_node = node
        self.specs += [s for s in specs if s.name not in {k.name for k in self.specs}]
        self.param_problems.update(declare(self, specs))
        if len(self.specs) == len(specs):     # the first call: from now on sets are checked
            # rclpy's parameter services call these: what they raised would end the spin
            self.add_on_set_parameters_callback(self.guarded(
                self._check_set_parameters, on_error=lambda exc, parameters: SetParametersResult(
                    successful=False, reason=f"{type(exc).__name__}: {exc}")))
            self.add_post_set_parameters_callback(self.guarded(self._parameters_set))

    def checked_params(self, **validate) -> dict[str, Any]:
        """For configure: the current values, checked (`ros_params.validate`); ConfigError
        names the first problem."""
        if self.param_problems:
            raise ConfigError(next(iter(self.param_problems.values())))
        values = with_undeclared(self, read_params(self, self.specs), self.specs)
        return ros_params.validate(self.schema_node, values, **validate)

    def _check_set_parameters(self, parameters) -> SetParametersResult:
        changes = {}
        for parameter in parameters:
            name = parameter.name
            if name == "use_sim_time" or name.startswith("qos_overrides.") or \
                    not self.has_parameter(name):
                continue                   # rclpy's own, or a declaration (not a change)
            value = list(parameter.value) if isinstance(parameter.value, (list, tuple)) or \
                type(parameter.value).__name__ == "array" else parameter.value
            changes[name] = value
        try:
            for name, value in changes.items():
                ros_params.check_change(self.schema_node, name, value,
                                        configured=self.configured,
                                        current={**self.params, **changes})
            if self.configured and changes:
                self.check_changes(changes)
        except CsrError as exc:
            self.get_logger().warning(f"parameter change refused: {exc}")
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _parameters_set(self, parameters) -> None:
        changes = {}
        for parameter in parameters:
            self.param_problems.pop(parameter.name, None)
            spec = ros_params.spec_of(self.schema_node, parameter.name)
            if self.configured and spec is not None and spec.dynamic:
                value = parameter.value
                changes[parameter.name] = list(value) if spec.kind is list else value
        if changes:
            said = ", ".join(f"{k} {self.params.get(k)!r} -> {v!r}" for k, v in changes.items())
            self.params.update(changes)
            self.parameters_changed(changes)
            self.get_logger().info(f"set at run time: {said}")

    # -- state --------------------------------------------------------------------------------

    @property
    def lifecycle_state(self) -> str:
        """'unconfigured', 'inactive', 'active' or 'finalized' (what the node last reached)."""
        return self.record.state

    @property
    def configured(self) -> bool:
        return self.record.state in ("inactive", "active")

    @property
    def active(self) -> bool:
        return self.record.state == "active"

    def bring_up(self) -> None:
        """Last in a subclass's __init__: with autostart, configure and activate now; a failure
        is raised (after the node is destroyed), so the process that makes it exits with it."""
        if not self.get_parameter("autostart").value:
            self.get_logger().info("unconfigured: waiting for a lifecycle manager "
                                   "(autostart is false)")
            return
        for name, trigger in (("configure", self.trigger_configure),
                              ("activate", self.trigger_activate)):
            if trigger() != SUCCESS:
                error = self.transition_error or CsrError(f"{self.get_name()}: {name} failed")
                self.close()
                self.destroy_node()
                raise error

    # -- rclpy's transition callbacks ---------------------------------------------------------

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._transition("configure", self.configure, "inactive", undo=self.release)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        LifecycleNode.on_activate(self, state)         # enable the lifecycle publishers
        result = self._transition("activate", self.activate, "active", undo=self.deactivate)
        if result != SUCCESS:
            LifecycleNode.on_deactivate(self, state)
        return result

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        result = self._transition("deactivate", self.deactivate, "inactive")
        LifecycleNode.on_deactivate(self, state)
        return result

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._transition("cleanup", self.release, "unconfigured")

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        def shut_down():
            if state.label == "active":
                self.deactivate()
                LifecycleNode.on_deactivate(self, state)
            self.release()
        return self._transition("shutdown", shut_down, "finalized")

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """After a hook raised a defect: release everything; the node ends unconfigured."""
        try:
            LifecycleNode.on_deactivate(self, state)
            self.release()
        except Exception:  # noqa: BLE001 - already failing: said, and unconfigured anyway
            self.get_logger().error(f"releasing after an error raised:\n"
                                    f"{traceback.format_exc()}")
        return SUCCESS

    def _transition(self, name: str, step: Callable[[], None], reached: str, *,
                    undo: Callable[[], None] | None = None) -> TransitionCallbackReturn:
        before = self.record.state
        try:
            step()
        except CsrError as exc:
            self._undo(undo)
            self._failed(name, before if name != "shutdown" else "finalized", exc)
            return FAILURE
        except Exception as exc:  # noqa: BLE001 - a defect: on_error releases everything
            self.get_logger().error(f"{name} raised:\n{traceback.format_exc()}")
            self._failed(name, "unconfigured", CsrError(f"{type(exc).__name__}: {exc}"))
            return TransitionCallbackReturn.ERROR
        self.record.succeeded(name, reached)
        self.transition_error = None
        self.get_logger().info(f"{name}: {reached}")
        return SUCCESS

    def _undo(self, undo: Callable[[], None] | None) -> None:
        if undo is None:
            return
        try:
            undo()
        except Exception:  # noqa: BLE001 - the failure itself is what is reported
            self.get_logger().error(f"undoing a failed transition raised:\n"
                                    f"{traceback.format_exc()}")

    def _failed(self, name: str, state: str, exc: CsrError) -> None:
        self.transition_error = exc
        self.record.failed(name, state, str(exc))
        self.get_logger().error(f"{name} failed, the node is {state}: {exc}")

    def give_up(self, exc: CsrError) -> None:
        """From a callback, when the node cannot go on working (resources that stay
        unreachable): deactivate and clean up in the lifecycle services' callback group (never
        alongside one of their transitions), and say why. With autostart nothing would bring
        it up again: the process then ends with `exc` (exit 2)."""
        def fall_back():
            timer.cancel()
            self.destroy_timer(timer)
            if self.active:
                self.trigger_deactivate()
            if self.configured:
                self.trigger_cleanup()
            self._failed("activate", self.record.state, exc)
            if self.get_parameter("autostart").value:
                self.exit_error = exc
                self.context.try_shutdown()
        timer = self.create_timer(0.0, fall_back, callback_group=self.default_callback_group)

    def close(self) -> None:
        """The process is ending: stop working (when the graph is still up) and release."""
        try:
            if self.active and self.context.ok():
                self.deactivate()
        finally:
            if self.configured:
                self.release()
                self.record.succeeded("shutdown", "finalized")

    # -- /diagnostics -------------------------------------------------------------------------

    def diagnostics_callback(self) -> None:
        now_s = time.monotonic()
        level, message, values = OK, "ok", []
        if self.configured:
            level, message, values = self.work_status(now_s)
        said = self.record.level_message()
        if said is not None:
            state_level, state_message = said
            if state_level == ERROR or level < ERROR:
                work = "" if message == "ok" or not self.configured else f"; {message}"
                level, message = max(level, state_level), state_message + work
        fault = self.faults.status(now_s)
        if fault is not None:
            level, message = ERROR, fault + ("" if message == "ok" else f"; {message}")
        values = list(values) + self.record.values() + self.faults.values()
        if self.robot_id:
            values.append(("robot_id", self.robot_id))
        status = DiagnosticStatus(level=LEVELS[level], name=status_name(self), message=message,
                                  hardware_id=self.get_fully_qualified_name(),
                                  values=[KeyValue(key=k, value=str(v)) for k, v in values])
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(array)
