"""The test results: results.json, PNG plots, W&B tables and images, written after every test run."""

import json

from PIL import Image
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks import ResultsWriter
from units_lightning.evaluation import Rotation
from units_lightning.evaluation.results import format_results, write_results
from units_lightning.samplers import RandomSampler


def _results():
    curve = [0.1, 0.2, 0.5, 1.0]
    return {
        "tasks": 4,
        "queries": 20,
        "accuracy": {"mean": 0.6, "ci95": 0.1},
        **{k: {"mean": 0.3, "ci95": 0.01} for k in ("vacuity", "dissonance", "incorrect_belief", "correct_belief")},
        "vacuity_thresholds": [
            {"threshold": 0.1, "accuracy": None, "coverage": 0.0},
            {"threshold": 0.2, "accuracy": 0.9, "coverage": 0.25},
        ],
        "threshold_curve": {"threshold": curve, "accuracy": [None, 0.9, 0.7, 0.6], "coverage": [0.0, 0.25, 0.8, 1.0]},
        "selective_accuracy": [{"coverage": 1.0, "accuracy": 0.6}, {"coverage": 0.5, "accuracy": 0.8}],
        "aurc": 0.2,
        "ece": 0.05,
        "ood": {
            "rotation": [
                {
                    "level": 0.0,
                    "name": "rotation_0",
                    "accuracy": {"mean": 0.6, "ci95": 0.1},
                    "vacuity": {"mean": 0.3, "ci95": 0.01},
                    "auroc": 0.5,
                },
                {
                    "level": 90.0,
                    "name": "rotation_90",
                    "accuracy": {"mean": 0.3, "ci95": 0.1},
                    "vacuity": {"mean": 0.5, "ci95": 0.02},
                    "auroc": 0.8,
                },
            ],
            "dataset": [
                {
                    "level": "mnist",
                    "name": "mnist",
                    "accuracy": None,
                    "vacuity": {"mean": 0.6, "ci95": 0.02},
                    "auroc": 0.9,
                }
            ],
        },
    }


class FakeRun:
    def __init__(self):
        self.logged, self.summary = [], {}

    def log(self, payload):
        self.logged.append(payload)


def test_write_results_files_and_wandb_payload(tmp_path):
    import wandb

    run = FakeRun()
    path = write_results(_results(), tmp_path / "run", wandb_run=run)
    written = json.loads(path.read_text())
    assert written["plots"] == {
        "vacuity_threshold": "accuracy_vs_vacuity_threshold.png",
        "rotation": "ood_rotation.png",
        "dataset": "ood_dataset.png",
    }
    for name in written["plots"].values():
        with Image.open(tmp_path / "run" / name) as image:
            assert image.format == "PNG" and image.size == (720, 480)
    (payload,) = run.logged
    assert isinstance(payload["test/threshold_curve"], wandb.Table)
    assert payload["test/ood"].columns == ["shift", "level", "accuracy", "vacuity", "auroc"]
    assert len(payload["test/ood"].data) == 3
    assert isinstance(payload["test/plots/rotation"], wandb.Image)
    assert run.summary["test/accuracy"] == 0.6


def test_format_results_names_the_numbers():
    text = format_results(_results())
    assert "accuracy 60.00% +- 10.00% (95% CI over 4 tasks, 20 queries)" in text
    assert "vacuity < 0.2: accuracy 90.00%, coverage 25.00%" in text
    assert "mnist: vac 0.6000 AUROC 0.9000" in text


def test_prediction_rows_for_episodic_tasks_name_positions_and_class_ids():
    import torch

    from units_lightning.callbacks.prediction_writer import prediction_rows

    output = {
        "prediction": torch.tensor([[1, 0]]),
        "probability": torch.tensor([[[0.2, 0.8], [0.6, 0.4]]]),
        "vacuity": torch.tensor([[0.1, 0.3]]),
        "dissonance": torch.tensor([[0.05, 0.2]]),
        "classes": torch.tensor([[7, 3]]),
    }
    rows = prediction_rows([output], threshold=0.2)
    assert [r["query"] for r in rows] == ["batch0/task0/query0", "batch0/task0/query1"]
    assert [r["predicted"] for r in rows] == ["3", "7"] and [r["abstain"] for r in rows] == [False, True]
    assert rows[0]["probabilities"] == {"7": 0.2, "3": 0.8}
    # a largest probability below min_probability abstains too: query 0 (0.8) passes 0.7, not 0.85
    assert [r["abstain"] for r in prediction_rows([output], threshold=0.5, min_probability=0.7)] == [False, True]
    assert [r["abstain"] for r in prediction_rows([output], threshold=0.5, min_probability=0.85)] == [True, True]
    assert [r["abstain"] for r in prediction_rows([output], threshold=0.5)] == [False, False]


def test_a_prediction_writer_refuses_a_min_probability_outside_0_1():
    import pytest

    from units_lightning.callbacks.prediction_writer import PredictionWriter

    with pytest.raises(ValueError, match="min_probability must lie in"):
        PredictionWriter(min_probability=1.5)


def test_trainer_test_from_python_writes_results_and_plots(tmp_path, capsys):
    data = tiny_data(RandomSampler(tasks=2))
    model = tiny_model(sampler=data.sampler, query_shifts=[Rotation([0, 90])])
    tiny_trainer(tmp_path, inference_mode=True).test(model, data, verbose=False)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["tasks"] == 4 and 0.0 <= results["accuracy"]["mean"] <= 1.0
    assert results["task"] == {"n_way": 5, "k_shot": 1, "query_shots": 2} and results["checkpoint"] is None
    assert [row["name"] for row in results["ood"]["rotation"]] == ["rotation_0", "rotation_90"]
    assert results["plots"] == {
        "vacuity_threshold": "accuracy_vs_vacuity_threshold.png",
        "rotation": "ood_rotation.png",
    }
    for name in results["plots"].values():
        assert Image.open(tmp_path / name).size[0] > 100
    assert "units-lightning test report" in capsys.readouterr().out


def test_a_results_writer_of_the_trainer_is_kept_not_doubled(tmp_path):
    data = tiny_data(RandomSampler(tasks=2))
    model = tiny_model(sampler=data.sampler, query_shifts=[])
    writer = ResultsWriter(output_dir=str(tmp_path / "elsewhere"), verbose=False)
    trainer = tiny_trainer(tmp_path, inference_mode=True, callbacks=[writer])
    trainer.test(model, data, verbose=False)
    assert [c for c in trainer.callbacks if isinstance(c, ResultsWriter)] == [writer]
    assert writer.path == tmp_path / "elsewhere" / "results.json" and writer.path.is_file()
    assert not (tmp_path / "results.json").exists()
