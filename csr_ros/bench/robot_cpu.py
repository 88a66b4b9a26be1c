"""The robot side's CPU cost per chunk and per decision, to size a robot computer
(docs/benchmarks.md, "The robot side's CPU").

CPU seconds of this process (`time.process_time`: every thread of it; the server's are its
own), so waiting for the server costs nothing and a loaded machine changes little:

- aggregator: a patrol bag's messages, read into memory first (deserializing is rclpy's job on
  a robot), through the aggregator's Emitter (`bag_replay.replay_chunks`): per message and per
  chunk it makes;
- policy, per chunk: the chunk folded into its CsrState (checked, tokenized);
- policy, per decision, every 1/rate_hz of bag time: the vocabulary's constraint, the request
  built, the HTTP query to an OpenAI-compatible server (body, stream, parse) and the answer
  decided into a typed action. At tau_mem the oldest half is evicted, as the reconciler does.
"""

from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path

from csr_ros.stats import percentile

# The policy's and reconciler's defaults in config/csr_ros.yaml.
VOCABULARY = ("wait()", "stop()", "look_around()", "move(direction: forward|backward|left|right)",
              "turn(direction: left|right)", "say(text: str)")
TASK = "Decide the robot's next action."
PROFILE = "You are the decision policy of a home robot on patrol.\n"
TAU_MEM_TOKENS = 6144


def _cpu(fn, *args, **kwargs):
    start = time.process_time()
    out = fn(*args, **kwargs)
    return out, time.process_time() - start


def patrol_messages(duration_s: float, seed: int) -> tuple[list, dict]:
    """(topic, bag time ns, message) of a patrol bag of `duration_s`, and its sources."""
    from csr_ros.bag_sources import read_bag, sources_for
    from csr_ros.patrol import generate_patrol

    with tempfile.TemporaryDirectory() as tmp:
        bag = Path(tmp) / "patrol"
        generate_patrol(bag, duration_s=duration_s, seed=seed)
        sources = sources_for([bag], None, None)
        return list(read_bag([bag], sources)), sources


