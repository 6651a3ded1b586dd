"""Engines run the inner loop: adapt to support sets, predict on query sets."""

from units_lightning.engines.base import Engine, InnerLoss
from units_lightning.engines.batched import BatchedEngine
from units_lightning.engines.build import EngineName, build_engine
from units_lightning.engines.ensemble import EnsembleEngine
from units_lightning.engines.inner_lr import InnerLearningRates, InnerLRMode
from units_lightning.engines.learn2learn import Learn2LearnEngine

__all__ = [
    "BatchedEngine",
    "Engine",
    "EngineName",
    "EnsembleEngine",
    "InnerLRMode",
    "InnerLearningRates",
    "InnerLoss",
    "Learn2LearnEngine",
    "build_engine",
]
