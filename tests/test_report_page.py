"""``report.html``: its sections (headline table, test results, charts in a grid, terms), several runs side by side,
and which run a folder names. Run folders are written by hand here (CSV logs), so nothing trains."""

import csv
import json
import re
from pathlib import Path

import pytest
import yaml

from units_lightning.cli import main
from units_lightning.dashboard import build_report, read_run_log, runs_to_report, setting_name
from units_lightning.dashboard.run_log import merge_parts, wandb_parts
from units_lightning.runs import find_run_folders

SETTINGS = {
    "MAML": ("CrossEntropyLoss", "RandomSampler"),
    "Units-NTS": ("EvidentialLoss", "RandomSampler"),
    "Units-ML": ("EvidentialLoss", "MultiQuerySampler"),
}


def _rows(accuracy_end: float) -> list[dict]:
    rows = []
    for epoch in range(3):
        for step in range(epoch * 5, epoch * 5 + 5):
            rows.append(
                {
                    "step": step,
                    "epoch": epoch,
                    "train/loss_step": 1.0 - 0.05 * step,
                    "schedule/lambda": 0.99 - 0.01 * step,
                    "schedule/eta": min(1.0, 0.1 * step),
                    "labels/query_sets": 4 * (step + 1),
                }
            )
        accuracy = accuracy_end - 0.1 * (2 - epoch)
        rows.append(
            {
                "step": epoch * 5 + 4,
                "epoch": epoch,
                "val/acc": accuracy,
                "val/acc_ci95": 0.02,
                "val/vacuity": 0.5 - 0.05 * epoch,
                "val/dissonance": 0.2,
                "val/incorrect_belief": 0.15,
                "val/correct_belief": 0.4,
                "label_budget/query_sets": 20 * (epoch + 1),
                "val/theorem1_holds": 1.0,
                "val/theorem1_margin": 0.05,
                "val_curve/acc_vacuity_below_0p50": accuracy,
                "val_curve/acc_vacuity_below_1p00": accuracy,
                "val_curve/coverage_vacuity_below_0p50": 0.4,
                "val_curve/coverage_vacuity_below_1p00": 1.0,
            }
        )
        rows.append(
            {
                "step": epoch * 5 + 4,
                "epoch": epoch,
                "train/acc_epoch": accuracy,
                "train/vacuity_epoch": 0.5,
                "train/dissonance_epoch": 0.2,
                "train/incorrect_belief_epoch": 0.2,
                "train/correct_belief_epoch": 0.4,
                "train/theorem1_holds": 1.0,
            }
        )
    return rows


def _results(accuracy: float) -> dict:
    return {
        "tasks": 600,
        "queries": 15000,
        "accuracy": {"mean": accuracy, "ci95": 0.01},
        **{
            name: {"mean": 0.3, "ci95": 0.01}
            for name in ("vacuity", "dissonance", "incorrect_belief", "correct_belief")
        },
        "vacuity_thresholds": [
            {"threshold": 0.1, "accuracy": None, "coverage": 0.0},
            {"threshold": 0.2, "accuracy": 0.99, "coverage": 0.3},
        ],
        "threshold_curve": {
            "threshold": [0.1, 0.5, 1.0],
            "accuracy": [None, 0.97, accuracy],
            "coverage": [0.0, 0.6, 1.0],
        },
        "selective_accuracy": [
            {"coverage": c, "accuracy": min(1.0, accuracy + (1 - c) / 10)} for c in (1.0, 0.7, 0.6, 0.5)
        ],
        "aurc": 0.02,
        "ece": 0.05,
        "task": {"n_way": 5, "k_shot": 1, "query_shots": 5},
        "ood": {
            "rotation": [
                {
                    "level": angle,
                    "name": f"rotation_{angle}",
                    "accuracy": {"mean": accuracy - angle / 400, "ci95": 0.01},
                    "vacuity": {"mean": 0.3 + angle / 1000, "ci95": 0.01},
                    "auroc": 0.5 + angle / 500,
                }
                for angle in (0, 90, 180)
            ]
        },
    }


