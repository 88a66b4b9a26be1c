"""Build a resource by kind name, importing its backend only when asked for.

    make_resource("local", model="smollm2", threads=1)
    make_resource("local", model="smollm2", threads=1, backend="llamacpp")   # llama.cpp in process
    make_resource("openai", url="http://127.0.0.1:8001", ...)
"""

from __future__ import annotations

import importlib

from csr_ros.errors import ConfigError
from csr_ros.resources.base import Resource

BACKENDS = {                                   # kind -> (module, what builds it from keywords)
    "local": ("csr_ros.resources.local", "LocalResource"),
    "openai": ("csr_ros.resources.openai", "connect"),
}


def make_resource(kind: str, **options) -> Resource:
    if kind not in BACKENDS:
        raise ConfigError(f"unknown resource kind {kind!r}; choose one of {sorted(BACKENDS)}")
    module_name, builder = BACKENDS[kind]
    return getattr(importlib.import_module(module_name), builder)(**options)
