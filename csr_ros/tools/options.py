"""Options that several `csr-ros` commands declare alike, declared once; and settings from them."""

from __future__ import annotations

import argparse
from dataclasses import fields

from csr_ros.errors import ConfigError
from csr_ros.model_store import DEFAULT_MODEL
from csr_ros.stream_defaults import StreamDefaults

ENGINE_OPTIONS = ("model", "threads", "dtype", "backend")
BACKENDS = ("auto", "torch", "llamacpp")
_ENGINE_HELP = {
    "model": "'smollm2', a prepared catalog model (csr-ros model list) or a model directory",
    "threads": "CPU threads of the local engine",
    "dtype": "local engine precision: auto, float32, bfloat16",
    "backend": "local engine: auto, torch, llamacpp",
}


def add_engine_options(group, *names: str, model: str | None = DEFAULT_MODEL,
                       threads: int | None = None, dtype: str = "auto", backend: str = "auto",
                       backend_choices: tuple[str, ...] | None = BACKENDS,
                       helps: dict[str, str] | None = None) -> None:
    """The local engine's --model/--threads/--dtype/--backend (those of `names`, default all),
    with the command's defaults; `helps` gives an option the command's own help text."""
    helps = _ENGINE_HELP | (helps or {})
    for name in names or ENGINE_OPTIONS:
        if name == "model":
            group.add_argument("--model", default=model, help=helps["model"])
        elif name == "threads":
            group.add_argument("--threads", type=int, default=threads, help=helps["threads"])
        elif name == "dtype":
            group.add_argument("--dtype", default=dtype, help=helps["dtype"])
        else:
            assert name == "backend", f"no engine option {name!r}"
            group.add_argument("--backend", choices=backend_choices, default=backend,
                               help=helps["backend"])


def add_episode_options(run, stream, d: StreamDefaults, *, seed_help: str, paced_help: str,
                        whose: str = "the", each: str = "") -> None:
    """The synthetic episode's options of `demo` and `fleet` (`each`: ' per robot')."""
    run.add_argument("--seed", type=int, default=0, help=seed_help)
    run.add_argument("--paced", action="store_true", help=paced_help)
    stream.add_argument("--tau-mem", dest="tau_mem_tokens", metavar="TAU_MEM", type=int,
                        default=d.tau_mem_tokens,
                        help=f"evict when {whose} static part reaches this many tokens "
                             f"(default {d.tau_mem_tokens})")
    stream.add_argument("--chunk-rate-hz", type=float, default=d.chunk_rate_hz,
                        help=f"episode chunks per second{each} (default {d.chunk_rate_hz})")
    stream.add_argument("--rate-hz", type=float, default=d.rate_hz,
                        help=f"{'' if each else 'policy '}decisions per second{each} "
                             f"(default {d.rate_hz})")
    stream.add_argument("--max-context-tokens", type=int, default=d.max_context_tokens)


def from_args(cls, args: argparse.Namespace, **given):
    """A settings dataclass from the parsed options named as its fields, and `given`."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names} | given)


def words(text: str) -> tuple[str, ...]:
    """`a, b,c` → ('a', 'b', 'c')."""
    return tuple(w.strip() for w in text.split(",") if w.strip())


def ints(text: str | None, flag: str, *, minimum: int = 0) -> tuple[int, ...] | None:
    """`512,1024` → (512, 1024) (None stays None), with a clear error naming `flag` for anything
    else."""
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise ConfigError(f"{flag} takes integers >= {minimum}, got {text!r}")
    return values