def measure(url: str, *, duration_s: float = 300.0, decisions: int = 60, rate_hz: float = 2.0,
            max_new_tokens: int = 48, seed: int = 0, model_dir: str | Path | None = None) -> dict:
    from csr_ros.actions import Vocabulary
    from csr_ros.bag_replay import replay_chunks
    from csr_ros.cpu import cpu_model
    from csr_ros.layout import Layout
    from csr_ros.resources.openai import OpenAIOptions, OpenAIResource
    from csr_ros.state import CsrState

    messages, sources = patrol_messages(duration_s, seed)
    chunks, render_s = _cpu(lambda: [c for c in replay_chunks(messages, sources)
                                     if not c.instant])
    vocab = Vocabulary.parse(VOCABULARY, max_str_chars=32)
    period_ns = int(1e9 / rate_hz)
    start_ns = messages[0][1]
    # `decisions` decision times spread over the bag, each at a multiple of the period
    step = max(1, int((messages[-1][1] - start_ns) // period_ns) // decisions)
    due = [start_ns + (k + 1) * step * period_ns for k in range(decisions)]

    fold_s, evictions, rows = [], 0, []
    with OpenAIResource(OpenAIOptions(url, model_dir=model_dir)) as resource:
        tok = resource.tokenizer
        state = CsrState(tok, Layout.from_tokenizer(tok), PROFILE + vocab.describe(),
                         mode=resource.state_mode)
        # warm-up, left out: the server's first prefill of the profile, the client's first call
        resource.query(state.build_request(task=TASK), max_new_tokens=4)
        pending = iter(chunks)
        chunk = next(pending, None)
        for now_ns in due:
            while chunk is not None and chunk.t_ns <= now_ns:
                _, cpu_s = _cpu(state.add, chunk.text, source=chunk.source, stamp_ns=chunk.stamp_ns)
                fold_s.append(cpu_s)
                chunk = next(pending, None)
            if state.n_static >= TAU_MEM_TOKENS:
                state, evictions = state.evicted(len(state.chunks) // 2), evictions + 1
            t0, wall0 = time.process_time(), time.perf_counter()
            constraint = vocab.constraint()
            request = state.build_request(task=TASK, suffix=f"now: t={(now_ns - start_ns) / 1e9:.1f}s")
            t1 = time.process_time()
            result = resource.query(request, max_new_tokens=max_new_tokens, constraint=constraint)
            t2, wall2 = time.process_time(), time.perf_counter()
            decision = vocab.decide(result.text, constrained=result.constrained,
                                    finish_reason=result.finish_reason,
                                    max_new_tokens=max_new_tokens)
            t3 = time.process_time()
            rows.append({"build_s": t1 - t0, "http_s": t2 - t1, "parse_s": t3 - t2,
                         "cpu_s": t3 - t0, "wall_s": wall2 - wall0, "valid": decision.valid,
                         "static_tokens": request.n_static, "dynamic_tokens": request.n_dynamic})
        server = resource.info.kind

    n_chunks = len(fold_s)
    per_decision = [r["cpu_s"] for r in rows]
    bag_s = (messages[-1][1] - start_ns) / 1e9
    aggregator_chunk_s = render_s / len(chunks)
    fold_chunk_s = sum(fold_s) / max(1, n_chunks)
    mean_decision_s = sum(per_decision) / len(rows)
    # one second of the robot: the bag's messages, its chunks folded, rate_hz decisions
    second_cpu_s = (render_s + fold_chunk_s * len(chunks)) / bag_s + mean_decision_s * rate_hz
    return {
        "meta": {"cpu": cpu_model(), "machine": platform.machine(),
                 "python": platform.python_version(), "server": server, "url": url,
                 "state_mode": state.mode, "duration_s": duration_s, "seed": seed,
                 "rate_hz": rate_hz, "max_new_tokens": max_new_tokens,
                 "tau_mem_tokens": TAU_MEM_TOKENS, "vocabulary": list(VOCABULARY),
                 "clock": "time.process_time (this process, every thread)"},
        "aggregator": {"messages": len(messages), "chunks": len(chunks), "cpu_s": render_s,
                       "per_message_s": render_s / len(messages),
                       "per_chunk_s": aggregator_chunk_s},
        "policy": {"chunks_folded": n_chunks, "per_chunk_s": fold_chunk_s,
                   "decisions": len(rows), "valid": sum(r["valid"] for r in rows),
                   "evictions": evictions,
                   "per_decision_s": {"mean": mean_decision_s,
                                      "p50": percentile(per_decision, 50),
                                      "p99": percentile(per_decision, 99),
                                      "max": max(per_decision)},
                   "parts_mean_s": {k: sum(r[k] for r in rows) / len(rows)
                                    for k in ("build_s", "http_s", "parse_s")},
                   "wall_per_decision_p50_s": percentile([r["wall_s"] for r in rows], 50),
                   "static_tokens_max": max(r["static_tokens"] for r in rows)},
        "per_second": {"messages": len(messages) / bag_s, "chunks": len(chunks) / bag_s,
                       "cpu_s": second_cpu_s},
        "rows": rows,
    }


def format_report(report: dict) -> str:
    m, a, p, per = report["meta"], report["aggregator"], report["policy"], report["per_second"]
    d, parts = p["per_decision_s"], p["parts_mean_s"]
    ms = 1000.0
    return "\n".join([
        f"robot-side CPU ({m['clock']}), {m['cpu']}, Python {m['python']}, "
        f"{m['server']} server at {m['url']} ({m['state_mode']} prompts)",
        f"  aggregator  {a['messages']} messages -> {a['chunks']} chunks: "
        f"{a['per_message_s'] * 1e6:.0f} us per message, {a['per_chunk_s'] * ms:.2f} ms per chunk",
        f"  policy      per chunk folded {p['per_chunk_s'] * ms:.2f} ms ({p['chunks_folded']} chunks)",
        f"  policy      per decision mean {d['mean'] * ms:.2f} ms  p50 {d['p50'] * ms:.2f} ms  "
        f"p99 {d['p99'] * ms:.2f} ms  max {d['max'] * ms:.2f} ms  ({p['decisions']} decisions, "
        f"{p['valid']} valid, up to {p['static_tokens_max']} cached tokens, "
        f"{p['evictions']} evictions)",
        f"              of which request {parts['build_s'] * ms:.2f} ms, HTTP client "
        f"{parts['http_s'] * ms:.2f} ms, parse {parts['parse_s'] * ms:.2f} ms; wall p50 "
        f"{p['wall_per_decision_p50_s'] * ms:.0f} ms (the server's time)",
        f"  per second of the robot ({per['messages']:.0f} messages, {per['chunks']:.2f} chunks, "
        f"{m['rate_hz']:g} decisions): {per['cpu_s'] * ms:.1f} ms CPU, "
        f"{per['cpu_s'] * 100:.1f}% of one core"])
