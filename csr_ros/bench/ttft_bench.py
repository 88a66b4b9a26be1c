"""TTFT of CSR queries against the unordered baseline, and capsule timings (`csr-ros bench`).

    report = run_bench(BenchSettings(kinds=("local", "openai"), urls=(url,), ns=(512, 1024)))
    print(format_table(report["rows"], report["summary"]))        # csr_ros.bench.bench_report

For every static length N and dynamic length M, on every resource:
  csr        the static prompt is loaded once (prefix cached); each query pays only its M tokens
  unordered  the dynamic tokens come first, so nothing is cached: every query prefills N + M
  capsule    (local only) snapshot and restore of the complete execution state at N
Per resource and N also the cold prefill (tokens/s) and greedy decode speed (tokens/s, EOS
suppressed). With several resources their timed repeats run in turn (a decode or CSR repeat of
one, then the same of the next: `interleaved`). The prompt is real text: rendered synthetic
robot observations in the model's chat template, tokenized with the model's tokenizer and
assembled by CsrState. Every query carries a fresh dynamic part (a new time stamp), so a
server cannot serve it from its cache either. Eight short warm-up answers per resource are
left out of the timings (a llama.cpp server is at speed only after several). Progress goes to
stderr.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
import time
from dataclasses import dataclass

from csr_ros.bench.bench_report import capsule_row, prefill_row, summarize, ttft_row
from csr_ros.engine.calibration import describe as describe_choice
from csr_ros.errors import ConfigError
from csr_ros.model_store import DEFAULT_MODEL, resolve_model_dir
from csr_ros.state import QueryId, Request, Version

TASK = "Pick the next action from the menu and answer with its number only."
MENU = ("Actions: 1 go_to(room) 2 pick(object) 3 place(object, room) 4 say(text) "
        "5 look_around 6 wait(seconds) 7 follow(person) 8 stop.")
CAPSULE_MIN_REPEATS = 15
DECODE_TOKENS = 16
# Warm-up answers per resource before anything is timed. llama-cpp-python's server decodes at
# half its speed for its first half-dozen answers (measured at N=1024 on 2 cores: 20-31 tokens/s,
# then 55-70, whether or not it had idled a minute first), so one warm-up query timed a server
# that was not yet at speed.
WARMUP_QUERIES = 8
WARMUP_STATIC_TOKENS = 64
ROOMS = ("kitchen", "hallway", "office", "bedroom", "garage")
OBJECTS = ("red_mug", "apple", "keys", "book", "phone", "towel")
BACKENDS = ("auto", "torch", "llamacpp")


@dataclass(frozen=True)
class BenchSettings:
    """The resources to measure and the cells: every static length in `ns` with every dynamic
    length in `ms`, `repeats` timed queries each (the median is reported)."""
    kinds: tuple[str, ...] = ("local",)        # local, openai
    backends: tuple[str, ...] = ("auto",)      # local engines; each after the first: local-<b>
    urls: tuple[str, ...] = ()                 # openai servers; each after the first: openai-<i>
    model: str = DEFAULT_MODEL                 # weights (local) and tokenizer (every resource)
    ns: tuple[int, ...] = (512, 1024)
    ms: tuple[int, ...] = (32,)
    repeats: int = 3
    max_new_tokens: int = 1                    # per query (TTFT needs only the first)
    unordered: bool = True                     # also the unordered baseline
    threads: int | None = None                 # the local engine's
    device: str = "cpu"
    dtype: str = "auto"
    decode_weights: str = "auto"
    decode_threads: int | None = None
    forward: str = "auto"

    def __post_init__(self):
        if not self.backends or any(b not in BACKENDS for b in self.backends):
            raise ConfigError(f"--backend takes auto, torch, llamacpp (comma-separated), got "
                              f"{','.join(self.backends)!r}")
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be >= 1, got {self.repeats}")
        if "openai" in self.kinds and not self.urls:
            raise ConfigError("--resource openai needs --url (the server's base URL)")

    @property
    def resources(self) -> list[str]:
        """The resources' names: each kind, then one per further local backend and server."""
        kinds = list(self.kinds)
        if "local" in kinds:
            at = kinds.index("local") + 1
            kinds[at:at] = [f"local-{b}" for b in self.backends[1:]]
        if "openai" in kinds:
            at = kinds.index("openai") + 1
            kinds[at:at] = [f"openai-{i}" for i in range(2, len(self.urls) + 1)]
        return kinds


