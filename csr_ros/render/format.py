"""Generic formatting of plain data: one stable line of ``key=value`` pairs.

    format_pairs({"pose": {"x": 1.23456}, "ok": True}, ctx)  →  "pose.x=1.235 ok=true"

Floats keep `float_digits` decimals but at most three significant digits beyond the integer part
(199.43 → 199, 23.27 → 23.3, 0.866 → 0.87 with 2 decimals),
without trailing zeros or negative zero; long numeric arrays become ``{n min max mean}``;
empty strings and arrays carry nothing and are left out; points, vectors and quaternions
(x,y[,z[,w]]) are written as tuples; Time values are written relative to
the episode (``12.3s``) and Durations in seconds, never as nanosecond integers.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Mapping

from csr_ros.errors import ConfigError
from csr_ros.render.plain import Bulk, DurationNs, Plain, StampNs

DEFAULT_FLOAT_DIGITS = 3
DEFAULT_MAX_ARRAY = 8
DEFAULT_MAX_CHARS = 2000
MAX_SIGNIFICANT = 3
_BARE = re.compile(r"^[A-Za-z0-9_./:+\-]+$")


@dataclass(frozen=True)
class RenderOptions:
    fields: tuple[str, ...] = ()       # dotted paths; when given, the type summary is not used
    summarize: bool = True             # use the built-in summary of the type when there is one
    float_digits: int = DEFAULT_FLOAT_DIGITS
    max_array: int = DEFAULT_MAX_ARRAY  # longer arrays are summarised (n/min/max/mean)
    max_chars: int = DEFAULT_MAX_CHARS  # longer text is cut with a marker saying how much

    def __post_init__(self):
        if not 0 <= self.float_digits <= 9:
            raise ConfigError(f"float_digits must be in 0..9, got {self.float_digits}")
        if self.max_array < 1:
            raise ConfigError(f"max_array must be >= 1, got {self.max_array}")
        if self.max_chars < 32:
            raise ConfigError(f"max_chars must be >= 32, got {self.max_chars}")


@dataclass(frozen=True)
class Context:
    """What a render may depend on besides the message: options and the source's history."""
    options: RenderOptions = RenderOptions()
    origin_ns: int | None = None       # episode start: times are written relative to it
    usual_frame: str | None = None     # the source's usual frame id (others are written out)
    previous: Mapping | None = None    # the source's last emitted features (delta summaries)


def fmt_float(x: float, digits: int) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    whole = len(str(int(abs(x)))) if abs(x) >= 1 else 0
    digits = max(0, min(digits, MAX_SIGNIFICANT - whole))
    text = f"{x:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def fmt_seconds(ns: int) -> str:
    return fmt_float(ns / 1e9, 1 if abs(ns) >= 1e9 else 3) + "s"


def fmt_text(text: str) -> str:
    """A free-text value: bare when it is one plain word, else JSON-quoted (stays data)."""
    return text if _BARE.match(text) else json.dumps(text, ensure_ascii=False)


def fmt_scalar(v: Plain, digits: int, ctx: Context | None = None) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, StampNs):
        if ctx is not None and ctx.origin_ns is not None:
            return fmt_seconds(int(v) - ctx.origin_ns)
        return fmt_float(int(v) / 1e9, 1) + "s"
    if isinstance(v, DurationNs):
        return fmt_seconds(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return fmt_float(v, digits)
    return fmt_text(str(v))


def _is_number(v: Plain) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, (bool, StampNs, DurationNs))


def fmt_list(values: list, digits: int, max_array: int, ctx: Context | None = None) -> str:
    numeric = [v for v in values if _is_number(v)]
    if len(values) > max_array and len(numeric) == len(values):
        finite = [float(v) for v in numeric if math.isfinite(v)]
        if not finite:
            return f"{{n={len(values)}}}"
        if min(finite) == max(finite):
            return f"{{n={len(values)} all={fmt_float(finite[0], digits)}}}"
        return (f"{{n={len(values)} min={fmt_float(min(finite), digits)} "
                f"max={fmt_float(max(finite), digits)} "
                f"mean={fmt_float(sum(finite) / len(finite), digits)}}}")
    shown = [fmt_value(v, digits, max_array, ctx) for v in values[:max_array]]
    if len(values) > max_array:
        shown.append(f"…+{len(values) - max_array}")
    return "[" + ",".join(shown) + "]"


_TUPLES = (("x", "y"), ("x", "y", "z"), ("x", "y", "z", "w"))


def fmt_value(v: Plain, digits: int, max_array: int, ctx: Context | None = None) -> str:
    if isinstance(v, Bulk):
        return f"{{n={v.n}}}"
    if isinstance(v, Mapping) and tuple(v) in _TUPLES and all(map(_is_number, v.values())):
        return ",".join(fmt_scalar(x, digits) for x in v.values())   # Point, Vector3, Quaternion
    if isinstance(v, Mapping):
        return "{" + " ".join(format_pairs(v, digits, max_array, ctx=ctx)) + "}"
    if isinstance(v, list):
        return fmt_list(v, digits, max_array, ctx)
    return fmt_scalar(v, digits, ctx)


def _empty(v: Plain) -> bool:
    return v == "" or (isinstance(v, (list, dict)) and not v)


def format_pairs(plain: Mapping[str, Plain], digits: int, max_array: int, *,
                 ctx: Context | None = None, prefix: str = "") -> list[str]:
    """'key=value' for every non-empty leaf; nested mappings flatten to dotted keys."""
    pairs = []
    for key, value in plain.items():
        if _empty(value) or value is None and key in ("stamp_ns", "frame"):
            continue
        name = prefix + key
        if isinstance(value, Mapping) and tuple(value) not in _TUPLES:
            pairs.extend(format_pairs(value, digits, max_array, ctx=ctx, prefix=name + "."))
        else:
            pairs.append(f"{name}={fmt_value(value, digits, max_array, ctx)}")
    return pairs


def cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    marker = f" …[{len(text) - max_chars} chars cut]"
    return text[:max_chars - len(marker)] + marker
