"""`dtype="auto"` on a CPU: the local engine's backend and precision chosen by measuring them.

    choice = calibrate("smollm2", threads=2)       # cached per machine, model and versions
    choice.chosen, choice.figures                   # "torch-bf16", {name: {"decision_s": ...}}

Each candidate this machine has (precision.py says which kernels each one needs) is timed on
the decision the main job makes: the demo episode's typed-action prompt with its history
cached, a CSR query of about 30 dynamic tokens, then a typed action decoded under its grammar.
The fastest decision wins. The choice is kept as JSON in the cache directory, one file per key
(CPU model, flags, threads, model fingerprint, library versions); a file whose stored key is
not this machine's is never used. docs/engine.md#calibration has the method and the figures.

The pure part (`candidates`, `pick`, `cache_key`, `read_cached`) takes facts and figures; the
measuring (`measure`) is thin and imports torch only through the engines it builds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

FORMAT = 1                      # the method's version: a new one invalidates every cached choice
CHUNKS, REPS, MAX_NEW_TOKENS = 24, 3, 24
LIBRARIES = ("torch", "transformers", "llama_cpp_python", "llguidance", "csr_ros")


@dataclass(frozen=True)
class Candidate:
    name: str                   # torch-bf16 | torch-fp32 | llamacpp
    backend: str
    dtype: str | None = None
    decode_weights: str = "auto"

    def options(self) -> dict:
        """LocalResource / make_engine keywords that run this candidate."""
        if self.backend == "llamacpp":
            return {"backend": "llamacpp"}
        return {"backend": "torch", "dtype": self.dtype, "decode_weights": self.decode_weights}


TORCH_BF16 = Candidate("torch-bf16", "torch", "bfloat16", "int4")
TORCH_FP32 = Candidate("torch-fp32", "torch", "float32", "fp16")
TORCH_FP32_PLAIN = Candidate("torch-fp32", "torch", "float32", "float")
LLAMACPP = Candidate("llamacpp", "llamacpp")


def candidates(*, torch: bool, native_bf16: bool, fp16: bool,
               llamacpp: bool) -> tuple[list[Candidate], dict[str, str]]:
    """The candidates a machine with these facts has, and why each other one is left out."""
    have, why_not = [], {}
    if not torch:
        why_not["torch-bf16"] = why_not["torch-fp32"] = "torch is not installed"
    else:
        if native_bf16:
            have.append(TORCH_BF16)
        else:
            why_not["torch-bf16"] = "no native bf16 (AVX512-BF16 or AMX-BF16; CSR_ROS_CPU_BF16)"
        have.append(TORCH_FP32 if fp16 else TORCH_FP32_PLAIN)
    if llamacpp:
        have.append(LLAMACPP)
    else:
        why_not["llamacpp"] = "llama-cpp-python is not installed"
    return have, why_not


def pick(figures: dict[str, dict]) -> str:
    """The candidate with the fastest decision. Greedy answers differ between precisions, and so
    do their lengths: each is compared at the same number of decoded tokens (the median over
    the candidates), as its TTFT plus that many of its decode steps."""
    assert figures, "pick() needs at least one measured candidate"
    tokens = statistics.median(f["tokens"] for f in figures.values())
    return min(figures, key=lambda name: estimate_s(figures[name], tokens))


def estimate_s(figure: dict, tokens: float) -> float:
    return figure["ttft_s"] + max(tokens - 1, 0) * figure["decode_s_per_token"]


def cache_key(*, cpu_model: str, flags: Sequence[str], bf16_override: str, threads: int,
              model_fingerprint: str, versions: dict[str, str | None]) -> dict:
    """What a cached choice holds for: on another CPU, thread count, model or library version
    the figures may rank the candidates otherwise."""
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]
    return {"format": FORMAT, "cpu_model": cpu_model, "cpu_flags_sha256": digest,
            "cpu_bf16_override": bf16_override, "threads": int(threads),
            "model_fingerprint": model_fingerprint, "versions": dict(sorted(versions.items()))}


def cache_path(directory: Path, key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(directory) / f"{name}.json"


@dataclass
class Calibration:
    chosen: str
    figures: dict[str, dict]            # per measured candidate: decision_s, ttft_s, ...
    skipped: dict[str, str]             # per candidate left out: why
    key: dict
    options: dict                       # the chosen candidate's LocalResource keywords
    measured_utc: str
    seconds: float                      # the calibration's wall time, loads included
    cached: bool = False
    settings: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"how": "calibrated", **asdict(self)}

    def summary(self) -> str:
        return describe(self.as_dict())


def describe(choice: dict) -> str:
    """One line for reports and /diagnostics: how the engine was chosen and, when it was
    measured, every candidate's decision (compared at the same number of tokens)."""
    precision = f"{choice['precision']}, " if choice.get("precision") else ""
    if choice.get("how") != "calibrated":
        named = choice.get("chosen") or choice.get("backend")
        return f"{precision}{choice.get('how', 'set')}: {named}"
    figures = choice["figures"]
    tokens = statistics.median(f["tokens"] for f in figures.values())
    said = [f"{name} {1000 * estimate_s(f, tokens):.0f} ms" for name, f in
            sorted(figures.items(), key=lambda item: estimate_s(item[1], tokens))]
    said += [f"{name} left out ({why})" for name, why in choice["skipped"].items()]
    return (f"{precision}calibrated{' (cached)' if choice.get('cached') else ''}: "
            f"{choice['chosen']}; decision at {tokens:.0f} tokens: " + ", ".join(said))


