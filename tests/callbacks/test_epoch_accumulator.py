"""EpochAccumulator maps Lightning's per-stage hooks onto start / update / finish, for its stages only, and keeps
the sanity check's validation out of the accumulation."""

from types import SimpleNamespace

import pytest

from units_lightning import keys
from units_lightning.callbacks._epoch_accumulator import EpochAccumulator


class Recorder(EpochAccumulator):
    def __init__(self, stages):
        self.stages = stages
        self.calls = []

    def start(self, pl_module, stage):
        self.calls.append(("start", stage))

    def update(self, stage, outputs):
        self.calls.append(("update", stage, outputs))

    def finish(self, pl_module, stage):
        self.calls.append(("finish", stage))


def run_epoch(callback, stage, trainer, module=None):
    hook = {keys.TRAIN: "train", keys.VAL: "validation", keys.TEST: "test"}[stage]
    getattr(callback, f"on_{hook}_epoch_start")(trainer, module)
    extra = () if stage == keys.TRAIN else (0,)  # validation and test batches carry a dataloader index
    getattr(callback, f"on_{hook}_batch_end")(trainer, module, {"step": 1}, None, 0, *extra)
    getattr(callback, f"on_{hook}_epoch_end")(trainer, module)


@pytest.mark.parametrize("stage", keys.STAGES, ids=keys.STAGES)
def test_each_stage_starts_updates_and_finishes_its_own_epoch(stage):
    callback = Recorder(keys.STAGES)
    run_epoch(callback, stage, SimpleNamespace(sanity_checking=False))
    assert callback.calls == [("start", stage), ("update", stage, {"step": 1}), ("finish", stage)]


def test_training_also_starts_at_the_train_start_for_a_run_resumed_mid_epoch():
    callback = Recorder(keys.STAGES)
    callback.on_train_start(SimpleNamespace(sanity_checking=False), None)
    assert callback.calls == [("start", keys.TRAIN)]


def test_the_sanity_check_is_started_but_neither_accumulated_nor_logged():
    callback = Recorder((keys.VAL,))
    run_epoch(callback, keys.VAL, SimpleNamespace(sanity_checking=True))
    assert callback.calls == [("start", keys.VAL)]


def test_stages_it_does_not_accumulate_cost_nothing():
    callback = Recorder((keys.VAL,))
    callback.on_train_start(SimpleNamespace(sanity_checking=False), None)
    for stage in (keys.TRAIN, keys.TEST):
        run_epoch(callback, stage, SimpleNamespace(sanity_checking=False))
    assert callback.calls == []
