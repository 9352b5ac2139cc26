"""The domain: plain Python, no Dagster; the package map is docs/architecture.md."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A package's module-level `__getattr__` that imports `package.<exports[name]>` on the
    first use of `name` and keeps the value in the package. The heavy packages use it so that
    `market-pipeline --help`, which imports every command module, does not pay for SciPy,
    scikit-learn or torch."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
