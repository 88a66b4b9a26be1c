"""The reconciler node: asynchronous state reconciliation over two resources.

    csr/chunks ──▶ SeqOrderer (gap-free; GetChunks for what it missed) ──▶ driver.add_chunk
    driver (ASR machine + one worker per resource): warms R2 with the evicted state, catches
    up, swaps ──▶ csr/swaps  SwapEvent (reliable, transient local, depth 1: a policy node that
                             starts later learns the current version and primary at once)

Start: the resources are built (servers are retried until `startup_timeout_s`, so the node may
start before vLLM has loaded its model), the history the aggregator already has is fetched,
then the driver loads the primary and a 'start' SwapEvent names it. With a chunk log the state
(chunks and version) is rebuilt from it first, so a restart continues where it stopped. A state
past tau_mem at the start (joining after a long history) is evicted first (see the machine).

A chunk of a new aggregator stream (restarted without its chunk log: seqs begin again) starts
a new version without the old stream's chunks ('stream' SwapEvent), logged and on
/diagnostics. The capacity check (eq. 54, from the first measurements) is logged when it says
reconciliation cannot keep up, with what to change, and is always on /diagnostics.
"""

from __future__ import annotations

import threading
import time

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup

from csr_ros import ros_params
from csr_ros.chunklog import ChunkLog, last_stream, rebuild_state
from csr_ros.errors import ChunkLogFullError, ConfigError, ResourceError
from csr_ros.eviction import make_policy
from csr_ros.msg import StateChunk, SwapEvent
from csr_ros.node_logic.stream import (ChunkEvent, Lost, SeqOrderer, Step, StreamTracker,
                                       add_lost_placeholders, add_or_placeholder, make_chunk)
from csr_ros.node_logic.swaps import TimedResource, swap_report
from csr_ros.node_logic.health import OK, WARN
from csr_ros.nodes.common import (CHUNKS_QOS, SWAPS_QOS, ChunkFetcher, chunk_event,
                                  load_tokenizer, node_python_logger, route_library_logging, run,
                                  unroute_library_logging)
from csr_ros.nodes.managed import ManagedNode
from csr_ros.reconcile.driver import Reconciler
from csr_ros.reconcile.machine import ReconcileConfig
from csr_ros.ros_params import state_from_params


