"""Checkpoint ensembles: ranking by the recorded validation score, and members adapted separately."""

import pickle
import re

import pytest
import torch
from tiny_setup import tiny_model

from units_lightning.engines import Learn2LearnEngine, adapt_and_predict_sets
from units_lightning.engines.base import EvaluatingEngine
from units_lightning.evaluation import CheckpointEnsemble
from units_lightning.losses import CrossEntropyLoss


def _save(path, model, step, score):
    callbacks = {"ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max'}": {"monitor": "val/acc", "current_score": score}}
    state = {"state_dict": model.state_dict(), "global_step": step, "callbacks": callbacks}
    torch.save(state, path)


@pytest.fixture
def checkpoints(tmp_path):
    models = []
    for step, score in ((10, 0.5), (20, 0.9), (30, 0.7)):
        torch.manual_seed(step)
        models.append(tiny_model())
        _save(tmp_path / f"step{step}.ckpt", models[-1], step, torch.tensor(score))
    _save(tmp_path / "last.ckpt", models[-1], 30, torch.tensor(0.7))  # same step as step30: counted once
    return tmp_path, models


def test_top_k_by_recorded_score(checkpoints):
    folder, _ = checkpoints
    ranked = CheckpointEnsemble(str(folder), top_k=2).rank()
    assert [(m.path.name, m.step, round(m.score, 3)) for m, _ in ranked] == [
        ("step20.ckpt", 20, 0.9),
        ("step30.ckpt", 30, 0.7),
    ]
    assert len(CheckpointEnsemble(str(folder)).rank()) == 3
    assert [m.path.name for m, _ in CheckpointEnsemble(str(folder), top_k=1, mode="min").rank()] == ["step10.ckpt"]


def test_ensemble_averages_the_logits_of_separately_adapted_members(checkpoints):
    folder, models = checkpoints
    support_x, support_y = torch.rand(2, 5, 1, 16, 16), torch.arange(5).repeat(2, 1)
    query_x = torch.rand(2, 10, 1, 16, 16)
    expected = _mean_of(models[1:], support_x, support_y, query_x)
    torch.manual_seed(99)
    ensemble = tiny_model(ensemble=CheckpointEnsemble([str(folder / "step20.ckpt"), str(folder / "step30.ckpt")]))
    ensemble.load_ensemble()
    assert len(ensemble.ensemble_engine) == 2
    assert torch.allclose(ensemble.adapt_and_predict(support_x, support_y, query_x), expected, atol=1e-6)
    assert set(ensemble.state_dict()) == set(tiny_model().state_dict())  # members live outside the model's state


def test_an_ensemble_evaluates_member_by_member_without_recording_a_backward(checkpoints, monkeypatch):
    # A CIFAR-FS 5w1s test of a top-3 ensemble (20 tasks, with the default rotated and scaled query sets) was
    # killed at 24 GB on the CPU: the members predicted through adapt + predict_sets with autograd recording, and
    # every member's query activations were kept until the batch ended. Now each member evaluates as one model
    # does (``BatchedEngine.evaluate``), and any engine without ``evaluate`` predicts under no_grad.
    folder, models = checkpoints
    support_x, support_y = torch.rand(2, 5, 1, 16, 16), torch.arange(5).repeat(2, 1)
    query_sets = [torch.rand(2, 10, 1, 16, 16), torch.rand(2, 10, 1, 16, 16)]
    ensemble = tiny_model(ensemble=CheckpointEnsemble([str(folder / "step20.ckpt"), str(folder / "step30.ckpt")]))
    ensemble.load_ensemble()
    members = ensemble.ensemble_engine.members
    assert isinstance(ensemble.ensemble_engine, EvaluatingEngine)
    evaluated = []
    for member in members:
        monkeypatch.setattr(member, "evaluate", _recording(member.evaluate, evaluated))
    logits = ensemble.adapt_and_predict_sets(support_x, support_y, query_sets)
    assert evaluated == [False, False]  # each member once, its predictions not recorded (grad mode seen inside)
    for got, query_x in zip(logits, query_sets, strict=True):
        expected = _mean_of(models[1:], support_x, support_y, query_x)
        assert not got.requires_grad and torch.allclose(got, expected, atol=1e-6)

    # an engine without evaluate (learn2learn's, one task at a time): its predictions are not recorded either
    engine = tiny_model(engine="learn2learn").engine
    assert isinstance(engine, Learn2LearnEngine) and not isinstance(engine, EvaluatingEngine)
    predicted = []
    monkeypatch.setattr(engine, "predict_sets", _recording(engine.predict_sets, predicted))
    sets = adapt_and_predict_sets(engine, support_x, support_y, query_sets, CrossEntropyLoss(), 1)
    assert predicted == [False] and all(not q.requires_grad for q in sets)


def _mean_of(models, support_x, support_y, query_x):
    """The mean of the models' logits, each adapted on its own: what an ensemble of them must predict."""
    return sum(model.adapt_and_predict(support_x, support_y, query_x) for model in models) / len(models)


