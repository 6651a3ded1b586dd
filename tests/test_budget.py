"""The label budget is never exceeded: the last step labels only what is left, split by rank under DDP."""

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from test_label_leak import TamperingSampler
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.episode import SealedLabels, TaskBatch
from units_lightning.ledger import LabelLedger, chosen_indices
from units_lightning.samplers import MultiQuerySampler


class StepOutputs(pl.Callback):
    def __init__(self):
        self.outputs = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.outputs.append(outputs)


def batch(tasks=2, sets=3, per_set=5):
    labels = torch.arange(tasks * sets * per_set).reshape(tasks, sets, per_set) % 5
    return TaskBatch(
        torch.zeros(tasks, 5, 1, 2, 2),
        torch.zeros(tasks, 5, dtype=torch.long),
        torch.zeros(tasks, sets, per_set, 1, 2, 2),
        SealedLabels(labels),
        torch.zeros(tasks, 5, dtype=torch.long),
    )


def test_the_last_step_labels_only_what_is_left_the_most_uncertain_first(tmp_path):
    seen = StepOutputs()
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=3))
    model = tiny_model(label_budget=5, sampler=data.sampler)
    trainer = tiny_trainer(tmp_path, max_steps=100, callbacks=[seen])
    trainer.fit(model, data)
    assert trainer.global_step == 3
    assert model.ledger.query_sets == 5 and model.ledger.query_images == 25 and model.ledger.exhausted
    assert model.ledger.support_images == 3 * 2 * 5  # every adapted support set counts
    assert [int(o["chosen"].sum()) for o in seen.outputs] == [2, 2, 1]
    last = seen.outputs[-1]
    assert last["vacuity"].shape == (1, 5)  # the step trained on the one set it labeled
    # The sampler chose one set per task; the ledger kept the one whose task uncertainty is higher.
    best = last["scores"].max(dim=1).values
    assert last["chosen"][int(best.argmax())].any()


def test_a_budget_smaller_than_one_meta_batch_is_refused_before_the_first_step(tmp_path):
    data = tiny_data(MultiQuerySampler(tasks=4, query_sets=2))
    model = tiny_model(label_budget=2, sampler=data.sampler)
    message = (
        r"label budget of 2 query sets is smaller than one meta-batch: each step labels 4 query sets "
        r"\(4 tasks x 1 process\)\. Raise model.label_budget to at least 4, or lower the sampler's tasks "
        r"\(data.sampler.init_args.tasks\) to at most 2"
    )
    with pytest.raises(ValueError, match=message):
        tiny_trainer(tmp_path, limit_val_batches=None).fit(model, data)
    assert model.ledger.query_sets == 0 and model.ledger.support_images == 0
    with pytest.raises(ValueError, match=r"label budget must be >= 1 query set or None, got 0"):
        tiny_model(label_budget=0)


