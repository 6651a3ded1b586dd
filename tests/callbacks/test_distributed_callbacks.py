"""The dashboard callbacks under two-process data-parallel training (gloo): global values, the same on both ranks."""

import math
import textwrap

from tiny_setup import run_two_rank_script

SCRIPT = textwrap.dedent("""
    import json, sys
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    sys.path.insert(0, {tests!r})
    from tiny_setup import tiny_data, tiny_model
    from units_lightning.callbacks import dashboard_callbacks
    from units_lightning.samplers import MultiQuerySampler

    class Record(Callback):
        chosen = []
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.chosen.append([trainer.current_epoch, outputs["chosen"].int().tolist()])

    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=4, limit_train_batches=2,
                         limit_val_batches=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, inference_mode=False,
                         callbacks=[Record(), *dashboard_callbacks()])
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=3), eval_batch_tasks=2)
    trainer.fit(tiny_model(sampler=data.sampler), data)
    metrics = {{k: float(v) for k, v in trainer.callback_metrics.items()}}
    with open(f"result_{{trainer.global_rank}}.json", "w") as handle:
        json.dump({{"rank": trainer.global_rank, "metrics": metrics, "chosen": Record.chosen}}, handle)
""")


def test_callbacks_log_global_values_on_every_rank(tmp_path):
    results = run_two_rank_script(tmp_path, SCRIPT)
    keys = [k for k in results[0]["metrics"] if k.startswith(("selection/slot_win", "val_curve/", "label_budget/"))]
    keys += [f"{stage}/theorem1_holds" for stage in ("train", "val")]
    for key in keys:
        first, second = results[0]["metrics"][key], results[1]["metrics"][key]
        assert first == second or (math.isnan(first) and math.isnan(second)), key
    # Slot wins of the last epoch count the tasks of both ranks, which chose differently.
    last = [tasks for rank in (0, 1) for epoch, step in results[rank]["chosen"] if epoch == 1 for tasks in step]
    assert len(last) == 2 * 2 * 2  # ranks x steps x tasks
    for slot in range(3):
        expected = sum(row[slot] for row in last) / len(last)
        assert abs(results[0]["metrics"][f"selection/slot_win/{slot}"] - expected) < 1e-6
    assert results[0]["metrics"]["train/theorem1_holds"] == 1.0
    assert results[0]["metrics"]["label_budget/query_sets"] == 4 * 2 * 2  # steps x ranks x tasks
