"""The policy node: decisions at rate_hz over the cached state.

    csr/chunks, csr/swaps ──▶ StateFold (gap-free; GetChunks for what it missed)
    csr/instant ───────────▶ latest value per source → dynamic suffix
    timer at rate_hz ──────▶ QueryScheduler: a query starts only if none is running
                             (skipped ticks are counted) → query worker thread
    query worker ──────────▶ the primary (its URL from the latest SwapEvent) → csr/decisions,
                             and the typed action of each valid decision → csr/actions
    csr/query (service) ───▶ the same, on demand: queued behind the running query (and a
    csr/decide (action)      periodic one that fell due meanwhile); the action sends TTFT and
                             tokens as feedback, and a cancel stops it between two tokens
    /diagnostics ◀───────── TTFT, cache hits, version, skipped ticks, lost chunks,
                             valid and invalid actions (1 Hz)

The query runs on its own (daemon) thread, so the executor keeps folding chunks and answering
services while a model computes, and a shutdown does not wait for it: the running query is
abandoned and its answer never published. Inside all_in_one the node is given the in-process
reconciliation driver instead, which builds each request against its active version and
routes it.
"""

from __future__ import annotations

import functools
import json
import queue
import threading
import time
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Callable

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node

from csr_ros import ros_params
from csr_ros.action import Decide
from csr_ros.actions import SeenValues
from csr_ros.errors import ActionSpecError, ConfigError, CsrError, QueryCancelledError
from csr_ros.msg import Action, PolicyDecision, StateChunk
from csr_ros.msg import SwapEvent as SwapEventMsg
from csr_ros.node_logic.health import (ERROR, OK, WARN, Announcer, QueryStats, diagnose,
                                       keep_up_warning)
from csr_ros.node_logic.schedule import MAX_WAITING_QUERIES, PERIODIC, QueryScheduler
from csr_ros.node_logic.stream import FetchRequest, StateFold, SwapEvent
from csr_ros.node_logic.suffix import InstantValue, build_suffix
from csr_ros.nodes.common import (CHUNKS_QOS, DECISIONS_QOS, DIAGNOSTICS_QOS, INSTANT_QOS,
                                  SWAPS_QOS, ChunkFetcher, chunk_event, declare, load_tokenizer,
                                  log_at, route_library_logging, run, status_name, time_msg,
                                  unroute_library_logging, with_undeclared)
from csr_ros.render import episode_origin_ns
from csr_ros.ros_params import state_from_params, vocabulary_from_params
from csr_ros.srv import Query

_LEVELS = {OK: DiagnosticStatus.OK, WARN: DiagnosticStatus.WARN, ERROR: DiagnosticStatus.ERROR}


