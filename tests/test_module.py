import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.losses import CrossEntropyLoss
from units_lightning.module import COMPILE_MIN_STEPS, UnitsMAML, auto_capture
from units_lightning.samplers import MultiQuerySampler, RandomSampler, SingleTaskSelectionSampler
from units_lightning.schedules import Constant


@pytest.mark.parametrize(
    "sampler,labeled_per_step,support_per_step",
    [
        (RandomSampler(tasks=3), 3, 3),
        (SingleTaskSelectionSampler(tasks=2, candidates=4), 2, 4),
        (MultiQuerySampler(tasks=2, query_sets=3), 2, 2),
    ],
    ids=["random", "units-st", "multi-query"],
)
def test_every_sampler_trains_and_the_ledger_counts_what_was_labeled(
    tmp_path, sampler, labeled_per_step, support_per_step
):
    model = tiny_model(sampler=sampler)
    tiny_trainer(tmp_path, max_steps=3).fit(model, tiny_data(sampler))
    assert model.ledger.query_sets == 3 * labeled_per_step
    assert model.ledger.query_images == 3 * labeled_per_step * 5
    assert model.ledger.support_images == 3 * support_per_step * 5


def test_meta_update_changes_the_initialisation_with_second_order_gradients(tmp_path):
    pl.seed_everything(0, verbose=False)
    data = tiny_data(RandomSampler(tasks=2))
    model = tiny_model(first_order=False, sampler=data.sampler)
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    tiny_trainer(tmp_path, max_steps=2).fit(model, data)
    after = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    assert not torch.equal(before, after)


def test_validation_adapts_even_under_inference_mode(tmp_path):
    model = tiny_model(inner_steps=2)
    data = tiny_data(RandomSampler(tasks=2))
    trainer = tiny_trainer(tmp_path, inference_mode=True, limit_val_batches=None)
    (metrics,) = trainer.validate(model, data, verbose=False)
    assert set(metrics) >= {
        "val/acc",
        "val/loss",
        "val/vacuity",
        "val/dissonance",
        "val/incorrect_belief",
        "val/correct_belief",
    }
    assert 0.0 <= metrics["val/acc"] <= 1.0
    (metrics,) = trainer.test(model, data, verbose=False)
    assert "test/acc" in metrics


def test_evaluation_adapts_to_the_support_set():
    # From a random initialisation, inner steps on a support set must fit that support set better.
    data = tiny_data(RandomSampler(tasks=2))
    data.setup("validate")
    batch = data.val_dataloader().dataset[0]
    support_loss = {}
    for steps in (0, 10):
        pl.seed_everything(0, verbose=False)
        model = tiny_model(eval_inner_steps=steps, inner_lr=0.5, filters=8)
        logits = model.adapt_and_predict(batch.support_x, batch.support_y, batch.support_x)
        support_loss[steps] = model.loss(logits, batch.support_y).item()
    assert support_loss[10] < 0.8 * support_loss[0]


