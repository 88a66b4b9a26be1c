"""The policy node: decisions at rate_hz over the cached state, a managed (lifecycle) node.

    csr/chunks, csr/swaps ──▶ StateFold (gap-free; GetChunks for what it missed)
    csr/instant ───────────▶ latest value per source → dynamic suffix
    timer at rate_hz ──────▶ QueryScheduler: a query starts only if none is running
                             (skipped ticks are counted) → query worker thread
    query worker ──────────▶ the primary (its URL from the latest SwapEvent); not answered by
                             hedge_after_s, also the old primary (the state it holds since
                             that swap), the first answer wins → csr/decisions,
                             and the typed action of each valid decision → csr/actions, valid
                             until its query's start plus action_ttl_s
    DecisionWatchdog ──────▶ the safe action (safe_action, e.g. wait()) once on csr/actions when
                             no valid decision came for stale_after_s, the context would
                             overflow, or the node is deactivated (node_logic.watchdog)
    csr/query (service) ───▶ the same, on demand: queued behind the running query (and a
    csr/decide (action)      periodic one that fell due meanwhile); the action sends TTFT and
                             tokens as feedback, and a cancel stops it between two tokens
    /diagnostics ◀───────── TTFT, cache hits, version, skipped ticks, lost chunks, valid,
                             invalid and expired actions, the watchdog (1 Hz, every state)

Its lifecycle transitions and the parameters it takes at run time: docs/ros.md, "Managed
nodes (lifecycle)" and "Parameters".

The query runs on its own (daemon) thread, so the executor keeps folding chunks and answering
services while a model computes, and a shutdown does not wait for it: the running query is
abandoned and its answer never published. Inside all_in_one the node is given the in-process
reconciliation driver instead, which builds each request against its active version and
routes it.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Callable

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup

from csr_ros import ros_params
from csr_ros.action import Decide
from csr_ros.actions import SeenValues
from csr_ros.errors import (ActionSpecError, ConfigError, ContextOverflowError, CsrError,
                            QueryCancelledError)
from csr_ros.msg import Action, PolicyDecision, StateChunk
from csr_ros.msg import SwapEvent as SwapEventMsg
from csr_ros.node_logic.health import (OK, WARN, Announcer, QueryStats, diagnose,
                                       keep_up_warning)
from csr_ros.node_logic.schedule import MAX_WAITING_QUERIES, PERIODIC, QueryScheduler
from csr_ros.node_logic.stream import FetchRequest, StateFold, SwapEvent
from csr_ros.node_logic.suffix import InstantValue, build_suffix
from csr_ros.node_logic.watchdog import (Activated, Deactivated, Decided, DecisionWatchdog,
                                         Failed, GoSafe, Resumed, Tick, WatchdogConfig)
from csr_ros.nodes.common import (ACTIONS_QOS, CHUNKS_QOS, DECISIONS_QOS, INSTANT_QOS,
                                  SWAPS_QOS, ChunkFetcher, chunk_event, load_tokenizer, log_at,
                                  route_library_logging, run, time_msg, unroute_library_logging)
from csr_ros.nodes.managed import ManagedNode
from csr_ros.render import episode_origin_ns
from csr_ros.ros_params import state_from_params, vocabulary_from_params
from csr_ros.serial_worker import SerialWorker
from csr_ros.srv import Query
from csr_ros.waiting import wait_until


SUSPECT_RETRY_S = 30.0      # a suspect server is asked again (hedged) after this long


class PolicyNode(ManagedNode):
    def __init__(self, *, driver=None, **kwargs):
        super().__init__("policy", **kwargs)
        route_library_logging(self)
        self.driver = driver       # the reconciler node of this process (all_in_one), or None
        self.lock = threading.Condition()      # fold, scheduler, stats, watchdog, instant values
        self.epoch = 0            # +1 at each deactivation: older queries publish nothing
        self.accepting = False    # active: ticks and on-demand queries start queries
        self.last_routing_key: str | None = None   # what the last answered query was sent with
        self.reconciler_missing = False        # no reconciler on the swaps topic (said once)
        self.expired_actions = 0               # valid decisions that took longer than the TTL
        self.running_since_s: float | None = None   # the running query's start (monotonic)
        self._pending_commands: list = []      # the watchdog's, said under the lock
        self.safe = None                       # the safe action, parsed (None: none set)
        self.action_pub = None
        self.decision_pub = None
        self.fold: StateFold | None = None
        self.fetcher: ChunkFetcher | None = None
        self.worker: SerialWorker | None = None
        self.tick_timer = None
        self.decide_server = None
        self.demands: dict[int, _Demand] = {}     # on-demand queries waiting, by scheduler key
        self.goals: dict[bytes, _Demand] = {}      # Decide goals not finished, by goal id
        self.http_resources: dict[str, tuple[int, object]] = {}   # url → (version, resource)
        self.suspect_urls: dict[str, float] = {}   # url → since when a query there is late
        self.hedged_queries = 0
        # Events are folded one at a time; services and client answers may run alongside.
        self.events_group = MutuallyExclusiveCallbackGroup()
        self.service_group = ReentrantCallbackGroup()
        self.declare_schema("policy", list(ros_params.POLICY))
        self.bring_up()

    # -- lifecycle -----------------------------------------------------------------------------

    def configure(self) -> None:
        p = self.params = self.checked_params()
        self.robot_id = ros_params.robot_id_for(p["robot_id"], self.get_namespace())
        if p["resource.kind"] == "local" and self.driver is None:
            msg = ("policy: resource.kind 'local' runs the model inside the reconciler's process;"
                   " use `ros2 launch csr_ros all.launch.py` (all_in_one), or 'openai' servers")
            raise ConfigError(msg)
        self.check_changes({"temperature": p["temperature"]})
        self.safe = ros_params.check_safe_action("policy", p)     # None: no safe action
        self.watchdog = DecisionWatchdog(WatchdogConfig(p["stale_after_s"], p["safe_action"]))
        self.scheduler = QueryScheduler(rate_hz=p["rate_hz"])
        self.stats = QueryStats()      # its rate window opens with the first query
        self.keep_up = Announcer()     # logs when the policy or reconciliation falls behind
        self.instant: dict[str, InstantValue] = {}
        self.started_s = time.monotonic()
        if self.driver is None:
            self.tokenizer, self.model_dir = load_tokenizer(p)
            self.fold = StateFold(state_from_params(p, self.tokenizer),
                                  keep_previous_tokens=p["context_tokens"] - p["max_new_tokens"])
            self.fold.primary, self.fold.primary_url = "r1", p["resource.r1_url"]
        self.vocab = vocabulary_from_params(p)          # None: free text only
        self.seen = SeenValues.from_params(p["actions.seen"])
        self.seen_upto_seq = -1
        self.worker = SerialWorker("csr-policy-query")
        if self.driver is None:
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
        # lifecycle publishers: an inactive policy publishes nothing (but its safe action)
        self.decision_pub = self.create_lifecycle_publisher(
            PolicyDecision, p["topics.decisions"], DECISIONS_QOS)
        self.action_pub = self.create_lifecycle_publisher(Action, p["topics.actions"],
                                                          ACTIONS_QOS)
        self.query_srv = self.create_service(Query, p["services.query"], self.query_callback,
                                             callback_group=self.service_group)
        # A goal waits (accepted) for its turn, then executes: only the running goal holds an
        # executor thread, however many wait.
        self.decide_server = ActionServer(
            self, Decide, p["services.decide"], self.decide_execute_callback,
            goal_callback=self.guarded(self.decide_goal_callback,
                                       on_error=lambda exc, goal: GoalResponse.REJECT),
            handle_accepted_callback=self.guarded(self.decide_accepted_callback),
            cancel_callback=self.guarded(self.decide_cancel_callback,
                                         on_error=lambda exc, goal: CancelResponse.REJECT),
            callback_group=self.service_group)

    def activate(self) -> None:
        p = self.params
        with self.lock:
            self.accepting = True
            self.started_s = time.monotonic()
            self.stats.started_s = None             # the rate window opens again
            self.stats.decided_s.clear()
            self.watchdog.handle(Activated(now_s=time.monotonic()))
        self.tick_timer = self.create_timer(self.scheduler.period_s, self.tick_callback,
                                            callback_group=self.events_group)
        where = "in-process driver" if self.driver else \
            f"servers {p['resource.r1_url']}, {p['resource.r2_url']}"
        self.get_logger().info(f"deciding at {p['rate_hz']} Hz over {where}")

    def deactivate(self) -> None:
        """Stop deciding: no tick, the running query is abandoned (it stops at its next token
        and its answer is not published), waiting on-demand queries end; then the safe
        action."""
        with self.lock:
            self.accepting = False
            self.epoch += 1
            waiting = [self.demands.pop(key) for key in list(self.scheduler.waiting)
                       if key in self.demands]
            for key in list(self.scheduler.waiting):
                self.scheduler.withdraw(key)
            commands = self.watchdog.handle(Deactivated(now_s=time.monotonic()))
        if self.tick_timer is not None:
            self.destroy_timer(self.tick_timer)
            self.tick_timer = None
        for demand in waiting:
            _end(demand, CsrError("the policy node was deactivated"), waiting=True)
        self._watchdog_commands(commands)

    def release(self) -> None:
        """Stop deciding and close everything configure made: a running query is abandoned
        (its thread is a daemon; its answer is not published), queued ones are cancelled, and
        the Decide goals and Query calls that wait or run end at once with the reason."""
        with self.lock:
            self.accepting = False
            self.epoch += 1
            unfinished = list(self.demands.values()) + list(self.goals.values())
            self.demands = {}
        for demand in unfinished:     # their callers (a goal's execution, a service call) end
            _end(demand, CsrError("the policy node is shutting down"))
        if self.worker is not None:
            self.worker.stop(cancel_queued=True)
            self.worker = None
        if self.decide_server is not None:
            self.decide_server.destroy()
            self.decide_server = None
        for name in ("tick_timer", "fetch_timer", "probe_timer"):
            timer = getattr(self, name, None)
            if timer is not None:
                self.destroy_timer(timer)
                setattr(self, name, None)
        for name in ("chunks_sub", "swaps_sub", "instant_sub"):
            sub = getattr(self, name, None)
            if sub is not None:
                self.destroy_subscription(sub)
                setattr(self, name, None)
        for name in ("decision_pub", "action_pub"):
            pub = getattr(self, name, None)
            if pub is not None:
                self.destroy_lifecycle_publisher(pub)
                setattr(self, name, None)
        if getattr(self, "query_srv", None) is not None:
            self.destroy_service(self.query_srv)
            self.query_srv = None
        if self.fetcher is not None:
            self.destroy_client(self.fetcher.client)
            self.fetcher = None
        for _, resource in self.http_resources.values():
            resource.close()
        self.http_resources = {}
        with self.lock:                        # work_status reads it under the lock
            self.fold = None

    def check_changes(self, changes: dict) -> None:
        if changes.get("temperature", 0.0) and self.driver is not None:
            raise ConfigError("policy: temperature applies to the answers of servers (openai); "
                              "the in-process engines of all_in_one decode greedily")

    def parameters_changed(self, changes: dict) -> None:
        """Run-time parameters: each takes effect at its next use (the next tick, query or
        watchdog check)."""
        p = self.params
        with self.lock:
            if "rate_hz" in changes:
                self.scheduler.rate_hz = p["rate_hz"]
                if self.tick_timer is not None:
                    self.tick_timer.timer_period_ns = int(self.scheduler.period_s * 1e9)
            if "safe_action" in changes or "stale_after_s" in changes:
                self.safe = ros_params.check_safe_action("policy", p)
                self.watchdog.reconfigure(WatchdogConfig(p["stale_after_s"], p["safe_action"]))

    # -- state events --------------------------------------------------------------------------

    def chunk_callback(self, msg: StateChunk) -> None:
        with self.lock:
            if self.fold is None:              # taken just before the node was cleaned up
                return
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
            if self.fold is None:
                return
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
        if self.fold is None:                  # answered after the node was cleaned up
            return
        before = self.fold.lost
        restarts = self.fold.counters.stream_restarts
        first = int(response.first_available_seq)
        self._fetch(self.fold.on_fetched(events, first, stream=response.stream, probe=probe))
        self._stream_check(restarts)
        if self.fold.lost > before:
            self.get_logger().warning(
                f"{self.fold.lost - before} chunks are no longer available from the "
                f"aggregator (oldest it has: {response.first_available_seq}); skipped")

    def _fetch_failed(self) -> None:
        if self.fold is not None:
            self._fetch(self.fold.on_fetch_failed())

    def fetch_watchdog_callback(self) -> None:
        with self.lock:
            if self.fold.order.fetching is not None and \
                    self.fetcher.give_up_after(self.params["fetch_timeout_s"]):
                self._fetch_failed()

    # -- queries -------------------------------------------------------------------------------

    def tick_callback(self) -> None:
        driver_waits = ""
        if self.driver is not None:
            phase = self.driver.snapshot()["phase"]
            if phase in ("starting", "inactive"):
                # the in-process reconciler is loading its models, or is not active: nothing
                # to ask yet, and not a failed query (it says what it does itself)
                driver_waits = ("the in-process reconciler is loading its models"
                                if phase == "starting" else
                                "the in-process reconciler is not active")
        with self.lock:
            waiting = driver_waits
            if driver_waits:             # not this policy's shortfall: the rate window waits
                self.stats.started_s = None
                self.stats.decided_s.clear()
            if not waiting and self.running_since_s is not None:
                waiting = (f"the running query started "
                           f"{time.monotonic() - self.running_since_s:.1f} s ago")
            commands = self.watchdog.handle(Tick(now_s=time.monotonic(), waiting=waiting))
            if self.accepting and not driver_waits and self.scheduler.tick():
                self._start_periodic()
        self._watchdog_commands(commands)

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
            refused = f"the policy node is {self.lifecycle_state}" if not self.accepting else (
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
            if not self.accepting:
                raise CsrError(f"the policy node is {self.lifecycle_state}: it decides nothing until it "
                               "is active")
            if self.scheduler.full:
                raise CsrError(f"{MAX_WAITING_QUERIES} on-demand queries are waiting already; "
                               "try again later")
            demand.key = self.scheduler.enqueue()
            self.demands[demand.key] = demand
            self._start_granted()
        self._watchdog_commands([])
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
        while self.accepting:
            granted = self.scheduler.grant()
            if granted is None:
                return
            if granted == PERIODIC:
                if self._start_periodic():
                    return
                continue
            demand = self.demands.pop(granted)
            try:
                demand.started_s = time.monotonic()
                future = self._start_query(demand.task, demand.suffix, demand.max_new_tokens,
                                           on_token=demand.on_token)
            except Exception as exc:  # noqa: BLE001 - the slot is free again, the caller told
                self._start_failed(exc)
                demand.done.set_exception(exc)
                if demand.goal_handle is not None:
                    demand.goal_handle.execute()
                continue
            future.add_done_callback(functools.partial(_settle, demand.done))
            if demand.goal_handle is not None:
                demand.goal_handle.execute()
            return

    def _start_periodic(self) -> bool:
        """Under the lock, with the slot taken: a periodic query; False if it could not start
        (the slot is free again, the failure counted)."""
        try:
            self._start_query(self.params["task"], "", self.params["max_new_tokens"])
        except Exception as exc:  # noqa: BLE001 - a failed query, not a stuck slot
            self._start_failed(exc)
            self.get_logger().warning(f"query failed to start: {type(exc).__name__}: {exc}",
                                      throttle_duration_sec=5.0)
            return False
        return True

    def _start_failed(self, exc: Exception) -> None:
        """Under the lock: a query that could not start frees the slot and counts as failed."""
        self.running_since_s = None
        self.scheduler.finish(ok=False)
        error = f"{type(exc).__name__}: {exc}"
        self.stats.record_error(error)
        self._pending_commands += self.watchdog.handle(Failed(
            now_s=time.monotonic(), error=error, overflow=isinstance(exc, ContextOverflowError)))

    def _start_query(self, task: str, extra_suffix: str, max_new_tokens: int, *,
                     on_token: Callable[[int], None] | None = None) -> Future:
        """Under the lock, with the scheduler slot taken: build, then run on the worker.
        `on_token` follows the answer's tokens (and may stop it; see Decoder.query); a
        deactivation stops the query at its next token."""
        now_ns = self.get_clock().now().nanoseconds
        if self.stats.started_s is None:
            self.stats.started_s = time.monotonic()
        self.running_since_s = time.monotonic()
        on_token = functools.partial(self._progress, self.epoch, on_token)
        chunks = self.fold.state.chunks if self.driver is None else self.driver.active_chunks()
        suffix = build_suffix(self.instant, now_ns, stale_s=self.params["stale_instant_s"],
                              origin_ns=episode_origin_ns(chunks))
        if extra_suffix.strip():
            suffix += "\n" + extra_suffix.strip()
        bound, constraint = self._actions(chunks)
        answer = _Answer(task=task, max_new_tokens=max_new_tokens, started_ns=now_ns,
                         epoch=self.epoch, bound=bound, constraint=constraint, on_token=on_token,
                         ttl_s=self.params["action_ttl_s"])
        if self.driver is not None:
            job = functools.partial(self._query_driver, suffix, answer)
        else:
            url = self.fold.primary_url or self.params["resource.r1_url"]
            name = self.fold.primary or "r1"
            hedge = functools.partial(self._hedge_request, task, suffix)
            straight = time.monotonic() - self.suspect_urls.get(url, -SUSPECT_RETRY_S) < \
                SUSPECT_RETRY_S and hedge() or None
            if straight is not None:              # a suspect primary is not waited for
                request, url, name = straight
            else:
                request = self.fold.state.build_request(task=task, suffix=suffix)
            job = functools.partial(self._query_http, request, url, name, answer,
                                    self.params["temperature"],
                                    None if straight is not None else hedge)
        future = self.worker.submit(job)
        future.add_done_callback(self.guarded(self._query_done))
        return future

    def _progress(self, epoch: int, follow: Callable[[int], None] | None, n_tokens: int) -> None:
        """On the query's thread, after each token: stop if the node was deactivated since
        the query started (its answer would not be published anyway)."""
        if epoch != self.epoch:
            raise QueryCancelledError("the policy node was deactivated")
        if follow is not None:
            follow(n_tokens)

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

    def _query_http(self, request, url: str, name: str, answer: "_Answer",
                    temperature: float, hedge) -> PolicyDecision:
        """On the worker thread: answer on the primary server. Not answered by
        hedge_after_s, the query is asked on the other server too (`hedge()`: the request
        against the state it holds, its URL and name, or None), and the first answer wins;
        the other stops at its next token."""
        answered = threading.Event()
        calls = {self._call_http(request, url, name, answer, temperature, answered):
                 (request, url)}
        hedge_after_s = self.params["hedge_after_s"] if hedge is not None else 0.0
        error = None
        while calls:
            done, _ = futures_wait(list(calls), timeout=hedge_after_s or None,
                                   return_when=FIRST_COMPLETED)
            for future in done:
                asked, _ = calls.pop(future)
                try:
                    resource, result = future.result()
                except Exception as exc:  # noqa: BLE001 - the other call may still answer
                    error = error or exc
                    continue
                answered.set()
                self.last_routing_key = resource.last_routing_key
                return self._decision(asked, result, result.ttft_s, answer)
            if hedge_after_s:                  # late or failed: the other server too, once
                hedge_after_s = 0.0
                with self.lock:
                    self.suspect_urls[url] = time.monotonic()
                    other = hedge()
                    self.hedged_queries += other is not None
                if other is not None:
                    self.get_logger().warning(
                        f"query {request.query_id} on {url} " +
                        ("failed" if error is not None else "not answered after "
                         f"{self.params['hedge_after_s']:g} s") +
                        f": asked {other[1]} too (v{other[0].version}, the state it holds); "
                        f"{url} is suspect until it answers")
                    calls[self._call_http(*other, answer, temperature, answered)] = other[:2]
        raise error

    def _call_http(self, request, url: str, name: str, answer: "_Answer", temperature: float,
                   answered: threading.Event) -> Future:
        """One server call on a thread of its own: (resource, result). A call that answers
        (or stops at a token because the other answered) clears its server's suspicion."""
        def on_token(n_tokens: int) -> None:
            with self.lock:
                self.suspect_urls.pop(url, None)
            if answered.is_set():
                raise QueryCancelledError("the other server answered first")
            answer.on_token(n_tokens)

        def call():
            resource = self._http_resource(url, name, int(request.version))
            resource.temperature = temperature  # a run-time parameter: from this query on
            result = resource.query(request, max_new_tokens=answer.max_new_tokens,
                                    constraint=answer.constraint, on_token=on_token)
            return resource, result

        future: Future = Future()

        def run_call():
            try:
                future.set_result(call())
            except BaseException as exc:  # delivered to whoever waits on the future
                future.set_exception(exc)

        threading.Thread(target=run_call, name="csr-policy-call", daemon=True).start()
        return future

    def _hedge_request(self, task: str, suffix: str):
        """Under the lock: (request, url, name) against the state the old primary holds since
        the last swap, or None (no swap yet, the history ran past its context, a gap)."""
        fold = self.fold
        if fold is None or fold.previous is None or fold.previous_url in self.suspect_urls:
            return None
        request = fold.previous.build_request(task=task, suffix=suffix)
        return request, fold.previous_url, fold.previous_primary

    def _query_driver(self, suffix: str, answer: "_Answer") -> PolicyDecision:
        outcome = self.driver.query(answer.task, suffix=suffix,
                                    max_new_tokens=answer.max_new_tokens,
                                    constraint=answer.constraint, on_token=answer.on_token)
        if not outcome.ok:
            if outcome.error.startswith(ContextOverflowError.__name__):
                raise ContextOverflowError(outcome.error)
            raise CsrError(outcome.error)
        self.last_routing_key = self.driver.routing_key(outcome.result.resource)
        return self._decision(outcome.request, outcome.result, outcome.ttft_s, answer)

    def _http_resource(self, url: str, name: str, version: int):
        """One client per server and version: after a swap the committed run it tracks is
        another version's, so a fresh client starts from the server's cache state."""
        from csr_ros.resources.factory import make_resource

        with self.lock:
            cached = self.http_resources.get(url)
        if cached is not None and cached[0] == version:
            return cached[1]
        p = self.params
        # Not under the node's lock: connecting asks the server's health, which a hung
        # server answers only at the timeout, and the executor's callbacks need that lock.
        resource = make_resource("openai", url=url, name=name,
                                 model=p["resource.served_model"] or None,
                                 tokenizer=self.tokenizer, model_dir=self.model_dir,
                                 max_context_tokens=p["context_tokens"], robot_id=self.robot_id,
                                 read_timeout_s=p["resource.timeout_s"])
        with self.lock:
            replaced = self.http_resources.get(url)
            self.http_resources[url] = (version, resource)
        if replaced is not None:
            replaced[1].close()
        return resource

    def _decision(self, request, result, ttft_s: float, answer: "_Answer") -> PolicyDecision:
        decision_s = float(ttft_s) + float(result.decode_s)
        bound = answer.bound
        typed = None if bound is None else bound.decide(
            result.text, constrained=result.constrained, finish_reason=result.finish_reason,
            max_new_tokens=answer.max_new_tokens)
        action = typed.action if typed is not None else None
        names, values, arguments = _arguments(action)
        decision = PolicyDecision(
            stamp=time_msg(answer.started_ns), query_id=int(request.query_id),
            version=int(request.version), resource=result.resource, task=answer.task,
            text=result.text, ttft_s=float(ttft_s), decode_s=float(result.decode_s),
            static_tokens=request.n_static, dynamic_tokens=request.n_dynamic,
            extended_tokens=int(result.n_extended),
            cached_tokens=-1 if result.cached_tokens is None else int(result.cached_tokens),
            last_seq=int(request.last_seq or 0), truncated=result.finish_reason == "length",
            constrained=bool(result.constrained), decision_s=decision_s,
            valid=action is not None, action_name="" if action is None else action.name,
            arg_names=names, arg_values=values, arguments_json=arguments,
            error="no action vocabulary (actions.vocabulary)" if typed is None else typed.error)
        valid_until_ns = answer.started_ns + int(answer.ttl_s * 1e9)
        expired = ""
        if action is not None and self.get_clock().now().nanoseconds > valid_until_ns:
            expired = (f"expired: the decision took {decision_s:.2f} s, longer than "
                       f"action_ttl_s {answer.ttl_s:g} (it is not published on csr/actions)")
        with self.lock:
            self.stats.record(result, int(request.version), ttft_s=float(ttft_s),
                              now_s=time.monotonic())
            if typed is not None:
                self.stats.record_action(typed.valid, typed.error)
            if answer.epoch != self.epoch or not self.context.ok():
                return decision       # deactivated or shutting down: the answer is not published
            self.decision_pub.publish(decision)
            published = False
            if action is not None and not expired:
                self.action_pub.publish(Action(
                    stamp=decision.stamp, valid_until=time_msg(valid_until_ns),
                    query_id=decision.query_id, name=decision.action_name,
                    arg_names=decision.arg_names, arg_values=decision.arg_values,
                    arguments_json=decision.arguments_json,
                    constrained=decision.constrained, decision_s=decision_s))
                published = True
            self.expired_actions += bool(expired)
            # without a vocabulary the decision itself is the answer the watchdog waits for
            commands = self.watchdog.handle(Decided(
                now_s=time.monotonic(), valid=published or typed is None,
                error=expired or (typed.error if typed is not None else "")))
        self._watchdog_commands(commands)
        if typed is not None and not typed.valid:
            self.get_logger().warning(f"decision {decision.query_id} is not a valid action: "
                                      f"{typed.error}", throttle_duration_sec=5.0)
        if expired:
            self.get_logger().warning(f"decision {decision.query_id} {expired}",
                                      throttle_duration_sec=5.0)
        return decision

    def _query_done(self, future: Future) -> None:
        exc = None if future.cancelled() else future.exception()
        cancelled = isinstance(exc, QueryCancelledError)
        with self.lock:
            self.running_since_s = None
            self.scheduler.finish(ok=exc is None or cancelled)
            if exc is not None and not cancelled:
                error = f"{type(exc).__name__}: {exc}"
                self.stats.record_error(error)
                self._pending_commands += self.watchdog.handle(Failed(
                    now_s=time.monotonic(), error=error,
                    overflow=isinstance(exc, ContextOverflowError)))
            self.lock.notify_all()
            self._start_granted()
        self._watchdog_commands([])
        if exc is not None and not cancelled:
            self.get_logger().warning(f"query failed: {exc}", throttle_duration_sec=5.0)

    # -- the watchdog --------------------------------------------------------------------------

    def _watchdog_commands(self, commands: list) -> None:
        """Carry out what the watchdog said (also what it said under the lock, queued in
        `_pending_commands`): the safe action once, a warning with the cause; an info when
        valid decisions are back."""
        with self.lock:
            commands = self._pending_commands + list(commands)
            self._pending_commands = []
            for command in commands:
                if isinstance(command, GoSafe) and self.safe is not None and \
                        self.action_pub is not None and self.context.ok():
                    self.action_pub.publish(self._safe_action_msg(command.cause))
        for command in commands:
            if isinstance(command, GoSafe):
                what = (f"published the safe action {self.params['safe_action']}"
                        if self.safe is not None else "no safe_action is set")
                self.get_logger().warning(f"{what}: {command.cause}")
            elif isinstance(command, Resumed):
                self.get_logger().info(f"valid decisions again after {command.after_s:.1f} s" +
                                       ("; the safe action no longer holds"
                                        if self.safe is not None else ""))

    def _safe_action_msg(self, cause: str) -> Action:
        names, values, arguments = _arguments(self.safe)
        return Action(stamp=self.get_clock().now().to_msg(), query_id=0, name=self.safe.name,
                      arg_names=names, arg_values=values, arguments_json=arguments,
                      constrained=False, decision_s=0.0, safe=True, cause=cause)

    # -- health --------------------------------------------------------------------------------

    def work_status(self, now_s: float) -> tuple[int, str, list[tuple[str, str]]]:
        capacity = None
        if self.driver is not None:
            snap = self.driver.snapshot()
            capacity = self.driver.capacity()
        with self.lock:
            if self.driver is None and self.fold is None:      # being cleaned up
                return OK, "ok", []
            if self.driver is not None:
                view = {"version": snap["version"], "primary": snap["primary"],
                        "chunks": snap["n_chunks"], "next_seq": snap["next_seq"],
                        "static_tokens": snap["n_static_tokens"], "phase": snap["phase"],
                        "fallbacks": snap.get("fallbacks", 0), "swaps": snap.get("swaps", 0)}
                d = diagnose(view, self.scheduler, self.stats, now_s=now_s,
                             capacity=capacity.as_dict() if capacity is not None else None)
            else:
                d = diagnose(self.fold, self.scheduler, self.stats, now_s=now_s)
            said = None
            if self.accepting:             # an inactive policy is not expected to keep up
                said = self.keep_up.update(keep_up_warning(
                    self.stats, self.scheduler.rate_hz, now_s,
                    capacity=capacity.as_dict() if capacity is not None else None,
                    scheduler=self.scheduler), now_s)
            watch = self.watchdog.status(now_s)
        if said is not None:
            log_at(self.get_logger(), *said)
        level, message = d.level, d.message
        if self.driver is None and self._reconciler_missing() and level == OK:
            level, message = WARN, "no reconciler publishes " + self.params["topics.swaps"]
        if watch.message:            # the safe action holds: that, with its cause, first
            level, message = WARN, watch.message
        values = list(d.values) + list(watch.values)
        values.append(("expired_actions", str(self.expired_actions)))
        values.append(("hedged_queries", str(self.hedged_queries)))
        values.append(("suspect_servers", ", ".join(sorted(self.suspect_urls)) or "none"))
        if self.last_routing_key is not None:
            values.append(("routing_key", self.last_routing_key))
        return level, message, values

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
        try:
            super().close()
        finally:
            unroute_library_logging(self)