class ReconcilerNode(ManagedNode):
    def __init__(self, **kwargs):
        super().__init__("reconciler", **kwargs)
        route_library_logging(self)
        self.lock = threading.RLock()          # orderer, state before the driver, publishing
        self.epoch = 0                         # +1 at each deactivation and cleanup
        self.chunk_log: ChunkLog | None = None
        self.resources: list | None = None
        self.driver: Reconciler | None = None
        self.order: SeqOrderer | None = None
        self.start_timer = None
        self.building = False                  # the start timer is building the resources
        self.chunks_sub = None
        self.timers_made: list = []
        self.events_group = MutuallyExclusiveCallbackGroup()
        self.client_group = ReentrantCallbackGroup()
        self.declare_schema("reconciler", list(ros_params.RECONCILER))
        self.bring_up()

    # -- lifecycle -----------------------------------------------------------------------------

    def configure(self) -> None:
        """Parameters checked, the tokenizer loaded, the chunk log opened and the state rebuilt
        from it (a restart continues where it stopped); the resources come up once active."""
        p = self.params = self.checked_params()
        self.robot_id = ros_params.robot_id_for(p["robot_id"], self.get_namespace())
        self.tokenizer, self.model_dir = load_tokenizer(p)
        if p["chunk_log"]:
            self.chunk_log = ChunkLog(p["chunk_log"],
                                      **ros_params.chunk_log_options(p, keep_state=True))
        state = state_from_params(p, self.tokenizer)
        if self.chunk_log is not None and self.chunk_log.records:
            state = rebuild_state(self.chunk_log.records, state)
        self.state = state                     # fed directly until the driver takes it over
        self.order = SeqOrderer(int(state.next_seq))
        self.streams = StreamTracker(last_stream(self.chunk_log.records)
                                     if self.chunk_log is not None else "")
        self.stream_restarts = 0
        self.capacity_said = None              # the last capacity verdict logged
        self.capacity_said_s = 0.0
        self.ops: list = []                    # load/extend timings of the resources
        self.urls: dict[str, str] = {}
        self.engines: dict[str, str] = {}       # resource -> how its local engine was chosen
        self.published_version: int | None = None
        self.catching_up = True                # until the aggregator's history is folded
        self.history_unasked = False           # started without GetChunks: ask once it is seen
        self.started_s = time.monotonic()
        self.lost_while_running = 0
        self.unlogged: list[ChunkEvent] = []   # before the start, while the chunk log is full
        # a lifecycle publisher: an inactive reconciler announces no version (the latched
        # last one stays with its subscribers)
        self.swaps_pub = self.create_lifecycle_publisher(SwapEvent, p["topics.swaps"],
                                                         SWAPS_QOS)
        self.fetcher = ChunkFetcher(self, p["services.get_chunks"], lock=self.lock,
                                    callback_group=self.client_group,
                                    on_fetched=self._fetched, on_failed=self._fetch_failed)

    def activate(self) -> None:
        p = self.params
        with self.lock:
            self.started_s = time.monotonic()      # startup_timeout_s counts from here
        self.chunks_sub = self.create_subscription(StateChunk, p["topics.chunks"],
                                                   self.chunk_callback, CHUNKS_QOS,
                                                   callback_group=self.events_group)
        if self.driver is None:
            # building resources blocks on the network or a model load: its own group, so
            # chunks keep flowing
            self.start_timer = self.create_timer(
                1.0, self.start_callback, callback_group=MutuallyExclusiveCallbackGroup())
        self.timers_made = [
            self.create_timer(1.0 / p["poll_hz"], self.poll_callback,
                              callback_group=self.events_group),
            self.create_timer(0.5, self.fetch_watchdog_callback,
                              callback_group=self.events_group)]
        with self.lock:
            if self.driver is not None and self.fetcher.client.service_is_ready():
                # active again: what the aggregator published meanwhile, before the next chunk
                self.fetcher.fetch(self.order.probe())
        version = self.state.version if self.driver is None else self.driver.snapshot()["version"]
        seq = self.order.next_seq
        self.get_logger().info(f"reconciling over {p['resource.kind']} resources from v"
                               f"{version}, seq {seq}")

    def deactivate(self) -> None:
        """Stop taking chunks (those that come meanwhile are fetched when it is active again).
        A reconciliation in progress finishes in the background; its version is announced
        once the node is active again."""
        with self.lock:
            self.epoch += 1
        for timer in self.timers_made + [self.start_timer]:
            if timer is not None:
                self.destroy_timer(timer)
        self.timers_made, self.start_timer = [], None
        if self.chunks_sub is not None:
            self.destroy_subscription(self.chunks_sub)
            self.chunks_sub = None
        if self.driver is not None:
            phase = self.driver.snapshot()["phase"]
            if phase != "idle":
                self.get_logger().info(f"a reconciliation is in progress ({phase}): it "
                                       "finishes in the background; its version is "
                                       "announced when the node is active again")

    def release(self) -> None:
        """Stop within a few seconds: a model computation that is still running is abandoned
        (the resource workers are daemon threads), not awaited."""
        with self.lock:
            self.epoch += 1
            driver, resources = self.driver, self.resources
            self.driver, self.resources = None, None
        if driver is not None:
            driver.close(timeout_s=1.0)
        if resources:
            closer = threading.Thread(target=_close_all, args=(resources,), name="csr-close",
                                      daemon=True)
            closer.start()
            closer.join(2.0)
            if closer.is_alive() and self.context.ok():
                self.get_logger().info("a model computation is still running; not waiting "
                                       "for it")
        if self.chunk_log is not None:
            self.chunk_log.close()
            self.chunk_log = None
        if getattr(self, "swaps_pub", None) is not None:
            self.destroy_lifecycle_publisher(self.swaps_pub)
            self.swaps_pub = None
        if getattr(self, "fetcher", None) is not None:
            self.destroy_client(self.fetcher.client)
            self.fetcher = None
        self.order = None
        self.state = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            unroute_library_logging(self)

    # -- start ---------------------------------------------------------------------------------

    def start_callback(self) -> None:
        """Retried every second: build the resources, fetch the history, start the driver. A
        resource that stays unreachable past startup_timeout_s, or a context the resources
        cannot hold, ends the bring-up (`give_up`: back to unconfigured, with the reason)."""
        p = self.params
        with self.lock:
            epoch = self.epoch
            if self.building:                  # a build from before a reactivation goes on
                return
            build = self.resources is None
            self.building = build
        if build:
            built = None
            try:
                built = self._build_resources()
            except ConfigError as exc:
                self._stop_starting(epoch)
                self.give_up(exc)
                return
            except ResourceError as exc:
                waited_s = time.monotonic() - self.started_s
                if waited_s > p["startup_timeout_s"]:
                    self._stop_starting(epoch)
                    self.give_up(ResourceError(
                        f"reconciler: the resources were unreachable for {waited_s:.0f} s "
                        f"(startup_timeout_s {p['startup_timeout_s']:g}): {exc}"))
                    return
                self.get_logger().warning(f"waiting for the resources: {exc}",
                                          throttle_duration_sec=15.0)
                return
            finally:
                with self.lock:
                    self.building = False
                    if built is not None and self.order is not None:
                        self.resources, built = built, None
                if built is not None:          # cleaned up while they were built
                    _close_all(built)
        with self.lock:
            if epoch != self.epoch or self.resources is None:
                return                         # deactivated meanwhile: the next activation
            if self.catching_up:
                if self.order.fetching is None and self.fetcher.client.service_is_ready():
                    self.fetcher.fetch(self.order.probe())
                elif not self.fetcher.client.service_is_ready() and \
                        time.monotonic() - self.started_s > 5.0:
                    self.get_logger().info("no GetChunks service; starting from live chunks "
                                           "(and asking it for the history once it is seen)")
                    self.catching_up = False
                    self.history_unasked = True
                if self.catching_up:
                    return
            self._stop_starting(epoch)
            self._start_driver()

    def _stop_starting(self, epoch: int) -> None:
        with self.lock:
            if epoch == self.epoch and self.start_timer is not None:
                self.start_timer.cancel()

    def _build_resources(self) -> list:
        from csr_ros.resources.factory import make_resource

        p = self.params
        names = ["r1", "r2"]
        built = []
        try:
            if p["resource.kind"] == "local":
                self.get_logger().info(f"loading the model {p['model']} for r1 and r2 (local, "
                                       "in this process); decisions start when both are loaded")
                for name in names:
                    built.append(make_resource("local", model=p["model"], name=name,
                                               threads=p["resource.threads"] or None,
                                               dtype=p["resource.dtype"],
                                               max_context_tokens=p["context_tokens"]))
            else:
                for name, url in zip(names, (p["resource.r1_url"], p["resource.r2_url"])):
                    # robot_id: the routing key of a pool behind a router (openai only; an
                    # in-process engine is this robot's alone)
                    built.append(make_resource(
                        "openai", url=url, name=name, model=p["resource.served_model"] or None,
                        tokenizer=self.tokenizer, model_dir=self.model_dir,
                        max_context_tokens=p["context_tokens"], robot_id=self.robot_id,
                        tau_mem_tokens=p["tau_mem_tokens"], read_timeout_s=p["resource.timeout_s"]))
                    self.urls[name] = url
            self._check_context(built)
            self._say_engines(built)
        except Exception:
            for resource in built:
                resource.close()
            raise
        return [TimedResource(r, self.ops, time.monotonic) for r in built]

    def _say_engines(self, built: list) -> None:
        """The local engines' backends and how `dtype auto` chose them, for /diagnostics."""
        from csr_ros.engine.calibration import describe

        self.engines = {r.name: describe(r.engine_choice) for r in built
                        if getattr(r, "engine_choice", None) is not None}
        for name, text in self.engines.items():
            self.get_logger().info(f"{name}: {text}")

    def _check_context(self, built: list) -> None:
        """The context_tokens parameter must fit every resource: name it and the server."""
        want = self.params["context_tokens"]
        short = [r for r in built if r.max_context_tokens < want]
        if not short:
            return
        where = ", ".join(f"{r.name} ({self.urls.get(r.name, 'in process')}) has "
                          f"{r.max_context_tokens}" for r in short)
        least = min(r.max_context_tokens for r in short)
        raise ConfigError(f"reconciler: context_tokens {want} is more than the resources' "
                          f"context: {where} tokens. Set context_tokens to at most {least} "
                          "(the policy's too), or start the server with a longer context "
                          "(llama.cpp --n-ctx, vLLM --max-model-len)")

    def _start_driver(self) -> None:
        """Under the lock: the driver takes over the state folded so far."""
        p = self.params
        config = ReconcileConfig(tau_mem_tokens=p["tau_mem_tokens"],
                                 max_context_tokens=p["context_tokens"],
                                 reserve_tokens=p["reserve_tokens"],
                                 n_catchup_tokens=p["n_catchup_tokens"],
                                 # a server's warm-up may take longer than one HTTP request
                                 # should: its timeout follows the measured prefill rate
                                 warm_timeout_s=p["resource.timeout_s"])
        if p["eviction.policy"] == "oldest_fraction":
            policy = make_policy("oldest_fraction", fraction=p["eviction.fraction"])
        else:
            policy = make_policy("keep_recent_tokens", keep_tokens=p["eviction.keep_tokens"])
        self.driver = Reconciler(self.state, self.resources, config, policy=policy,
                                 chunk_log=self.chunk_log, logger=node_python_logger(self))
        self.driver.start(wait=False)
        self.state = None                      # the driver's machine owns it now
        for event in self.unlogged:            # chunks the full chunk log could not take
            self._add(event)
        self.unlogged.clear()
        self._publish_version(reason="start")
        self.get_logger().info(f"started: v{self.published_version} on "
                               f"{self.driver.machine.primary}")

    # -- chunks --------------------------------------------------------------------------------

    def chunk_callback(self, msg: StateChunk) -> None:
        with self.lock:
            if self.order is None:             # taken just before the node was cleaned up
                return
            event = chunk_event(msg)
            if self._follow_stream(event.stream):
                self._apply(self.order.offer(event))

    def _follow_stream(self, stream: str) -> bool:
        """Under the lock: False for a chunk of a retired stream. A new stream starts a new
        version without the old stream's chunks (never a merge of two seq spaces)."""
        seen = self.streams.see(stream)
        if seen == "retired":
            return False
        if seen == "first" and self.chunk_log is not None:
            self.chunk_log.append_stream(stream)
        if seen != "new":
            return True
        self.stream_restarts += 1
        if self.driver is None:
            old = self.state
            self.state = old.evicted(len(old.chunks))
            self.state.next_seq = 0
            if self.chunk_log is not None:
                self.chunk_log.append_version(self.state.version, 0, 0, "stream")
            dropped = len(old.chunks)
        else:
            dropped = self.driver.snapshot()["n_chunks"]
            self.driver.new_stream()           # logs the version change in the chunk log
        if self.chunk_log is not None:
            self.chunk_log.append_stream(stream)
        self.order = SeqOrderer(0)
        self.get_logger().warning(
            f"the aggregator began a new chunk stream {stream} (restarted without its chunk "
            f"log; its seqs begin again at 0): a new version starts from it, without the "
            f"{dropped} chunks of the old stream. Give the aggregator a chunk_log to keep the "
            "history across its restarts")
        if self.driver is not None:
            self._publish_version(reason="stream")
        return True

    def _apply(self, step: Step) -> None:
        for item in step.items:
            if isinstance(item, Lost):
                self._lost(item)
            else:
                self._add(item)
        self.fetcher.fetch(step.fetch)

    def _add(self, event: ChunkEvent) -> None:
        if self.driver is None:
            if not self.unlogged:
                chunk, _ = make_chunk(self.state, event)
                try:
                    if self.chunk_log is not None:
                        self.chunk_log.append_chunk(chunk)
                    self.state.append(chunk)
                    return
                except ChunkLogFullError as exc:   # the orderer moved on: keep it, in order
                    self.get_logger().error(f"{exc}; chunk {event.seq} waits for the start")
            self.unlogged.append(event)            # the driver takes them (and holds them)
            return
        chunks, refused = add_or_placeholder(self.driver.add_chunk, event)
        if refused is not None:
            self.get_logger().warning(f"chunk {event.seq} refused ({refused}); a placeholder "
                                      "keeps its seq")
        assert chunks[-1].seq == event.seq, f"driver at seq {chunks[-1].seq}, event {event.seq}"

    def _lost(self, lost: Lost) -> None:
        if self.driver is None:
            self.state.next_seq = lost.end_seq   # before the start nothing depends on them
            self.get_logger().warning(f"chunks {lost.start_seq}..{lost.end_seq - 1} are no "
                                      "longer available; starting after them")
            return
        # The running machine cannot skip seqs: each lost one becomes a short placeholder.
        self.lost_while_running += lost.end_seq - lost.start_seq
        self.get_logger().error(f"chunks {lost.start_seq}..{lost.end_seq - 1} lost while "
                                "running; placeholders keep the seq")
        add_lost_placeholders(self.driver.add_chunk, lost)

    # -- GetChunks -----------------------------------------------------------------------------

    def _fetched(self, events: list[ChunkEvent], response, probe: bool) -> None:
        """Under the lock: order a GetChunks answer."""
        if self.order is None:                 # answered after the node was cleaned up
            return
        for stream in {response.stream} | {e.stream for e in events}:
            if not self._follow_stream(stream):       # an answer about a retired stream
                self._fetch_failed()
                return
        first = int(response.first_available_seq)
        self._apply(self.order.fetched_all(events, first) if probe
                    else self.order.fetched(events, first))
        if self.catching_up and self.order.fetching is None and \
                self.order.next_seq >= int(response.next_seq):
            self.catching_up = False       # the history is in; start_callback starts

    def _fetch_failed(self) -> None:
        if self.order is not None:
            self._apply(self.order.fetch_failed())

    def fetch_watchdog_callback(self) -> None:
        with self.lock:
            if self.history_unasked and self.driver is not None and \
                    self.order.fetching is None and self.fetcher.client.service_is_ready():
                # Discovery on a loaded machine can take longer than the start waits: what the
                # aggregator published before this node subscribed is fetched now, not lost.
                self.history_unasked = False
                self.get_logger().info("GetChunks is there now: fetching what the aggregator "
                                       f"holds from seq {self.order.next_seq}")
                self.fetcher.fetch(self.order.probe())
                return
            if self.order.fetching is None or not self.fetcher.give_up_after(5.0):
                return
            self._fetch_failed()
            if self.catching_up and self.order.fetching is None:
                self.catching_up = False

    # -- swaps ---------------------------------------------------------------------------------

    def poll_callback(self) -> None:
        if self.driver is None:
            return
        with self.lock:
            if self.driver is None:
                return
            version = self.driver.snapshot()["version"]
            if version != self.published_version:
                reason = next((e.kind for e in reversed(self.driver.timeline)
                               if e.kind in ("swap", "sync", "fallback", "failover", "join",
                                             "stream")), "swap")
                self._publish_version(reason=reason)

    def _publish_version(self, *, reason: str) -> None:
        snapshot = self.driver.snapshot()
        swaps = self.driver.swaps
        committed = len(swaps[-1].committed_ids) if reason == "swap" and swaps else None
        window = self.driver.windows[-1] if self.driver.windows else None
        report = swap_report(snapshot, reason=reason, committed_tokens=committed, window=window,
                             ops=list(self.ops))
        msg = SwapEvent(stamp=self.get_clock().now().to_msg(), version=report.version,
                        reason=report.reason, primary=report.primary,
                        primary_url=self.urls.get(report.primary, ""),
                        evicted_before_seq=report.evicted_before_seq,
                        caught_up_to_seq=report.caught_up_to_seq,
                        static_tokens=report.static_tokens, window_s=report.window_s,
                        warmup_s=report.warmup_s, catchup_s=report.catchup_s,
                        catchup_rounds=report.catchup_rounds, stream=self.streams.current)
        self.swaps_pub.publish(msg)
        self.published_version = report.version
        self.get_logger().info(f"v{report.version} ({reason}) on {report.primary}: chunks from "
                               f"{report.evicted_before_seq}, {report.static_tokens} static "
                               f"tokens, warm-up {report.warmup_s:.2f} s, catch-up "
                               f"{report.catchup_s:.2f} s in {report.catchup_rounds} rounds")

    # -- in-process use (all_in_one) and health ------------------------------------------------

    def query(self, task: str, *, suffix: str = "", max_new_tokens: int = 8, constraint=None,
              on_token=None):
        """For a policy node in the same process: build and route against the active version
        (an inactive reconciler takes no chunks: its state would be stale)."""
        driver = self.driver
        if driver is None:
            raise ResourceError("the reconciler has not started its resources yet")
        if not self.active:
            raise ResourceError(f"the reconciler is {self.lifecycle_state}")
        return driver.query(task, suffix=suffix, max_new_tokens=max_new_tokens,
                            constraint=constraint, on_token=on_token)

    def routing_key(self, name: str) -> str | None:
        """The routing key resource `name` sends now (None: no robot_id, or a local one)."""
        resource = next((r for r in self.resources or [] if r.name == name), None)
        if resource is None or not resource.capabilities.routing_key:
            return None
        return resource.routing_key

    def active_chunks(self) -> list:
        """The chunks of the active version (for a policy node in the same process)."""
        driver = self.driver
        return [] if driver is None else list(driver.machine.active.chunks)

    def capacity(self):
        """Eq. 54 from the measurements so far; None before the driver runs."""
        driver = self.driver
        return None if driver is None else driver.capacity()

    def snapshot(self) -> dict:
        """The driver's snapshot; its phase is 'starting' until the resources are up and
        'inactive' while the node is not active (a policy in the same process waits then)."""
        driver, order = self.driver, self.order
        if driver is None:
            snap = {"version": -1, "primary": "-", "n_chunks": 0,
                    "next_seq": order.next_seq if order is not None else 0,
                    "n_static_tokens": 0, "phase": "starting"}
        else:
            snap = driver.snapshot()
        if not self.active:
            snap["phase"] = "inactive"
        return snap

    def work_status(self, now_s: float) -> tuple[int, str, list[tuple[str, str]]]:
        snap = self.snapshot()
        level = OK
        message = snap["phase"]
        if self.driver is None:
            level, message = WARN, "waiting for the resources"
        elif snap.get("fallbacks") or self.lost_while_running:
            level = WARN
            message = (f"{snap.get('fallbacks', 0)} synchronous fallbacks, "
                       f"{self.lost_while_running} chunks lost")
        capacity = self.capacity()
        if capacity is not None and capacity.viable is False:
            level, message = WARN, capacity.message
            now_s = time.monotonic()
            if self.capacity_said is not False or now_s - self.capacity_said_s > 60.0:
                self.get_logger().warning(capacity.message)
                self.capacity_said_s = now_s
        elif capacity is not None and capacity.viable and self.capacity_said is not True:
            self.get_logger().info(capacity.message)
        if capacity is not None:
            self.capacity_said = capacity.viable
        if self.stream_restarts:
            level = WARN
            message = (f"the aggregator restarted without its chunk log "
                       f"{self.stream_restarts} time(s); the state restarted with its new "
                       f"stream ({message})")
        values = [(k, str(v)) for k, v in snap.items()]
        values += [("stream", self.streams.current or "-"),
                   ("stream_restarts", str(self.stream_restarts))]
        values += [(f"engine.{name}", text) for name, text in sorted(self.engines.items())]
        for name in sorted(r.name for r in self.resources or []):
            key = self.routing_key(name)
            if key is not None:
                values.append((f"routing_key.{name}", key))
        if capacity is not None:
            values += [(f"capacity.{k}", str(v))
                       for k, v in capacity.as_dict().items() if k != "message"]
        return level, message, values


def _close_all(resources) -> None:
    for resource in resources:
        resource.close()


def main(args=None) -> int:
    return run(ReconcilerNode, args=args, threads=4, label="reconciler")


if __name__ == "__main__":
    raise SystemExit(main())
