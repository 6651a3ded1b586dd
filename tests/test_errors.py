"""Bad input: every case the README lists ("Bad input") ends in one paragraph that names the problem and the fix,
without a traceback; ``--debug`` and ``UNITS_LIGHTNING_DEBUG=1`` bring the traceback back."""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_setup import QUICKSTART, REPO, TINY_QUICKSTART

from units_lightning import errors
from units_lightning.cli import main
from units_lightning.dashboard.wandb_offline import find_offline_runs

FAST = [*TINY_QUICKSTART, "--trainer.limit_train_batches=2", "--trainer.max_steps=2"]


def _png(path: Path, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16), dtype=np.uint8)).save(path)


def _class_folders(root: Path, classes: int = 6, images: int = 6) -> Path:
    for c in range(classes):
        for i in range(images):
            _png(root / f"class{c}" / f"{i}.png", seed=c * 100 + i)
    return root


def _fit(tmp_path: Path, *options: str) -> list[str]:
    return ["fit", "--config", str(QUICKSTART), *FAST, f"--trainer.default_root_dir={tmp_path}", *options]


def _folders(tmp_path: Path, *options: str) -> list[str]:
    return _fit(
        tmp_path,
        "--trainer.logger=false",
        "--data=units_lightning.data.FewShotImageFolderDataModule",
        "--data.split=[0.5,0.25,0.25]",
        "--data.image_size=16",
        "--data.n_way=2",
        *options,
    )


def _trained_checkpoint(tmp_path: Path, *options: str) -> Path:
    main(_fit(tmp_path / "trained", "--trainer.logger=false", *options))
    return tmp_path / "trained" / "checkpoints" / "last.ckpt"


def more_ways_than_classes(tmp_path):
    return _fit(
        tmp_path, "--trainer.logger=false", "--data.n_way=60", "--data.train_classes=100", "--data.eval_classes=50"
    )


def too_few_images_per_class(tmp_path):
    return _fit(tmp_path, "--trainer.logger=false", "--data.images_per_class=3")


def missing_data_root(tmp_path):
    return _fit(
        tmp_path,
        "--trainer.logger=false",
        "--data=units_lightning.data.OmniglotDataModule",
        f"--data.root={tmp_path / 'omniglot'}",
    )


def corrupt_image(tmp_path):
    root = _class_folders(tmp_path / "images")
    (root / "class0" / "3.png").write_bytes(b"not an image")
    return _folders(tmp_path, f"--data.root={root}")


def zip_entry_escaping_its_folder(tmp_path):
    archive = tmp_path / "images.zip"
    source = _class_folders(tmp_path / "images")
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in sorted(source.rglob("*.png")):
            zipped.write(path, path.relative_to(source).as_posix())
        zipped.writestr("../escaped.png", (source / "class0" / "0.png").read_bytes())
    return _folders(tmp_path, f"--data.root={archive}")


def class_folder_without_images(tmp_path):
    _png(tmp_path / "task" / "support" / "a" / "0.png")
    (tmp_path / "task" / "support" / "b").mkdir(parents=True)
    _png(tmp_path / "task" / "query" / "0.png")
    return [
        "predict",
        "--config",
        str(QUICKSTART),
        *FAST,
        "--data=units_lightning.data.FolderPredictionDataModule",
        f"--data.support={tmp_path / 'task' / 'support'}",
        f"--data.query={tmp_path / 'task' / 'query'}",
    ]


def model_and_data_disagree_on_n_way(tmp_path):
    checkpoint = _trained_checkpoint(tmp_path)
    return [
        "test",
        "--config",
        str(QUICKSTART),
        *FAST,
        "--trainer.logger=false",
        "--data.test_tasks=2",
        "--data.n_way=3",
        f"--trainer.default_root_dir={tmp_path}",
        f"--ckpt_path={checkpoint}",
    ]


def label_budget_below_one_meta_batch(tmp_path):
    return _fit(tmp_path, "--trainer.logger=false", "--model.label_budget=2")


def label_budget_already_spent(tmp_path):
    checkpoint = _trained_checkpoint(tmp_path, "--model.label_budget=8")  # 4 query sets a step: spent at step 2
    return _fit(
        tmp_path,
        "--trainer.logger=false",
        "--model.label_budget=8",
        "--trainer.max_steps=4",
        f"--ckpt_path={checkpoint}",
    )