class PolicyNode(Node):
    def __init__(self, *, driver=None, **kwargs):
        super().__init__("policy", **kwargs)
        route_library_logging(self)
        self.params = ros_params.validate("policy", with_undeclared(
            self, declare(self, ros_params.POLICY), ros_params.POLICY))
        p = self.params
        self.robot_id = ros_params.robot_id_for(p["robot_id"], self.get_namespace())
        self.last_routing_key: str | None = None   # what the last answered query was sent with
        if p["resource.kind"] == "local" and driver is None:
            msg = ("policy: resource.kind 'local' runs the model inside the reconciler's process;"
                   " use `ros2 launch csr_ros all.launch.py` (all_in_one), or 'openai' servers")
            raise ConfigError(msg)
        self.driver = driver       # the reconciler node of this process (all_in_one), or None
        self.lock = threading.Condition()      # fold, scheduler, stats, instant values
        self.scheduler = QueryScheduler(rate_hz=p["rate_hz"])
        self.started_s = time.monotonic()
        self.stats = QueryStats()      # its rate window opens with the first query
        self.keep_up = Announcer()     # logs when the policy or reconciliation falls behind
        self.instant: dict[str, InstantValue] = {}
        self.closing = False
        self.reconciler_missing = False        # no reconciler on the swaps topic (said once)
        self.worker = _QueryWorker()
        self.demands: dict[int, _Demand] = {}     # on-demand queries waiting, by scheduler key
        self.goals: dict[bytes, _Demand] = {}      # Decide goals not finished, by goal id
        self.http_resources: dict[str, tuple[int, object]] = {}   # url → (version, resource)
        self.fold: StateFold | None = None
        if driver is None:
            self.tokenizer, self.model_dir = load_tokenizer(p)
            self.fold = StateFold(state_from_params(p, self.tokenizer))
        self.fetcher: ChunkFetcher | None = None
        self.vocab = vocabulary_from_params(p)          # None: free text only
        self.seen = SeenValues.from_params(p["actions.seen"])
        self.seen_upto_seq = -1

        # Events are folded one at a time; services and client answers may run alongside.
        self.events_group = MutuallyExclusiveCallbackGroup()
        self.service_group = ReentrantCallbackGroup()
        if driver is None:
            self.chunks_sub = self.create_subscription(
                StateChunk, p["topics.chunks"], self.chunk_callback, CHUNKS_QOS,
                callback_group=self.events_group)
            self.swaps_sub = self.create_subscription(
                SwapEventMsg, p["topics.swaps"], self.swap_callback, SWAPS_QOS,
                callback_group=self.events_group)
            self.fetcher = ChunkFetcher(self, p["services.get_chunks"], lock=self.lock,
                                        callback_group=self.service_group,
                                        on_fetched=self._fetched, on_failed=self._fetch_failed)
            self.fetch_timer = self.create_timer(0.5, self.fetch_watchdog_callback,
                                                 callback_group=self.events_group)
            self.probe_timer = self.create_timer(0.5, self.probe_callback,
                                                 callback_group=self.events_group)
        self.instant_sub = self.create_subscription(
            StateChunk, p["topics.instant"], self.instant_callback, INSTANT_QOS,
            callback_group=self.events_group)
        self.decision_pub = self.create_publisher(PolicyDecision, p["topics.decisions"],
                                                  DECISIONS_QOS)
        self.action_pub = self.create_publisher(Action, p["topics.actions"], DECISIONS_QOS)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics",
                                                     DIAGNOSTICS_QOS)
        self.query_srv = self.create_service(Query, p["services.query"], self.query_callback,
                                             callback_group=self.service_group)
        # A goal waits (accepted) for its turn, then executes: only the running goal holds an
        # executor thread, however many wait.
        self.decide_server = ActionServer(
            self, Decide, p["services.decide"], self.decide_execute_callback,
            goal_callback=self.decide_goal_callback,
            handle_accepted_callback=self.decide_accepted_callback,
            cancel_callback=self.decide_cancel_callback, callback_group=self.service_group)
        self.tick_timer = self.create_timer(self.scheduler.period_s, self.tick_callback,
                                            callback_group=self.events_group)
        self.diagnostics_timer = self.create_timer(1.0, self.diagnostics_callback,
                                                   callback_group=self.events_group)
        where = "in-process driver" if driver else f"servers {p['resource.r1_url']}, {p['resource.r2_url']}"
        self.get_logger().info(f"deciding at {p['rate_hz']} Hz over {where}")

    # -- state events --------------------------------------------------------------------------

    def chunk_callback(self, msg: StateChunk) -> None:
        with self.lock:
            restarts = self.fold.counters.stream_restarts
            fetch = self.fold.on_chunk(chunk_event(msg))
            self._stream_check(restarts)
            self._fetch(fetch)

    def _stream_check(self, restarts_before: int) -> None:
        """Under the lock: say it when the fold began a new aggregator stream."""
        if self.fold.counters.stream_restarts > restarts_before:
            self.get_logger().warning(self.fold.last_restart.describe())

    def swap_callback(self, msg: SwapEventMsg) -> None:
        event = SwapEvent(version=msg.version, primary=msg.primary, primary_url=msg.primary_url,
                          evicted_before_seq=msg.evicted_before_seq,
                          caught_up_to_seq=msg.caught_up_to_seq, reason=msg.reason,
                          stream=msg.stream)
        with self.lock:
            restarts = self.fold.counters.stream_restarts
            if self.fold.on_swap(event):
                self.get_logger().info(f"v{msg.version} ({msg.reason}) on {msg.primary}: "
                                       f"chunks from seq {msg.evicted_before_seq}")
            self._stream_check(restarts)
            self._fetch(self.fold.probe() if self.fold.needs_probe else self.fold.gap())

    def instant_callback(self, msg: StateChunk) -> None:
        with self.lock:
            self.instant[msg.source] = InstantValue(msg.source, msg.text,
                                                    self.get_clock().now().nanoseconds)

    # -- late joining: GetChunks ---------------------------------------------------------------

    def _fetch(self, request: FetchRequest | None) -> None:
        """Under the lock: ask the aggregator for a missing range (one request at a time)."""
        if request is None:
            return
        self.get_logger().info(f"fetching chunks from seq {request.start_seq} " + (
            f"to {request.end_seq - 1}" if request.end_seq else "to the newest"))
        self.fetcher.fetch(request)

    def probe_callback(self) -> None:
        """Once at start, when the aggregator answers: fetch the history before the first chunk."""
        if not self.fetcher.client.service_is_ready():
            return
        self.probe_timer.cancel()
        with self.lock:
            self._fetch(self.fold.probe())

    def _fetched(self, events: list, response, probe: bool) -> None:
        """Under the lock: fold a GetChunks answer."""
        before = self.fold.lost
        restarts = self.fold.counters.stream_restarts
        first = int(response.first_available_seq)
        self._fetch(self.fold.on_fetched_all(events, first, stream=response.stream) if probe
                    else self.fold.on_fetched(events, first, stream=response.stream))
        self._stream_check(restarts)
        if self.fold.lost > before:
            self.get_logger().warning(
                f"{self.fold.lost - before} chunks are no longer available from the "
                f"aggregator (oldest it has: {response.first_available_seq}); skipped")

    def _fetch_failed(self) -> None:
        self._fetch(self.fold.on_fetch_failed())

    def fetch_watchdog_callback(self) -> None:
        with self.lock:
            if self.fold.order.fetching is not None and \
                    self.fetcher.give_up_after(self.params["fetch_timeout_s"]):
                self._fetch_failed()

    # -- queries -------------------------------------------------------------------------------

    def tick_callback(self) -> None:
        if self.driver is not None and self.driver.snapshot()["phase"] == "starting":
            # the in-process reconciler is still loading its models: nothing to ask yet, and
            # not a failed query (it says when it loads and when it has started)
            return
        with self.lock:
            if not self.scheduler.tick():
                return
            self._start_query(self.params["task"], "", self.params["max_new_tokens"])

    def query_callback(self, request, response):
        """On demand: queued like a goal, answered when its decision is made."""
        timeout_s = request.timeout_s or None
        try:
            demand = self._demand(_Demand(request.task, request.suffix, request.max_new_tokens))
        except CsrError as exc:
            response.success, response.message = False, str(exc)
            return response
        try:
            decision = demand.done.result(timeout=timeout_s)
        except FutureTimeoutError:
            waited = self._withdraw(demand)
            response.success, response.message = False, (
                "timed out waiting for the running query" if waited else
                f"timed out after {timeout_s:g} s (the decision is still published)")
            return response
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            response.success, response.message = False, f"{type(exc).__name__}: {exc}"
            return response
        response.success, response.decision = True, decision
        return response

    # -- the Decide action ---------------------------------------------------------------------

    def decide_goal_callback(self, goal) -> GoalResponse:
        with self.lock:
            refused = "shutting down" if self.closing else (
                f"{MAX_WAITING_QUERIES} queries wait already" if self.scheduler.full else "")
        if refused:
            self.get_logger().warning(f"Decide goal refused: {refused}")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def decide_accepted_callback(self, goal_handle) -> None:
        """Queue the goal; it executes when the scheduler gives it the slot."""
        goal = goal_handle.request
        demand = _Demand(goal.task, goal.suffix, goal.max_new_tokens, goal_handle=goal_handle)
        demand.on_token = functools.partial(self._decide_progress, demand)
        with self.lock:
            self.goals[_goal_key(goal_handle)] = demand
        try:
            self._demand(demand)
        except CsrError as exc:       # the queue filled since the goal was accepted
            demand.done.set_exception(exc)
            goal_handle.execute()
            return
        with self.lock:
            ahead = self.scheduler.ahead_of(demand.key) if demand.key in \
                self.scheduler.waiting else None
        if ahead is not None:
            goal_handle.publish_feedback(Decide.Feedback(started=False, queued_ahead=ahead,
                                                         ttft_s=-1.0, tokens=0))

    def decide_cancel_callback(self, goal_handle) -> CancelResponse:
        """A waiting goal leaves the queue at once; a running one stops at its next token."""
        with self.lock:
            demand = self.goals.get(_goal_key(goal_handle))
        if demand is not None and self._withdraw(demand):
            goal_handle.execute()         # to report it canceled
        return CancelResponse.ACCEPT

    def decide_execute_callback(self, goal_handle):
        """Runs once the goal's query started (or the goal left the queue): wait for it."""
        with self.lock:
            demand = self.goals.get(_goal_key(goal_handle))
        result = Decide.Result()
        cancelled = False
        try:
            result.decision, result.success = demand.done.result(), True
        except (CancelledError, QueryCancelledError):
            cancelled, result.message = True, "canceled"
        except Exception as exc:  # noqa: BLE001 - reported to the client
            result.message = f"{type(exc).__name__}: {exc}"
        finally:
            with self.lock:
                self.goals.pop(_goal_key(goal_handle), None)
        if result.success:
            goal_handle.succeed()     # also after a cancel that came too late to stop it
        elif cancelled:
            _wait_for_cancel_state(goal_handle)
            goal_handle.canceled()
        else:
            goal_handle.abort()
        return result

    def _decide_progress(self, demand: "_Demand", n_tokens: int) -> None:
        """On the query's thread, after each token: feedback, or stop if the goal was
        canceled."""
        handle = demand.goal_handle
        if handle.is_cancel_requested:
            raise QueryCancelledError("the Decide goal was canceled")
        now_s = time.monotonic()
        if demand.first_token_s is None:
            demand.first_token_s = now_s
        handle.publish_feedback(Decide.Feedback(
            started=True, queued_ahead=0, ttft_s=demand.first_token_s - demand.started_s,
            tokens=n_tokens))

    # -- on-demand queries: one queue for the service and the action ---------------------------

    def _demand(self, demand: "_Demand") -> "_Demand":
        """Queue an on-demand query; `demand.done` ends with its PolicyDecision."""
        demand.task = demand.task or self.params["task"]
        demand.max_new_tokens = demand.max_new_tokens or self.params["max_new_tokens"]
        with self.lock:
            if self.closing:
                raise CsrError("the policy node is shutting down")
            if self.scheduler.full:
                raise CsrError(f"{MAX_WAITING_QUERIES} on-demand queries are waiting already; "
                               "try again later")
            demand.key = self.scheduler.enqueue()
            self.demands[demand.key] = demand
            self._start_granted()
        return demand

    def _withdraw(self, demand: "_Demand") -> bool:
        """Take a waiting query out of the queue (cancelled); False if it runs already."""
        with self.lock:
            if demand.key is None or not self.scheduler.withdraw(demand.key):
                return False
            self.demands.pop(demand.key, None)
        demand.done.cancel()
        return True

    def _start_granted(self) -> None:
        """Under the lock: start what the scheduler lets into the free slot."""
        while not self.closing:
            granted = self.scheduler.grant()
            if granted is None:
                return
            demand = None if granted == PERIODIC else self.demands.pop(granted)
            try:
                if demand is None:
                    self._start_query(self.params["task"], "", self.params["max_new_tokens"])
                    return
                demand.started_s = time.monotonic()
                future = self._start_query(demand.task, demand.suffix, demand.max_new_tokens,
                                           on_token=demand.on_token)
            except Exception as exc:  # noqa: BLE001 - the slot is free again, the caller told
                self.scheduler.finish(ok=False)
                self.stats.record_error(f"{type(exc).__name__}: {exc}")
                if demand is not None:
                    demand.done.set_exception(exc)
                    if demand.goal_handle is not None:
                        demand.goal_handle.execute()
                continue
            future.add_done_callback(functools.partial(_settle, demand.done))
            if demand.goal_handle is not None:
                demand.goal_handle.execute()
            return

    def _start_query(self, task: str, extra_suffix: str, max_new_tokens: int, *,
                     on_token: Callable[[int], None] | None = None) -> Future:
        """Under the lock, with the scheduler slot taken: build, then run on the worker.
        `on_token` follows the answer's tokens (and may stop it; see Decoder.query)."""
        now_ns = self.get_clock().now().nanoseconds
        if self.stats.started_s is None:
            self.stats.started_s = time.monotonic()
        chunks = self.fold.state.chunks if self.driver is None else self.driver.active_chunks()
        suffix = build_suffix(self.instant, now_ns, stale_s=self.params["stale_instant_s"],
                              origin_ns=episode_origin_ns(chunks))
        if extra_suffix.strip():
            suffix += "\n" + extra_suffix.strip()
        bound, constraint = self._actions(chunks)
        if self.driver is not None:
            job = functools.partial(self._query_driver, task, suffix, max_new_tokens, now_ns,
                                    bound, constraint, on_token)
        else:
            request = self.fold.state.build_request(task=task, suffix=suffix)
            url = self.fold.primary_url or self.params["resource.r1_url"]
            name = self.fold.primary or "r1"
            job = functools.partial(self._query_http, request, url, name, task, max_new_tokens,
                                    now_ns, bound, constraint, on_token)
        future = self.worker.submit(job)
        future.add_done_callback(self._query_done)
        return future

    def _actions(self, chunks):
        """Under the lock: the vocabulary bound to the values seen so far, and its constraint
        (None, None without a vocabulary; a vocabulary and None in free-text mode)."""
        if self.vocab is None:
            return None, None
        for chunk in list(chunks):
            if chunk.seq > self.seen_upto_seq:
                self.seen.observe(chunk.text)
                self.seen_upto_seq = int(chunk.seq)
        mode = self.params["actions.mode"]
        try:
            bound = self.vocab.bind(self.seen.values())
            return bound, None if mode == "free" else bound.constraint(mode)
        except ActionSpecError as exc:   # e.g. every action needs a value not seen yet
            self.get_logger().warning(f"no constrained decision possible: {exc}",
                                      throttle_duration_sec=5.0)
            return self.vocab, None

    def _query_http(self, request, url: str, name: str, task: str, max_new_tokens: int,
                    started_ns: int, bound=None, constraint=None,
                    on_token=None) -> PolicyDecision:
        """On the worker thread: answer on the primary server."""
        resource = self._http_resource(url, name, int(request.version))
        result = resource.query(request, max_new_tokens=max_new_tokens, constraint=constraint,
                                on_token=on_token)
        self.last_routing_key = resource.last_routing_key
        return self._decision(request, result, result.ttft_s, task, started_ns, bound,
                              max_new_tokens)

    def _query_driver(self, task: str, suffix: str, max_new_tokens: int, started_ns: int,
                      bound=None, constraint=None, on_token=None) -> PolicyDecision:
        outcome = self.driver.query(task, suffix=suffix, max_new_tokens=max_new_tokens,
                                    constraint=constraint, on_token=on_token)
        if not outcome.ok:
            raise CsrError(outcome.error)
        self.last_routing_key = self.driver.routing_key(outcome.result.resource)
        return self._decision(outcome.request, outcome.result, outcome.ttft_s, task, started_ns,
                              bound, max_new_tokens)

    def _http_resource(self, url: str, name: str, version: int):
        """One client per server and version: after a swap the committed run it tracks is
        another version's, so a fresh client starts from the server's cache state."""
        from csr_ros.resources.factory import make_resource

        cached = self.http_resources.get(url)
        if cached is not None and cached[0] == version:
            return cached[1]
        if cached is not None:
            cached[1].close()
        p = self.params
        resource = make_resource("openai", url=url, name=name,
                                 model=p["resource.served_model"] or None,
                                 tokenizer=self.tokenizer, model_dir=self.model_dir,
                                 max_context_tokens=p["context_tokens"], robot_id=self.robot_id,
                                 read_timeout_s=p["resource.timeout_s"])
        self.http_resources[url] = (version, resource)
        return resource

    def _decision(self, request, result, ttft_s: float, task: str, started_ns: int,
                  bound=None, max_new_tokens: int = 0) -> PolicyDecision:
        decision_s = float(ttft_s) + float(result.decode_s)
        typed = None if bound is None else bound.decide(
            result.text, constrained=result.constrained, finish_reason=result.finish_reason,
            max_new_tokens=max_new_tokens)
        action = typed.action if typed is not None else None
        names, values, arguments = _arguments(action)
        decision = PolicyDecision(
            stamp=time_msg(started_ns), query_id=int(request.query_id),
            version=int(request.version), resource=result.resource, task=task, text=result.text,
            ttft_s=float(ttft_s), decode_s=float(result.decode_s),
            static_tokens=request.n_static, dynamic_tokens=request.n_dynamic,
            extended_tokens=int(result.n_extended),
            cached_tokens=-1 if result.cached_tokens is None else int(result.cached_tokens),
            last_seq=int(request.last_seq or 0), truncated=result.finish_reason == "length",
            constrained=bool(result.constrained), decision_s=decision_s,
            valid=action is not None, action_name="" if action is None else action.name,
            arg_names=names, arg_values=values, arguments_json=arguments,
            error="no action vocabulary (actions.vocabulary)" if typed is None else typed.error)
        with self.lock:
            self.stats.record(result, int(request.version), ttft_s=float(ttft_s),
                              now_s=time.monotonic())
            if typed is not None:
                self.stats.record_action(typed.valid, typed.error)
            if self.closing or not self.context.ok():
                return decision            # shutting down: the answer is not published
            self.decision_pub.publish(decision)
            if typed is not None and typed.valid:
                self.action_pub.publish(Action(
                    stamp=decision.stamp, query_id=decision.query_id,
                    name=decision.action_name, arg_names=decision.arg_names,
                    arg_values=decision.arg_values, arguments_json=decision.arguments_json,
                    constrained=decision.constrained, decision_s=decision_s))
        if typed is not None and not typed.valid:
            self.get_logger().warning(f"decision {decision.query_id} is not a valid action: "
                                      f"{typed.error}", throttle_duration_sec=5.0)
        return decision

    def _query_done(self, future: Future) -> None:
        exc = None if future.cancelled() else future.exception()
        cancelled = isinstance(exc, QueryCancelledError)
        with self.lock:
            self.scheduler.finish(ok=exc is None or cancelled)
            if exc is not None and not cancelled:
                self.stats.record_error(f"{type(exc).__name__}: {exc}")
            self.lock.notify_all()
            if self.closing:
                return
            self._start_granted()
        if exc is not None and not cancelled:
            self.get_logger().warning(f"query failed: {exc}", throttle_duration_sec=5.0)

    # -- health --------------------------------------------------------------------------------

    def diagnostics_callback(self) -> None:
        capacity = None
        if self.driver is not None:
            snap = self.driver.snapshot()
            capacity = self.driver.capacity()
        with self.lock:
            now_s = time.monotonic()
            if self.driver is not None:
                view = {"version": snap["version"], "primary": snap["primary"],
                        "chunks": snap["n_chunks"], "next_seq": snap["next_seq"],
                        "static_tokens": snap["n_static_tokens"], "phase": snap["phase"],
                        "fallbacks": snap.get("fallbacks", 0), "swaps": snap.get("swaps", 0)}
                d = diagnose(view, self.scheduler, self.stats, now_s=now_s,
                             capacity=capacity.as_dict() if capacity is not None else None)
            else:
                d = diagnose(self.fold, self.scheduler, self.stats, now_s=now_s)
            said = self.keep_up.update(keep_up_warning(
                self.stats, self.scheduler.rate_hz, now_s,
                capacity=capacity.as_dict() if capacity is not None else None), now_s)
        if said is not None:
            log_at(self.get_logger(), *said)
        level, message = _LEVELS[d.level], d.message
        if self.driver is None and self._reconciler_missing() and level == DiagnosticStatus.OK:
            level, message = DiagnosticStatus.WARN, "no reconciler publishes " + \
                self.params["topics.swaps"]
        values = [KeyValue(key=k, value=v) for k, v in d.values]
        if self.robot_id:
            values.append(KeyValue(key="robot_id", value=self.robot_id))
        if self.last_routing_key is not None:
            values.append(KeyValue(key="routing_key", value=self.last_routing_key))
        status = DiagnosticStatus(level=level, name=status_name(self),
                                  message=message, hardware_id=self.get_fully_qualified_name(),
                                  values=values)
        self.diagnostics_pub.publish(DiagnosticArray(header=_header(self), status=[status]))

    def _reconciler_missing(self) -> bool:
        """True while no reconciler publishes the swaps topic (it exited, or never started,
        for 10 s after this node did); said once when it happens and once when one is back."""
        missing = self.count_publishers(self.params["topics.swaps"]) == 0 and \
            time.monotonic() - self.started_s > 10.0
        if missing != self.reconciler_missing:
            self.reconciler_missing = missing
            if missing:
                self.get_logger().warning(
                    f"no reconciler publishes {self.params['topics.swaps']}: decisions go on "
                    f"against {self.fold.primary_url or self.params['resource.r1_url']} with "
                    "nothing evicting the history, until the server's context is full. Look "
                    "at the reconciler's log (server.launch.py)")
            else:
                self.get_logger().info("a reconciler publishes "
                                       f"{self.params['topics.swaps']} again")
        return missing

    def close(self) -> None:
        """Stop deciding: a running query is abandoned (its thread is a daemon; its answer is
        not published), queued ones are cancelled, and the Decide goals and Query calls that
        wait or run end at once with the reason."""
        with self.lock:
            self.closing = True
            unfinished = list(self.demands.values()) + list(self.goals.values())
            self.demands = {}
        for demand in unfinished:     # their callers (a goal's execution, a service call) end
            try:
                demand.done.set_exception(CsrError("the policy node is shutting down"))
            except InvalidStateError:  # it has just ended
                pass
        self.worker.stop()
        self.decide_server.destroy()
        for _, resource in self.http_resources.values():
            resource.close()
        unroute_library_logging(self)


