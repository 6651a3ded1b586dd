"""Train the quick start briefly, then `test` (report, plots, OOD, ensemble) and `predict` on folders of PNGs."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_setup import REPO

from units_lightning.cli import cli_main
from units_lightning.data.datasets.synthetic import SyntheticGlyphs

QUICKSTART = str(REPO / "configs" / "quickstart.yaml")
SMALL = [
    "--model.filters=4",
    "--model.inner_steps=1",
    "--data.image_size=16",
    "--data.train_classes=40",
    "--data.eval_classes=10",
    "--data.images_per_class=12",
    "--data.eval_batch_tasks=3",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def _csv_logger(tmp_path: Path, name: str) -> list[str]:
    return [
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={tmp_path}",
        f"--trainer.logger.name={name}",
        f"--trainer.default_root_dir={tmp_path}",
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A quick-start model trained for 2 epochs of 3 steps, its two best checkpoints kept by val/acc."""
    root = tmp_path_factory.mktemp("fit")
    cli = cli_main(
        [
            "fit",
            "--config",
            QUICKSTART,
            *SMALL,
            "--data.val_tasks=3",
            "--trainer.max_epochs=2",
            "--trainer.limit_train_batches=3",
            # in place of the quick start's checkpoints (the best by val/acc and last.ckpt)
            '--trainer.callbacks=[{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": '
            '{"monitor": "val/acc", "mode": "max", "save_top_k": 2, "filename": "step{step}"}}]',
            *_csv_logger(root, "fit"),
        ]
    )
    checkpoints = Path(cli.trainer.checkpoint_callback.dirpath)
    return root, checkpoints, cli.trainer.checkpoint_callback.best_model_path


def test_validation_logs_the_uncertainty_metrics(trained):
    root, _, _ = trained
    (metrics_file,) = root.glob("fit/*/metrics.csv")
    header = metrics_file.read_text().splitlines()[0].split(",")
    for key in (
        "val/acc",
        "val/loss",
        "val/vacuity",
        "val/dissonance",
        "val/acc_ci95",
        "val/acc_vacuity_below_0p20",
        "val/coverage_vacuity_below_0p10",
        "val/selective_acc_70",
        "val/aurc",
        "val/ece",
    ):
        assert key in header, key


def test_test_writes_results_plots_and_ood_probes(trained, tmp_path, capsys):
    _, _, best = trained
    cli = cli_main(
        [
            "test",
            "--config",
            QUICKSTART,
            *SMALL,
            "--data.test_tasks=6",
            f"--ckpt_path={best}",
            *_csv_logger(tmp_path, "test"),
        ]
    )
    directory = Path(cli.trainer.log_dir)
    results = json.loads((directory / "results.json").read_text())
    assert results["tasks"] == 6 and results["queries"] == 6 * 5 * 5  # eval_query_shots 5 in the quick start
    assert results["task"] == {"n_way": 5, "k_shot": 1, "query_shots": 5}
    accuracy = results["accuracy"]
    assert 0.0 <= accuracy["mean"] <= 1.0 and accuracy["ci95"] > 0
    assert math.isclose(accuracy["mean"], float(cli.trainer.callback_metrics["test/acc"]), abs_tol=1e-6)
    assert [r["threshold"] for r in results["vacuity_thresholds"]] == [0.1, 0.2]
    curve = results["threshold_curve"]
    assert curve["coverage"] == sorted(curve["coverage"]) and curve["coverage"][-1] == 1.0
    assert curve["accuracy"][-1] == pytest.approx(accuracy["mean"], abs=1e-6)
    assert results["selective_accuracy"][0]["accuracy"] == pytest.approx(accuracy["mean"], abs=1e-6)
    assert 0.0 <= results["aurc"] <= 1.0 and 0.0 <= results["ece"] <= 1.0
    rotations = results["ood"]["rotation"]
    assert [r["level"] for r in rotations] == [0, 30, 60, 90, 120, 150, 180]
    assert rotations[0]["accuracy"]["mean"] == pytest.approx(accuracy["mean"], abs=1e-6)
    assert rotations[0]["auroc"] == 0.5  # unrotated queries cannot be told from themselves
    assert all(0.0 < r["vacuity"]["mean"] <= 1.0 and 0.0 <= r["auroc"] <= 1.0 for r in rotations)
    assert [r["level"] for r in results["ood"]["scale"]] == [0.5, 0.75, 1.0, 1.25, 1.5]
    for name in results["plots"].values():
        with Image.open(directory / name) as image:
            assert image.size[0] > 300 and image.size[1] > 200
    assert set(results["plots"]) == {"vacuity_threshold", "rotation", "scale"}
    assert "units-lightning test report" in capsys.readouterr().out