def read_cached(path: Path, key: dict) -> Calibration | None:
    """The choice stored at `path`, only if it was made under exactly `key`."""
    try:
        stored = json.loads(Path(path).read_text())
        if stored.get("key") != key:
            return None
        stored.pop("how", None)
        return Calibration(**{**stored, "cached": True})
    except (OSError, ValueError, TypeError):
        return None


def resolve(model: str, *, device: str = "cpu", dtype=None, forward: str = "auto",
            decode_weights: str = "auto", threads: int | None = None,
            directory: Path | None = None) -> tuple[dict, dict]:
    """LocalResource(backend="auto"): (the engine's keywords, how they were chosen). Only
    `dtype="auto"` on a CPU with the torch settings left at auto is calibrated (or, with one
    candidate, takes it); a dtype, forward or decode_weights of its own asks for torch."""
    on_cpu = str(device).split(":")[0] == "cpu"
    if dtype != "auto" or not on_cpu or forward != "auto" or decode_weights != "auto":
        return ({"backend": "torch", "dtype": dtype, "decode_weights": decode_weights},
                {"how": "set", "backend": "torch"})
    have, skipped = machine_candidates()
    if len(have) == 1:
        return have[0].options(), {"how": "only candidate", "chosen": have[0].name,
                                   "skipped": skipped}
    choice = calibrate(model, threads=threads, directory=directory)
    return choice.options, choice.as_dict()


# -- measuring ---------------------------------------------------------------------------------

def say(message: str) -> None:
    print(f"csr-ros calibration: {message}", file=sys.stderr, flush=True)


def machine_candidates(device: str = "cpu") -> tuple[list[Candidate], dict[str, str]]:
    from csr_ros.engine import precision

    torch = precision.torch_available()
    native = fp16 = False
    if torch:
        from csr_ros.engine import lean

        native, fp16 = precision.native_bf16(), lean.fp16_available()
    return candidates(torch=torch, native_bf16=native, fp16=fp16,
                      llamacpp=precision.llamacpp_available())


def machine_key(model: str, threads: int | None) -> dict:
    from csr_ros import cpu
    from csr_ros.model_store import model_fingerprint, resolve_model_dir

    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return cache_key(cpu_model=cpu.cpu_model(), flags=cpu.cpu_flags(),
                     bf16_override=os.environ.get(cpu.BF16_OVERRIDE_ENV, "").strip(),
                     threads=threads or len(os.sched_getaffinity(0)),
                     model_fingerprint=model_fingerprint(resolve_model_dir(model)),
                     versions=versions)


def default_directory() -> Path:
    from csr_ros.model_store import cache_root

    return cache_root() / "calibration"


