"""The tables of the finished runs: every seed's test accuracy, mean and 95% confidence interval beside the paper's
numbers, Units-ML, Units-NTS and MAML against each other paired by seed, each run's record; as JSON, Markdown and
plots."""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.tables.folders import DONE, RECORD, now, read_json, read_results, write_json
from benchmarks.tables.grid import ConfigInfo, Run, Target, authors_query_shots, shown, targets_of
from benchmarks.tables.metrics import best_validation, run_metrics
from benchmarks.tables.reference import (
    BUDGET_POINTS,
    NOT_COMPARABLE,
    PAPER_BUDGET,
    PAPER_SOURCE,
    PAPER_STANDARD,
    VACUITY_THRESHOLDS,
)
from benchmarks.tables.statistics import paired_difference, summary


def _percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def collect(runs: Sequence[Run]) -> dict[str, Any]:
    """The numbers of every finished run (``done.json``) as tables: ``budget`` and ``standard``, each
    ``{config: {method: ...}}`` with every seed's value, mean, 95% CI and n, beside the paper's;
    ``budget_error_ranking``, how well each budget run knows its errors at the full budget (``ERROR_RANKING``); and
    ``runs``, the record of every finished run (commands, commit, device, wall time)."""
    budget: dict[str, dict[str, Any]] = {}
    budget_errors: dict[str, dict[str, Any]] = {}
    standard: dict[str, dict[str, Any]] = {}
    records = []
    finished = [r for r in runs if (r.folder / DONE).is_file()]
    for run in finished:
        record = read_json(run.folder / RECORD) or {}
        segments = (record.get("fit") or {}).get("segments", [])
        records.append(
            {
                "config": run.config.name,
                "method": run.method,
                "seed": run.seed,
                "folder": shown(run.folder),
                "fit_wall_s": round(sum(s.get("wall_s", 0.0) for s in segments), 2),
                "fit_segments": len(segments),
                "fit_command": segments[-1]["command"] if segments else None,
                "test_wall_s": round(sum(t.get("wall_s", 0.0) for t in record.get("tests", {}).values()), 2),
                "commits": sorted({s.get("commit") or "unknown" for s in segments}),
                "devices": sorted({s.get("device") or "unknown" for s in segments}),
                "best_val": best_validation(run_metrics(run.folder)),
            }
        )
    for config in {r.config.name: r.config for r in runs}.values():
        done = [r for r in finished if r.config.name == config.name]
        for method in dict.fromkeys(r.method for r in runs if r.config.name == config.name):
            mine = sorted((r for r in done if r.method == method), key=lambda r: r.seed)
            if config.kind == "budget":
                row, budget_errors.setdefault(config.name, {})[method] = _budget_row(config, method, mine)
                budget.setdefault(config.name, {})[method] = row
            else:
                standard.setdefault(config.name, {})[method] = _standard_row(config, method, mine)
    return {
        "source": PAPER_SOURCE,
        "budget": budget,
        "budget_error_ranking": budget_errors,
        "standard": standard,
        "paired": paired_rows(budget, standard),
        "runs": records,
    }


PAIRS = (("Units-ML", "Units-NTS"), ("Units-ML", "MAML"), ("Units-NTS", "MAML"))
"""The pairs compared seed by seed, each the first method minus the second: the paper's question first, then each
evidential method against plain MAML (cross-entropy on random tasks, the same network)."""


def pair_label(pair: tuple[str, str]) -> str:
    return f"{pair[0]} - {pair[1]}"


