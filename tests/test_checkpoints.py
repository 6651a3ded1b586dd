"""Checkpoints that do not match the configured model: shapes stop with the option to change, and the CLI says
which configured options a checkpoint's saved hyperparameters replaced. No file is ever unpickled in full."""

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_setup import REPO, tiny_data, tiny_model, tiny_trainer

from units_lightning.cli import cli_main
from units_lightning.evaluation.checkpoints import check_shapes
from units_lightning.module import UnitsMAML
from units_lightning.samplers import RandomSampler

QUICKSTART = str(REPO / "configs" / "quickstart.yaml")
SMALL = [
    "--model.inner_steps=1",
    "--data.image_size=16",
    "--data.train_classes=40",
    "--data.eval_classes=10",
    "--data.images_per_class=12",
    "--data.val_tasks=2",
    "--data.test_tasks=2",
    "--data.eval_batch_tasks=2",
    "--model.query_shifts=[]",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def test_no_full_unpickling_anywhere_in_the_repository():
    needle = "weights_only=" + "False"
    found = [
        str(path.relative_to(REPO))
        for folder in ("units_lightning", "tests", "benchmarks", "scripts")
        for path in (REPO / folder).rglob("*")
        if path.suffix in (".py", ".sh") and needle in path.read_text()
    ]
    assert found == []


@pytest.mark.parametrize(
    ("saved", "configured", "expected"),
    [
        (
            {"filters": 4},
            {"filters": 8},
            [
                "engine.model.convs.0.weight: checkpoint (4, 1, 3, 3), model (8, 1, 3, 3)",
                "set model.filters to 4",
                "... and 11 more",  # 17 parameters differ (not the classifier bias); six are listed
            ],
        ),
        ({"n_way": 5}, {"n_way": 3}, ["engine.model.classifier.bias: checkpoint (5,), model (3,)", "data.n_way to 5"]),
        (
            {"image_shape": (3, 16, 16)},
            {"image_shape": (1, 16, 16)},
            ["engine.model.convs.0.weight: checkpoint (4, 3, 3, 3), model (4, 1, 3, 3)", "3-channel images"],
        ),
        (
            {"image_shape": (1, 32, 32)},
            {"image_shape": (1, 16, 16)},
            ["engine.model.classifier.weight: checkpoint (5, 16), model (5, 4)", "data.image_size"],
        ),
        (
            {"per_step_bn": True, "inner_steps": 2},
            {"per_step_bn": False, "inner_steps": 2},
            ["engine.model.norms.0.weight: checkpoint (3, 4), model (4,)", "set model.per_step_bn to true"],
        ),
        (
            {"inner_lr_mode": "per_parameter"},
            {"inner_lr_mode": "per_layer_per_step"},
            ["engine.inner_lr.rates.convs__0__bias: checkpoint (4,), model (1,)", "inner_lr_mode to per_parameter"],
        ),
    ],
    ids=["filters", "n_way", "channels", "image_size", "per_step_bn", "inner_lr_mode"],
)
def test_a_shape_mismatch_names_the_parameter_both_shapes_and_the_option(saved, configured, expected):
    with pytest.raises(ValueError) as refused:
        check_shapes(tiny_model(**configured).state_dict(), tiny_model(**saved).state_dict(), "checkpoint x.ckpt")
    message = str(refused.value)
    assert message.startswith("checkpoint x.ckpt does not fit the configured model")
    for text in expected:
        assert text in message
    check_shapes(tiny_model(**saved).state_dict(), tiny_model(**saved).state_dict(), "same")  # no complaint


@pytest.fixture(scope="module")
def four_filters(tmp_path_factory):
    """A checkpoint of a 5-way model with 4 filters, written by a Python run."""
    root = tmp_path_factory.mktemp("python")
    data = tiny_data(RandomSampler(tasks=2))
    trainer = tiny_trainer(root, max_steps=1)
    trainer.fit(tiny_model(sampler=data.sampler), data)
    trainer.save_checkpoint(root / "four_filters.ckpt")
    return root / "four_filters.ckpt"


def test_trainer_and_load_from_checkpoint_stop_on_other_shapes(four_filters, tmp_path):
    data = tiny_data(RandomSampler(tasks=2))
    with pytest.raises(ValueError, match=r"model \(8, 1, 3, 3\)[\s\S]*set model.filters to 4") as refused:
        tiny_trainer(tmp_path).test(tiny_model(filters=8), data, ckpt_path=four_filters, verbose=False)
    assert str(refused.value).startswith(f"checkpoint {four_filters} does not fit the configured model")
    with pytest.raises(ValueError, match=r"classifier.weight: checkpoint \(5, 4\), model \(4, 4\)[\s\S]*n_way to 5"):
        UnitsMAML.load_from_checkpoint(four_filters, n_way=4)
    assert UnitsMAML.load_from_checkpoint(four_filters, eval_inner_steps=3).eval_inner_steps == 3


@pytest.fixture(scope="module")
def cli_checkpoint(tmp_path_factory):
    """A quick-start checkpoint (4 filters, lr 0.002) written by ``units-lightning fit``."""
    root = tmp_path_factory.mktemp("cli")
    cli = cli_main(
        [
            "fit",
            "--config",
            QUICKSTART,
            *SMALL,
            "--model.filters=4",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",  # an int above 1: a count of batches, not a fraction
            "--trainer.logger=false",
            f"--trainer.default_root_dir={root}",
        ]
    )
    return Path(cli.trainer.checkpoint_callback.best_model_path)


def _test(checkpoint, root, *args):
    return cli_main(
        ["test", "--config", QUICKSTART, *SMALL, f"--ckpt_path={checkpoint}", "--trainer.logger=false"]
        + [f"--trainer.default_root_dir={root}", *args]
    )


def test_the_cli_names_the_options_a_checkpoint_replaces(cli_checkpoint, tmp_path, capsys):
    _test(cli_checkpoint, tmp_path, "--model.filters=4")
    assert "replace the configured ones" not in capsys.readouterr().err  # nothing replaced, nothing said
    cli = _test(cli_checkpoint, tmp_path, "--model.filters=64", "--model.lr=0.5", "--model.loss.activation=relu")
    err = capsys.readouterr().err
    assert f"--ckpt_path {cli_checkpoint}: the model options saved in the checkpoint replace the configured" in err
    for row in (
        "model.filters: given 64, checkpoint 4",
        "model.lr: given 0.5, checkpoint 0.002",
        "model.loss.activation: given 'relu', checkpoint 'softplus'",
    ):
        assert row in err
    assert len(re.findall(r"^  model\.", err, flags=re.M)) == 3  # linked n_way and image_shape are not reported
    assert "The checkpoint's values are used. To run with the given ones, train a checkpoint with them" in err
    assert cli.model.hparams.filters == 4 and cli.model.lr == 0.002


def test_the_cli_stops_on_a_checkpoint_of_another_n_way(cli_checkpoint, tmp_path):
    with pytest.raises(ValueError) as refused:
        _test(cli_checkpoint, tmp_path, "--data.n_way=4")
    message = str(refused.value)
    assert f"checkpoint {cli_checkpoint} does not fit the configured model" in message
    assert "engine.model.classifier.weight: checkpoint (5, 4), model (4, 4)" in message
    assert "set data.n_way to 5" in message


def test_predict_folders_with_another_number_of_classes_stop_with_the_option(cli_checkpoint, tmp_path):
    for c in range(4):  # a 5-way checkpoint, 4 class folders
        (tmp_path / "support" / f"class{c}").mkdir(parents=True)
        Image.fromarray(np.full((16, 16), 40 * c, np.uint8)).save(tmp_path / "support" / f"class{c}" / "a.png")
    (tmp_path / "query").mkdir()
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(tmp_path / "query" / "q.png")
    with pytest.raises(ValueError, match=r"checkpoint \(5, 4\), model \(4, 4\)[\s\S]*data.support needs 5 class"):
        cli_main(
            [
                "predict",
                "--config",
                QUICKSTART,
                "--model.query_shifts=[]",
                "--data=units_lightning.data.FolderPredictionDataModule",
                f"--data.support={tmp_path / 'support'}",
                f"--data.query={tmp_path / 'query'}",
                "--data.image_size=16",
                f"--ckpt_path={cli_checkpoint}",
                "--trainer.logger=false",
                f"--trainer.default_root_dir={tmp_path}",
                f"--prediction.output_dir={tmp_path / 'out'}",
                "--trainer.enable_progress_bar=false",
            ]
        )