def run_bench(settings: BenchSettings) -> dict:
    """Every resource measured (side by side); {"rows", "meta", "summary"}, JSON-ready."""
    from csr_ros.layout import Layout
    from csr_ros.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(resolve_model_dir(settings.model, weights=False))
    layout = Layout.from_tokenizer(tokenizer)
    rows: list[dict] = []
    engines: dict[str, dict] = {}
    started = time.perf_counter()
    resources = []
    try:
        for kind in settings.resources:
            resource = resource_for(kind, settings)
            resources.append(resource)
            if resource.capabilities.capsules:           # an in-process engine
                engine = resource.engine
                engines[resource.name] = {"precision": engine.precision,
                                          "forward": engine.forward_kind,
                                          "decode_threads": engine.decode_threads,
                                          "device": str(engine.device),
                                          "choice": resource.engine_choice}
                _progress(f"[{resource.name}] {engine.precision}, {engine.forward_kind} forward; "
                          f"{describe_choice(resource.engine_choice)}")
        rows = interleaved([bench_phases(resource, tokenizer, layout, ns=list(settings.ns),
                                         ms=list(settings.ms), repeats=settings.repeats,
                                         max_new_tokens=settings.max_new_tokens,
                                         unordered=settings.unordered)
                            for resource in resources])
    finally:
        for resource in resources:
            resource.close()
    meta = _meta(settings, time.perf_counter() - started)
    meta["engines"] = engines
    return {"rows": rows, "meta": meta, "summary": summarize(rows)}


def interleaved(phases: list) -> list[dict]:
    """Run several resources' phases in turn (one step of each, then the next). A timed
    repeat is one step, so the same figure of two resources is taken in pairs seconds apart,
    one repeat of each in turn: on a shared machine whose speed drifts, the load then weighs on
    both sides of a ratio alike."""
    rows: list[dict] = []
    active = list(phases)
    while active:
        for phase in list(active):
            try:
                rows += next(phase)
            except StopIteration:
                active.remove(phase)
    return rows


def bench_phases(resource, tokenizer, layout, *, ns: list[int], ms: list[int], repeats: int,
                 max_new_tokens: int = 1, unordered: bool = True,
                 decode_tokens: int | None = None):
    """All rows for one resource (any `Resource`; capsules where it has an engine), one step at
    a time: yields after every timed repeat of decode and of CSR queries (an empty list until
    the figure's last repeat, then its row), and after the cold prefill, the capsules at one N
    and the unordered queries at one (N, M), for `interleaved`."""
    name = resource.name
    decode_tokens = decode_tokens or max(max_new_tokens, DECODE_TOKENS)
    need = max(ns) + max(ms) + max(max_new_tokens, decode_tokens)
    if need > resource.max_context_tokens:
        msg = (f"{name}: N + M + max_new_tokens = {need} exceeds its context of "
               f"{resource.max_context_tokens} tokens; lower --n or --m")
        raise ConfigError(msg)
    mode = resource.state_mode
    prompts = PromptMaker(tokenizer, layout, mode=mode, n_max=max(ns))
    rows: list[dict] = []
    query_no = 0

    def fresh_dynamic(m: int) -> tuple[tuple[int, ...], str]:
        nonlocal query_no
        query_no += 1
        return prompts.dynamic(m, query_no)

    # Warm-up (not timed): first forwards allocate and initialize kernels, and a server comes up
    # to speed (WARMUP_QUERIES). It uses the unordered layout (dynamic tokens first) over a short
    # static part, which shares no prefix with the timed prompts, so a server's prefix cache
    # cannot make the first "cold prefill" below look free.
    _progress(f"[{name}] warm-up ({WARMUP_QUERIES} short answers)")
    static, static_text = prompts.static(min(min(ns), WARMUP_STATIC_TOKENS))
    resource.load((), "")
    for _ in range(WARMUP_QUERIES):
        resource.query(prompts.unordered(*fresh_dynamic(min(ms)), static, static_text),
                       max_new_tokens=max(max_new_tokens, decode_tokens))
    for n in ns:
        static, static_text = prompts.static(n)
        loaded = resource.load(static, static_text)
        _progress(f"[{name}] N={n}: cold prefill {loaded.seconds:.3f} s")
        yield []
        rates = []
        for repeat in range(repeats):
            rate = _decode_rate(resource, tokenizer,
                                prompts.request(static, static_text, *fresh_dynamic(min(ms))),
                                decode_tokens)
            if rate is not None:
                rates.append(rate)
            if repeat < repeats - 1:
                yield []                # the other resources' repeat of the same figure
        rows.append(prefill_row(name, n, loaded.seconds, rates))
        if rates:
            _progress(f"[{name}] N={n}: decode {rows[-1]['decode_tokens_per_s']:.1f} tokens/s")
        yield rows
        rows = []
        for m in ms:
            samples, cached = [], []
            for repeat in range(repeats):
                result = resource.query(prompts.request(static, static_text, *fresh_dynamic(m)),
                                        max_new_tokens=max_new_tokens)
                assert result.n_extended == 0, f"{name}: CSR query prefilled static tokens"
                samples.append(result.ttft_s)
                cached.append(result.cached_tokens)
                if repeat < repeats - 1:
                    yield []
            rows.append(ttft_row(name, n, m, "csr", samples))
            rows[-1]["cached_tokens"] = cached      # per query, as the resource reports it
            _progress(f"[{name}] N={n} M={m}: CSR TTFT median {rows[-1]['ttft_median_s']:.3f} s")
            yield rows
            rows = []
        if resource.capabilities.capsules:
            rows.append(_capsule_timings(name, resource.engine, n, repeats))
            _progress(f"[{name}] N={n}: capsule restore median "
                      f"{rows[-1]['restore_median_s'] * 1e3:.3f} ms")
            yield rows
            rows = []
        if not unordered:
            continue
        for m in ms:
            samples, cached = [], []
            for _ in range(repeats):
                dynamic, dynamic_text = fresh_dynamic(m)
                resource.load((), "")        # nothing committed: the whole prompt is new
                request = prompts.unordered(dynamic, dynamic_text, static, static_text)
                result = resource.query(request, max_new_tokens=max_new_tokens)
                samples.append(result.ttft_s)
                cached.append(result.cached_tokens)
            rows.append(ttft_row(name, n, m, "unordered", samples))
            rows[-1]["cached_tokens"] = cached
            _progress(f"[{name}] N={n} M={m}: unordered TTFT median "
                      f"{rows[-1]['ttft_median_s']:.3f} s")
            yield rows
            rows = []