def make_run(
    root: Path, setting: str = "Units-ML", accuracy: float = 0.9, tested: bool = True, tested_step: int = 15
) -> Path:
    """A run folder as `units-lightning fit` (CSVLogger) and `test` leave it: validations after steps 5, 10 and 15
    (logged, as Lightning does, at the step index 4, 9 and 14), the test of the checkpoint of ``tested_step`` (by
    default that of the last validation)."""
    folder = root / "lightning_logs" / "version_0"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
    loss, sampler = SETTINGS[setting]
    config = {
        "model": {"loss": {"class_path": f"units_lightning.losses.{loss}"}},
        "data": {
            "class_path": "units_lightning.data.SyntheticGlyphsDataModule",
            "init_args": {"n_way": 5, "k_shot": 1, "sampler": {"class_path": f"units_lightning.samplers.{sampler}"}},
        },
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    summary = {
        "val_accuracy": accuracy,
        "val_accuracy_ci95": 0.012,
        "val_vacuity": 0.38,
        "val_dissonance": 0.13,
        "val_incorrect_belief": 0.1,
        "val_correct_belief": 0.52,
        "steps": 300,
        "wall_time_s": 68.3,
        "labels": {"query_sets": 1200, "query_images": 6000, "support_images": 6000},
        "checkpoints": {"last": "checkpoints/last.ckpt"},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    if tested:
        checkpoint = folder / "checkpoints" / f"step{tested_step}-acc0.9000.ckpt"
        results = {**_results(accuracy - 0.01), "checkpoint": str(checkpoint), "checkpoint_step": tested_step}
        (folder / "results.json").write_text(json.dumps(results))
    rows = _rows(accuracy)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with (folder / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, keys)
        writer.writeheader()
        writer.writerows(rows)
    return folder


def test_the_page_of_one_run_has_every_section(tmp_path):
    folder = make_run(tmp_path / "runs" / "quickstart")
    report = build_report(tmp_path / "runs" / "quickstart")  # the folder above the run, as the README passes it
    assert report.html == folder / "report" / "report.html"
    page = report.html.read_text()
    for heading in ("At a glance", "Test results", "Training", "Belief trends", "Files", "Terms"):
        assert re.search(rf"<h[234][^>]*>{re.escape(heading)}</h[234]>", page), heading
    headline = page[page.index('id="headline"') : page.index('id="test"')]
    for row in (
        "Setting",
        "Final validation accuracy (± 95% CI; step)",
        "Test accuracy (± 95% CI; tasks, checkpoint)",
        "Test accuracy at vacuity &lt; 0.2 (coverage)",
        "Dissonance (conflicting belief), validation / test",
        "Labels spent",
        "Wall time of the last fit command",
    ):
        assert f"<th>{row}</th>" in headline, row
    assert (
        "90.00% ± 1.20 (step 15)" in headline
        and "89.00% ± 1.00 (600 tasks, step15-acc0.9000.ckpt)</td>" in headline
        and "68.3 s" in headline
    )
    assert "1,200 query sets (6,000 images), 6,000 support images" in headline and "Units-ML" in headline
    assert "Out of distribution: rotation" in page and "Most confident queries kept" in page
    assert "<th>90 degrees</th>" in page  # a probe's level with its unit
    assert "no query below 0.1 (keeps 0.00%)" in headline  # not an unexplained n/a
    assert "Test: <code>units-lightning test</code>" in headline  # backquotes in a caption become code
    assert "Charts read from the CSV log" in page
    names = {path.name for path in report.images}
    assert {"test_threshold_curve.png", "test_selective_accuracy.png", "test_ood_rotation_accuracy.png"} <= names
    assert 'class="warning"' not in page  # validated and tested at step 15
    assert page.count("data:image/png;base64,") == len(report.images) >= 10
    assert "grid-template-columns:repeat(auto-fill,minmax(min(100%,460px),1fr))" in page  # responsive grid
    assert '<meta name="viewport"' in page
    assert "<dt>dissonance</dt><dd>conflicting belief" in page
    assert "incorrect belief &gt;= dissonance / 2" in page and "not with correct belief" in page
    assert "Tasks where Theorem 1 holds: incorrect belief &gt;= dissonance / 2" in page


def test_three_runs_side_by_side(tmp_path):
    runs = [
        make_run(tmp_path / "runs" / name, setting, accuracy)
        for name, setting, accuracy in (
            ("maml", "MAML", 0.8),
            ("nts", "Units-NTS", 0.85),
            ("quickstart", "Units-ML", 0.9),
        )
    ]
    report = build_report([tmp_path / "runs" / "maml", tmp_path / "runs" / "nts", runs[2]])
    assert report.html == tmp_path / "runs" / "comparison" / "report.html"
    page = report.html.read_text()
    assert "<h1>Runs side by side: MAML vs Units-NTS vs Units-ML</h1>" in page
    header = re.search(r"<thead><tr><th></th>(.*?)</tr></thead>", page).group(1)
    assert header == "<th>MAML</th><th>Units-NTS</th><th>Units-ML</th>"
    assert "80.00% ± 1.20" in page and "85.00% ± 1.20" in page and "90.00% ± 1.20" in page
    assert any(path.name.startswith("compare_") for path in report.images)
    assert page.count("<details><summary>") >= 3  # every run's own charts, folded


def test_a_folder_with_several_trained_runs_is_listed_not_guessed(tmp_path, capsys):
    make_run(tmp_path / "a")
    make_run(tmp_path / "b", "MAML")
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "holds 2 trained runs; name the one to draw, or several to compare" in err
    assert str(tmp_path / "a" / "lightning_logs" / "version_0") in err and "(MAML, 300 steps" in err


def test_the_trained_run_is_chosen_over_an_evaluation_only_folder(tmp_path):
    trained = make_run(tmp_path / "runs")
    evaluated = tmp_path / "runs" / "lightning_logs" / "version_1"
    evaluated.mkdir(parents=True)
    (evaluated / "results.json").write_text(json.dumps(_results(0.5)))
    assert find_run_folders(tmp_path / "runs") == [trained, evaluated]
    (run,) = runs_to_report([tmp_path / "runs"])
    assert run.folder == trained


def test_a_resumed_and_tested_wandb_run_is_read_as_one_history():
    first = [{"step": s, "train/loss_step": 1.0} for s in range(12)]
    resumed = [{"step": s, "train/loss_step": 0.5} for s in range(10, 15)]
    tested = [{"step": 9, "test/acc": 0.9}]
    merged = merge_parts([first, tested, resumed])
    assert [row["step"] for row in merged] == [*range(10), *range(10, 15)]
    assert all("test/acc" not in row for row in merged)
    assert merged[-1]["train/loss_step"] == 0.5


def test_wandb_parts_include_a_part_that_started_in_the_same_second(tmp_path):
    # W&B names a part that starts in the same second as an earlier one of the run `<that folder>-1` (CI saw a
    # `test` begin in the second its `fit` did, and the part went unread).
    wandb_dir = tmp_path / "wandb"
    names = [
        "offline-run-20261129_045301-abc123",
        "offline-run-20261129_045301-abc123-1",
        "offline-run-20261129_045301-abc123-10",
        "offline-run-20261129_045301-abc123-2",
        "run-20261129_045302-abc123",
    ]
    other_runs = {"offline-run-20261129_045301-xabc123": "xabc123", "offline-run-20261129_045300-abc1234": "abc1234"}
    for name, run_id in [*((name, "abc123") for name in names), *other_runs.items()]:
        (wandb_dir / name).mkdir(parents=True)
        (wandb_dir / name / f"run-{run_id}.wandb").write_bytes(b"")
    (wandb_dir / "offline-run-20261129_045303-abc123").mkdir()  # no run file: nothing was logged
    parts = wandb_parts(tmp_path / "units-lightning" / "abc123")
    assert [p.name for p in parts] == [names[0], names[1], names[3], names[2], names[4]]


def test_the_setting_is_named_from_the_loss_and_the_sampler():
    def config(loss, sampler):
        sampler_spec = {"sampler": {"class_path": f"y.{sampler}"}}
        return {"model": {"loss": {"class_path": f"x.{loss}"}}, "data": {"init_args": sampler_spec}}

    assert setting_name(config("EvidentialLoss", "SingleTaskSelectionSampler")) == "Units-ST"
    assert setting_name(config("EvidentialLoss", "NeighbourClassSampler")) == "EvidentialLoss + NeighbourClassSampler"


def test_a_run_folder_without_a_log_still_has_its_headline(tmp_path):
    folder = make_run(tmp_path)
    (folder / "metrics.csv").unlink()
    assert read_run_log(folder) is None
    report = build_report(folder, tmp_path / "out")
    page = report.html.read_text()
    assert "No log found" in page and "90.00% ± 1.20" in page


def test_a_resumed_fit_says_which_steps_its_seconds_trained(tmp_path):
    from units_lightning.cli.console import format_summary

    folder = make_run(tmp_path / "runs" / "quickstart")
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(steps=400, start_step=300, wall_time_s=62.2)
    (folder / "summary.json").write_text(json.dumps(summary))
    page = build_report(folder).html.read_text()
    assert "62.2 s (steps 300-400)" in page
    printed = {
        **summary,
        "chance_accuracy": 0.2,
        "labels": {"query_sets": 1600, "query_images": 8000, "support_images": 8000},
    }
    assert "  steps 400 (resumed at step 300: 100 steps in 62.2 s)" in format_summary(printed).splitlines()
    assert "  steps 300 in 68.3 s" in format_summary({**printed, "steps": 300, "start_step": 0, "wall_time_s": 68.3})


def test_a_folder_with_nothing_to_show_is_refused_in_one_line(tmp_path, capsys):
    # What a `test` that failed before its first batch left (before failed commands cleaned up after themselves):
    # a W&B offline part with no rows and a run folder holding only its config_test.yaml.
    import wandb

    touched = tmp_path / "touched"
    wandb.init(mode="offline", dir=touched, project="units-lightning", id="failedtest").finish()
    (touched / "units-lightning" / "failedtest").mkdir(parents=True)
    (touched / "units-lightning" / "failedtest" / "config_test.yaml").write_text("trainer: {}\n")
    header_only = tmp_path / "header_only" / "lightning_logs" / "version_0"
    header_only.mkdir(parents=True)
    (header_only / "metrics.csv").write_text("epoch,step\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (touched, header_only, empty):
        with pytest.raises(SystemExit) as exit_info:
            main(["report", str(folder)])
        err = capsys.readouterr().err
        assert exit_info.value.code != 0, folder
        assert "nothing to show" in err and str(folder) in err and err.strip().count("\n") == 0, err
        assert not (folder / "report").exists()
    # Beside a run that has something to show, the empty one is named.
    trained = make_run(tmp_path / "trained")
    with pytest.raises(SystemExit):
        main(["report", str(trained), str(header_only)])
    assert f"nothing to show in {header_only}" in capsys.readouterr().err


# --- issue 34, item 8: the page's plots read alike, accuracy in % with chance, no line or bar hidden ---------


def _accuracy_lines(axes):
    return [line for line in axes.get_lines() if not line.get_label().startswith(("chance", "_"))]


def _chance(axes):
    return [line for line in axes.get_lines() if line.get_label().startswith("chance")]


def _chart(title):
    from units_lightning.dashboard import CHARTS

    return next(chart for chart in CHARTS if chart.title == title)


def test_the_out_of_distribution_plots_have_the_size_and_fonts_of_the_others():
    from units_lightning.dashboard.plots import draw, shift_probes

    other = draw(_chart("Theorem 1 slack: smallest (incorrect belief - dissonance / 2) over tasks"), _rows(0.9))
    (other_axes,) = other.axes
    tested = [("Units-ML", _results(0.9))]
    for measure in ((), ("vacuity",)):  # accuracy (the default), then vacuity
        figure = shift_probes("rotation", tested, *measure)
        (axes,) = figure.axes  # one plot per figure, not two squeezed side by side into one grid cell
        assert tuple(figure.get_size_inches()) == tuple(other.get_size_inches()) and figure.dpi == other.dpi
        assert axes.title.get_fontsize() == other_axes.title.get_fontsize()
        assert axes.xaxis.label.get_fontsize() == other_axes.xaxis.label.get_fontsize()
        assert axes.get_xticklabels()[0].get_fontsize() == other_axes.get_xticklabels()[0].get_fontsize()
    assert [axes.get_title() for axes in figure.axes] == ["rotation: mean vacuity"]


def test_accuracy_is_in_percent_with_a_chance_line_on_every_accuracy_plot(tmp_path):
    from units_lightning.dashboard.plots import draw, draw_compared, selective_accuracy, shift_probes, threshold_curves

    results = _results(0.9)  # 5-way
    tested = [("Units-ML", results)]
    figures = {
        "threshold": threshold_curves(tested),
        "selective": selective_accuracy(tested),
        "ood": shift_probes("rotation", tested),
        "accuracy": draw(_chart("Accuracy"), _rows(0.9), n_way=5),
        "budget": draw_compared(
            _chart("Validation accuracy vs labeled query sets (label-budget curve)"),
            "val/acc",
            [("a", _rows(0.9)), ("b", _rows(0.8))],
            [5, 5],
        ),
        "curve": draw(_chart("Validation accuracy vs vacuity threshold (one line per validation)"), _rows(0.9), 5),
    }
    for name, figure in figures.items():
        (axes,) = figure.axes
        (chance,) = _chance(axes)
        assert chance.get_label().startswith("chance (20%)"), name
        assert chance.get_linestyle() == "--", name
        assert "%" in axes.get_ylabel() or "%" in axes.get_xlabel(), name
        if name != "selective":
            assert list(chance.get_ydata()) == [20.0, 20.0], name
            assert "chance (20%)" in [text.get_text() for text in axes.get_legend().get_texts()], name
    # The plots give the numbers the tables give: 90% of the threshold table is 90 on the plot's axis.
    ood = _accuracy_lines(figures["ood"].axes[0])[0]
    assert list(ood.get_ydata()) == pytest.approx([100 * r["accuracy"]["mean"] for r in results["ood"]["rotation"]])
    selective = _accuracy_lines(figures["selective"].axes[0])[0]
    assert list(selective.get_xdata()) == [50.0, 60.0, 70.0, 100.0]
    assert selective.get_ydata()[-1] == pytest.approx(90.0)
    page = build_report(make_run(tmp_path, accuracy=0.91), tmp_path / "out").html.read_text()  # tests 90%
    assert '<th>100%</th><td class="num">90.00%</td>' in page  # the same point in the selective-accuracy table
    # Without N (an older results.json) there is no chance line rather than a wrong one.
    unknown = {key: value for key, value in results.items() if key != "task"}
    assert _chance(threshold_curves([("Units-ML", unknown)]).axes[0]) == []


def test_a_chance_level_far_below_selective_accuracy_is_named_not_stretched_to():
    from units_lightning.dashboard.plots import selective_accuracy

    results = _results(0.97)
    results["selective_accuracy"] = [{"coverage": c, "accuracy": 0.97 + (1 - c) / 50} for c in (1.0, 0.7, 0.5)]
    (axes,) = selective_accuracy([("Units-ML", results)]).axes
    assert axes.get_ylim()[0] > 90  # the differences of a point stay readable
    assert "chance (20%) (below the axis)" in [text.get_text() for text in axes.get_legend().get_texts()]


def test_lines_that_coincide_stay_visible_and_the_legend_says_so():
    from units_lightning.dashboard.plots import draw, draw_compared

    rows = [
        {"step": step, "labels/query_sets": step, "labels/query_images": 5 * step, "labels/support_images": 5 * step}
        for step in range(1, 6)
    ]
    (axes,) = draw(_chart("Labels spent"), rows).axes
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == ["query sets", "query images", "support images (same as query images)"]
    sets, images, support = axes.get_lines()
    assert list(images.get_ydata()) == list(support.get_ydata())
    # The one beneath is a wide pale band, the one on top thin with open markers: both show.
    assert images.get_linewidth() > 2 * support.get_linewidth() and images.get_alpha() < 1
    assert support.get_markerfacecolor() == "none" and support.get_zorder() > images.get_zorder()
    assert sets.get_alpha() is None  # a line that coincides with none is drawn as before
    # Two runs that spent the same labels (Units-ML and Units-NTS, 4 query sets a step).
    (axes,) = draw_compared(_chart("Labels spent"), "labels/query_sets", [("Units-ML", rows), ("Units-NTS", rows)]).axes
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["Units-ML", "Units-NTS (same as Units-ML)"]
    # Lines that merely cross are left alone.
    crossing = [{**row, "labels/support_images": 25 - 5 * row["step"] + 5} for row in rows]
    assert "same as" not in " ".join(
        t.get_text() for t in draw(_chart("Labels spent"), crossing).axes[0].get_legend().get_texts()
    )


def _histogram_rows():
    # W&B's histograms: 64 bins over each side's own range, so chosen and rejected come with different bins.
    def histogram(low, high, counts):
        return {"bins": [low + (high - low) * i / len(counts) for i in range(len(counts) + 1)], "values": counts}

    chosen = histogram(0.4, 0.8, [0, 2, 5, 10, 3])
    rejected = histogram(0.1, 0.7, [6, 12, 30, 10, 2, 0])
    row = {"step": 40, "epoch": 1}
    for side, histogram_ in (("chosen", chosen), ("rejected", rejected)):
        row[f"selection/uncertainty_{side}_hist/bins"] = histogram_["bins"]
        row[f"selection/uncertainty_{side}_hist/values"] = histogram_["values"]
    return [row], chosen, rejected


def test_chosen_and_rejected_histograms_share_bins_and_one_y_scale(tmp_path):
    from units_lightning.dashboard import CHARTS
    from units_lightning.dashboard.plots import draw_histograms, rebin

    histograms = [chart for chart in CHARTS if chart.kind == "histogram"]
    rows, chosen, rejected = _histogram_rows()
    figure = draw_histograms(histograms, rows)
    (axes,) = figure.axes  # one axis: one y-scale for both
    outlines = [patch for patch in axes.patches if patch.get_label() and not patch.get_label().startswith("_")]
    assert [patch.get_label() for patch in outlines] == ["chosen (20 query sets)", "rejected (60 query sets)"]
    (chosen_edges, rejected_edges) = [list(patch.get_data().edges) for patch in outlines]
    assert chosen_edges == rejected_edges and chosen_edges[0] == 0.1 and chosen_edges[-1] == pytest.approx(0.8)
    for patch in outlines:  # the share of each side's sets per bin
        assert sum(patch.get_data().values) == pytest.approx(100.0)
    assert axes.get_ylabel() == "share of the side's sets (%)"
    # Rebinning keeps every set and is exact on the same edges.
    assert sum(rebin(rejected["values"], rejected["bins"], chosen_edges)) == pytest.approx(60)
    assert rebin(chosen["values"], chosen["bins"], chosen["bins"]) == [0.0, 2.0, 5.0, 10.0, 3.0]


def _mixed_run(tmp_path):
    """A run whose last validation is at step 15 and whose test is of the checkpoint of step 10."""
    folder = make_run(tmp_path / "runs" / "quickstart", tested_step=10)
    (folder / "checkpoints" / "last.ckpt").unlink()
    torch = pytest.importorskip("torch")
    torch.save({"global_step": 15, "state_dict": {}}, folder / "checkpoints" / "last.ckpt")
    return folder


def test_a_test_of_an_earlier_checkpoint_beside_the_last_validation_is_warned_of(tmp_path, capsys):
    folder = _mixed_run(tmp_path)
    main(["report", str(folder)])
    page = (folder / "report" / "report.html").read_text()
    (warning,) = re.findall(r'<p class="warning" role="alert">(.*?)</p>', page)
    assert page.index('class="warning"') < page.index('id="headline"')  # at the top, above the numbers
    assert "the final validation accuracy (90.00%) is the last validation, at step 15" in warning
    assert "the test accuracy (89.00%) is of an earlier checkpoint, step10-acc0.9000.ckpt at step 10" in warning
    assert "compare the test with the validation at step 10 (80.00%)" in warning  # read from the log
    command = (
        f"units-lightning test --config {folder / 'config.yaml'} --ckpt_path {folder / 'checkpoints' / 'last.ckpt'}"
    )
    assert f"test the model of step 15: <code>{command}</code>" in warning
    assert "(600 tasks, step10-acc0.9000.ckpt) ⚠" in page  # the cell it concerns is marked
    err = capsys.readouterr().err
    assert err.startswith("units-lightning report: warning: Units-ML: the final validation accuracy") and command in err


def test_the_tested_step_of_an_older_results_file(tmp_path):
    from units_lightning.dashboard import describe_run

    folder = _mixed_run(tmp_path)
    results = json.loads((folder / "results.json").read_text())
    del results["checkpoint_step"]  # written before results.json recorded it: the step is in the name
    (folder / "results.json").write_text(json.dumps(results))
    assert describe_run(folder).tested_step == 10
    # last.ckpt names no step: its stored step counts only if the file is no newer than the results.
    results["checkpoint"] = str(folder / "checkpoints" / "last.ckpt")
    (folder / "results.json").write_text(json.dumps(results))
    assert describe_run(folder).tested_step == 15
    import os

    later = (folder / "results.json").stat().st_mtime + 60
    os.utime(folder / "checkpoints" / "last.ckpt", (later, later))  # trained on after the test: unknown
    assert describe_run(folder).tested_step is None
    assert 'class="warning"' not in build_report(folder, tmp_path / "out").html.read_text()


def test_results_record_the_step_of_the_checkpoint_tested(tmp_path):
    # last.ckpt is rewritten when a run trains on after its test: the step is read when the test ends.
    from types import SimpleNamespace

    from units_lightning.callbacks import ResultsWriter

    torch = pytest.importorskip("torch")
    checkpoint = tmp_path / "last.ckpt"
    torch.save({"global_step": 40, "state_dict": {}}, checkpoint)
    trainer = SimpleNamespace(is_global_zero=True, ckpt_path=str(checkpoint), datamodule=None, logger=None)
    ResultsWriter(output_dir=str(tmp_path), verbose=False).on_test_end(
        trainer, SimpleNamespace(test_results=_results(0.9))
    )
    assert json.loads((tmp_path / "results.json").read_text())["checkpoint_step"] == 40
    trainer.ckpt_path = None  # an ensemble tests no one checkpoint
    ResultsWriter(output_dir=str(tmp_path), verbose=False).on_test_end(
        trainer, SimpleNamespace(test_results=_results(0.9))
    )
    assert json.loads((tmp_path / "results.json").read_text())["checkpoint_step"] is None