def test_ledger_lives_in_checkpoints_and_resumes(tmp_path):
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    model = tiny_model(sampler=data.sampler)
    tiny_trainer(tmp_path, max_steps=3, enable_checkpointing=True, callbacks=[checkpoints]).fit(model, data)
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert saved["label_ledger"]["query_sets"] == 6
    loaded = UnitsMAML.load_from_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert torch.equal(
        torch.nn.utils.parameters_to_vector(loaded.parameters()),
        torch.nn.utils.parameters_to_vector(model.parameters()),
    )
    assert loaded.ledger.query_sets == 6 and loaded.inner_steps == model.inner_steps
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    resumed = tiny_model(sampler=data.sampler)
    tiny_trainer(tmp_path, max_steps=5).fit(resumed, data, ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    assert resumed.ledger.query_sets == 10
    assert resumed.ledger.support_images == 5 * 2 * 5


def test_label_budget_ends_training_when_spent(tmp_path):
    data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
    model = tiny_model(label_budget=5, sampler=data.sampler)
    trainer = tiny_trainer(tmp_path, max_steps=100)
    trainer.fit(model, data)
    assert trainer.global_step == 3
    assert model.ledger.query_sets == 5 and model.ledger.exhausted  # the last step labels only what is left


def test_plain_maml_is_a_config_away(tmp_path):
    data = tiny_data(RandomSampler(tasks=2))
    model = tiny_model(loss=CrossEntropyLoss(), sampler=data.sampler)
    trainer = tiny_trainer(tmp_path, max_steps=2)
    trainer.fit(model, data)
    assert torch.isfinite(trainer.callback_metrics["train/loss_epoch"])


def test_non_finite_loss_stops_with_a_clear_error_when_asked(tmp_path):
    class Exploding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(256, 5)
            self.calls = 0

        def forward(self, x):
            return self.linear(x.flatten(1)) * float("nan")

    data = tiny_data(RandomSampler(tasks=2))
    model = UnitsMAML(
        n_way=5, image_shape=(1, 16, 16), backbone=Exploding(), inner_steps=1, sampler=data.sampler, non_finite="stop"
    )
    with pytest.raises(FloatingPointError, match="non-finite meta-loss .* step 0: lower model.lr"):
        tiny_trainer(tmp_path).fit(model, data)


def test_a_second_sampler_on_the_model_is_refused(tmp_path):
    model = tiny_model(sampler=RandomSampler(tasks=2))
    with pytest.raises(ValueError, match="different task samplers"):
        tiny_trainer(tmp_path).fit(model, tiny_data(MultiQuerySampler(tasks=2, query_sets=2)))


def test_a_model_without_a_sampler_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match=r"UnitsMAML\(sampler=data.sampler\)"):
        tiny_trainer(tmp_path).fit(tiny_model(), tiny_data(RandomSampler(tasks=2)))


def test_mismatched_ways_between_model_and_data_are_caught_before_training(tmp_path):
    data = tiny_data(RandomSampler(tasks=2), n_way=3)
    with pytest.raises(ValueError, match=r"model.n_way=5 but data.n_way=3"):
        tiny_trainer(tmp_path).fit(tiny_model(sampler=data.sampler), data)


def test_too_many_ways_for_a_split_fails_before_the_first_step(tmp_path):
    data = tiny_data(RandomSampler(tasks=2), n_way=20)
    model = tiny_model(n_way=20, sampler=data.sampler)
    with pytest.raises(ValueError, match=r"n_way=20 but split 'val' has only 10 classes"):
        tiny_trainer(tmp_path).fit(model, data)
    assert model.ledger.query_sets == 0


def test_predict_describes_every_query_without_labels(tmp_path):
    model = tiny_model()
    data = tiny_data(RandomSampler(tasks=2), test_tasks=3, eval_batch_tasks=2)
    outputs = tiny_trainer(tmp_path, inference_mode=True).predict(model, data)
    assert [o["prediction"].shape for o in outputs] == [(2, 10), (1, 10)]
    first = outputs[0]
    assert first["probability"].shape == (2, 10, 5)
    assert torch.allclose(first["probability"].sum(-1), torch.ones(2, 10))
    assert ((first["vacuity"] > 0) & (first["vacuity"] <= 1)).all()
    assert ((first["dissonance"] >= 0) & (first["dissonance"] < 1)).all()
    assert first["classes"].shape == (2, 5)


class _Outputs(pl.Callback):
    def __init__(self):
        self.train, self.val = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.train.append((outputs, batch))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.val.append((outputs, batch))