def _recording(function, seen: list):
    """``function``, appending whether autograd records when it runs to ``seen``; its output says the same."""

    def wrapper(*args, **kwargs):
        output = function(*args, **kwargs)
        seen.append(torch.is_grad_enabled() and output.requires_grad)
        return output

    return wrapper


def test_unranked_files_and_missing_folders_are_clear_errors(tmp_path):
    torch.save({"state_dict": tiny_model().state_dict(), "global_step": 1, "callbacks": {}}, tmp_path / "a.ckpt")
    with pytest.raises(ValueError, match="cannot rank by 'val/acc'"):
        CheckpointEnsemble(str(tmp_path), top_k=1).rank()
    with pytest.raises(ValueError, match="no checkpoint files"):
        CheckpointEnsemble(str(tmp_path / "nowhere")).files()
    with pytest.raises(ValueError, match="top_k"):
        CheckpointEnsemble(str(tmp_path), top_k=0)


class _Payload:
    """Unpickling this would create ``marker``: a stand-in for a pickled ``os.system`` call."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_malicious_checkpoint_in_an_ensemble_folder_runs_nothing_and_is_named(checkpoints, tmp_path, writer):
    folder, _ = checkpoints
    marker = tmp_path / "code_ran"
    evil = folder / "step40.ckpt"
    state = {"state_dict": {}, "global_step": 40, "callbacks": {}, "hyper_parameters": _Payload(marker)}
    if writer == "torch.save":
        torch.save(state, evil)
    else:
        evil.write_bytes(pickle.dumps(state))
    for load in (
        lambda: CheckpointEnsemble(str(folder), top_k=2).rank(),
        lambda: tiny_model(ensemble=CheckpointEnsemble(str(folder))).load_ensemble(),
    ):
        with pytest.raises(ValueError) as refused:
            load()
        message = str(refused.value)
        assert f"refused to load checkpoint {evil}" in message
        assert "nothing in it was run" in message
        assert "remove it from the folder, or list the member files in ensemble.checkpoints" in message
        if writer == "torch.save":
            assert "builtins.exec" in message  # what it would have imported, read from its opcodes
        assert not marker.exists()
    pickle.loads(pickle.dumps(_Payload(marker)))  # control: a plain unpickler does run the payload
    assert marker.exists()


def test_a_trusted_checkpoint_with_objects_loads_once_its_classes_are_allowed(tmp_path):
    # A model built in Python with loss=CrossEntropyLoss() saves the object among its hyperparameters.
    path = tmp_path / "python.ckpt"
    hyper_parameters = {"loss": CrossEntropyLoss()}
    torch.save({"state_dict": tiny_model().state_dict(), "global_step": 1, "hyper_parameters": hyper_parameters}, path)
    with pytest.raises(ValueError, match=r"needs units_lightning\.losses\.CrossEntropyLoss.*safe_globals"):
        CheckpointEnsemble(str(path)).rank()
    with torch.serialization.safe_globals([CrossEntropyLoss]):  # what the message proposes, for a file you trust
        ((member, loaded),) = CheckpointEnsemble(str(path)).rank()
    assert member.step == 1 and set(loaded) == {"state_dict", "global_step"}  # only what a member needs is kept


def test_a_truncated_or_foreign_file_is_named(tmp_path):
    good = tmp_path / "good.ckpt"
    _save(good, tiny_model(), 1, torch.tensor(0.5))
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:1000])
    with pytest.raises(ValueError, match=rf"cannot read checkpoint {re.escape(str(truncated))}.*remove it from the"):
        CheckpointEnsemble([str(good), str(truncated)]).rank()
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(ValueError, match=r"foreign\.ckpt is not a Lightning checkpoint \(it has no \['state_dict'"):
        CheckpointEnsemble([str(foreign)]).rank()


def test_a_member_of_another_shape_names_the_file_both_shapes_and_the_option(tmp_path):
    four_way = tmp_path / "four_way.ckpt"
    _save(four_way, tiny_model(n_way=4), 1, torch.tensor(0.5))
    model = tiny_model(ensemble=CheckpointEnsemble([str(four_way)]))
    with pytest.raises(ValueError) as refused:
        model.load_ensemble()
    message = str(refused.value)
    assert f"ensemble member {four_way} does not fit the configured model" in message
    assert "engine.model.classifier.weight: checkpoint (4, 4), model (5, 4)" in message
    assert "set data.n_way to 4" in message


def test_a_later_last_checkpoint_does_not_borrow_the_best_score(tmp_path):
    # Lightning records the best score so far in every checkpoint: a last.ckpt of a later, worse step carries it too.
    torch.manual_seed(0)
    _save(tmp_path / "step3.ckpt", tiny_model(), 3, torch.tensor(0.9))
    _save(tmp_path / "step6.ckpt", tiny_model(), 6, torch.tensor(0.5))
    _save(tmp_path / "last.ckpt", tiny_model(), 9, torch.tensor(0.9))
    assert [m.path.name for m, _ in CheckpointEnsemble(str(tmp_path), top_k=1).rank()] == ["step3.ckpt"]
    assert len(CheckpointEnsemble(str(tmp_path)).rank()) == 3  # listed without ranking: every file counts