@dataclass(eq=False)
class _Demand:
    """An on-demand query (a Query service call or a Decide goal) while it waits and runs."""

    task: str
    suffix: str
    max_new_tokens: int
    goal_handle: object | None = None          # the Decide goal (None: the Query service)
    on_token: Callable[[int], None] | None = None
    key: int | None = None                     # its place in the scheduler's queue
    started_s: float = 0.0                     # when its query started (monotonic)
    first_token_s: float | None = None
    done: Future = field(default_factory=Future)


def _settle(done: Future, query: Future) -> None:
    """Pass a query's outcome on to the future its caller waits on."""
    if done.done():
        return
    if query.cancelled():
        done.cancel()
    elif query.exception() is not None:
        done.set_exception(query.exception())
    else:
        done.set_result(query.result())


def _goal_key(goal_handle) -> bytes:
    return bytes(goal_handle.goal_id.uuid)


def _wait_for_cancel_state(goal_handle, timeout_s: float = 2.0) -> None:
    """rclpy marks a goal canceling right after the cancel callback returns, and that callback
    may have started the execution of a goal that was still waiting: wait for the mark."""
    deadline = time.monotonic() + timeout_s
    while not goal_handle.is_cancel_requested and time.monotonic() < deadline:
        time.sleep(0.01)


class _QueryWorker:
    """Runs queries one at a time on a daemon thread: a process that is stopped does not wait
    for a model to finish (a ThreadPoolExecutor's threads are joined at exit)."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="csr-policy-query", daemon=True)
        self._thread.start()

    def submit(self, fn) -> Future:
        future: Future = Future()
        self._queue.put((fn, future))
        return future

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered to whoever waits on the future
                future.set_exception(exc)

    def stop(self) -> None:
        while True:                        # cancel what has not started
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1].cancel()
        self._queue.put(None)


def _arguments(action) -> tuple[list[str], list[str], str]:
    """A typed action's argument names, values as text, and the arguments as typed JSON."""
    if action is None:
        return [], [], ""
    values = [v if isinstance(v, str) else json.dumps(v) for _, v in action.args]
    return [n for n, _ in action.args], values, action.arguments_json


def _header(node: Node):
    from std_msgs.msg import Header

    return Header(stamp=node.get_clock().now().to_msg())


def main(args=None) -> int:
    # Queries run on their own thread; a second executor thread keeps the Query service and
    # GetChunks answers flowing while chunks are folded.
    return run(PolicyNode, args=args, threads=4)


if __name__ == "__main__":
    raise SystemExit(main())
