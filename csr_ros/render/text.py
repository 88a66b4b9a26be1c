"""One message → one line of chunk text: ``label: body``, body from the type's summary."""

from __future__ import annotations

import re
from typing import Any, Mapping

from csr_ros.render.format import Context, RenderOptions, cut, format_pairs
from csr_ros.render.plain import (Plain, message_type_name, normalize_type_name, select_fields,
                                  to_plain)
from csr_ros.render.summaries import (SUMMARIZERS, Summary, generic_body,
                                      summarize_detection_like, summarize_generic)

DETECTION_LIKE = re.compile(r"detect", re.IGNORECASE)   # custom detection types


def summarize(plain: Plain, *, type_name: str | None, ctx: Context = Context()) -> Summary:
    """The `Summary` of plain message data: selected fields, the type's summary, or generic."""
    if not isinstance(plain, Mapping):
        plain = {"data": plain}
    o = ctx.options
    if o.fields:
        body = select_fields(plain, o.fields)
        summary = summarize_generic(body, ctx)
        return Summary(" ".join(format_pairs(body, o.float_digits, o.max_array, ctx=ctx)),
                       summary.features)
    if o.summarize and type_name in SUMMARIZERS:
        return SUMMARIZERS[type_name](plain, ctx)
    if o.summarize and type_name and DETECTION_LIKE.search(type_name.rsplit("/", 1)[-1]):
        summary = summarize_detection_like(plain, ctx)
        if summary is not None:
            return summary
    return summarize_generic(plain, ctx)


def render_plain(plain: Plain, *, label: str, type_name: str | None = None,
                 options: RenderOptions = RenderOptions(), ctx: Context | None = None) -> str:
    """Format plain message data as one line: 'label: body'."""
    ctx = ctx or Context(options=options)
    return cut(f"{label}: {summarize(plain, type_name=type_name, ctx=ctx).text}",
               ctx.options.max_chars)


def render(msg: Any, *, label: str, type_name: str | None = None,
           options: RenderOptions = RenderOptions()) -> str:
    """Render an rclpy message, a rosbags dataclass or a dict as one stable line of text.

    Stateless: no episode time and no history (the `Emitter` adds both)."""
    name = type_name or message_type_name(msg)
    return render_plain(to_plain(msg), label=label,
                        type_name=normalize_type_name(name) if name else None, options=options)


__all__ = ["render", "render_plain", "summarize", "generic_body"]