def ran_pairs(methods: Mapping[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    """``(pair label, the first method's row, the second's)`` for each of ``PAIRS`` whose two methods are in
    ``methods``."""
    for first, second in PAIRS:
        if first in methods and second in methods:
            yield pair_label((first, second)), methods[first], methods[second]


def paired_rows(budget: Mapping[str, Any], standard: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{config: {pair label: difference}}`` for each of ``PAIRS`` whose two methods ran: per budget point, or of the
    standard accuracy (``{"accuracy": difference}``)."""
    rows: dict[str, dict[str, Any]] = {}
    for config, methods in budget.items():
        for label, ours, theirs in ran_pairs(methods):
            rows.setdefault(config, {})[label] = {p: paired_difference(ours[p], theirs[p]) for p in ours}
    for config, methods in standard.items():
        for label, ours, theirs in ran_pairs(methods):
            rows.setdefault(config, {})[label] = {"accuracy": paired_difference(ours["accuracy"], theirs["accuracy"])}
    return rows


def _budget_row(config: ConfigInfo, method: str, runs: Sequence[Run]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The test accuracy at each milestone, ``{milestone: summary}``; and how well the runs know their errors at the
    full budget, the last milestone: ``{"labels", "error_ranking"}``."""
    paper = PAPER_BUDGET.get(config.name, {}).get(method)
    targets, row, results = targets_of(config), {}, []
    for target in targets:
        paper_value = (
            paper[BUDGET_POINTS.index(target.milestone)] if paper and target.milestone in BUDGET_POINTS else None
        )
        row[str(target.milestone)], results = _accuracy(runs, target, paper_value)
    return row, {"labels": targets[-1].milestone, "error_ranking": _error_ranking(results)}


def _threshold_row(results: Mapping[str, Any], threshold: float) -> Mapping[str, Any] | None:
    for row in results.get("vacuity_thresholds", []):
        if math.isclose(row["threshold"], threshold):
            return row
    return None


def _accuracy(runs: Sequence[Run], target: Target, paper: float | None) -> tuple[dict[str, Any], list]:
    """The summary of ``target``'s test accuracy over ``runs``, and the ``(seed, results)`` it came from."""
    results = [(r.seed, read_results(r, target)) for r in runs]
    results = [(seed, res) for seed, res in results if res]
    accuracy = [(seed, _percent(res["accuracy"]["mean"])) for seed, res in results]
    return summary([v for _, v in accuracy], [s for s, _ in accuracy], paper), results


ERROR_RANKING = {
    "selective_50_vacuity": ("selective_accuracy", 0.5),
    "selective_50_max_probability": ("selective_accuracy_max_probability", 0.5),
    "aurc_vacuity": ("aurc", None),
    "aurc_max_probability": ("aurc_max_probability", None),
    "ece": ("ece", None),
}
"""How well a method knows its errors, from each ``results.json``: accuracy of the half of the queries it is surest
of (ranked by vacuity, or by the largest expected probability), the area under the risk-coverage curve by each
ranking, and the calibration error; all in percent."""


def _error_ranking(results: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """``ERROR_RANKING``'s summaries over the seeds whose results hold them (older results lack the second ranking)."""
    rows = {}
    for name, (key, coverage) in ERROR_RANKING.items():
        found = []
        for seed, res in results:
            value = res.get(key)
            if coverage is not None:
                value = next((r["accuracy"] for r in value or () if math.isclose(r["coverage"], coverage)), None)
            if value is not None:
                found.append((seed, _percent(value)))
        rows[name] = summary([v for _, v in found], [s for s, _ in found], None)
    return rows


def _standard_row(config: ConfigInfo, method: str, runs: Sequence[Run]) -> dict[str, Any]:
    paper = PAPER_STANDARD.get(config.name, {})
    target, *authors = targets_of(config)
    accuracy, results = _accuracy(runs, target, paper.get(method))
    row = {"accuracy": accuracy}
    if authors:  # the same ensembles tested with the authors' query count (grid.authors_query_shots)
        row["authors_protocol"] = {
            "query_shots": authors_query_shots(config),
            "accuracy": _accuracy(runs, authors[0], paper.get(method))[0],
        }
    for threshold in VACUITY_THRESHOLDS:
        kept = [(seed, _threshold_row(res, threshold)) for seed, res in results]
        kept = [(seed, t) for seed, t in kept if t is not None and t["accuracy"] is not None]
        paper_value = paper.get(f"vacuity<{threshold}") if method == "Units-ML" else None
        row[f"vacuity<{threshold}"] = {
            "accuracy": summary([_percent(t["accuracy"]) for _, t in kept], [s for s, _ in kept], paper_value),
            "coverage": summary([_percent(t["coverage"]) for _, t in kept], [s for s, _ in kept], None),
        }
    row["error_ranking"] = _error_ranking(results)
    return row


def cell(summary: Mapping[str, Any], digits: int = 2, signed: bool = False) -> str:
    """``mean +- ci (n)`` of one summary; an empty cell where no run is finished; ``signed`` for a difference.

    Example:
        >>> cell({"mean": 95.123, "ci95": 0.456, "n": 3}), cell({"mean": 95.1, "ci95": None, "n": 1})
        ('95.12 ± 0.46 (3)', '95.10 (1)')
        >>> cell({"mean": 0.714, "ci95": 0.46, "n": 3}, signed=True)
        '+0.71 ± 0.46 (3)'
    """
    if not summary.get("n"):
        return ""
    ci = f" ± {summary['ci95']:.{digits}f}" if summary.get("ci95") is not None else ""
    sign = "+" if signed else ""
    return f"{summary['mean']:{sign}.{digits}f}{ci} ({summary['n']})"


def _paper(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _data_roots(records: Sequence[Mapping[str, Any]], config: str) -> list[str]:
    roots = {
        a.split("=", 1)[1]
        for r in records
        if r["config"] == config
        for a in r["fit_command"] or []
        if a.startswith("--data.root=")
    }
    return sorted(roots)


def _config_note(config: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
    notes = [text for prefix, text in NOT_COMPARABLE.items() if config.startswith(prefix)]
    if not notes:
        return []
    roots = ", ".join(_data_roots(records, config)) or "the config's own data.root"
    return [f"Note ({config}): {notes[0]}. Data of these runs: {roots}."]


def _short_commit(commit: str) -> str:
    sha, plus, rest = commit.partition("+")
    return sha[:12] + plus + rest


def _runs_table(records: Sequence[Mapping[str, Any]], config: str) -> list[str]:
    """Per finished run: fit wall time (all segments), its best validation accuracy over every segment's metrics
    (runs before ``keep_metrics``: over the last segment's only), device and commit; then one fit command per
    method."""
    mine = [r for r in records if r["config"] == config]
    if not mine:
        return []
    lines = [
        "| Method | Seed | Fit wall time | Fit segments | Best val/acc (step; validations logged) | Device | Commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in mine:
        best = r.get("best_val")
        shown_best = f"{100 * best['value']:.2f}% ({best['step']:,}; {best['validations']})" if best else ""
        lines.append(
            f"| {r['method']} | {r['seed']} | {r['fit_wall_s'] / 60:.1f} min | {r['fit_segments']} | {shown_best} | "
            f"{', '.join(r['devices'])} | {', '.join(_short_commit(c) for c in r['commits'])} |"
        )
    first: dict[str, Mapping[str, Any]] = {}
    for r in mine:
        first.setdefault(r["method"], r)
    commands = [shlex.join(["units-lightning", *r["fit_command"][3:]]) for r in first.values() if r["fit_command"]]
    explained = (
        "Fit commands, one per method (seed k: `--seed_everything=k --data.seed=k`; the "
        "`paper_tables.CheckpointOnSigterm` of older commands is the `CheckpointOnSigterm` that every fit now has):"
    )
    return [*lines, "", explained, "", "```", *commands, "```"]


def _threshold_cell(kept: Mapping[str, Any] | None) -> str:
    if not kept or not kept["accuracy"]["n"]:
        return ""
    return f"{cell(kept['accuracy'])}, {kept['coverage']['mean']:.1f}% kept"


def markdown(tables: Mapping[str, Any], plots: Mapping[str, str]) -> str:
    """The tables as Markdown: one per label-budget config, one for the standard setting, each with its runs."""
    lines = [
        "# Paper tables",
        "",
        "Test accuracy (%) on each config's seeded test tasks: mean ± 95% confidence interval over seeds (Student t, "
        "n - 1 degrees of freedom), the number of seeds in brackets; an empty cell has no finished run. "
        f"Paper: {tables['source']}.",
    ]
    if tables.get("paired"):
        lines += [
            "",
            "A - B, paired by seed: method A's test accuracy minus method B's, seed by seed (both methods of a seed "
            "start from the same weights, their episode streams from the same seed), in points: mean ± 95% CI over "
            "the seeds both finished.",
        ]
    if tables.get("extra"):
        overrides = " ".join(f"`{o}`" for o in tables["extra"])
        lines += ["", f"Every run with the overrides {overrides}: not the configs' protocol, not the paper's."]
    for config, methods in tables["budget"].items():
        points = list(next(iter(methods.values())))
        lines += ["", f"## Label budget: {config}", ""]
        lines.append("| Method | " + " | ".join(f"{int(p):,} labeled query sets" for p in points) + " |")
        lines.append("|---|" + "---|" * len(points))
        for method, row in methods.items():
            lines.append(f"| {method} | " + " | ".join(cell(row[p]) for p in points) + " |")
            lines.append(f"| {method}, paper | " + " | ".join(_paper(row[p]["paper"]) for p in points) + " |")
        for label, paired in tables.get("paired", {}).get(config, {}).items():
            lines.append(
                f"| {label}, paired by seed | " + " | ".join(cell(paired[p], signed=True) for p in points) + " |"
            )
        errors = tables.get("budget_error_ranking", {}).get(config, {})
        labels = next((e["labels"] for e in errors.values()), None)
        lines += _error_ranking_table({config: errors}, f"at {labels:,} labeled query sets" if labels else "")
        if config in plots:
            lines += ["", f"![{config}]({plots[config]})"]
        for extra in (_config_note(config, tables["runs"]), _runs_table(tables["runs"], config)):
            if extra:
                lines += ["", *extra]
    if tables["standard"]:
        methods = list(dict.fromkeys(m for row in tables["standard"].values() for m in row))
        thresholds = VACUITY_THRESHOLDS if "Units-ML" in methods else ()
        header = [*methods, *(f"Units-ML, vacuity < {t}" for t in thresholds)]
        lines += ["", "## Standard setting", ""]
        lines.append(
            "Each run tested as the ensemble of its top-k validation checkpoints (k = the config's save_top_k of "
            "val/acc); the vacuity columns: accuracy on the test queries of vacuity below the threshold, and the "
            'share of queries kept (mean over seeds). A row "N queries a class (the authors\' test)" tests the same '
            "ensembles with the query count of the authors' code, whose numbers the paper reports: batch norm uses "
            "the statistics of the test batch, so the count changes the accuracy."
        )
        lines += ["", "| Config | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
        for config, row in tables["standard"].items():
            ours = [cell(row[m]["accuracy"]) if m in row else "" for m in methods]
            paper = [_paper(row[m]["accuracy"]["paper"]) if m in row else "" for m in methods]
            for threshold in thresholds:
                kept = row.get("Units-ML", {}).get(f"vacuity<{threshold}")
                ours.append(_threshold_cell(kept))
                paper.append(_paper(kept["accuracy"]["paper"]) if kept else "")
            lines.append(f"| {config} | " + " | ".join(ours) + " |")
            authors = [row[m].get("authors_protocol") if m in row else None for m in methods]
            if any(a and a["accuracy"]["n"] for a in authors):
                shots = next(a["query_shots"] for a in authors if a)
                cells = [cell(a["accuracy"]) if a else "" for a in authors] + [""] * len(thresholds)
                lines.append(f"| {config}, {shots} queries a class (the authors' test) | " + " | ".join(cells) + " |")
            lines.append(f"| {config}, paper | " + " | ".join(paper) + " |")
        for label in map(pair_label, PAIRS):
            paired = [
                (c, pairs[label]["accuracy"])
                for c, pairs in tables.get("paired", {}).items()
                if c in tables["standard"] and label in pairs
            ]
            if paired:
                lines += [
                    "",
                    f"{label}, paired by seed: " + "; ".join(f"{c} {cell(d, signed=True)}" for c, d in paired) + ".",
                ]
        lines += _error_ranking_table(tables["standard"], "")
        for config in tables["standard"]:
            note = _config_note(config, tables["runs"])
            if note:
                lines += ["", *note]
        for config in tables["standard"]:
            runs = _runs_table(tables["runs"], config)
            if runs:
                lines += ["", f"### Runs: {config}", "", *runs]
    return "\n".join(lines) + "\n"


def _error_ranking_table(rows_of: Mapping[str, Mapping[str, Any]], where: str) -> list[str]:
    """``{config: {method: {"error_ranking": ...}}}`` as a Markdown table, one row per (config, method) and one per
    pair of ``PAIRS`` that both ran (paired by seed), headed "How well each method knows its errors" and ``where``; none
    without a finished test."""
    rows = []
    for config, methods in rows_of.items():
        ranked = {
            m: row["error_ranking"]
            for m, row in methods.items()
            if any(s.get("n") for s in row.get("error_ranking", {}).values())
        }
        rows += [
            f"| {config} | {m} | " + " | ".join(cell(r[name]) for name in ERROR_RANKING) + " |"
            for m, r in ranked.items()
        ]
        for label, ours, theirs in ran_pairs(ranked):
            differences = [paired_difference(ours[name], theirs[name]) for name in ERROR_RANKING]
            if any(d["n"] for d in differences):
                cells = " | ".join(cell(d, signed=True) for d in differences)
                rows.append(f"| {config} | {label}, paired by seed | {cells} |")
    if not rows:
        return []
    return [
        "",
        f"### How well each method knows its errors {where}".rstrip(),
        "",
        "The same tests, in percent: accuracy of the half of the test queries each model is surest of, ranked by "
        "vacuity (the paper's score) or by the largest expected probability (the baseline any classifier has; for "
        "MAML, trained with cross-entropy, vacuity only measures total evidence); the area under the risk-coverage "
        "curve (AURC, lower is better) by each ranking; the expected calibration error (ECE) of the expected "
        'probabilities. Results written before the second ranking existed leave its cells empty. A row "A - B, paired '
        "by seed\": A's value minus B's, seed by seed, over the seeds both have.",
        "",
        "| Config | Method | 50% surest, by vacuity | 50% surest, by max probability | AURC, by vacuity "
        "| AURC, by max probability | ECE |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]


def plot_budget(config: str, methods: Mapping[str, Mapping[str, Any]], path: Path) -> Path | None:
    """Test accuracy against labeled query sets, one line and 95% band per method, the paper's as open markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    drawn = 0
    for index, (method, row) in enumerate(methods.items()):
        colour = f"C{index}"
        points = [(int(p), s) for p, s in row.items() if s["n"]]
        if points:
            x = [p for p, _ in points]
            mean = [s["mean"] for _, s in points]
            axes.plot(x, mean, "o-", color=colour, label=f"{method} (n = {max(s['n'] for _, s in points)})")
            half = [s["ci95"] if s["ci95"] is not None else 0.0 for _, s in points]
            low = [m - h for m, h in zip(mean, half, strict=True)]
            high = [m + h for m, h in zip(mean, half, strict=True)]
            axes.fill_between(x, low, high, color=colour, alpha=0.2)
            drawn += 1
        paper = [(int(p), s["paper"]) for p, s in row.items() if s["paper"] is not None]
        if paper:
            axes.plot(
                *zip(*paper, strict=True),
                "o--",
                color=colour,
                markerfacecolor="none",
                alpha=0.7,
                label=f"{method}, paper",
            )
    if not drawn:
        plt.close(figure)
        return None
    axes.set_xticks(sorted({int(p) for row in methods.values() for p in row}))
    axes.set_xlabel("labeled query sets")
    axes.set_ylabel("test accuracy (%)")
    axes.set_title(f"{config}: mean and 95% CI over seeds", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def write_tables(runs: Sequence[Run], folder: Path, extra: Sequence[str] = ()) -> dict[str, Path]:
    """Write ``paper_tables.json``, ``paper_tables.md`` and one plot per label-budget config into ``folder``.

    ``extra``: the ``--extra`` overrides of the runs, named above the tables (a shortened protocol).
    """
    tables = {**collect(runs), "extra": list(extra)}
    plots = {}
    for config, methods in tables["budget"].items():
        path = plot_budget(config, methods, folder / f"{config}.png")
        if path is not None:
            plots[config] = path.name
    written = {"json": folder / "paper_tables.json", "markdown": folder / "paper_tables.md"}
    write_json(written["json"], {**tables, "plots": plots, "written": now()})
    written["markdown"].write_text(markdown(tables, plots))
    return {**written, **{config: folder / name for config, name in plots.items()}}
