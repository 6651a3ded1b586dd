"""units-lightning: uncertainty-aware, label-efficient meta-learning (Units-ML) on PyTorch Lightning.

``import units_lightning`` loads nothing else: ``UnitsMAML`` and ``LabelLedger`` are imported on first use (with
torch and Lightning), so that ``units-lightning --help`` and a refused command answer at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from units_lightning.lazy import lazy_exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from units_lightning.ledger import LabelLedger
    from units_lightning.module import UnitsMAML

# Public name -> the module that defines it, imported by ``__getattr__`` when the name is first read.
_LAZY = {"LabelLedger": "units_lightning.ledger", "UnitsMAML": "units_lightning.module"}

__all__ = ["LabelLedger", "UnitsMAML", "__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
