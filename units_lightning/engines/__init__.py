"""Engines run the inner loop: adapt to support sets, predict on query sets."""

from units_lightning.engines.base import CapturingEngine, Engine, EvaluatingEngine, InnerLoss, adapt_and_predict_sets
from units_lightning.engines.batched import BatchedEngine
from units_lightning.engines.build import EngineFactory, EngineName, build_engine
from units_lightning.engines.captured_step import CapturedStep
from units_lightning.engines.ensemble import EnsembleEngine
from units_lightning.engines.inner_lr import InnerLearningRates, InnerLRMode
from units_lightning.engines.learn2learn import Learn2LearnEngine

__all__ = [
    "BatchedEngine",
    "CapturedStep",
    "CapturingEngine",
    "Engine",
    "EngineFactory",
    "EngineName",
    "EnsembleEngine",
    "EvaluatingEngine",
    "InnerLRMode",
    "InnerLearningRates",
    "InnerLoss",
    "Learn2LearnEngine",
    "adapt_and_predict_sets",
    "build_engine",
]
