"""Task sampler plugins: how candidate tasks are drawn and which query sets get labeled.

Acquisition (what a candidate query set is worth) is the sampler's ``score``; the scores' maths lives in
``units_lightning.samplers.acquisition``.
"""

from units_lightning.samplers.base import TaskSampler
from units_lightning.samplers.diverse import DiverseSampler
from units_lightning.samplers.multi_query import MultiQuerySampler
from units_lightning.samplers.random import RandomSampler
from units_lightning.samplers.representative import TypicalitySampler
from units_lightning.samplers.scored import EntropySampler, MarginSampler, VacuitySampler
from units_lightning.samplers.single_task import SingleTaskSelectionSampler
from units_lightning.samplers.stochastic import StochasticSampler

__all__ = [
    "DiverseSampler",
    "EntropySampler",
    "MarginSampler",
    "MultiQuerySampler",
    "RandomSampler",
    "SingleTaskSelectionSampler",
    "StochasticSampler",
    "TaskSampler",
    "TypicalitySampler",
    "VacuitySampler",
]