def test_resuming_a_spent_budget_is_refused_with_the_fix(tmp_path):
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    tiny_trainer(tmp_path, max_steps=10, enable_checkpointing=True, callbacks=[checkpoints]).fit(
        tiny_model(label_budget=4, sampler=data.sampler), data
    )
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    resumed = tiny_model(label_budget=4, sampler=data.sampler)
    with pytest.raises(ValueError, match=r"label budget of 4 query sets is spent: 4 are labeled already.*Raise model"):
        tiny_trainer(tmp_path, max_steps=10).fit(resumed, data, ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    assert resumed.ledger.query_sets == 4


def test_labels_the_budget_cut_are_never_read(tmp_path):
    """Scrambling the labels of the sets the sampler chose but the budget cut changes nothing."""

    def train(tamper=None):
        pl.seed_everything(0, verbose=False)
        seen = StepOutputs()
        sampler = TamperingSampler(tamper=tamper, tasks=2, query_sets=4, warmup_steps=1)
        model = tiny_model(label_budget=5, sampler=sampler)
        tiny_trainer(tmp_path, max_steps=10, callbacks=[seen]).fit(model, tiny_data(sampler, seed=3))
        labeled = {step: o["chosen"].numpy() for step, o in enumerate(seen.outputs)}
        return torch.nn.utils.parameters_to_vector(model.parameters()).detach(), sampler.chosen, labeled

    reference, chosen, labeled = train()
    cut = {step: chosen[step] & ~labeled[step] for step in chosen}
    assert cut[2].sum() == 1 and not any(cut[s].any() for s in (0, 1)), "the last step must cut one chosen set"
    scrambled, _, labeled_again = train(tamper=cut)
    assert torch.equal(reference, scrambled)
    assert all((labeled[s] == labeled_again[s]).all() for s in labeled)


def test_ranks_split_what_is_left_evenly_lower_ranks_first():
    chosen = torch.ones(2, 3, dtype=torch.bool)
    shares = {}
    for rank in range(3):
        ledger = LabelLedger(budget=20)
        ledger.start(meta_batch=2, rank=rank, world_size=3)
        ledger.query_sets = 12  # 8 left for 3 ranks: 3, 3, 2
        shares[rank] = int(ledger.within_budget(chosen).sum())
    assert shares == {0: 3, 1: 3, 2: 2}
    ledger.query_sets = 18  # 2 left for 3 ranks: fewer than ranks, so training is over
    assert ledger.exhausted
    with pytest.raises(ValueError, match="is spent"):
        ledger.within_budget(chosen)


def test_reveal_refuses_a_choice_beyond_the_budget_before_reading_a_label():
    ledger = LabelLedger(budget=4)
    ledger.query_sets = 3
    with pytest.raises(ValueError, match=r"chosen holds 2 query sets but only 1 are left .* LabelLedger.within_budget"):
        ledger.reveal(batch(), torch.tensor([[True, False, False], [False, True, False]]))
    assert ledger.query_sets == 3
    trimmed = ledger.within_budget(torch.tensor([[True, False, False], [False, True, False]]))
    assert trimmed.tolist() == [[True, False, False], [False, False, False]]  # no priority: task by task
    priority = torch.tensor([[0.1, 0.0, 0.0], [0.0, 0.9, 0.0]])
    kept = ledger.within_budget(torch.tensor([[True, False, False], [False, True, False]]), priority)
    assert kept.tolist() == [[False, False, False], [False, True, False]]  # the more uncertain set
    assert ledger.reveal(batch(), kept).labels.shape == (1, 5) and ledger.query_sets == 4 and ledger.exhausted


def test_a_skipped_step_keeps_its_labels_counted_once():
    ledger = LabelLedger()
    ledger.reveal(batch(), torch.tensor([[True, False, False], [False, True, False]]))
    assert ledger.close_step(applied=False) == 2
    ledger.reveal(batch(), torch.tensor([[True, False, False], [False, False, True]]))
    assert ledger.close_step(applied=True) == 2
    state = ledger.state_dict()
    assert state["query_sets"] == 4 and state["skipped_steps"] == 1 and state["skipped_query_sets"] == 2
    restored = LabelLedger()
    restored.load_state_dict({k: v for k, v in state.items() if not k.startswith("skipped")})  # an older checkpoint
    assert restored.skipped_steps == 0 and restored.query_sets == 4


def test_a_declared_count_gathers_the_chosen_sets_as_the_mask_does_without_reading_it():
    generator = torch.Generator().manual_seed(0)
    for count in (1, 3, 6):
        for _ in range(20):
            flat = torch.zeros(6, dtype=torch.bool)
            flat[torch.randperm(6, generator=generator)[:count]] = True
            mask = flat.view(2, 3)
            assert all(
                torch.equal(a, b) for a, b in zip(chosen_indices(mask, count), mask.nonzero(as_tuple=True), strict=True)
            )
            declared, counted = LabelLedger(), LabelLedger()
            opened, expected = declared.reveal(batch(), mask, count), counted.reveal(batch(), mask)
            assert all(torch.equal(a, b) for a, b in zip(opened, expected, strict=True))
            assert declared.state_dict() == counted.state_dict()


def test_ranks_count_each_others_labels_without_communicating():
    """Under DDP with a declared count every rank adds what all ranks labeled, each trimmed to its share."""
    counts = []
    for rank in range(3):
        ledger = LabelLedger(budget=20)
        ledger.start(meta_batch=2, rank=rank, world_size=3)
        ledger.query_sets = 12  # 8 left for 3 ranks: shares 3, 3, 2; each rank's sampler chose 3 sets
        chosen = ledger.within_budget(torch.ones(1, 3, dtype=torch.bool), count=3)
        ledger.reveal(batch(tasks=1), chosen, count=3)
        counts.append((ledger.query_sets, ledger.query_images, ledger.support_images))
    assert counts == [(12 + 3 + 3 + 2, 8 * 5, 3 * 5)] * 3


def test_a_sampler_that_chooses_another_count_than_it_declares_is_stopped(tmp_path):
    class Miscounting(MultiQuerySampler):
        def choose(self, scores):  # two sets per task, while chosen_count still says one
            return torch.ones_like(scores, dtype=torch.bool)

    data = tiny_data(Miscounting(tasks=2, query_sets=2))
    model = tiny_model(sampler=data.sampler)
    with pytest.raises(ValueError, match=r"Miscounting\(tasks=2.*declared in chosen_count\(\)"):
        tiny_trainer(tmp_path, max_steps=3, log_every_n_steps=1).fit(model, data)
