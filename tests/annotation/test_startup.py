"""The annotation commands import what they need only (issue 34): ``select --help`` and ``serve --help`` print a
short page without torch, Lightning or jsonargparse, ``ingest`` never loads Lightning, every option a page names is
one the command accepts, and every public name of ``units_lightning.annotation`` still imports (lazily).

What is loaded is checked in a fresh interpreter: in this one, other tests have imported everything already."""

import importlib
import re
import subprocess
import sys
import textwrap

import pytest
from tiny_setup import REPO

import units_lightning.annotation as annotation
from units_lightning.annotation import SimulatedAnnotator
from units_lightning.annotation.batch import write_batch
from units_lightning.annotation.commands import NEXT_EPOCH, TOKEN_VARIABLE, select_parser, serve_parser
from units_lightning.annotation.help import FULL_HELP_FLAG, short_help
from units_lightning.cli import main
from units_lightning.cli.preflight import FULL_HELP_FLAG as LIGHTNING_FULL_HELP_FLAG

HEAVY = ("torch", "lightning", "jsonargparse", "torchvision", "matplotlib", "scipy", "wandb")
# Every name of `units_lightning.annotation.__all__` as of the change that made them lazy, and its module.
PUBLIC = {
    "CANT_TELL": "answers",
    "AnnotatedTasksDataModule": "datamodule",
    "AnnotationBatch": "batch",
    "AnnotationProject": "layout",
    "AnnotationTask": "layout",
    "Answer": "answers",
    "IngestError": "ingest",
    "IngestOutcome": "ingest",
    "LabelStore": "label_store",
    "SimulatedAnnotator": "annotator",
    "ingest": "ingest",
    "ingest_answers": "ingest",
    "ingest_outcome": "ingest",
    "load_project": "layout",
    "read_answers": "answers",
    "read_manifest": "batch",
    "select_batch": "selection",
    "write_batch": "batch",
}


def loaded_after(statements: str) -> list[str]:
    """The heavy packages a fresh interpreter has loaded after ``statements`` (which may exit with status 0)."""
    script = f"""
import sys
try:
{textwrap.indent(statements.strip(), "    ")}
except SystemExit as stop:
    assert stop.code in (0, None), stop.code
print(sorted(name for name in {HEAVY!r} if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return eval(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", ["select", "serve"])
def test_help_prints_the_short_page_without_torch_or_lightning(command):
    statements = f"""
from units_lightning.cli import main
main([{command!r}, "--config", "some.yaml", "--help"])
"""
    assert loaded_after(statements) == []


def test_ingest_help_loads_nothing_heavy():
    assert loaded_after("from units_lightning.cli import main\nmain(['ingest', '--help'])") == []


def test_the_check_sees_lightning_where_the_full_list_builds_the_parser():
    """--help-full builds jsonargparse's parser of UnitsMAML: Lightning is seen, so the checks above can fail."""
    loaded = loaded_after(f"from units_lightning.cli import main\nmain(['select', '{FULL_HELP_FLAG}'])")
    assert "lightning" in loaded and "jsonargparse" in loaded


def test_ingest_takes_answers_in_without_lightning(project, make_batch, glyph_project, tmp_path):
    root, key = glyph_project
    batch = make_batch(project, [(t.name, list(t.unlabeled[:5])) for t in project.tasks[:2]], "batch-001")
    folder = tmp_path / "batch-001"
    write_batch(batch, folder)
    answers = SimulatedAnnotator(key).fill_in_csv(batch, tmp_path / "answers.csv")
    statements = f"""
from units_lightning.cli import main
main(["ingest", "--batch", {str(folder)!r}, "--answers", {str(answers)!r}])
"""
    loaded = loaded_after(statements)
    assert "lightning" not in loaded and "jsonargparse" not in loaded
    assert "torch" in loaded  # the ledger opens the answers (LabelLedger.reveal), as every label is opened
    assert (root / "labels.json").exists()


@pytest.mark.parametrize("command", ["select", "serve"])
def test_the_short_page_is_short_and_names_the_full_list(command, capsys):
    main([command, "--help"])
    printed = capsys.readouterr().out
    assert printed.strip() == short_help(command, ["-h"]).strip()
    assert len(printed.splitlines()) <= 45
    assert f"units-lightning {command} {FULL_HELP_FLAG}" in printed
    assert f"${TOKEN_VARIABLE}" in printed
    assert max(len(line) for line in printed.splitlines()) <= 120
    assert short_help(command, ["--acquisition.help", "MarginSampler"]) is None  # a class's help is jsonargparse's


