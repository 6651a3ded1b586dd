"""Two-process data-parallel training on the CPU (gloo): ranks draw their own tasks, the ledger counts all."""

import textwrap

from tiny_setup import run_two_rank_script

SCRIPT = textwrap.dedent("""
    import json, sys
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    sys.path.insert(0, {tests!r})
    from tiny_setup import tiny_data, tiny_model
    from units_lightning.samplers import MultiQuerySampler

    class Record(Callback):
        classes = []
        labeled = []
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.classes.append(batch.classes.tolist())
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.labeled.append(int(outputs["chosen"].sum()))

    pl.seed_everything(0, verbose=False)
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    model = tiny_model(label_budget=10, sampler=data.sampler)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=50, limit_train_batches=100,
                         limit_val_batches=2, val_check_interval=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, inference_mode=False,
                         callbacks=[Record()])
    trainer.fit(model, data)
    with open(f"result_{{trainer.global_rank}}.json", "w") as out:
        json.dump({{"rank": trainer.global_rank, "steps": trainer.global_step, "ledger": model.ledger.state_dict(),
                   "classes": Record.classes, "labeled": Record.labeled,
                   "val_acc": float(trainer.callback_metrics["val/acc"])}}, out)
""")


def test_ddp_ranks_draw_different_tasks_and_share_one_label_budget(tmp_path):
    results = run_two_rank_script(tmp_path, SCRIPT)
    # Each step labels 2 query sets per rank, 4 in all: after 2 steps 2 are left of the budget of 10, one per rank.
    for result in results.values():
        assert result["steps"] == 3 and result["labeled"] == [2, 2, 1]
        assert result["ledger"]["query_sets"] == 10 and result["ledger"]["support_images"] == 60
    assert results[0]["classes"] != results[1]["classes"]
    assert results[0]["val_acc"] == results[1]["val_acc"]