def calibrate(model: str = "smollm2", *, threads: int | None = None, force: bool = False,
              directory: Path | None = None, only: Sequence[str] | None = None,
              chunks: int = CHUNKS, reps: int = REPS, max_new_tokens: int = MAX_NEW_TOKENS,
              progress: Callable[[str], None] = say) -> Calibration:
    """This machine's choice for `model` at `threads`: the cached one under this machine's key,
    else measured (and cached). One process measures at a time (a file lock): the others wait
    and read its result. `only`: measure just these candidates (tests)."""
    directory = Path(directory or default_directory())
    directory.mkdir(parents=True, exist_ok=True)
    key = machine_key(model, threads)
    path = cache_path(directory, key)
    with _locked(directory / ".lock"):
        cached = None if force else read_cached(path, key)
        if cached is not None:
            return cached
        have, skipped = machine_candidates()
        if only is not None:
            have = [c for c in have if c.name in only]
        started = time.perf_counter()
        figures, failed = measure(have, model, threads=threads, chunks=chunks, reps=reps,
                                  max_new_tokens=max_new_tokens, progress=progress)
        skipped.update(failed)
        if not figures:
            from csr_ros.errors import ConfigError

            raise ConfigError(f"no local engine loads here: {failed or skipped}")
        chosen = pick(figures)
        by_name = {c.name: c for c in have}
        result = Calibration(
            chosen=chosen, figures=figures, skipped=skipped, key=key,
            options=by_name[chosen].options(), seconds=time.perf_counter() - started,
            measured_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            settings={"chunks": chunks, "reps": reps, "max_new_tokens": max_new_tokens})
        progress(result.summary())
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(result.as_dict(), indent=1))
        os.replace(temporary, path)
    return result


def measure(have: Sequence[Candidate], model: str, *, threads: int | None, chunks: int,
            reps: int, max_new_tokens: int,
            progress: Callable[[str], None] = say) -> tuple[dict[str, dict], dict[str, str]]:
    """Each candidate's decision figures (medians over `reps`, after one untimed decision), the
    candidates taking turns so that load on the machine hits them alike; and why each candidate
    that did not load was left out."""
    from csr_ros.engine.decoder import make_engine
    from csr_ros.engine.grammar import GrammarCompiler

    request, constraint = _decision(model, chunks)
    engines, failed = {}, {}
    try:
        for candidate in have:
            progress(f"loading {candidate.name} ({len(engines) + len(failed) + 1}/{len(have)})")
            try:
                engine = make_engine(model, threads=threads, max_context_tokens=4096,
                                     **candidate.options())
                compiler = GrammarCompiler(engine.model_dir / "tokenizer.json",
                                           vocab_size=engine.vocab_size, eos_ids=engine.eos_ids)
                engine.load(request.static_ids)
                engines[candidate.name] = (engine, compiler)
            except Exception as exc:          # any failure to load leaves the candidate out
                failed[candidate.name] = f"{type(exc).__name__}: {exc}"
                progress(f"{candidate.name} left out: {failed[candidate.name]}")
        runs: dict[str, list] = {name: [] for name in engines}
        for rep in range(reps + 1):
            for name, (engine, compiler) in engines.items():
                started = time.perf_counter()
                out = engine.query(request.dynamic_ids, max_new_tokens,
                                   constraint=compiler.compile(constraint))
                if rep:                                      # the first is the warm-up
                    runs[name].append((time.perf_counter() - started, out))
            if rep:
                progress(f"decision {rep}/{reps} on each of {', '.join(engines)}")
    finally:
        for engine, _ in engines.values():
            engine.close()
    figures = {}
    for name, items in runs.items():
        steps = [o.decode_s / (len(o.token_ids) - 1) for _, o in items if len(o.token_ids) > 1]
        figures[name] = {"decision_s": statistics.median(s for s, _ in items),
                         "ttft_s": statistics.median(o.ttft_s for _, o in items),
                         "decode_s_per_token": statistics.median(steps) if steps else 0.0,
                         "tokens": statistics.median(len(o.token_ids) for _, o in items),
                         "n_static": len(request.static_ids),
                         "n_dynamic": len(request.dynamic_ids),
                         "answer": items[0][1].text}
    return figures, failed


def _decision(model: str, chunks: int):
    """The demo episode's typed-action request after `chunks` chunks, and its grammar."""
    from csr_ros.demo_episode import Episode, typed_decision
    from csr_ros.model_store import resolve_model_dir
    from csr_ros.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(resolve_model_dir(model, weights=False))
    request, bound = typed_decision(Episode(0), tokenizer, chunks)
    return request, bound.constraint("grammar")


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
