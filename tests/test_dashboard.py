"""The W&B workspace against a real offline W&B run, the ``dashboard`` and ``report`` commands, the on/off switch."""

import json
import re

import pytest
from test_cli import FAST, QUICKSTART

from units_lightning.callbacks import ScheduleMonitor, SelectionMonitor, TheoremOneMonitor, UncertaintyCurves
from units_lightning.cli import cli_main, main
from units_lightning.dashboard import CHARTS, build_report, build_workspace, find_offline_runs, panel_keys, read_log
from units_lightning.dashboard.wandb_offline import read_records

DASHBOARD_CALLBACKS = (ScheduleMonitor, TheoremOneMonitor, SelectionMonitor, UncertaintyCurves)
# Key families the dashboard callbacks log: each logged key of these must be on the workspace.
CALLBACK_FAMILIES = [
    r"schedule/(lambda|eta)",
    r"selection/slot_win/\d+",
    r"selection/uncertainty_(chosen|rejected)_p\d+",
    r"selection/uncertainty_(chosen|rejected)_hist",
    r"(train|val)/theorem1_(holds|margin)",
    r"label_budget/query_sets",
    r"val_curve/(acc|coverage)_vacuity_below_\dp\d\d",
]


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory):
    """A quick-start-like fit (tiny sizes, selection after 2 steps) logged by W&B in offline mode."""
    root = tmp_path_factory.mktemp("wandb")
    cli = cli_main(
        [
            "fit",
            "--config",
            str(QUICKSTART),
            *FAST,
            "--data.sampler.init_args.warmup_steps=2",
            f"--trainer.logger.init_args.save_dir={root}",
            f"--trainer.default_root_dir={root}",
        ]
    )
    cli.trainer.logger.experiment.finish()  # what the process exit does for a command-line run: flush to disk
    (run,) = find_offline_runs(root)
    return run


def logged_keys(run):
    """The run's logged keys; W&B stores a histogram or table as fields <key>/<field>: count <key> instead."""
    keys = read_log(run).keys
    objects = {key.rsplit("/", 1)[0] for key in keys if key.endswith("/_type")}
    return {key for key in keys if key.rsplit("/", 1)[0] not in objects} | objects


def test_workspace_builds_offline_and_its_panel_keys_are_logged(wandb_run):
    workspace = build_workspace("an-entity", "a-project")
    workspace._to_model()  # the full W&B view spec, built without the network
    keys, patterns = panel_keys(workspace)
    logged = logged_keys(wandb_run)
    assert keys - logged == set()
    for pattern in patterns:
        assert any(re.fullmatch(pattern, key) for key in logged), pattern
    for family in CALLBACK_FAMILIES:
        covered = {key for key in logged if re.fullmatch(family, key)}
        assert covered, f"nothing of {family} was logged"
        missing = {key for key in covered if key not in keys and not any(re.fullmatch(p, key) for p in patterns)}
        assert missing == set(), family
    # Conversely the module's own dashboard keys are on it too.
    for key in ("train/vacuity_epoch", "val/incorrect_belief", "val/acc", "labels/query_sets", "schedule/eta"):
        assert key in keys


def test_offline_run_holds_every_dashboard_key_and_the_config(wandb_run):
    rows = read_log(wandb_run).rows
    logged = logged_keys(wandb_run)
    for chart in CHARTS:
        assert chart.matching(logged), chart.title
    holds = [row[k] for row in rows for k in ("train/theorem1_holds", "val/theorem1_holds") if k in row]
    assert holds == [1.0] * 4  # train and val, two epochs
    histograms = [row for row in rows if "selection/uncertainty_chosen_hist/values" in row]
    assert len(histograms) == 2 and sum(histograms[-1]["selection/uncertainty_chosen_hist/values"]) == 3 * 4
    config = [r for r in read_records(next(wandb_run.glob("run-*.wandb"))) if r.WhichOneof("record_type") == "config"]
    updated = {item.nested_key[0] if item.nested_key else item.key for r in config for item in r.config.update}
    assert "cli" in updated
    run_folder = wandb_run.parent.parent / "units-lightning" / wandb_run.name.rsplit("-", 1)[-1]
    assert "model:" in (run_folder / "config.yaml").read_text()  # in the run's folder, beside its checkpoints


def test_report_from_an_offline_wandb_run(wandb_run, tmp_path):
    report = build_report(wandb_run.parent.parent, tmp_path)  # the logger's save_dir, as a user would pass it
    (run,) = report.runs
    assert run.folder.name == wandb_run.name.rsplit("-", 1)[-1] and run.log.source == "wandb"  # found by its id
    assert run.summary["steps"] == 6 and run.setting == "Units-ML"
    names = {path.name for path in report.images}
    assert len(names) == len(CHARTS) - 1  # chosen and rejected histograms share one figure (bins, y-scale)
    assert [name for name in names if "histograms" in name] == [
        "09_task_uncertainty_of_chosen_vs_rejected_query_sets_histograms.png"
    ]
    page = report.html.read_text()
    assert page.count("data:image/png;base64,") == len(report.images)
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in report.images)


def test_report_without_logs_says_what_it_looked_for(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert (
        f"nothing to show in {tmp_path}" in error and "units-lightning fit" in error
    )  # what it looked for, and the way on


def test_dashboard_command_dry_run_prints_the_keys(capsys):
    main(["dashboard", "--dry-run"])  # no account details needed
    printed = json.loads(capsys.readouterr().out)
    assert "val_curve/acc_vacuity_below_0p20" in printed["keys"] and printed["patterns"] == [r"selection/slot_win/\d+"]
    assert list(printed["sections"]) == list(dict.fromkeys(chart.section for chart in CHARTS))
    with pytest.raises(SystemExit) as exit_info:
        main(["dashboard"])  # saving needs the entity
    assert exit_info.value.code == 2 and "--entity is needed" in capsys.readouterr().err


@pytest.mark.parametrize("switch", [[], ["--dashboard_callbacks=false"]], ids=["default_on", "switched_off"])
def test_dashboard_callbacks_are_on_by_default_and_can_be_switched_off(tmp_path, switch):
    cli = cli_main(
        [
            "fit",
            "--config",
            str(QUICKSTART),
            *FAST,
            "--trainer.fast_dev_run=true",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
            *switch,
        ]
    )
    present = {type(c) for c in cli.trainer.callbacks} & set(DASHBOARD_CALLBACKS)
    assert present == (set() if switch else set(DASHBOARD_CALLBACKS))
