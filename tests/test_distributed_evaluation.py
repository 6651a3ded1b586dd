"""Evaluation under two-process data-parallel runs (gloo, CPU): every fixed task is evaluated exactly once.

Lightning's ``DistributedSampler`` pads a dataset that does not divide by the number of processes with repeated
items; 7 validation tasks in batches of 3 on 2 processes would count a batch twice. The data modules instead give
each process a contiguous block of the task list (``evaluation_shard``), so the metrics summed across processes
are those of one process that saw every task once.
"""

import hashlib
import math
import textwrap

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from tiny_setup import run_two_rank_script, tiny_data, tiny_model, tiny_trainer

from units_lightning.samplers import RandomSampler

VAL_TASKS, TEST_TASKS, BATCH = 7, 5, 3  # neither divides by 2 processes nor by the batch

SCRIPT = textwrap.dedent("""
    import json, sys
    import lightning.pytorch as pl
    sys.path.insert(0, {tests!r})
    from test_distributed_evaluation import RecordTasks, build

    pl.seed_everything(0, verbose=False)
    data, model = build()
    record = RecordTasks()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=2, limit_train_batches=10,
                         val_check_interval=2, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, inference_mode=False,
                         callbacks=[record])
    trainer.validate(model, data, verbose=False)
    validated = {{k: float(v) for k, v in trainer.callback_metrics.items()}}
    trainer.test(model, data, verbose=False)
    kept = ("tasks", "queries", "accuracy", "aurc", "aurc_max_probability", "ece")
    tested = {{k: v for k, v in model.test_results.items() if k in kept}}
    trainer.fit(model, data)  # validates once, at step 2
    with open(f"result_{{trainer.global_rank}}.json", "w") as out:
        json.dump({{"rank": trainer.global_rank, "tasks": record.tasks, "counted": record.counted,
                   "samplers": record.samplers, "validated": validated, "tested": tested}}, out)
""")


def build():
    """The data module and model of both runs: 7 validation and 5 test tasks in batches of 3; no query shifts."""
    data = tiny_data(RandomSampler(tasks=2), val_tasks=VAL_TASKS, test_tasks=TEST_TASKS, eval_batch_tasks=BATCH)
    return data, tiny_model(sampler=data.sampler, query_shifts=[])


def task_keys(batch) -> list[str]:
    """One key per task of a batch: its classes and a digest of its support images."""
    return [
        f"{classes.tolist()}:{hashlib.sha1(images.numpy().tobytes()).hexdigest()[:12]}"
        for classes, images in zip(batch.classes, batch.support_x, strict=True)
    ]


class RecordTasks(Callback):
    """The tasks each evaluation saw (by stage), the tasks its metrics counted, and the loader's sampler."""

    def __init__(self):
        self.tasks: dict[str, list[str]] = {}
        self.counted: dict[str, int] = {}
        self.samplers: dict[str, str] = {}

    @staticmethod
    def _stage(trainer) -> str:
        return "test" if trainer.testing else "fit" if trainer.state.fn == "fit" else "validate"

    def on_validation_start(self, trainer, pl_module):
        self.samplers[self._stage(trainer)] = type(trainer.val_dataloaders.sampler).__name__

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.tasks.setdefault(self._stage(trainer), []).extend(task_keys(batch))

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.tasks.setdefault("test", []).extend(task_keys(batch))

    def on_validation_epoch_end(self, trainer, pl_module):  # before the module's hook, which resets the metrics
        self.counted[self._stage(trainer)] = pl_module.val_metrics.num_tasks()


def _close(first: float, second: float) -> bool:
    return (math.isnan(first) and math.isnan(second)) or first == pytest.approx(second, rel=1e-6, abs=1e-9)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_every_evaluation_task_counts_once_under_ddp(tmp_path):
    results = run_two_rank_script(tmp_path, SCRIPT)

    # One process, the same tasks and initial weights: the reference.
    pl.seed_everything(0, verbose=False)
    data, model = build()
    data.setup()
    expected = {
        "val": [key for batch in data.val_dataloader() for key in task_keys(batch)],
        "test": [key for batch in data.test_dataloader() for key in task_keys(batch)],
    }
    assert len(expected["val"]) == VAL_TASKS and len(set(expected["val"])) == VAL_TASKS
    trainer = tiny_trainer(tmp_path, limit_val_batches=1.0)
    trainer.validate(model, data, verbose=False)
    validated = {k: float(v) for k, v in trainer.callback_metrics.items()}
    trainer.test(model, data, verbose=False)

    # Each process evaluates a contiguous block of the task list: in rank order they are the list, once.
    for stage, split in (("validate", "val"), ("fit", "val"), ("test", "test")):
        assert results[0]["tasks"][stage] + results[1]["tasks"][stage] == expected[split], stage
        assert results[0]["tasks"][stage] and results[1]["tasks"][stage], f"{stage}: a process had no task"
    for rank in (0, 1):
        assert results[rank]["counted"] == {"validate": VAL_TASKS, "fit": VAL_TASKS}
        assert set(results[rank]["samplers"].values()) == {"ShardSampler"}, "Lightning re-wrapped the sampler"
        tested = results[rank]["tested"]
        assert tested["tasks"] == TEST_TASKS and tested["queries"] == TEST_TASKS * 5 * 2  # n_way x query shots
        for name in ("aurc", "aurc_max_probability", "ece"):
            assert _close(tested[name], model.test_results[name]), name
        assert _close(tested["accuracy"]["mean"], model.test_results["accuracy"]["mean"])
        assert _close(tested["accuracy"]["ci95"], model.test_results["accuracy"]["ci95"])
    # The logged validation values are those of one process that saw every task once.
    logged = {k: v for k, v in validated.items() if k.startswith("val/")}
    assert logged.keys() == {k for k in results[0]["validated"] if k.startswith("val/")}
    for key, value in logged.items():
        assert _close(results[0]["validated"][key], value), key
        assert results[0]["validated"][key] == results[1]["validated"][key] or math.isnan(value), key