def test_test_with_a_top_k_ensemble(trained, tmp_path):
    _, checkpoints, _ = trained
    cli = cli_main(
        [
            "test",
            "--config",
            QUICKSTART,
            *SMALL,
            "--data.test_tasks=3",
            "--model.query_shifts=[]",
            "--model.ensemble=units_lightning.evaluation.CheckpointEnsemble",
            f"--model.ensemble.checkpoints={checkpoints}",
            "--model.ensemble.top_k=2",
            *_csv_logger(tmp_path, "ens"),
        ]
    )
    results = json.loads((Path(cli.trainer.log_dir) / "results.json").read_text())
    members = results["ensemble"]
    assert len(members) == 2 and members[0]["score"] >= members[1]["score"]
    assert members[0]["step"] != members[1]["step"]
    assert results["ood"] == {}
    assert set(results["plots"]) == {"vacuity_threshold"}


def _write_png(path: Path, image) -> None:
    pixels = (255 - image[0].numpy() * 255).round().astype(np.uint8)  # black strokes on white, like a scan
    Image.fromarray(pixels).resize((40, 40)).save(path)


def test_predict_on_folders_of_pngs(trained, tmp_path, capsys):
    _, _, best = trained
    glyphs = SyntheticGlyphs(split="test", num_classes=5, images_per_class=3, image_size=16, seed=0)
    for c in range(5):
        (tmp_path / "support" / f"glyph{c}").mkdir(parents=True)
        _write_png(tmp_path / "support" / f"glyph{c}" / "a.png", glyphs[3 * c][0])
    (tmp_path / "query").mkdir()
    for c in range(5):
        for i in (1, 2):
            _write_png(tmp_path / "query" / f"q{c}_{i}.png", glyphs[3 * c + i][0])
    (tmp_path / "query" / "notes.txt").write_text("not an image")
    out = tmp_path / "out"
    cli_main(
        [
            "predict",
            "--config",
            QUICKSTART,
            "--model.filters=4",
            "--model.inner_steps=1",
            "--model.query_shifts=[]",
            "--data=units_lightning.data.FolderPredictionDataModule",
            f"--data.support={tmp_path / 'support'}",
            f"--data.query={tmp_path / 'query'}",
            "--data.image_size=16",
            "--data.invert=true",
            f"--ckpt_path={best}",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
            f"--prediction.output_dir={out}",
            "--prediction.threshold=0.5",
            "--prediction.min_probability=0.3",
            "--trainer.enable_progress_bar=false",
        ]
    )
    printed = capsys.readouterr().out
    assert "10 queries" in printed and "q0_1.png" in printed
    rows = list(csv.DictReader((out / "predictions.csv").open()))
    assert [r["query"] for r in rows] == [f"q{c}_{i}.png" for c in range(5) for i in (1, 2)]
    assert set(rows[0]) == {
        "query",
        "predicted",
        *(f"p_glyph{c}" for c in range(5)),
        "vacuity",
        "dissonance",
        "abstain",
    }
    payload = json.loads((out / "predictions.json").read_text())
    assert payload["threshold"] == 0.5 and payload["min_probability"] == 0.3
    assert "abstain at vacuity >= 0.5 or largest probability < 0.3" in printed
    for row in payload["predictions"]:
        assert row["abstain"] == (row["vacuity"] >= 0.5 or max(row["probabilities"].values()) < 0.3)
        assert row["predicted"] in {f"glyph{c}" for c in range(5)}
        assert sum(row["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
        assert max(row["probabilities"], key=row["probabilities"].get) == row["predicted"]
        assert 0.0 < row["vacuity"] <= 1.0 and 0.0 <= row["dissonance"] < 1.0
        assert row["abstain"] == (row["vacuity"] >= 0.5)
