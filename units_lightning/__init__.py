"""units-lightning: uncertainty-aware, label-efficient meta-learning (Units-ML) on PyTorch Lightning."""

__version__ = "0.1.0"

from units_lightning.ledger import LabelLedger  # noqa: E402
from units_lightning.module import UnitsMAML  # noqa: E402

__all__ = ["LabelLedger", "UnitsMAML", "__version__"]
