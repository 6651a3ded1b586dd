"""``LabelBudget``: added to every fit by ``UnitsMAML``, it logs the labels spent and stops a spent budget; the ledger
keeps its checkpoint key, so checkpoints written before the callback existed resume and load."""

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks.label_budget import LabelBudget
from units_lightning.module import UnitsMAML
from units_lightning.samplers import MultiQuerySampler


def test_every_fit_gets_one_label_budget_that_logs_what_was_spent_and_stops_when_spent(tmp_path):
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    model = tiny_model(label_budget=5, sampler=data.sampler)
    trainer = tiny_trainer(tmp_path, max_steps=100, log_every_n_steps=1, callbacks=[LabelBudget()])
    trainer.fit(model, data)
    assert sum(isinstance(c, LabelBudget) for c in trainer.callbacks) == 1  # the module's replaced the trainer's
    assert trainer.global_step == 3 and model.ledger.query_sets == 5 and model.ledger.exhausted
    logged = trainer.callback_metrics
    assert logged["labels/query_sets"] == 5 and logged["labels/query_images"] == 5 * 5
    assert logged["labels/support_images"] == 3 * 2 * 5


def test_a_checkpoint_written_before_the_callback_resumes_and_loads_with_its_ledger(tmp_path):
    folder = tmp_path / "checkpoints"
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    checkpoints = ModelCheckpoint(dirpath=folder, filename="last", every_n_train_steps=1)
    trainer = tiny_trainer(tmp_path, max_steps=3, enable_checkpointing=True, callbacks=[checkpoints])
    trainer.fit(tiny_model(sampler=data.sampler), data)
    checkpoint = torch.load(folder / "last.ckpt", weights_only=True)
    # The ledger as checkpoints held it before skipped steps were counted, and no state of the new callback.
    checkpoint["label_ledger"] = {
        k: checkpoint["label_ledger"][k] for k in ("budget", "support_images", "query_images", "query_sets")
    }
    checkpoint["callbacks"] = {k: v for k, v in checkpoint.get("callbacks", {}).items() if "LabelBudget" not in k}
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    assert UnitsMAML.load_from_checkpoint(old).ledger.query_sets == 3 * 2
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    resumed = tiny_model(sampler=data.sampler)
    tiny_trainer(tmp_path, max_steps=5).fit(resumed, data, ckpt_path=old)
    assert resumed.ledger.query_sets == 5 * 2 and resumed.ledger.support_images == 5 * 2 * 5
    assert resumed.ledger.skipped_steps == 0
