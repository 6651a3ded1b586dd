"""units-lightning: uncertainty-aware, label-efficient meta-learning (Units-ML) on PyTorch Lightning.

``import units_lightning`` loads nothing else: ``UnitsMAML`` and ``LabelLedger`` are imported on first use (with
torch and Lightning), so that ``units-lightning --help`` and a refused command answer at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from units_lightning.ledger import LabelLedger
    from units_lightning.module import UnitsMAML

# Public name -> the module that defines it, imported by ``__getattr__`` when the name is first read.
_LAZY = {"LabelLedger": "units_lightning.ledger", "UnitsMAML": "units_lightning.module"}

__all__ = ["LabelLedger", "UnitsMAML", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later reads find it without calling __getattr__
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
