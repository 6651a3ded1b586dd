"""Lazy re-exports for a package's ``__init__``: a public name's module is imported when the name is first read, so
that importing the package (and a command that needs little of it) stays cheap (docs/PERFORMANCE.md, "Start-up")."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["import_object", "lazy_exports"]


def import_object(path: str) -> Any:
    """The object a ``package.module.Name`` path names, such as a config's ``class_path``.

    Raises:
        ImportError: the module cannot be imported. AttributeError: it has no such name. ValueError: ``path`` names
        no module (no dot).

    Example:
        >>> import_object("units_lightning.ledger.LabelLedger").__name__
        'LabelLedger'
    """
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def lazy_exports(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module ``package``, resolving each of ``names`` (public name -> the module
    that defines it) on first read and keeping it in the package's namespace, so later reads do not come back.

    Example:
        >>> getattr_, dir_ = lazy_exports("units_lightning", {"LabelLedger": "units_lightning.ledger"})
        >>> getattr_("LabelLedger").__name__, "LabelLedger" in dir_()
        ('LabelLedger', True)
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            vars(sys.modules[package])[name] = value  # later reads find it without calling __getattr__
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__