def test_the_full_list_flag_is_the_lightning_commands_and_still_lists_everything(capsys):
    assert FULL_HELP_FLAG == LIGHTNING_FULL_HELP_FLAG
    with pytest.raises(SystemExit) as exit_info:
        main(["select", FULL_HELP_FLAG])
    printed = capsys.readouterr().out
    assert exit_info.value.code == 0 and len(printed.splitlines()) > 500
    for option in ("--model.filters", "--data.help", "--acquisition.help", "--label_studio_files_root"):
        assert option in printed


# A value for every option a short page names, and the key and value the parsed config then holds.
VALUES = {
    "--ckpt_path": ("run/last.ckpt", "ckpt_path", "run/last.ckpt"),
    "--budget": ("3", "budget", 3),
    "--acquisition": ("units_lightning.samplers.MarginSampler", "acquisition.class_path", None),
    "--label_budget": ("7", "label_budget", 7),
    "--device": ("cuda:1", "device", "cuda:1"),
    "--output": ("out/batch", "output", "out/batch"),
    "--batch_id": ("batch-x", "batch_id", "batch-x"),
    "--alongside": ("true", "alongside", True),
    "--cancel": ("[a,b]", "cancel", ["a", "b"]),
    "--label_studio_url": ("http://ls:8080", "label_studio_url", "http://ls:8080"),
    "--label_studio_token": ("secret", "label_studio_token", "secret"),
    "--label_studio_files_root": ("/files", "label_studio_files_root", "/files"),
    "--image_url_prefix": ("http://images/", "image_url_prefix", "http://images/"),
    "--hint_vacuity": ("0.3", "hint_vacuity", 0.3),
    "--host": ("0.0.0.0", "host", "0.0.0.0"),
    "--port": ("9191", "port", 9191),
    "--debounce": ("5", "debounce", 5.0),
    "--train_command": (
        f"fit --trainer.max_epochs {NEXT_EPOCH}",
        "train_command",
        f"fit --trainer.max_epochs {NEXT_EPOCH}",
    ),
    "--agreement": ("unanimous", "agreement", "unanimous"),
    "--annotators": ("2", "annotators", 2),
}


@pytest.mark.parametrize(
    "command, parser", [("select", select_parser), ("serve", serve_parser)], ids=["select", "serve"]
)
def test_every_option_on_a_page_is_accepted(command, parser, project_options, tmp_path):
    options = re.findall(r"^  (--[\w.]+)", short_help(command, ["--help"]), flags=re.MULTILINE)
    assert options[0] == "--config" and len(options) >= 10
    assert not set(options[1:]) - set(VALUES), set(options[1:]) - set(VALUES)
    words = project_options(tmp_path / "project")  # --config and the tiny project's data
    for option in options[1:]:
        words += [option, VALUES[option][0]]
    config = parser().parse_args(words)
    for option in options[1:]:
        _, key, expected = VALUES[option]
        assert config[key] == (VALUES[option][0] if expected is None else expected), option


def test_every_public_name_still_imports_from_where_it_did():
    assert sorted(annotation.__all__) == sorted(PUBLIC)
    for name, module in PUBLIC.items():
        assert name in dir(annotation)
        defined = importlib.import_module(f"units_lightning.annotation.{module}")
        assert getattr(annotation, name) is getattr(defined, name), name
    namespace: dict = {}
    exec("from units_lightning.annotation import *", namespace)
    assert set(PUBLIC) <= set(namespace)
    with pytest.raises(AttributeError, match="has no attribute 'select_batches'"):
        annotation.select_batches  # noqa: B018


def test_ingest_is_the_function_whichever_is_imported_first():
    """Importing the submodule ``ingest`` binds it to the package's name ``ingest``: the package keeps the function."""
    script = """
import importlib
module = importlib.import_module("units_lightning.annotation.ingest")  # the submodule first
from units_lightning.annotation import ingest
from units_lightning.annotation.ingest import ingest as function
assert ingest is function is module.ingest, ingest
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
