"""The whole round-based loop, unattended: fit, select, label (simulated annotator), ingest, fit, twice over, with the
real commands on real PNG files."""

from __future__ import annotations

import torch

from units_lightning.annotation import LabelStore, SimulatedAnnotator, read_manifest
from units_lightning.annotation.commands import ingest_main, select_main
from units_lightning.cli import cli_main
from units_lightning.module import UnitsMAML

STEPS = 3  # training steps per round
BUDGET = 2  # query sets per batch


def test_two_rounds_label_exactly_the_selected_sets_and_resume_training(
    glyph_project, project_options, fit_options, recording_key, tmp_path, monkeypatch, capsys
):
    root, truth = glyph_project
    options, run = project_options(root), tmp_path / "run"
    last = run / "checkpoints" / "last.ckpt"
    started = []  # (global step, parameters) at the start of every fit, after any checkpoint was restored

    def on_train_start(model):
        started.append((model.global_step, torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()))

    monkeypatch.setattr(UnitsMAML, "on_train_start", on_train_start)
    selected: dict[str, str] = {}
    ended = []  # (global step, parameters) of each round's last.ckpt
    for round_number in (1, 2, 3):  # round 1 has no model yet: its batch is random; rounds 2 and 3 are chosen
        key = recording_key(truth)
        ckpt = ["--ckpt_path", str(last)] if round_number > 1 else []
        select_main([*options, *ckpt, "--budget", str(BUDGET)])
        batch = read_manifest(sorted((root / "batches").iterdir(), key=lambda p: p.stat().st_mtime_ns)[-1])
        assert len(batch.query_sets) == BUDGET and (batch.checkpoint == "") == (round_number == 1)
        images = [p.image for s in batch.query_sets for p in s.images]
        answers = SimulatedAnnotator(key).fill_in_csv(batch, tmp_path / f"answers-{round_number}.csv")
        assert key.read == images  # the answer key was opened for the selected images only, once each
        ingest_main(["--batch", str(root / "batches" / batch.id), "--answers", str(answers)])
        selected.update({image: truth[image] for image in images})
        store = LabelStore.load(root / "labels.json")
        assert dict(store.labels) == selected  # the labels ingested are exactly those of the selected query sets
        assert store.ledger["query_sets"] == BUDGET * round_number
        resume = ["--ckpt_path", "last", f"--trainer.max_epochs={round_number}"] if round_number > 1 else []
        cli_main(["fit", *options, *fit_options(run, STEPS), *resume])
        checkpoint = torch.load(last, map_location="cpu", weights_only=True)
        assert checkpoint["global_step"] == STEPS * round_number
        model = UnitsMAML(n_way=5, image_shape=(1, 16, 16), filters=4, inner_steps=1)
        model.load_state_dict(checkpoint["state_dict"])
        ended.append((checkpoint["global_step"], torch.nn.utils.parameters_to_vector(model.parameters()).detach()))
    assert "resuming from" in capsys.readouterr().out
    for previous, current in zip(ended[:-1], started[1:], strict=True):  # each round starts where the last one ended
        assert current[0] == previous[0]
        assert torch.equal(current[1], previous[1])
    assert not torch.equal(started[1][1], started[2][1])  # and trains on from there
    assert len(selected) == 3 * BUDGET * 5 < len(truth)
