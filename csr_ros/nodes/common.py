"""What the three nodes share: parameter declaration from the pure schemas, named QoS
profiles, message conversions, the GetChunks client of the nodes that fold chunks, and the
standard main()."""

from __future__ import annotations

import difflib
import functools
import importlib
import logging
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Sequence

import rclpy
from builtin_interfaces.msg import Time
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import (InvalidHandle, InvalidParameterTypeException,
                              InvalidParameterValueException, ParameterUninitializedException)
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from csr_ros.errors import ConfigError, CsrError, MessageTypeNotInstalledError
from csr_ros.node_logic.stream import ChunkEvent, FetchRequest
from csr_ros.render import normalize_type_name
from csr_ros.ros_params import (ParamSpec, bounds, check_params_files, check_value,
                                constraints_text, type_problem)


def _reliable(depth: int, *, latched: bool = False) -> QoSProfile:
    """Keep-last `depth`, reliable; latched: transient local (a late joiner gets the last)."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL if latched
                      else DurabilityPolicy.VOLATILE)


# The chunk stream must not lose a chunk under a burst (a bag replayed fast, many sources at
# once): reliable, and deep enough that a slow subscriber catches up before keep-last drops.
CHUNKS_QOS = _reliable(1000)
# Instant values: only the newest of each source matters.
INSTANT_QOS = _reliable(50)
# The active version: latched, so a node that starts later learns it at once.
SWAPS_QOS = _reliable(1, latched=True)
# Decisions: reliable, and latched for the last few, so a monitor or logger that joins late
# gets the latest decisions at once.
DECISIONS_QOS = _reliable(10, latched=True)
# Actions for a controller: reliable, and latched with depth 1, so a controller that joins late
# (or restarts) gets exactly the latest action, whose valid_until says if it still holds, and
# never an older one. Any subscriber matches: volatile gets only new ones, transient local the
# latest at once; best effort matches too, but may lose actions on a lossy link.
ACTIONS_QOS = _reliable(1, latched=True)
# What diagnostic_aggregator and rqt_robot_monitor subscribe with.
DIAGNOSTICS_QOS = _reliable(10)
# A subscriber of /rosout (a monitor, the replay harness): rcl's rosout publishers are
# transient local (depth 1000, lifespan 10 s), so a subscriber that matches a node a moment
# after it logged still gets the line.
ROSOUT_QOS = _reliable(1000, latched=True)

_ARRAY_TYPES = {str: Parameter.Type.STRING_ARRAY, int: Parameter.Type.INTEGER_ARRAY,
                float: Parameter.Type.DOUBLE_ARRAY, bool: Parameter.Type.BOOL_ARRAY}


def descriptor(spec: ParamSpec) -> ParameterDescriptor:
    """The ROS descriptor of a spec: its description, its range (`ros2 param describe`), what
    else constrains it, and whether it may change at run time (the node's set-parameters
    callback decides that, with the reason, so none is marked read-only)."""
    out = ParameterDescriptor(description=spec.description,
                              additional_constraints=constraints_text(spec))
    low, high = bounds(spec)
    if spec.kind is int and (low is not None or high is not None):
        out.integer_range = [IntegerRange(from_value=int(low if low is not None else -2**63),
                                          to_value=int(high if high is not None else 2**63 - 1),
                                          step=0)]
    elif spec.kind is float and (low is not None or high is not None):
        out.floating_point_range = [FloatingPointRange(
            from_value=float(low if low is not None else -math.inf),
            to_value=float(high if high is not None else math.inf), step=0.0)]
    return out


def declare(node: Node, specs: Sequence[ParamSpec]) -> dict[str, str]:
    """Declare every spec not declared yet, with its descriptor; the params file's or the
    command line's value where one is given, else the default.

    A parameter without a usable default (an empty list) is declared statically typed and
    uninitialized. A given value that cannot be declared (the wrong type, out of range) is
    declared with the default instead and returned as {name: what is wrong}: the node refuses
    to configure until it is set right.
    """
    problems: dict[str, str] = {}
    for spec in specs:
        if node.has_parameter(spec.name):
            continue
        default = spec.default
        if isinstance(default, list) and not default:
            default = _ARRAY_TYPES[spec.element or str]
        try:
            node.declare_parameter(spec.name, default, descriptor(spec))
        except (InvalidParameterTypeException, InvalidParameterValueException) as exc:
            problems[spec.name] = _declare_problem(node.get_name(), spec,
                                                   given_parameters(node).get(spec.name), exc)
            node.declare_parameter(spec.name, default, descriptor(spec), ignore_override=True)
    return problems


def _declare_problem(node_name: str, spec: ParamSpec, given: Any, exc: Exception) -> str:
    """What is wrong with a given value rclpy refused to declare, said as validate says it."""
    where = f"{node_name}: {spec.name}"
    problem = type_problem(spec, given) if given is not None else None
    if problem is not None:
        return f"{where} {problem}"
    try:
        check_value(node_name, spec, given)
    except ConfigError as bad:
        return str(bad)
    return f"{where}: {exc}"


def read_params(node: Node, specs: Sequence[ParamSpec]) -> dict[str, Any]:
    """The current values of the declared specs (uninitialized ones left out), lists as
    lists."""
    values: dict[str, Any] = {}
    for spec in specs:
        try:
            value = node.get_parameter(spec.name).value
        except ParameterUninitializedException:
            continue
        values[spec.name] = list(value) if spec.kind is list else value
    return values


def given_parameters(node: Node) -> dict[str, Any]:
    """Every parameter the command line or a params file gives this node, declared or not."""
    overrides = getattr(node, "_parameter_overrides", None) or {}
    return {name: param.value for name, param in overrides.items()}


def with_undeclared(node: Node, values: dict[str, Any], specs: Sequence[ParamSpec]) -> dict:
    """`values` plus the given parameters no spec declares, so `ros_params.validate` refuses
    them by name (a typo such as `rate_hzz` is otherwise ignored in silence)."""
    names = {s.name for s in specs}
    extra = {k: v for k, v in given_parameters(node).items() if k not in names}
    return {**values, **extra}


def log_at(logger, level: str, text: str) -> None:
    """Log `text` at `level` ('error', 'warning' or 'info'). rclpy ties one severity to each
    line that calls it and raises ValueError on a second one, so a level chosen at run time
    needs a line of its own per severity."""
    if level == "error":
        logger.error(text)
    elif level == "warning":
        logger.warning(text)
    else:
        logger.info(text)


class NodeLogHandler(logging.Handler):
    """The library's Python logging (`csr_ros.*`: reconciliation notices, resource and chunk-log
    warnings) through a node's logger, so it reaches /rosout with the node's name and level
    instead of stderr without either. One per process: the oldest of its nodes that is up."""

    def __init__(self, node: Node | None = None):
        super().__init__(level=logging.INFO)
        self.nodes: list[Node] = [node] if node is not None else []

    @property
    def node(self) -> Node | None:
        return next((n for n in self.nodes if n.context.ok()), None)

    def emit(self, record: logging.LogRecord) -> None:
        node = self.node
        if node is None:                   # no node up (yet): plain stderr, as without us
            if logging.lastResort is not None and record.levelno >= logging.lastResort.level:
                logging.lastResort.handle(record)
            return
        try:
            message = record.getMessage()
            logger = node.get_logger()
            if record.levelno >= logging.ERROR:
                logger.error(message)
            elif record.levelno >= logging.WARNING:
                logger.warning(message)
            else:
                logger.info(message)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


_LIBRARY_LOG = NodeLogHandler()


def route_library_logging(node: Node) -> None:
    """Call first in a node's __init__: the library's logging goes through this node's logger
    (unless another node of this process already has it)."""
    library = logging.getLogger("csr_ros")
    if _LIBRARY_LOG not in library.handlers:
        library.addHandler(_LIBRARY_LOG)
        library.setLevel(logging.INFO)
    library.propagate = False              # not also to stderr without node name and level
    _LIBRARY_LOG.nodes = [n for n in _LIBRARY_LOG.nodes if n.context.ok()] + [node]


def node_python_logger(node: Node) -> logging.Logger:
    """A Python logger whose records go through `node`'s logger only (for a library object the
    node owns, such as its reconciliation driver)."""
    log = logging.getLogger(f"csr_ros.nodes.{node.get_name()}.{id(node):x}")
    log.handlers = [NodeLogHandler(node)]
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def unroute_library_logging(node: Node) -> None:
    """Call in a node's close(): a destroyed node's logger no longer carries the library's."""
    _LIBRARY_LOG.nodes = [n for n in _LIBRARY_LOG.nodes if n is not node]
    if not _LIBRARY_LOG.nodes:
        logging.getLogger("csr_ros").propagate = True


