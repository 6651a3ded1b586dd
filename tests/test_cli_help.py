"""``units-lightning <command> --help``: a short page of the options people change, each one the command accepts,
with the switch to the full list (``--help-full``), which still lists everything; and what the command line
answers before Lightning is imported (the short page, a ``--config`` file that does not exist)."""

import re
import subprocess
import sys

import pytest
import yaml
from tiny_setup import QUICKSTART, REPO

from units_lightning.cli import cli_main, main
from units_lightning.cli.preflight import FULL_HELP_FLAG, LIGHTNING_COMMANDS, config_refusal, short_help

# A value for every option a short page names, and what --print_config then shows for it (None: nothing to look
# for). Adding an option to a page without a line here fails test_every_option_on_a_page_is_accepted.
VALUES = {
    "--config": (str(QUICKSTART), None),
    "--print_config": (None, None),
    "--seed_everything": ("7", "seed_everything: 7"),
    "--ckpt_path": ("best", "ckpt_path: best"),
    "--progress": ("steps", "progress: steps"),
    "--trainer.max_steps": ("123", "max_steps: 123"),
    "--trainer.max_epochs": ("4", "max_epochs: 4"),
    "--trainer.accelerator": ("cpu", "accelerator: cpu"),
    "--trainer.devices": ("1", "devices: '1'"),
    "--trainer.default_root_dir": ("runs/elsewhere", "default_root_dir: runs/elsewhere"),
    "--trainer.logger.offline": ("false", None),  # accepted; --trainer.logger false then replaces the logger
    "--trainer.logger": ("false", "logger: false"),
    "--data": ("units_lightning.data.OmniglotDataModule", "class_path: units_lightning.data.OmniglotDataModule"),
    "--data.root": ("some/folder", "root: some/folder"),
    "--data.sampler": ("VacuitySampler", "class_path: units_lightning.samplers.VacuitySampler"),
    "--data.sampler.tasks": ("5", "tasks: 5"),
    "--data.sampler.query_sets": ("6", "query_sets: 6"),
    "--data.sampler.warmup_steps": ("11", "warmup_steps: 11"),
    "--data.val_tasks": ("13", "val_tasks: 13"),
    "--data.test_tasks": ("17", "test_tasks: 17"),
    "--model.lr": ("0.0042", "lr: 0.0042"),
    "--model.inner_steps": ("2", "inner_steps: 2"),
    "--model.label_budget": ("321", "label_budget: 321"),
    "--model.loss.ib_reduction": ("mean", "ib_reduction: mean"),
    "--model.loss.activation": ("relu", "activation: relu"),
    "--model.loss.vacuity_weight": ("0.25", "vacuity_weight: 0.25"),
    "--verbose": ("true", "verbose: true"),
    "--data.support": ("my/support", "support: my/support"),
    "--data.query": ("my/query", "query: my/query"),
    "--prediction.threshold": ("0.35", "threshold: 0.35"),
    "--prediction.min_probability": ("0.9", "min_probability: 0.9"),
    "--prediction.output_dir": ("my/predictions", "output_dir: my/predictions"),
}
# Options that replace what another sets, given after it (the logger switched off after its offline option).
LAST = ("--trainer.logger",)
# predict's data module is FolderPredictionDataModule (its page names it), whose options are --data.support/query.
PREDICT_DATA = "units_lightning.data.FolderPredictionDataModule"
COMMAND_VALUES = {"predict": {"--data": (PREDICT_DATA, f"class_path: {PREDICT_DATA}")}}


def page_options(page: str) -> list[str]:
    """The options a short page describes: the first word of its option lines, in order."""
    return re.findall(r"^  (?:-c, )?(--[\w.]+)", page, flags=re.MULTILINE)


def page(command: str) -> str:
    text = short_help(command, ["--help"])
    assert text is not None
    return text


@pytest.mark.parametrize("command", LIGHTNING_COMMANDS)
def test_the_short_page_is_short_and_names_the_full_list(command, capsys):
    main([command, "--config", str(QUICKSTART), "--help"])
    printed = capsys.readouterr().out
    assert printed.strip() == page(command).strip()
    assert len(printed.splitlines()) <= 60
    assert f"units-lightning {command} {FULL_HELP_FLAG}" in printed
    assert "--ckpt_path last|best|FILE" in printed and "--print_config" in printed
    assert short_help(command, ["--data.help", "OmniglotDataModule"]) is None  # a class's help is jsonargparse's


@pytest.mark.parametrize("command", LIGHTNING_COMMANDS)
def test_every_option_on_a_page_is_accepted(command, capsys):
    options = page_options(page(command))
    assert len(options) >= 10 and not set(options) - set(VALUES), set(options) - set(VALUES)
    values = {**VALUES, **COMMAND_VALUES.get(command, {})}
    words = [command]
    for option in [o for o in options if o not in LAST] + [o for o in options if o in LAST]:
        value, _ = values[option]
        words += [option] if value is None else [option, value]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(words)
    captured = capsys.readouterr()
    assert exit_info.value.code in (0, None), captured.err
    assert isinstance(yaml.safe_load(captured.out), dict)  # --print_config printed the config, whole
    missing = [values[o][1] for o in options if values[o][1] and values[o][1] not in captured.out]
    assert not missing, captured.out


def test_the_full_list_still_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", FULL_HELP_FLAG])
    printed = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert len(printed.splitlines()) > 500
    for option in ("--trainer.max_steps", "--model.inner_lr_mode", "--trainer.gradient_clip_val", "--data.help"):
        assert option in printed


def test_a_missing_config_is_refused_in_one_paragraph(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "quickstart.yaml", "--trainer.max_steps", "5"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "units-lightning fit: error: --config quickstart.yaml: does not exist" in err
    assert "Did you mean --config configs/quickstart.yaml?" in err and "Traceback" not in err
    assert "is a folder" in config_refusal("test", ["--config=configs"])
    assert "does not exist" in config_refusal("fit", ["-c", str(tmp_path / "gone.yaml")])
    # Existing files, and a config given inline as YAML (jsonargparse reads both), are the parser's to judge.
    assert config_refusal("fit", ["--config", str(QUICKSTART), "--config", "{trainer: {max_steps: 3}}"]) is None


def test_help_and_refusals_answer_without_importing_lightning():
    script = """
import sys
from units_lightning.cli import main
main(["fit", "--help"])
main(["predict", "-h"])
main(["--help"])
for words in (["fit", "--config", "does-not-exist.yaml"], ["fitt"]):
    try:
        main(words)
    except SystemExit as stop:
        assert stop.code == 2, stop.code
    else:
        raise AssertionError(words)
heavy = sorted(name for name in ("torch", "lightning", "jsonargparse", "wandb", "matplotlib") if name in sys.modules)
assert not heavy, heavy
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "units-lightning fit: error: --config does-not-exist.yaml: does not exist" in done.stderr
