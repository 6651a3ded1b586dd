"""Checkpoint ensembles: ranking by the recorded validation score, and members adapted separately."""

import pytest
import torch
from tiny_setup import tiny_model

from units_lightning.evaluation import CheckpointEnsemble


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
    expected = (
        models[1].adapt_and_predict(support_x, support_y, query_x)
        + models[2].adapt_and_predict(support_x, support_y, query_x)
    ) / 2
    torch.manual_seed(99)
    ensemble = tiny_model(ensemble=CheckpointEnsemble([str(folder / "step20.ckpt"), str(folder / "step30.ckpt")]))
    ensemble.load_ensemble()
    assert len(ensemble.ensemble_engine) == 2
    assert torch.allclose(ensemble.adapt_and_predict(support_x, support_y, query_x), expected, atol=1e-6)
    assert set(ensemble.state_dict()) == set(tiny_model().state_dict())  # members live outside the model's state


def test_unranked_files_and_missing_folders_are_clear_errors(tmp_path):
    torch.save({"state_dict": tiny_model().state_dict(), "global_step": 1, "callbacks": {}}, tmp_path / "a.ckpt")
    with pytest.raises(ValueError, match="cannot rank by 'val/acc'"):
        CheckpointEnsemble(str(tmp_path), top_k=1).rank()
    with pytest.raises(ValueError, match="no checkpoint files"):
        CheckpointEnsemble(str(tmp_path / "nowhere")).files()
    with pytest.raises(ValueError, match="top_k"):
        CheckpointEnsemble(str(tmp_path), top_k=0)
