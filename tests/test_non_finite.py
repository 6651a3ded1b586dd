"""A step whose loss or gradients are not finite is skipped (never applied, counted) or stops the run."""

import copy

import lightning.pytorch as pl
import pytest
import torch
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks import dashboard_callbacks
from units_lightning.losses import EvidentialLoss
from units_lightning.samplers import MultiQuerySampler, RandomSampler

BAD_STEP = 2


class PoisonedLoss(EvidentialLoss):
    """The evidential loss, multiplied by nan while ``poisoned`` (inner and outer loop alike)."""

    poisoned = False

    def __call__(self, logits, labels, eta=0.0):
        loss = super().__call__(logits, labels, eta)
        return loss * float("nan") if self.poisoned else loss


class Poison(pl.Callback):
    """At ``BAD_STEP``: poisons the loss (``where="loss"``) or only the gradient of the first parameter after
    backward (``where="grad"``: the loss stays finite); records the weights and Adam's state just before and just
    after that step."""

    def __init__(self, where):
        self.where, self.before, self.after, self.next = where, None, None, None

    def snapshot(self, trainer, pl_module):
        return (
            torch.nn.utils.parameters_to_vector(pl_module.parameters()).detach().clone(),
            copy.deepcopy(trainer.optimizers[0].state_dict()),
        )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == BAD_STEP:
            self.before = self.snapshot(trainer, pl_module)
            PoisonedLoss.poisoned = self.where == "loss"

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step == BAD_STEP and self.where == "grad":
            next(pl_module.parameters()).grad.view(-1)[0] = float("inf")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == BAD_STEP + 1:
            self.after = self.snapshot(trainer, pl_module)
            PoisonedLoss.poisoned = False
        if trainer.global_step == BAD_STEP + 2:
            self.next = self.snapshot(trainer, pl_module)


def fit(tmp_path, where, fused=False, **model_options):
    PoisonedLoss.poisoned = False
    poison = Poison(where)
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    model = tiny_model(loss=PoisonedLoss(), sampler=data.sampler, **model_options)
    if fused:  # as on CUDA: the guard skips on the device, through the fused kernel's found_inf, with no read
        model.configure_optimizers = lambda: torch.optim.Adam(model.parameters(), lr=model.lr, fused=True)
    trainer = tiny_trainer(tmp_path, max_steps=5, callbacks=[poison], log_every_n_steps=1)
    return model, trainer, poison, data


@pytest.mark.parametrize("fused", [False, True], ids=["host", "fused"])
@pytest.mark.parametrize("where", ["loss", "grad"])
def test_a_non_finite_step_is_skipped_counted_and_never_applied(tmp_path, where, fused):
    model, trainer, poison, data = fit(tmp_path, where, fused)
    with pytest.warns(
        UserWarning,
        match=rf"non-finite {'meta-loss' if where == 'loss' else 'gradients'}.* at step 2: "
        r"the step was skipped, not applied \(its 2 labeled query sets stay counted, once\)",
    ):
        trainer.fit(model, data)
    assert trainer.global_step == 5
    weights, adam = poison.before
    weights_after, adam_after = poison.after
    assert torch.equal(weights, weights_after)  # not applied
    assert adam["state"].keys() == adam_after["state"].keys()
    for index, state in adam["state"].items():  # Adam's moments and step counts untouched
        for name, value in state.items():
            assert torch.equal(value, adam_after["state"][index][name]), (index, name)
    assert not torch.equal(weights_after, poison.next[0])  # and training goes on with the next step
    assert model.ledger.skipped_steps == 1 and model.ledger.skipped_query_sets == 2
    assert model.ledger.query_sets == 5 * 2  # the skipped step's labels are counted once, not again
    assert trainer.callback_metrics["train/skipped_steps"] == 1.0
    assert torch.isfinite(torch.nn.utils.parameters_to_vector(model.parameters())).all()


def test_stop_mode_raises_naming_the_step_and_the_fix(tmp_path):
    model, trainer, _, data = fit(tmp_path, "grad", non_finite="stop")
    with pytest.raises(FloatingPointError, match=r"non-finite gradients \(loss [-\d.e]+\) at step 2: lower model.lr"):
        trainer.fit(model, data)
    assert model.ledger.query_sets == 3 * 2


def test_a_nan_model_skips_every_step_and_keeps_its_weights(tmp_path):
    class Exploding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(256, 5)

        def forward(self, x):
            return self.linear(x.flatten(1)) * float("nan")

    from units_lightning.module import UnitsMAML

    data = tiny_data(RandomSampler(tasks=2))
    model = UnitsMAML(n_way=5, image_shape=(1, 16, 16), backbone=Exploding(), inner_steps=1, sampler=data.sampler)
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    with pytest.warns(UserWarning, match="non-finite meta-loss"):
        tiny_trainer(tmp_path, max_steps=3).fit(model, data)
    assert torch.equal(before, torch.nn.utils.parameters_to_vector(model.parameters()))
    assert model.ledger.skipped_steps == 3 and model.ledger.query_sets == 3 * 2


