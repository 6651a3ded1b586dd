"""``units-lightning report RUN [RUN ...]``: a run's dashboard drawn offline, or several runs side by side.

For users without a W&B account, or offline: one self-contained ``report.html`` (and the PNGs beside it) with a
headline table (final validation and test accuracy with their 95% CI, beliefs, labels spent, wall time), the test
results (threshold curve, selective accuracy, out-of-distribution probes) when the run was tested, and the charts
of ``charts.py`` (the same the W&B workspace shows) drawn from the run's own logs, whichever logger wrote them.

A run is its folder (``units_lightning.runs``): ``runs/quickstart`` finds the quick start's run in it; several runs
(MAML, Units-NTS, Units-ML of one setting) are drawn on shared axes.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from units_lightning import keys
from units_lightning.dashboard.charts import CHARTS, Chart
from units_lightning.dashboard.page import Figure, Section, Table, render
from units_lightning.dashboard.plots import (
    draw,
    draw_compared,
    draw_histograms,
    selective_accuracy,
    shift_probes,
    threshold_curves,
)
from units_lightning.dashboard.run_info import RunInfo, runs_to_report, stored_step
from units_lightning.dashboard.run_log import find_log
from units_lightning.runs import REPORT, find_run_folders

__all__ = ["NothingToShow", "Report", "build_report", "main"]

_NA = "n/a"
_SOURCES = {"wandb": "W&B offline run", "csv": "CSV", "tensorboard": "TensorBoard"}  # RunLog.source, in words


@dataclass
class Report:
    """What ``build_report`` wrote.

    Attributes:
        html: the HTML page.
        images: the PNG files, in page order.
        skipped: titles of charts with nothing to draw, and why.
        runs: the runs drawn.
        warnings: what the page warns of at its top (numbers of different models side by side), one paragraph
            each; ``units-lightning report`` prints them on stderr too.
    """

    html: Path
    images: list[Path]
    skipped: list[str]
    runs: list[RunInfo]
    warnings: list[str] = field(default_factory=list)


class NothingToShow(ValueError):
    """A folder with nothing for the report to draw: no summary, no test results, no logged metrics (an empty
    folder, or one that only a command failing before its first step touched). A blank page would say less."""


# Keys a logger writes with every row, which alone are no metric (W&B's own start with "_").
_BOOKKEEPING = {"step", "epoch", "trainer/global_step"}


def _has_something_to_show(run: RunInfo) -> bool:
    """Whether ``run`` has a summary, test results or at least one logged metric."""
    if run.summary is not None or run.results is not None:
        return True
    keys = run.log.keys if run.log is not None else set()
    return any(not key.startswith("_") and key not in _BOOKKEEPING for key in keys)


def _refuse_empty(paths: Sequence[str | Path], runs: list[RunInfo] | None = None) -> None:
    """Raise ``NothingToShow`` for the first given folder without a run or a log, or (``runs``) the first run
    with nothing to show, in one line."""
    advice = "train with `units-lightning fit`, or name the folder of a run that has trained or been tested"
    for given in paths if runs is None else ():
        path = Path(given)
        if not path.is_dir() or find_run_folders(path):
            continue
        try:
            find_log(path)
        except FileNotFoundError:
            raise NothingToShow(
                f"nothing to show in {path}: no run folder (summary.json, results.json, checkpoints/) and no log "
                f"(W&B offline run, CSV metrics.csv, TensorBoard events) in it or below it; {advice}"
            ) from None
    for run in runs or ():
        if not _has_something_to_show(run):
            raise NothingToShow(
                f"nothing to show in {run.folder}: no summary.json, no results.json and no logged metrics (a "
                f"command that failed before its first step writes none); {advice}"
            )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60]


def _pct(value: Any, ci: Any = None) -> str:
    if not isinstance(value, int | float) or value != value:
        return _NA
    text = f"{100 * value:.2f}%"
    return text + (f" ± {100 * ci:.2f}" if isinstance(ci, int | float) and ci == ci else "")


def _num(value: Any, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) and value == value else _NA


def _seconds(value: Any) -> str:
    return f"{value:.1f} s" if isinstance(value, int | float) else _NA


def _wall_time(summary: dict[str, Any]) -> str:
    """``296.3 s``; for a resumed fit, which steps those seconds trained (``62.2 s (steps 300-400)``)."""
    text, start = _seconds(summary.get("wall_time_s")), summary.get("start_step") or 0
    return f"{text} (steps {start}-{summary['steps']})" if start and text != _NA and "steps" in summary else text


def _last(run: RunInfo, key: str) -> Any:
    rows = run.log.rows if run.log else []
    values = [row[key] for row in rows if isinstance(row.get(key), int | float)]
    return values[-1] if values else None


def _mean(results: dict[str, Any] | None, name: str) -> Any:
    entry = (results or {}).get(name)
    return entry.get("mean") if isinstance(entry, dict) else None


def _labels(runs: list[RunInfo], given: Sequence[str] | None) -> None:
    """Name each run: ``--label`` values, else its setting, with its folder where settings repeat."""
    if given:
        if len(given) != len(runs):
            raise ValueError(f"{len(given)} labels (--label) for {len(runs)} runs: give one per run, in order")
        for run, label in zip(runs, given, strict=True):
            run.label = label
        return
    settings = [run.setting for run in runs]
    parent = Path(os.path.commonpath([str(run.folder.resolve()) for run in runs])) if len(runs) > 1 else None
    for run, setting in zip(runs, settings, strict=True):
        if settings.count(setting) == 1:
            run.label = setting
            continue
        relative = run.folder.resolve().relative_to(parent) if parent else Path(run.folder.name)
        short = relative.parts[0] if relative.parts else run.folder.name
        run.label = f"{setting} ({short}{'/' + run.folder.name if run.folder.name != short else ''})"


_VAL_ACC = keys.stage_key(keys.VAL, keys.ACC)
_VAL_CI = keys.stage_key(keys.VAL, keys.ACC_CI95)


def _validation_accuracy(run: RunInfo) -> Any:
    return (run.summary or {}).get("val_accuracy", _last(run, _VAL_ACC))


def _mixed_steps(run: RunInfo) -> tuple[int, int] | None:
    """``(last validation step, tested step)`` where the run's test is of another checkpoint than its last
    validation, else None."""
    validated, tested = run.last_validation_step, run.tested_step
    if run.results is None or validated is None or tested is None or validated == tested:
        return None
    return validated, tested


def _like_with_like(run: RunInfo) -> str | None:
    """The warning for a run whose headline puts the last validation beside a test of another checkpoint: both
    steps, the validation at the tested step where the log has it, and the command that tests the validated
    model."""
    steps = _mixed_steps(run)
    if steps is None:
        return None
    validated, tested = steps
    accuracy = (run.results or {}).get("accuracy") or {}
    checkpoint = Path(str((run.results or {}).get("checkpoint"))).name
    then = run.validations().get(tested)
    when = "an earlier" if tested < validated else "a later"
    text = (
        f"{run.label}: the final validation accuracy ({_pct(_validation_accuracy(run))}) is the last validation, at "
        f"step {validated}, but the test accuracy ({_pct(accuracy.get('mean'))}) is of {when} checkpoint, "
        f"{checkpoint} at step {tested}: the two numbers describe different models."
    )
    options = [f"compare the test with the validation at step {tested} ({_pct(then)})"] if then is not None else []
    last = ((run.summary or {}).get("checkpoints") or {}).get("last")
    path = run.folder / last if last else None
    config = run.folder / "config.yaml"
    if path is not None and path.is_file() and config.is_file():
        stored = stored_step(path)
        which = {validated: f"the model of step {validated}", None: "the last checkpoint"}.get(
            stored, f"the last checkpoint (step {stored})"
        )
        command = f"units-lightning test --config {shlex.quote(str(config))} --ckpt_path {shlex.quote(str(path))}"
        options.append(f"test {which}: `{command}`")
    else:
        options.append(f"test the checkpoint of step {validated} (`units-lightning test --ckpt_path <its file>`)")
    text += " To compare like with like, " + ", or ".join(options) + "."
    return text


def _headline(runs: list[RunInfo]) -> Table:
    rows: list[list[str]] = []

    def row(name: str, cells: list[str]) -> None:
        if any(cell != _NA for cell in cells):
            rows.append([name, *cells])

    row("Setting", [run.setting for run in runs])
    row("Data", [run.data or _NA for run in runs])
    val = []
    for run in runs:
        text = _pct(_validation_accuracy(run), (run.summary or {}).get("val_accuracy_ci95", _last(run, _VAL_CI)))
        step = run.last_validation_step
        val.append(f"{text} (step {step})" if text != _NA and step is not None else text)
    row("Final validation accuracy (± 95% CI; step)", val)
    test = []
    for run in runs:
        accuracy = (run.results or {}).get("accuracy") or {}
        tasks = (run.results or {}).get("tasks")
        text = _pct(accuracy.get("mean"), accuracy.get("ci95"))
        checkpoint = Path(str((run.results or {}).get("checkpoint") or "")).name
        step = run.tested_step
        if checkpoint and step is not None and not re.search(rf"(?:^|[^a-z])step=?{step}(?!\d)", checkpoint):
            checkpoint += f" at step {step}"
        details = ", ".join(part for part in (f"{tasks} tasks" if tasks else "", checkpoint) if part)
        mark = " ⚠" if _mixed_steps(run) else ""
        test.append(f"{text} ({details}){mark}" if text != _NA and details else text)
    row("Test accuracy (± 95% CI; tasks, checkpoint)", test)
    for threshold in keys.REPORTED_VACUITY_THRESHOLDS:
        cells = []
        for run in runs:
            found = [r for r in (run.results or {}).get("vacuity_thresholds", []) if r["threshold"] == threshold]
            if found and found[0]["coverage"] == 0:
                cells.append(f"no query below {threshold:g} (keeps 0.00%)")
            else:
                cells.append(f"{_pct(found[0]['accuracy'])} (keeps {_pct(found[0]['coverage'])})" if found else _NA)
        row(f"Test accuracy at vacuity < {threshold:g} (coverage)", cells)
    words = {
        "vacuity": "Vacuity (lack of evidence)",
        "dissonance": "Dissonance (conflicting belief)",
        "incorrect_belief": "Incorrect belief",
        "correct_belief": "Correct belief",
    }
    for name, word in words.items():
        cells = []
        for run in runs:
            validation = (run.summary or {}).get(f"val_{name}", _last(run, keys.stage_key(keys.VAL, name)))
            cells.append(f"{_num(validation)} / {_num(_mean(run.results, name))}")
        row(f"{word}, validation / test", cells)
    cells = []
    for run in runs:
        labels = (run.summary or {}).get("labels") or {}
        if "query_sets" in labels:
            cells.append(
                f"{labels['query_sets']:,} query sets ({labels['query_images']:,} images), "
                f"{labels['support_images']:,} support images"
            )
        else:
            cells.append(_NA)
    row("Labels spent", cells)
    row("Training steps", [str((run.summary or {}).get("steps", _NA)) for run in runs])
    row("Wall time of the last fit command", [_wall_time(run.summary or {}) for run in runs])
    row(
        "AURC / ECE (test)",
        [
            f"{_num((run.results or {}).get('aurc'))} / {_num((run.results or {}).get('ece'))}" if run.results else _NA
            for run in runs
        ],
    )
    row("Stopped", [str((run.summary or {}).get("stopped") or _NA) for run in runs])
    row("Skipped steps (non-finite)", [str((run.summary or {}).get("skipped_steps") or _NA) for run in runs])
    row("Warning", [str((run.summary or {}).get("collapse_warning") or _NA) for run in runs])
    return Table(
        ["", *(run.label for run in runs)],
        rows,
        "Validation: the last validation of training (summary.json). Test: `units-lightning test` (results.json), "
        "on its own fixed, seeded test tasks. ⚠: the test is of another checkpoint than the last validation (see "
        "the warning at the top). n/a: not measured for this run.",
    )


def _level(kind: str, level: str) -> str:
    """A probe's level as a reader writes it: ``30 degrees`` for a rotation, ``0.5x`` for a scale (``results.json``
    stores ``30.0`` and ``0.5``); other levels (a dataset's name) as they are."""
    try:
        number = float(level)
    except ValueError:
        return level
    unit = {"rotation": " degrees", "scale": "x"}.get(kind, "")
    return f"{number:g}{unit}"


def _save(figure: Any, path: Path, images: list[Path]) -> Path:
    import matplotlib.pyplot as plt

    figure.savefig(path, bbox_inches="tight")  # a legend below the axes is kept whole
    plt.close(figure)
    images.append(path)
    return path


def _test_section(runs: list[RunInfo], out: Path, images: list[Path]) -> Section | None:
    tested = [(run.label, run.results) for run in runs if run.results]
    if not tested:
        return None
    section = Section(
        "Test results",
        "test",
        html.escape(
            "Adapted to each test task's support set, then scored on its queries; the probes shift the queries "
            "only (rotations, scales, other datasets) and ask whether vacuity rises where accuracy falls."
        ),
    )
    coverages = sorted({r["coverage"] for _, res in tested for r in res.get("selective_accuracy", [])}, reverse=True)
    section.tables.append(
        Table(
            ["Most confident queries kept", *(label for label, _ in tested)],
            [
                [
                    f"{100 * coverage:.0f}%",
                    *(
                        _pct(
                            next(
                                (r["accuracy"] for r in res.get("selective_accuracy", []) if r["coverage"] == coverage),
                                None,
                            )
                        )
                        for _, res in tested
                    ),
                ]
                for coverage in coverages
            ],
            "Accuracy of the given fraction of queries with the lowest vacuity.",
        )
    )
    kinds = list(dict.fromkeys(kind for _, res in tested for kind in (res.get("ood") or {})))
    for kind in kinds:
        levels = list(dict.fromkeys(str(r["level"]) for _, res in tested for r in (res.get("ood") or {}).get(kind, [])))
        rows = []
        for level in levels:
            cells = []
            for _, res in tested:
                found = [r for r in (res.get("ood") or {}).get(kind, []) if str(r["level"]) == level]
                if not found:
                    cells.append(_NA)
                    continue
                r = found[0]
                accuracy = (r.get("accuracy") or {}).get("mean")
                parts = ([f"acc {_pct(accuracy)}"] if accuracy is not None else []) + [
                    f"vacuity {_num((r.get('vacuity') or {}).get('mean'), 3)}",
                    f"AUROC {_num(r.get('auroc'), 2)}",
                ]
                cells.append(", ".join(parts))
            rows.append([_level(kind, level), *cells])
        section.tables.append(
            Table(
                [f"Out of distribution: {kind}", *(label for label, _ in tested)],
                rows,
                "Accuracy and mean vacuity of the shifted query sets; AUROC: how well vacuity tells them from clean "
                "ones.",
            )
        )
    plots = [
        (
            "test_threshold_curve.png",
            "Accuracy and coverage vs vacuity threshold",
            threshold_curves(tested),
            "Solid: accuracy of the queries with vacuity below the threshold; dashed: the share of queries kept; "
            "grey dashes: chance.",
        ),
        (
            "test_selective_accuracy.png",
            "Selective accuracy",
            selective_accuracy(tested),
            "Accuracy of the most confident queries against the share kept: it should rise as fewer are kept; "
            "dashed: chance.",
        ),
    ]
    for kind in kinds:
        plots += [
            (
                f"test_ood_{_slug(kind)}_accuracy.png",
                f"Out of distribution: {kind}, accuracy",
                shift_probes(kind, tested, "accuracy"),
                f"Accuracy of the query sets under {kind}; dashed: chance.",
            ),
            (
                f"test_ood_{_slug(kind)}_vacuity.png",
                f"Out of distribution: {kind}, vacuity",
                shift_probes(kind, tested, "vacuity"),
                f"Mean vacuity of the query sets under {kind}: it should rise where accuracy falls.",
            ),
        ]
    for name, title, figure, caption in plots:
        if figure is not None:
            section.figures.append(Figure(_save(figure, out / name, images), title, caption))
    return section


def _chart_sections(
    charts: Sequence[Chart],
    rows: list[dict[str, Any]],
    out: Path,
    prefix: str,
    images: list[Path],
    skipped: list[str],
    source: str,
    n_way: int | None = None,
) -> list[Section]:
    sections: dict[str, Section] = {}
    for index, chart in enumerate(charts):
        title, about, drawn = chart.title, chart.about, [chart]
        if chart.kind == "histogram":
            # a section's histograms (chosen, rejected) share one figure: the same bins and y-scale
            drawn = [other for other in charts if other.kind == "histogram" and other.section == chart.section]
            if chart is not drawn[0]:
                continue
            if len(drawn) > 1:
                title = _HISTOGRAMS_TITLE
                about = _HISTOGRAMS_ABOUT
            figure = draw_histograms(drawn, rows)
        else:
            figure = draw(chart, rows, n_way)
        if figure is None:
            reason = "not logged in this run"
            if chart.kind == "histogram" and source != "wandb":
                reason = "needs W&B histograms; the quantile chart shows the same values"
            skipped.extend(f"{prefix}{each.title}: {reason}" for each in drawn)
            continue
        path = _save(figure, out / f"{_slug(prefix) + '_' if prefix else ''}{index:02d}_{_slug(title)}.png", images)
        section = sections.setdefault(chart.section, Section(chart.section, _slug(prefix + chart.section)))
        section.figures.append(Figure(path, title, about))
    return list(sections.values())


_HISTOGRAMS_TITLE = "Task uncertainty of chosen vs rejected query sets (histograms)"
_HISTOGRAMS_ABOUT = (
    "The task uncertainty of the chosen and of the rejected query sets in the latest epoch (W&B runs), on shared "
    "bins and one y-scale (the share of each side's sets per bin): chosen sets should sit to the right."
)


def _compared_sections(
    runs: list[RunInfo], charts: Sequence[Chart], out: Path, images: list[Path], skipped: list[str]
) -> list[Section]:
    """Every series of the line charts with fixed keys, one chart per series with a line per run."""
    logged = [(run.label, run.log.rows if run.log else []) for run in runs]
    n_ways = [run.n_way for run in runs]
    sections: dict[str, Section] = {}
    for index, chart in enumerate(charts):
        if chart.kind != "line" or not chart.y:
            continue
        for key in chart.y:
            figure = draw_compared(chart, key, logged, n_ways)
            if figure is None:
                skipped.append(f"{chart.title}, {key}: logged by none of the runs")
                continue
            path = _save(figure, out / f"compare_{index:02d}_{_slug(key)}.png", images)
            section = sections.setdefault(chart.section, Section(chart.section, "compare_" + _slug(chart.section)))
            section.figures.append(Figure(path, chart.title, f"{key}, one line per run (from: {chart.title})."))
    return list(sections.values())


def _files(runs: list[RunInfo]) -> Section:
    rows = []
    for run in runs:
        checkpoints = (run.summary or {}).get("checkpoints") or {}
        files = [f"{role}: {path}" for role, path in checkpoints.items()]
        files += [
            name
            for name in ("summary.json", "config.yaml", "results.json", "predictions.csv")
            if (run.folder / name).is_file()
        ]
        log = run.log
        where = _NA
        if log is not None:
            parts = f" (the newest of {len(log.parts)} parts)" if len(log.parts) > 1 else ""
            where = f"{_SOURCES.get(log.source, log.source)}: {log.path}{parts}"
        rows.append([run.label, str(run.folder), ", ".join(files) or _NA, where])
    return Section("Files", "files", tables=[Table(["Run", "Folder", "Files", "Log read"], rows)])


def build_report(
    run_dir: str | Path | Sequence[str | Path],
    out_dir: str | Path | None = None,
    charts: Sequence[Chart] = CHARTS,
    labels: Sequence[str] | None = None,
) -> Report:
    """Draw the report of one run, or of several side by side, into ``out_dir``.

    Args:
        run_dir: a run folder, a folder above one (``runs/quickstart``), a log file; or a list of them to compare.
        out_dir: where ``report.html`` and the PNGs go (default: ``<run folder>/report``; for several runs,
            ``comparison/`` in the folder that holds them all).
        charts: which charts (default: the dashboard's).
        labels: a name for each run (default: its setting, MAML / Units-NTS / Units-ST / Units-ML).

    Returns:
        The written files, the charts left out and the runs drawn.

    Raises:
        FileNotFoundError: a path that does not exist or holds no run and no log.
        ValueError: a folder holding several trained runs (name one), or labels that do not match the runs.
        NothingToShow: a folder or run with no summary, no test results and no logged metrics.
    """
    import matplotlib

    matplotlib.use("Agg")
    paths = [run_dir] if isinstance(run_dir, str | Path) else list(run_dir)
    _refuse_empty(paths)
    runs = runs_to_report(paths)
    _refuse_empty(paths, runs)
    _labels(runs, labels)
    if out_dir is not None:
        out = Path(out_dir)
    elif len(runs) == 1:
        out = runs[0].folder / REPORT
    else:
        out = Path(os.path.commonpath([str(run.folder.resolve()) for run in runs])) / "comparison"
    out.mkdir(parents=True, exist_ok=True)
    images: list[Path] = []
    skipped: list[str] = []
    headline = Section("At a glance", "headline", tables=[_headline(runs)])
    sections = [headline]
    test = _test_section(runs, out, images)
    if test is not None:
        sections.append(test)
    if len(runs) == 1:
        run = runs[0]
        rows = run.log.rows if run.log else []
        source = run.log.source if run.log else ""
        training = _chart_sections(charts, rows, out, "", images, skipped, source, run.n_way)
        sections.append(Section("Training", "training", subsections=training))
        title = f"Run report: {run.label}"
        subtitle = f"Run <code>{html.escape(str(run.folder))}</code>" + _read_from(run)
    else:
        compared = _compared_sections(runs, charts, out, images, skipped)
        sections.append(Section("Side by side", "compare", "One line per run, on shared axes.", subsections=compared))
        for number, run in enumerate(runs, 1):
            rows = run.log.rows if run.log else []
            source = run.log.source if run.log else ""
            own = _chart_sections(charts, rows, out, f"run{number} ", images, [], source, run.n_way)
            sections.append(
                Section(f"{run.label}: every chart", f"run{number}", _read_from(run), subsections=own, folded=True)
            )
        title = "Runs side by side: " + " vs ".join(run.label for run in runs)
        subtitle = ", ".join(f"{html.escape(run.label)}: <code>{html.escape(str(run.folder))}</code>" for run in runs)
    sections.append(_files(runs))
    warnings = [warning for warning in map(_like_with_like, runs) if warning]
    page = out / "report.html"
    page.write_text(render(title, subtitle, sections, skipped, warnings))
    return Report(page, images, skipped, runs, warnings)


def _read_from(run: RunInfo) -> str:
    if run.log is None:
        return ". No log found: the charts need a logger (W&B, CSV or TensorBoard)."
    parts = f" from {len(run.log.parts)} parts, the newest named" if len(run.log.parts) > 1 else ""
    source = _SOURCES.get(run.log.source, run.log.source)
    return (
        f". Charts read from the {html.escape(source)} log <code>{html.escape(str(run.log.path))}</code> "
        f"({len(run.log.rows)} rows{parts})."
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``units-lightning report RUN [RUN ...] [--out DIR] [--label NAME ...]``."""
    parser = argparse.ArgumentParser(
        prog="units-lightning report",
        description="Draw a run's dashboard from its folder and logs (W&B offline run, CSV or TensorBoard) into one "
        "self-contained report.html with PNGs beside it; give several runs to compare them side by side.",
    )
    parser.add_argument(
        "runs", nargs="+", metavar="RUN", help="a run folder, a folder above one (runs/quickstart), or a log file"
    )
    parser.add_argument("--out", default=None, help="output folder (default: RUN/report; several runs: comparison/)")
    parser.add_argument("--label", action="append", default=None, help="a name per run, in order (default: setting)")
    args = parser.parse_args(argv)
    try:
        report = build_report(args.runs, args.out, labels=args.label)
    except (FileNotFoundError, ImportError, ValueError) as error:
        parser.exit(2, f"units-lightning report: error: {error}\n")
    for warning in report.warnings:
        print(f"units-lightning report: warning: {warning}", file=sys.stderr, flush=True)
    print(f"wrote {report.html} ({len(report.images)} PNGs beside it)")
    print(f"  open file://{report.html.resolve()}")
    if report.skipped:
        print(f"  not drawn ({len(report.skipped)}, listed at the end of the page): " + "; ".join(report.skipped))
