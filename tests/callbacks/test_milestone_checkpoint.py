"""``MilestoneCheckpoint``: one checkpoint per count of labeled query sets, written once, also across resumes."""

from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from tiny_setup import REPO, tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks import MilestoneCheckpoint
from units_lightning.samplers import RandomSampler

MILESTONES = [4, 8, 9]  # two labeled query sets a step: reached at steps 2, 4 and 5 (10 labeled, past 9)


def fit(root: Path, max_steps: int, milestone: bool = True, ckpt_path: Path | None = None, **trainer_options):
    """Train the tiny model, ``last.ckpt`` after every step in ``root/checkpoints``; returns the callback."""
    pl.seed_everything(0, verbose=False)
    data = tiny_data(RandomSampler(tasks=2))
    callback = MilestoneCheckpoint(MILESTONES)
    last = ModelCheckpoint(dirpath=root / "checkpoints", filename="last", every_n_train_steps=1)
    callbacks = [callback, last] if milestone else [last]
    trainer = tiny_trainer(root, max_steps=max_steps, enable_checkpointing=True, callbacks=callbacks, **trainer_options)
    trainer.fit(tiny_model(sampler=data.sampler), data, ckpt_path=ckpt_path)
    return callback


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def milestone_files(root: Path) -> dict[str, dict]:
    return {p.name: load(p) for p in sorted((root / "checkpoints" / "milestones").glob("*.ckpt"))}


def weights(checkpoint: dict) -> dict:
    return checkpoint["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted")
    fit(root, max_steps=6)
    return milestone_files(root)


def test_one_file_per_milestone_at_the_step_that_reaches_it(uninterrupted):
    assert list(uninterrupted) == ["labels-00004.ckpt", "labels-00008.ckpt", "labels-00009.ckpt"]
    # (step, labeled query sets) of each file: the step that crossed 9 had labeled 10.
    seen = {name: (c["global_step"], c["label_ledger"]["query_sets"]) for name, c in uninterrupted.items()}
    assert seen == {"labels-00004.ckpt": (2, 4), "labels-00008.ckpt": (4, 8), "labels-00009.ckpt": (5, 10)}
    state = uninterrupted["labels-00009.ckpt"]["callbacks"][MilestoneCheckpoint(MILESTONES).state_key]
    assert state["passed"] == MILESTONES  # each file records itself as saved
    assert not torch.equal(
        *(weights(uninterrupted[n])["engine.model.classifier.weight"] for n in list(uninterrupted)[:2])
    )


def test_files_go_beside_the_model_checkpoints_in_a_folder_of_their_own(tmp_path):
    callback = fit(tmp_path, max_steps=2)
    assert callback.paths == {4: str(tmp_path / "checkpoints" / "milestones" / "labels-00004.ckpt")}
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")) == ["last.ckpt"]


def test_a_run_resumed_past_a_milestone_does_not_save_it_again(tmp_path, uninterrupted):
    fit(tmp_path, max_steps=3)  # labels-00004 at step 2; last.ckpt at step 3 (6 labeled)
    first = tmp_path / "checkpoints" / "milestones" / "labels-00004.ckpt"
    written = first.stat().st_mtime_ns, first.read_bytes()
    callback = fit(tmp_path, max_steps=6, ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert (first.stat().st_mtime_ns, first.read_bytes()) == written
    files = milestone_files(tmp_path)
    assert list(files) == list(uninterrupted) and callback.passed == set(MILESTONES)
    for name in ("labels-00008.ckpt", "labels-00009.ckpt"):
        assert files[name]["global_step"] == uninterrupted[name]["global_step"]
        assert files[name]["label_ledger"] == uninterrupted[name]["label_ledger"]


def test_a_run_stopped_just_before_a_milestone_saves_it_after_resume_as_an_uninterrupted_run_does(
    tmp_path, uninterrupted
):
    fit(tmp_path, max_steps=1)  # 2 labeled; the next step reaches 4
    assert milestone_files(tmp_path) == {}
    fit(tmp_path, max_steps=6, ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    files = milestone_files(tmp_path)
    assert list(files) == list(uninterrupted)
    for name, checkpoint in files.items():
        reference = uninterrupted[name]
        assert (checkpoint["global_step"], checkpoint["label_ledger"]) == (
            reference["global_step"],
            reference["label_ledger"],
        )
        for key, value in weights(reference).items():
            torch.testing.assert_close(weights(checkpoint)[key], value, rtol=0, atol=0, msg=f"{name}: {key}")


def test_a_resume_from_a_checkpoint_without_its_record_gives_up_passed_milestones_with_a_warning(tmp_path):
    fit(tmp_path, max_steps=3, milestone=False)  # 6 labeled, no record of the callback
    folder = tmp_path / "checkpoints" / "milestones"
    folder.mkdir(parents=True)
    (folder / "labels-00004.ckpt").write_bytes(b"written by an earlier run")
    # The first step after the resume reaches 8: passed before the resume, or by that step? It cannot tell.
    with pytest.warns(UserWarning, match=r"milestone\(s\) \[8\] have no file in .* may have been passed before"):
        callback = fit(tmp_path, max_steps=6, ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert sorted(p.name for p in folder.glob("*.ckpt")) == ["labels-00004.ckpt", "labels-00009.ckpt"]
    assert (folder / "labels-00004.ckpt").read_bytes() == b"written by an earlier run"  # taken as saved, kept
    assert callback.passed == set(MILESTONES) and sorted(callback.paths) == [4, 9]


def test_a_smoke_run_writes_nothing(tmp_path):
    pl.seed_everything(0, verbose=False)
    data = tiny_data(RandomSampler(tasks=2))
    callback = MilestoneCheckpoint([2])
    tiny_trainer(tmp_path, fast_dev_run=True, callbacks=[callback]).fit(tiny_model(sampler=data.sampler), data)
    assert callback.passed == set() and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    ("milestones", "filename", "match"),
    [
        ([], "labels-{labels:05d}", "distinct counts"),
        ([4000, 4000], "labels-{labels:05d}", "distinct counts"),
        ([0, 10], "labels-{labels:05d}", "distinct counts"),
        ([4000, 8000], "budget", "same name to several milestones"),
        ([4000], "labels-{count}", "cannot be formatted"),
    ],
    ids=["empty", "repeated", "zero", "one-name", "unknown-field"],
)
def test_bad_arguments_are_refused_with_the_fix(milestones, filename, match):
    with pytest.raises(ValueError, match=match):
        MilestoneCheckpoint(milestones, filename=filename)


def test_a_module_without_a_label_ledger_is_refused_at_setup():
    with pytest.raises(TypeError, match=r"pl_module\.ledger\.query_sets"):
        MilestoneCheckpoint([10]).setup(SimpleNamespace(), SimpleNamespace(), "fit")


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs").glob("budget_*.yaml")))
def test_every_budget_config_saves_the_papers_budget_points_within_its_budget(name):
    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    (milestone,) = [c for c in config["trainer"]["callbacks"] if c["class_path"].endswith(".MilestoneCheckpoint")]
    assert milestone["class_path"] == "units_lightning.callbacks.MilestoneCheckpoint"
    assert milestone["init_args"]["milestones"] == [2000, 4000, 8000, 10000]
    assert config["model"]["label_budget"] == 10000