@dataclass(frozen=True)
class _Answer:
    """What a query's answer needs to become a decision, fixed when the query starts."""

    task: str
    max_new_tokens: int
    started_ns: int           # node clock: the decision's stamp
    epoch: int                # the node's epoch: a later one publishes nothing of it
    bound: object = None      # the vocabulary bound to the values seen (None: free text)
    constraint: object = None
    on_token: Callable[[int], None] | None = None
    ttl_s: float = 0.0        # action_ttl_s when it started


def _end(demand: "_Demand", exc: CsrError, *, waiting: bool = False) -> None:
    """End an on-demand query with `exc` (its caller is told). A `waiting` goal has not
    executed yet: it executes now, to report itself aborted."""
    try:
        demand.done.set_exception(exc)
    except InvalidStateError:     # it has just ended
        return
    if waiting and demand.goal_handle is not None:
        demand.goal_handle.execute()


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
    wait_until(lambda: goal_handle.is_cancel_requested, timeout_s, interval_s=0.01)


def _arguments(action) -> tuple[list[str], list[str], str]:
    """A typed action's argument names, values as text, and the arguments as typed JSON."""
    if action is None:
        return [], [], ""
    values = [v if isinstance(v, str) else json.dumps(v) for _, v in action.args]
    return [n for n, _ in action.args], values, action.arguments_json


def main(args=None) -> int:
    # Queries run on their own thread; a second executor thread keeps the Query service and
    # GetChunks answers flowing while chunks are folded.
    return run(PolicyNode, args=args, threads=4, label="policy")


if __name__ == "__main__":
    raise SystemExit(main())