def _decode_rate(resource, tokenizer, request: Request,
                 n_tokens: int = DECODE_TOKENS) -> float | None:
    """Greedy decode speed on the cached state, tokens/s after the first token.

    End-of-sequence tokens are suppressed so every resource decodes the same `n_tokens`: the
    in-process engine is asked with no EOS ids, an OpenAI-compatible server with a -100 logit
    bias on them. A server that ignores the bias and stops early is timed on what it sent."""
    if resource.capabilities.capsules:
        # The bench has just loaded the request's static part: only its dynamic part is new.
        result = resource.engine.query(request.dynamic_ids, n_tokens, eos_ids=())
        n = len(result.token_ids)
    else:                                            # an OpenAI resource (resource_for)
        extra = resource.extra_body
        eos = tokenizer.eos_token_ids
        resource.extra_body = {**extra, "logit_bias": {str(i): -100 for i in eos}}
        try:
            result = resource.query(request, max_new_tokens=n_tokens)
        finally:
            resource.extra_body = extra
        n = n_tokens if result.finish_reason == "length" else len(result.token_ids)
    if n < 2 or result.decode_s <= 0:
        return None
    return (n - 1) / result.decode_s


def _capsule_timings(name: str, engine, n: int, repeats: int) -> dict:
    """Snapshot at N; restore after the state moved on (attached: O(1) K/V), and restore of a
    materialized copy (K/V copied into the buffers). Sub-millisecond figures are noisy, so at
    least CAPSULE_MIN_REPEATS are taken (they are cheap)."""
    repeats = max(repeats, CAPSULE_MIN_REPEATS)
    snapshot_s, restore_s, copy_s = [], [], []
    capsule = engine.snapshot()
    kept = capsule.materialize()
    extra = list(capsule.token_ids[-8:])
    for _ in range(repeats):
        t0 = time.perf_counter()
        capsule = engine.snapshot()
        snapshot_s.append(time.perf_counter() - t0)
        engine.extend(extra)                         # the state moves on (not timed)
        t0 = time.perf_counter()
        engine.restore(capsule)
        restore_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        engine.restore(kept)
        copy_s.append(time.perf_counter() - t0)
    assert engine.n_committed == n, f"restore left {engine.n_committed} tokens, expected {n}"
    kv_bytes = kept.kv_nbytes()
    return capsule_row(name, n, snapshot_s, restore_s, copy_s, kv_bytes)


