"""Acquisition samplers under two-process data-parallel training on the CPU (gloo): one budget, split by rank."""

from __future__ import annotations

import textwrap

from tiny_setup import run_two_rank_script

SCRIPT = textwrap.dedent("""
    import json, sys
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    sys.path.insert(0, {tests!r})
    from tiny_setup import tiny_data, tiny_model
    from units_lightning.samplers import DiverseSampler, MarginSampler, StochasticSampler

    class Record(Callback):
        def __init__(self):
            self.chosen = []
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.chosen.append(outputs["chosen"].int().tolist())

    def run(sampler):
        pl.seed_everything(0, verbose=False)
        data = tiny_data(sampler)
        model = tiny_model(label_budget=11, sampler=data.sampler)
        record = Record()
        trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=50, limit_train_batches=100,
                             limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, inference_mode=False, callbacks=[record])
        trainer.fit(model, data)
        return trainer, {{"chosen": record.chosen, "ledger": model.ledger.state_dict()}}

    trainer, stochastic = run(StochasticSampler(tasks=2, query_sets=3, scorer=MarginSampler(), temperature=5.0))
    _, diverse = run(DiverseSampler(tasks=2, query_sets=3, weight=0.5))
    with open(f"result_{{trainer.global_rank}}.json", "w") as out:
        json.dump({{"rank": trainer.global_rank, "stochastic": stochastic, "diverse": diverse}}, out)
""")


def test_two_ranks_spend_one_budget_with_a_stochastic_and_a_diverse_sampler(tmp_path):
    ranks = run_two_rank_script(tmp_path, SCRIPT)
    for name in ("stochastic", "diverse"):
        ledgers = [ranks[r][name]["ledger"] for r in (0, 1)]
        assert ledgers[0] == ledgers[1]  # one global count
        labeled = [sum(sum(map(sum, step)) for step in ranks[r][name]["chosen"]) for r in (0, 1)]
        # 2 steps of 2 x 2 sets, then 3 left: 2 on rank 0, 1 on rank 1; 0 left over 2 ranks ends the run
        assert labeled == [6, 5] and ledgers[0]["query_sets"] == sum(labeled) == 11
