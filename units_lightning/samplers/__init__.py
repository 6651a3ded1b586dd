"""Task sampler plugins: how candidate tasks are drawn and which query sets get labeled."""

from units_lightning.samplers.base import TaskSampler
from units_lightning.samplers.multi_query import MultiQuerySampler
from units_lightning.samplers.random import RandomSampler
from units_lightning.samplers.single_task import SingleTaskSelectionSampler

__all__ = ["MultiQuerySampler", "RandomSampler", "SingleTaskSelectionSampler", "TaskSampler"]