def status_name(node: Node) -> str:
    """The name of a node's /diagnostics status: `csr_ros: policy` in the root namespace,
    `csr_ros: robot_a/policy` in /robot_a, so the nodes of two robots on one graph (one
    /diagnostics topic) are told apart by a monitor."""
    return f"csr_ros: {node.get_fully_qualified_name().lstrip('/')}"


def time_msg(stamp_ns: int) -> Time:
    return Time(sec=int(stamp_ns // 1_000_000_000), nanosec=int(stamp_ns % 1_000_000_000))


def time_ns(stamp: Time) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def chunk_event(msg) -> ChunkEvent:
    """A StateChunk as the pure fold sees it."""
    return ChunkEvent(seq=int(msg.seq), source=msg.source, stamp_ns=time_ns(msg.stamp),
                      text=msg.text, stream=msg.stream)


class ChunkFetcher:
    """A node's GetChunks client: one call at a time for a range of chunks it missed.

    Each call has an id; an answer to a call the node has since given up on (`give_up_after`,
    from its watchdog timer) is dropped. Answers are handled under the node's lock:
    `on_fetched(events, response, probe)` with the chunks as ChunkEvents (`probe`: the request
    was open-ended, end_seq 0), or `on_failed()` when the call failed.
    """

    def __init__(self, node: Node, service: str, *, lock, callback_group,
                 on_fetched: Callable[[list[ChunkEvent], Any, bool], None],
                 on_failed: Callable[[], None]):
        # imported here: nodes of standard messages alone use this module without csr_ros.srv
        from csr_ros.srv import GetChunks

        self.node = node
        self.lock = lock
        self.client = node.create_client(GetChunks, service, callback_group=callback_group)
        self.on_fetched = on_fetched
        self.on_failed = on_failed
        self.fetch_id = 0
        self.started_s = 0.0

    def fetch(self, request: FetchRequest | None) -> None:
        """Under the lock: ask for the missing range (None: nothing to ask). A call the service
        is not ready for is left to the watchdog to count as failed."""
        if request is None:
            return
        self.fetch_id += 1
        self.started_s = time.monotonic()
        if not self.client.service_is_ready():
            return
        future = self.client.call_async(
            self.client.srv_type.Request(start_seq=request.start_seq, end_seq=request.end_seq))
        done = functools.partial(self._done, self.fetch_id, request.end_seq == 0)
        # the executor runs it as a task: what it raised would end the spin
        guarded = getattr(self.node, "guarded", None)
        future.add_done_callback(guarded(done, where="get_chunks_answer") if guarded else done)

    def give_up_after(self, timeout_s: float) -> bool:
        """Under the lock, while a fetch is outstanding: True (and its answer will be dropped)
        when it has not answered within timeout_s."""
        if time.monotonic() - self.started_s < timeout_s:
            return False
        self.fetch_id += 1
        self.node.get_logger().warning("GetChunks did not answer in time")
        return True

    def _done(self, fetch_id: int, probe: bool, future) -> None:
        with self.lock:
            if fetch_id != self.fetch_id:
                return                               # answered after the watchdog gave up
            self.fetch_id += 1
            try:
                response = future.result()
            except Exception as exc:  # noqa: BLE001 - a failed call is a failed fetch
                self.node.get_logger().warning(f"GetChunks failed: {exc}")
                self.on_failed()
                return
            self.on_fetched([chunk_event(c) for c in response.chunks], response, probe)


def resolve_message_type(type_name: str):
    """'pkg/msg/Name' (or 'pkg/Name') → the generated class, by importing `pkg.msg`.

    Raises MessageTypeNotInstalledError when the package does not import (not installed, or
    this workspace not sourced), and ConfigError when it imports but has no such type (a typo).
    """
    package, kind, name = normalize_type_name(type_name).split("/")
    try:
        module = importlib.import_module(f"{package}.{kind}")
    except ImportError as exc:
        raise MessageTypeNotInstalledError(
            f"message type {package}/{kind}/{name} is not installed: {package}.{kind} does not "
            f"import ({type(exc).__name__}: {exc})") from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type) or not hasattr(cls, "get_fields_and_field_types"):
        known = [n for n in dir(module) if not n.startswith("_") and
                 hasattr(getattr(module, n), "get_fields_and_field_types")]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {package}/{kind}/{close[0]}?)" if close else ""
        raise ConfigError(f"{package}/{kind} has no message type {name!r}{hint}")
    return cls


