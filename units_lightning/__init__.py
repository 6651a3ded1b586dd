"""units-lightning: uncertainty-aware, label-efficient meta-learning (Units-ML) on PyTorch Lightning."""

__version__ = "0.1.0"