class PromptMaker:
    """Static and dynamic token runs of exact lengths from rendered robot observations."""

    def __init__(self, tokenizer, layout, *, mode: str, n_max: int):
        from csr_ros.render import render_plain
        from csr_ros.state import CsrState

        profile = ("You are the policy of a home robot. You see its observations as lines of "
                   "text, oldest first, and choose one action at a time. " + MENU)
        self.state = CsrState(tokenizer=tokenizer, layout=layout, profile=profile, mode=mode)
        self.tokenizer, self.layout, self.mode = tokenizer, layout, mode
        i = 0
        while self.state.n_static < n_max:
            t_s = 0.5 * i
            room, obj = ROOMS[(i // 7) % len(ROOMS)], OBJECTS[(i * 5) % len(OBJECTS)]
            kind = i % 4
            if kind == 0:
                plain = {"x": 0.37 * (i % 29), "y": 0.21 * (i % 17), "yaw_deg": (13 * i) % 360,
                         "speed_mps": 0.1 * (i % 6), "room": room}
                label = "odometry"
            elif kind == 1:
                plain = {"detections": f"{obj} 0.{80 + i % 19} at {1 + i % 4}.{i % 10} m, person "
                                       f"0.{70 + i % 23}", "room": room}
                label = "camera"
            elif kind == 2:
                plain = {"ranges_min_m": 0.3 + 0.07 * (i % 20),
                         "ranges_mean_m": 2.1 + 0.05 * (i % 9), "n": 720}
                label = "lidar"
            else:
                plain = {"action": f"go_to({room})", "status": "succeeded" if i % 3 else "running",
                         "battery_pct": 100 - (i // 10) % 80}
                label = "action"
            self.state.add(f"[t={t_s:.1f}s] " + render_plain(plain, label=label),
                           source=label, stamp_ns=int(t_s * 1e9))
            i += 1

    def static(self, n: int) -> tuple[tuple[int, ...], str | None]:
        ids = tuple(self.state.static_ids[:n])
        return ids, (self.tokenizer.decode(ids) if self.mode == "text" else None)

    def dynamic(self, m: int, query_no: int) -> tuple[tuple[int, ...], str | None]:
        """M tokens: a fresh time stamp first (so no cache can hold them), the task, the tail.

        The very first token changes from one query to the next (the query number's last digit),
        so even an M=1 unordered prompt shares no prefix with the one before it."""
        tail = self.layout.tail_ids
        ids = self.tokenizer.encode_data(f"{query_no % 10} now: t={1000 + 0.5 * query_no:.1f}s, "
                                         f"query {query_no}. {TASK}")
        filler = self.tokenizer.encode_data(f" note {query_no}: all systems nominal.")
        while len(ids) + len(tail) < m:
            ids += filler
        ids = (ids[:m - len(tail)] + list(tail)) if m > len(tail) else ids[:m]
        ids = tuple(ids)
        return ids, (self.tokenizer.decode(ids) if self.mode == "text" else None)

    def request(self, static, static_text, dynamic, dynamic_text) -> Request:
        return Request(query_id=QueryId(0), version=Version(0), static_ids=static,
                       dynamic_ids=dynamic, i_star=0, last_seq=None, static_text=static_text,
                       dynamic_text=dynamic_text)

    def unordered(self, dynamic, dynamic_text, static, static_text) -> Request:
        text = None if static_text is None else dynamic_text + static_text
        return Request(query_id=QueryId(0), version=Version(0), static_ids=(),
                       dynamic_ids=dynamic + static, i_star=0, last_seq=None,
                       static_text=None if text is None else "", dynamic_text=text)


def resource_for(kind: str, settings: BenchSettings):
    """The resource named `kind` (one of `settings.resources`)."""
    from csr_ros.resources.factory import make_resource

    s = settings
    if kind == "local" or kind.startswith("local-"):
        backend = s.backends[0] if kind == "local" else kind[len("local-"):]
        options = dict(model=s.model, name=kind, threads=s.threads, device=s.device,
                       dtype=s.dtype, forward=s.forward, decode_weights=s.decode_weights,
                       decode_threads=s.decode_threads)
        return make_resource("local", **{**options, **_backend_options(backend, s.dtype)})
    if kind == "openai" or kind.startswith("openai-"):
        url = s.urls[0] if kind == "openai" else s.urls[int(kind[len("openai-"):]) - 1]
        return make_resource("openai", url=url, name=kind,
                             model_dir=resolve_model_dir(s.model, weights=False))
    return make_resource(kind)      # raises ConfigError naming the known kinds


def _backend_options(backend: str, dtype: str) -> dict:
    """The llama.cpp backend takes no torch settings (its dtype is the GGUF's); auto is
    resolved by the resource (`calibration.resolve`)."""
    if backend != "llamacpp":
        return {"backend": backend}
    return {"backend": "llamacpp", "dtype": None, "forward": "auto", "decode_weights": "auto"}




def _meta(s: BenchSettings, seconds: float) -> dict:
    kinds = s.resources
    meta = {"resources": kinds, "model": s.model, "n": list(s.ns), "m": list(s.ms),
            "repeats": s.repeats, "max_new_tokens": s.max_new_tokens, "threads": s.threads,
            "device": s.device, "dtype": s.dtype, "backend": ",".join(s.backends),
            "url": ",".join(s.urls) or None,
            "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "wall_s": seconds}
    if any(k == "local" or k.startswith("local-") for k in kinds):
        import torch
        import transformers

        from csr_ros.engine import precision

        meta.update(torch=torch.__version__, transformers=transformers.__version__,
                    torch_threads=torch.get_num_threads(), cpu=precision.describe())
    return meta


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