def unknown_config_key(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text("model:\n  filtrs: 16\n")
    return _fit(tmp_path, "--trainer.logger=false", "--config", str(config))


def misspelt_option(tmp_path):
    return _fit(tmp_path, "--trainer.logger=false", "--data.n_wya=5")


def class_path_not_importable(tmp_path):
    config = tmp_path / "sampler.yaml"
    config.write_text("data:\n  init_args:\n    sampler:\n      class_path: not_my_lab.samplers.Sampler\n")
    return _fit(tmp_path, "--trainer.logger=false", "--config", str(config))


# (README wording, arguments, exit status, what the message must say)
CASES = {
    "more ways than a split has classes": (
        more_ways_than_classes,
        1,
        r"n_way=60 but split 'val' has only 50 classes: lower data.n_way to at most 50",
    ),
    "classes with too few images": (
        too_few_images_per_class,
        1,
        r"classes have fewer than 5 images \(k_shot=1 \+ query_sets=4 x query_shots=1\)",
    ),
    "a missing data root": (missing_data_root, 1, r"Omniglot not found under .*omniglot"),
    "a corrupt image": (corrupt_image, 1, r"cannot decode .*class0/3\.png: the file is corrupt"),
    "a zip entry escaping its folder": (
        zip_entry_escaping_its_folder,
        1,
        r"unsafe zip .*images\.zip: entry '\.\./escaped\.png' escapes",
    ),
    "a class folder without images": (class_folder_without_images, 1, r"class folders without images in .*: \['b'\]"),
    "model and data disagreeing on n_way": (
        model_and_data_disagree_on_n_way,
        1,
        r"the checkpoint is 5-way, the model 3-way: set data.n_way to 5",
    ),
    "a label budget smaller than one meta-batch": (
        label_budget_below_one_meta_batch,
        1,
        r"label budget of 2 query sets is smaller than one meta-batch",
    ),
    "a label budget the checkpoint already spent": (
        label_budget_already_spent,
        1,
        r"the label budget of 8 query sets is spent: 8 are labeled already",
    ),
    "an unknown config key": (
        unknown_config_key,
        2,
        r"does not accept option 'model.filtrs'\n  model.filtrs: did "
        r"you mean model.filters\?",
    ),
    "a misspelt option": (misspelt_option, 2, r"Option 'n_wya' is not accepted\n  data.n_wya: did you mean data.n_way"),
    "a class_path that cannot be imported": (
        class_path_not_importable,
        2,
        r"data.sampler \(not_my_lab.samplers.Sampler\): No module named 'not_my_lab'",
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: c.replace(" ", "_"))
def test_bad_input_is_one_paragraph_without_a_traceback(case, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    build, status, expected = CASES[case]
    arguments = build(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(arguments)
    assert exit_info.value.code == status
    err = capsys.readouterr().err
    assert re.search(expected, err), err
    assert "Traceback" not in err
    message = err[err.index("error: ") :].strip()
    assert "\n\n" not in message and "usage:" not in message, message  # one paragraph, no usage text


@pytest.mark.parametrize("case", ["more ways than a split has classes", "a misspelt option"], ids=["data", "parser"])
def test_the_console_script_prints_the_paragraph_alone(case, tmp_path):
    """As a person runs it (a process of its own, with its warnings and loggers): the paragraph, no traceback."""
    build, status, expected = CASES[case]
    script = REPO / ".venv" / "bin" / "units-lightning"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "units_lightning"]
    env = {k: v for k, v in os.environ.items() if k != errors.DEBUG_ENV}
    done = subprocess.run(
        [*command, *build(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == status, done.stderr[-2000:]
    assert re.search(expected, done.stderr), done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr and "usage:" not in done.stderr, done.stderr[-2000:]


def test_the_readme_lists_exactly_the_tested_bad_inputs():
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Bad input\n") + len("### Bad input\n") :]
    section = section[: re.search(r"^#{2,3} ", section, flags=re.MULTILINE).start()]
    listed = re.findall(r"^\| ([^|`]+?) \| `", section, flags=re.MULTILINE)
    assert sorted(listed) == sorted(CASES)


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    with pytest.raises(ValueError, match="label budget of 2 query sets"):
        main([*label_budget_below_one_meta_batch(tmp_path), "--debug"])
    monkeypatch.setenv(errors.DEBUG_ENV, "1")
    with pytest.raises(ValueError, match="label budget of 2 query sets"):
        main(label_budget_below_one_meta_batch(tmp_path))


def test_a_failed_command_leaves_no_wandb_run_folder(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            _fit(
                tmp_path, f"--trainer.logger.init_args.save_dir={tmp_path}", "--data.n_way=60", "--data.eval_classes=50"
            )
        )
    assert "n_way=60" in capsys.readouterr().err
    assert find_offline_runs(tmp_path) == []
    assert not (tmp_path / "units-lightning").exists()  # nor a run folder holding only its config


def test_a_bug_keeps_its_traceback():
    class Bug(Exception):
        pass

    assert errors.user_error(Bug("internal")) is None
    wrapped = ValueError("Does not validate against any of the Union subtypes")
    try:
        try:
            raise ValueError("tasks must be >= 1, got 0")
        except ValueError as inner:
            raise wrapped from inner
    except ValueError as outer:
        assert errors.user_error(outer) is wrapped  # raised outside the package: the outermost user error
    assert errors.format_error("units-lightning fit", ValueError("x")).startswith("units-lightning fit: error: x\n(")


def test_the_parser_message_is_cut_to_the_option_and_its_problem():
    message = (
        'Parser key "data":\n  Does not validate against any of the Union subtypes\n  Subtypes: [...]\n  Errors:\n'
        "    - Problem with given class_path 'units_lightning.data.SyntheticGlyphsDataModule':\n"
        '        Parser key "sampler":\n          Does not validate against any of the Union subtypes\n'
        "          Errors:\n            - Problem with given class_path 'my_lab.samplers.Mine':\n"
        "                No module named 'my_lab'\n            - Expected a <class 'NoneType'>\n"
        "          Given value type: <class 'dict'>\n          Given value: {'class_path': 'my_lab.samplers.Mine'}\n"
    )
    text, path, class_path = errors.explain_parser_error(message)
    assert text == "data.sampler (my_lab.samplers.Mine): No module named 'my_lab'"
    assert (path, class_path) == ("data.sampler", "my_lab.samplers.Mine")