def test_an_unknown_non_finite_mode_is_refused():
    with pytest.raises(ValueError, match=r"non_finite must be 'skip' or 'stop', got 'ignore'"):
        tiny_model(non_finite="ignore")


def test_the_dashboards_leave_a_skipped_step_out(tmp_path):
    PoisonedLoss.poisoned, poison = False, Poison("loss")
    sampler = MultiQuerySampler(tasks=2, query_sets=2)
    data = tiny_data(sampler)
    model = tiny_model(loss=PoisonedLoss(), sampler=sampler)
    trainer = tiny_trainer(tmp_path, max_steps=5, callbacks=[poison, *dashboard_callbacks()])
    with pytest.warns(UserWarning, match="skipped"):
        trainer.fit(model, data)
    metrics = trainer.callback_metrics
    assert metrics["train/theorem1_holds"] == 1.0 and torch.isfinite(metrics["train/theorem1_margin"])
    assert torch.isfinite(metrics["selection/uncertainty_chosen_p50"])
    assert model.ledger.skipped_steps == 1


def test_skips_counted_on_the_device_are_in_every_checkpoint(tmp_path):
    """With a fused optimizer the guard counts skips on the device; a checkpoint taken at a logging step (where it
    settles them, in a hook that may not log) holds them, and the run goes on."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from units_lightning.evaluation.checkpoints import load_checkpoint

    model, _, poison, data = fit(tmp_path, "loss", fused=True)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    trainer = tiny_trainer(
        tmp_path, max_steps=5, callbacks=[poison, saver], log_every_n_steps=1, enable_checkpointing=True
    )
    with pytest.warns(UserWarning, match="skipped"):
        trainer.fit(model, data)
    with torch.serialization.safe_globals([PoisonedLoss]):  # the test's loss is among the saved hyperparameters
        last = load_checkpoint(tmp_path / "ckpt" / "epoch=0-step=5.ckpt")
    assert last["label_ledger"]["skipped_steps"] == 1 and model.ledger.skipped_steps == 1


def test_the_flag_marks_any_inf_or_nan_and_leaves_every_value_as_it_is():
    from units_lightning.callbacks.non_finite import _largest_not_finite, non_finite_flag

    one = torch.ones(())
    grads = [torch.tensor([0.5, -0.0, 3e38]), torch.tensor([[1.0, -2.0]], dtype=torch.float64)]
    copies = [g.clone() for g in grads]
    assert non_finite_flag(grads, one).item() == 0.0 and non_finite_flag([], one).item() == 0.0
    assert all(torch.equal(g, c) and g.signbit().equal(c.signbit()) for g, c in zip(grads, copies, strict=True))
    for bad in (float("inf"), float("-inf"), float("nan")):
        flag = non_finite_flag([*grads, torch.tensor([1.0, bad])], one)
        assert flag.dtype == torch.float32 and flag.shape == () and flag.item() == 1.0
        # the form for devices without GradScaler's kernel (MPS) says the same
        assert _largest_not_finite([*grads, torch.tensor([1.0, bad])]).item() == 1.0
    assert _largest_not_finite(grads).item() == 0.0 and _largest_not_finite(grads).dtype == torch.float32


def test_skips_counted_on_the_device_are_read_without_a_logging_step(tmp_path, monkeypatch):
    """A run that logs rarely still moves its skips into the ledger: after ``_SETTLE_AFTER`` steps, and at the end."""
    from units_lightning.callbacks import non_finite

    monkeypatch.setattr(non_finite, "_SETTLE_AFTER", BAD_STEP + 2)
    model, _, poison, data = fit(tmp_path, "grad", fused=True)
    seen = []

    class Ledger(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(pl_module.ledger.skipped_steps)

    trainer = tiny_trainer(tmp_path, max_steps=5, callbacks=[poison, Ledger()], log_every_n_steps=1000)
    with pytest.warns(UserWarning, match=r"non-finite gradients .* at step 2: the step was skipped"):
        trainer.fit(model, data)
    assert seen == [0, 0, 0, 1, 1]  # read after the 4th step (the cap), not at a logging step
    assert model.ledger.skipped_steps == 1 and model.ledger.skipped_query_sets == 2
    assert not torch.equal(poison.before[0], poison.next[0])
    assert torch.equal(poison.before[0], poison.after[0])