class _Stop(BaseException):
    """SIGINT/SIGTERM while the nodes are being built (a model loading). Not an Exception: a
    lifecycle transition that runs meanwhile must not take it for its own failure."""


def run(*make_nodes: Callable[..., Node], args: Sequence[str] | None = None,
        threads: int | None = None, label: str | None = None) -> int:
    """Standard main(): init, spin, clean shutdown on Ctrl-C and SIGTERM (exit 0, no traceback,
    within a few seconds: a running query is abandoned, not awaited); a ConfigError exits 2,
    and so does a node that gave up bringing itself up with autostart (its `exit_error`).

    Each factory is called with the nodes made before it (all_in_one hands its reconciler to
    the policy). Nodes are closed and destroyed in reverse order, also when a later one fails.
    """
    name = label or "csr_ros"
    try:
        check_params_files(sys.argv if args is None else args)
    except CsrError as exc:
        print(f"[{name}] error: {exc}", file=sys.stderr)
        return 2
    phase = {"building": True}

    def on_signal(signum, frame):
        # rclpy's own handler (chained before this one) has shut the context down, which ends
        # spin(); only the building phase, which rclpy cannot interrupt, needs to be left here.
        if phase["building"]:
            raise _Stop()

    # before rclpy.init, which chains its handlers to these
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        rclpy.init(args=args)
    except _rclpy.RCLError as exc:
        # what the file check above cannot see, e.g. a params file rcl cannot parse
        for sig, old in previous.items():
            signal.signal(sig, old)
        print(f"[{name}] error: cannot start ROS: {exc}", file=sys.stderr)
        return 2
    nodes: list[Node] = []
    names: list[str] = []                # said after the nodes are destroyed
    executor = MultiThreadedExecutor(num_threads=threads) if threads else None
    code = 0
    try:
        for make in make_nodes:
            nodes.append(make(*nodes))
            names.append(nodes[-1].get_name())
        phase["building"] = False
        if executor is None:
            rclpy.spin(nodes[0])
        else:
            for node in nodes:
                executor.add_node(node)
            spin(executor)
    except (KeyboardInterrupt, ExternalShutdownException, _Stop):
        pass
    except _rclpy.RCLError:
        # SIGTERM shut the context down while the executor was building its wait set (a race
        # inside rclpy's MultiThreadedExecutor): a stop, not an error
        if rclpy.ok():
            raise
    except CsrError as exc:
        name = label or (nodes[0].get_name() if nodes else name)
        print(f"[{name}] error: {exc}", file=sys.stderr)
        code = 2
    finally:
        phase["building"] = False
        try:
            for node in nodes:
                stop = getattr(node, "stop_callbacks", None)
                if stop is not None:
                    stop()
            if executor is not None:
                drain_callbacks(executor, timeout_s=2.0)
                executor.shutdown(timeout_sec=2.0)
            for node in reversed(nodes):
                close = getattr(node, "close", None)
                if close is not None:
                    close()       # ends the service calls and goals that still wait
            if executor is not None:
                drain_callbacks(executor, timeout_s=1.0)   # they answer before it is gone
            for node in reversed(nodes):
                node.destroy_node()
        finally:
            rclpy.try_shutdown()
            for sig, old in previous.items():
                signal.signal(sig, old)
    for node, node_name in zip(nodes, names):
        gave_up = getattr(node, "exit_error", None)
        if gave_up is not None:
            print(f"[{label or node_name}] error: {gave_up}", file=sys.stderr)
            code = 2
    busy = _busy_workers() + drain_callbacks(executor, timeout_s=1.0, cancel_queued=True)
    if busy:
        # A model is still computing on a worker thread (a query or a warm-up that cannot be
        # interrupted) or in a callback (the models loading in the reconciler's start timer).
        # Tearing the interpreter down under it aborts the process or waits for it, and a
        # load that goes on past interpreter shutdown fails ("cannot schedule new futures");
        # everything that must outlive it (chunk logs) was closed above, so leave now.
        if any(not t.startswith("csr-") for t in busy):
            print(f"[{name}] stopped while a callback still ran (a model loading); not "
                  "waiting for it", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def spin(executor) -> None:
    """`executor.spin()`, through rclpy's race between destroying an entity and waiting on it.

    A lifecycle cleanup destroys a node's subscriptions and publishers inside a callback. A
    MultiThreadedExecutor thread that builds its wait set meanwhile raises InvalidHandle for
    their QoS event handlers ("cannot use Destroyable because destruction was requested";
    rclpy issues 1206, 1284 and 1355, open in jazzy), and that ends `spin()`: the process
    would answer nothing more, the cleanup's own reply included. The destroyed entity is not
    in the next wait set, so the spin goes on."""
    while executor.context.ok():
        try:
            executor.spin_once()
        except InvalidHandle:
            continue


def drain_callbacks(executor, *, timeout_s: float, cancel_queued: bool = False) -> list[str]:
    """Let the handlers a MultiThreadedExecutor has queued run out, before its shutdown().

    jazzy's MultiThreadedExecutor hands each ready callback to a thread pool (`_executor`) and
    its shutdown() destroys its guard condition at once, without waiting (its wait is skipped).
    A handler still queued then starts, triggers that guard condition first thing and fails
    with InvalidHandle ("cannot use Destroyable because destruction was requested"); nobody
    retrieves that exception after spin ended, so Python prints it as the handler is collected
    ("The following exception was never retrieved"). Cancelling them instead leaves their
    coroutines never awaited, also printed. So: no new handlers (the spin has ended), the
    queued ones run (the nodes' callbacks return at once once `stop_callbacks` was called),
    and only then shutdown(). Its shutdown() does not shut the pool down either, and
    interpreter exit would join its threads: after the executor's shutdown, `cancel_queued`
    drops what is still queued. The names of the pool's threads still running a callback after
    `timeout_s`: empty when the pool is idle (a callback still running, e.g. a model load, is
    the caller's to handle)."""
    pool = getattr(executor, "_executor", None)
    if pool is None:
        return []
    pool.shutdown(wait=False, cancel_futures=cancel_queued)
    deadline = time.monotonic() + timeout_s
    threads = list(getattr(pool, "_threads", ()))
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


def _busy_workers() -> list[str]:
    """The csr_ros worker threads still running after the nodes were closed."""
    return [t.name for t in threading.enumerate()
            if t is not threading.current_thread() and t.name.startswith("csr-") and t.is_alive()]


def load_tokenizer(params) -> tuple[object, str]:
    """The tokenizer of the `model`/`tokenizer` parameters, and the model directory it uses."""
    from pathlib import Path

    from csr_ros.model_store import resolve_model_dir

    if params["tokenizer"] == "server":
        from csr_ros.resources.remote_tokenizer import RemoteTokenizer

        # the server tokenizes; the directory only needs the template and special-token files
        path = Path(params["model"]).expanduser()
        model_dir = path if path.is_dir() else resolve_model_dir(params["model"], weights=False)

        return RemoteTokenizer(params["resource.r1_url"], model_dir=model_dir,
                               model=params["resource.served_model"] or None), str(model_dir)
    from csr_ros.tokenizer import HFTokenizer

    model_dir = resolve_model_dir(params["model"], weights=False)
    return HFTokenizer(model_dir), str(model_dir)
