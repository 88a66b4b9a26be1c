"""A package's names imported on first use (PEP 562), so that importing the package costs
nothing until a name is read:

    _HOMES = {"TorchEngine": "torch_engine", ...}      # name -> its module in the package
    __all__ = sorted(_HOMES)
    __getattr__ = lazy_names(__name__, _HOMES)
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package` that imports `package.<homes[name]>` for `name`."""
    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home}"), name)
    return __getattr__
