"""Validation on an annotation project: a share of the labeled query sets held out, never trained on, so that `fit`
logs val/acc, records a best checkpoint and the printed `test ... --ckpt_path best` runs."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest
import torch

from units_lightning.annotation import AnnotatedTasksDataModule, SimulatedAnnotator, ingest, load_project, read_manifest
from units_lightning.annotation.commands import ingest_main, select_main
from units_lightning.annotation.holdout import (
    held_out_flags,
    held_out_sets,
    labels_needed,
    validation_phase,
)
from units_lightning.annotation.label_store import LabelStore
from units_lightning.cli import cli_main
from units_lightning.ledger import LabelLedger
from units_lightning.samplers import MultiQuerySampler


@pytest.mark.parametrize("share", [0.1, 0.2, 0.25, 0.5], ids=lambda s: f"share{s}")
def test_held_out_sets_are_a_fixed_share_and_keep_their_role_as_sets_arrive(share):
    for seed in range(20):
        phase = validation_phase(share, seed)
        assert 0 <= phase < 1 - share
        flags = held_out_flags(200, share, phase)
        for count in range(1, 200):
            assert (held_out_flags(count, share, phase) == flags[:count]).all()  # roles depend on position alone
            assert flags[:count].sum() == np.floor(share * count + phase)
        needed = labels_needed(share, phase)
        assert not flags[0] and not flags[: needed - 1].any() and flags[needed - 1]


def _ingest_sets(root, key, make_batch, sets, batch_id):
    project = load_project(root)
    batch = make_batch(project, sets, batch_id)
    ingest(batch, SimulatedAnnotator(key).answer(batch), "key")


def _all_sets(project):
    """Six query sets of 5 unlabeled images for each of the three tasks."""
    return [(t.name, list(t.unlabeled[i : i + 5])) for t in project.tasks for i in range(0, 30, 5)]


def test_the_held_out_sets_depend_on_the_seed_and_a_training_set_never_becomes_a_validation_set(
    glyph_project, make_batch
):
    root, key = glyph_project
    sets = _all_sets(load_project(root))
    chosen = {seed: [] for seed in range(4)}
    trained = {seed: set() for seed in range(4)}
    for number, start in enumerate(range(0, 18, 3)):  # six batches of three query sets
        _ingest_sets(root, key, make_batch, sets[start : start + 3], f"batch-{number}")
        store = LabelStore.load(root / "labels.json")
        for seed in chosen:
            held, labeled, _ = held_out_sets(store, 0.2, seed)
            assert held == held_out_sets(store, 0.2, seed)[0]  # deterministic
            assert labeled == start + 3 and len(held) == np.floor(0.2 * labeled + validation_phase(0.2, seed))
            assert not held & trained[seed]  # once trained on, never validated on
            assert set(chosen[seed]) <= held  # once held out, always held out
            chosen[seed] = sorted(held)
            trained[seed] |= {s.images for b in store.batches for s in b.query_sets} - held
    assert len({tuple(c) for c in chosen.values()}) > 1  # the seed picks which


def test_fit_never_trains_on_the_held_out_sets_and_says_when_it_cannot_validate(glyph_project, make_batch, capsys):
    root, key = glyph_project
    sets = _all_sets(load_project(root))
    sampler = MultiQuerySampler(tasks=2, query_sets=3)
    data = AnnotatedTasksDataModule(root=str(root), image_size=16, n_way=5, k_shot=1, sampler=sampler, val_share=0.2)
    needed = labels_needed(0.2, validation_phase(0.2, data.seed))
    _ingest_sets(root, key, make_batch, sets[: needed - 1], "batch-1")
    data.setup("fit")
    assert data.val_dataloader() == []
    out = capsys.readouterr().out
    assert f"cannot validate: none of the {needed - 1} labeled query set(s) is held out yet" in out
    assert f"the first when {needed} are labeled (seed 0). Label 1 more query set(s)" in out
    with pytest.raises(ValueError, match="`test`: cannot validate: none of the"):
        data.setup("test")

    _ingest_sets(root, key, make_batch, sets[needed - 1 : 10], "batch-2")
    data.setup("fit")
    assert "validation: 2 of the 10 labeled query sets held out (data.val_share 0.2)" in capsys.readouterr().out
    images = data._episodes.images
    trained = {tuple(s) for t in data._episodes.tasks for s in t.query_sets}
    validated = {tuple(h.query) for h in data._held_out}
    assert len(validated) == 2 and not trained & validated and len(trained) == 8
    batch = next(iter(data.val_dataloader()))
    assert batch.query_x.shape[:3] == (2, 1, 5) and batch.support_x.shape[:2] == (2, 5)
    labels = LabelLedger.evaluation_labels(batch)
    for task, held in enumerate(data._held_out):  # the held-out images with the labels people gave them
        assert np.array_equal(labels[task, 0].numpy(), held.labels)
        assert torch.equal(images.gather(torch.as_tensor(held.query)), batch.query_x[task, 0])


def test_a_fit_through_the_cli_validates_and_its_next_step_tests_the_best_checkpoint(
    glyph_project, project_options, fit_options, tmp_path, capsys
):
    root, key = glyph_project
    options, run = project_options(root), tmp_path / "run"
    select_main([*options, "--budget", "5"])  # 5 labeled query sets: one is held out whatever the seed (share 0.2)
    folder = next((root / "batches").iterdir())
    answers = SimulatedAnnotator(key).fill_in_csv(read_manifest(folder), tmp_path / "answers.csv")
    ingest_main(["--batch", str(folder), "--answers", str(answers)])
    capsys.readouterr()
    cli_main(["fit", *options, *fit_options(run, 3)])
    out = capsys.readouterr().out
    assert "validation: 1 of the 5 labeled query sets held out (data.val_share 0.2)" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val_accuracy"] is not None and 0 <= summary["val_accuracy"] <= 1
    assert "validation accuracy  n/a" not in out
    best = [p.name for p in (run / "checkpoints").iterdir() if p.name != "last.ckpt"]
    assert len(best) == 1 and best[0].startswith("step3-acc")
    hint = next(line for line in out.splitlines() if line.startswith("next: units-lightning test "))
    command = shlex.split(hint.removeprefix("next: units-lightning "))
    assert command[0] == "test" and command[-2:] == ["--ckpt_path", "best"]
    cli_main(command)  # the printed next step, as printed
    out = capsys.readouterr().out
    assert f"checkpoints/{best[0]}" in out