def test_steps_return_per_query_values_for_callbacks(tmp_path):
    seen = _Outputs()
    sampler = MultiQuerySampler(tasks=2, query_sets=3)
    data = tiny_data(sampler, eval_batch_tasks=2)
    trainer = tiny_trainer(tmp_path, max_steps=2, callbacks=[seen], limit_val_batches=None, val_check_interval=2)
    trainer.fit(tiny_model(sampler=sampler), data)
    outputs, batch = seen.train[-1]
    assert outputs["scores"].shape == outputs["chosen"].shape == (2, 3)
    assert outputs["chosen"].sum(dim=1).tolist() == [1, 1]
    # The chosen query set of each task is the one with the highest score.
    assert torch.equal(outputs["chosen"].float().argmax(1), outputs["scores"].argmax(1))
    assert outputs["vacuity"].shape == outputs["dissonance"].shape == outputs["correct"].shape == (2, 5)
    assert outputs["incorrect_belief"].shape == (2, 5) and outputs["scored"] is True
    assert ((outputs["incorrect_belief"] >= 0) & (outputs["incorrect_belief"] + outputs["vacuity"] <= 1 + 1e-6)).all()
    assert 0.0 <= outputs["lam"] <= 1.0 and outputs["eta"] >= 0.0
    outputs, batch = seen.val[0]
    queries = (2, 10)  # eval_query_shots=2 per class of 5
    for key in ("labels", "vacuity", "dissonance", "incorrect_belief", "correct_belief", "correct"):
        assert outputs[key].shape == queries, key
    assert outputs["probability"].shape == outputs["logits"].shape == (*queries, 5)
    torch.testing.assert_close(outputs["probability"].sum(-1), torch.ones(queries))
    total = outputs["vacuity"] + outputs["incorrect_belief"] + outputs["correct_belief"]
    torch.testing.assert_close(total, torch.ones(queries))
    assert torch.equal(outputs["correct"], outputs["logits"].argmax(-1) == outputs["labels"])


class StopAfterOneStep(pl.Callback):
    def on_train_batch_end(self, trainer, *args):
        trainer.should_stop = True


@pytest.mark.parametrize(
    "accelerator",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))],
)
def test_fit_then_test_in_one_process_equals_a_fresh_test_of_the_same_weights(tmp_path, accelerator):
    # Lightning moves the model to the CPU when fit ends and back for test: on a GPU, the evaluation graphs that
    # fit's validations captured must not be replayed over the memory of the weights' old copy.
    data = tiny_data(RandomSampler(tasks=2))
    capture = "cuda_graph" if accelerator == "cuda" else "none"
    model = tiny_model(sampler=data.sampler, capture=capture, eta=Constant(0.5))  # as a fresh trainer's schedules
    evaluating = dict(accelerator=accelerator, limit_val_batches=None, num_sanity_val_steps=0)
    trainer = tiny_trainer(tmp_path, max_steps=4, val_check_interval=2, **evaluating)
    trainer.fit(model, data)
    if accelerator == "cuda":
        assert model.engine._graphed_evaluation._graphs  # captured during fit, before the move
    (after_fit,) = trainer.test(model, data, verbose=False)
    fresh = tiny_model(sampler=data.sampler, capture="none", eta=Constant(0.5))
    fresh.load_state_dict(model.state_dict())
    (expected,) = tiny_trainer(tmp_path, **evaluating).test(fresh, data, verbose=False)
    for name in ("test/acc", "test/loss", "test/vacuity", "test/dissonance"):
        assert after_fit[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name


def test_capture_auto_compiles_long_runs_on_one_gpu_only():
    assert auto_capture(50_000, world_size=1) == "compile"  # the paper's standard setting: 100 x 500 steps
    assert auto_capture(COMPILE_MIN_STEPS, world_size=1) == "compile"
    assert auto_capture(float("inf"), world_size=1) == "compile"  # no max_steps, no max_epochs
    assert auto_capture(5_000, world_size=1) == "cuda_graph"  # a label-budget run is over before it pays back
    assert auto_capture(50_000, world_size=2) == "cuda_graph"  # data-parallel: CUDA graphs, as measured


@pytest.mark.parametrize(
    "accelerator",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))],
)
def test_a_long_fit_under_capture_auto_compiles_on_cuda_and_not_on_cpu(tmp_path, accelerator, capsys):
    data = tiny_data(RandomSampler(tasks=2))
    model = tiny_model(sampler=data.sampler)
    trainer = tiny_trainer(
        tmp_path, accelerator=accelerator, max_steps=COMPILE_MIN_STEPS, callbacks=[StopAfterOneStep()]
    )
    trainer.fit(model, data)
    compiles = accelerator == "cuda"
    assert model.engine.capture == ("compile" if compiles else "auto") and model.hparams.capture == "auto"
    printed = capsys.readouterr().out  # printed, not logged: the command line's quiet display hides Lightning's info
    assert ("capture auto: compiling the inner loop for this run of 20,000 steps" in printed) == compiles
