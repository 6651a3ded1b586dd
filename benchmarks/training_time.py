"""Training-time selection: labels saved at equal test accuracy, read from the label-budget tables.

Issue 31's first benchmark: the label-budget configs trained by every method (``benchmarks/paper_tables.py --methods
MAML Units-NTS Units-ML Margin ...``), each tested at the milestones of labeled query sets (2,000 / 4,000 / 8,000 /
10,000). A method's curve is its test accuracy against the labels spent, linear between milestones; the figure of
merit is the one of ``labeling_time.py``: **labels saved** = 1 - labels the method needs / labels the reference needs
to reach the reference's final accuracy, per seed, paired with the reference's run of the same seed; beside it the
paired difference of the curve areas (the mean accuracy over the labels spent). The reference is random selection
with the same loss (``Units-NTS``); ``--reference MAML`` compares with cross-entropy MAML on random tasks.

    python benchmarks/training_time.py runs/paper/tables/paper_tables.json [more.json ...] --reference Units-NTS

Several tables JSONs (one per call or root of ``paper_tables.py``) are read together, seed by seed: the seeds of a
(config, method) are gathered from all of them (seeds 0 and 1 from one sweep, seed 2 from a later one), and a seed
tested at a milestone in several tables is taken from the last (a table built with a wider ``--methods`` than its
call ran holds empty cells, which never replace results).

Beside the test figures, each method's best validation accuracy (the best of each run's validations, mean over its
seeds, from the tables' ``runs``): what a recommended config is chosen by. The method with the highest is named as the
validation choice; test accuracy never enters that choice.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the repository on sys.path, for ``benchmarks.*``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.labeling_time import curve_area, format_cell, labels_saved
from benchmarks.tables.statistics import mean_ci95


def seed_curves(cells: Mapping[str, Mapping[str, Any]]) -> tuple[list[float], dict[int, list[float]]]:
    """A method's (labels, {seed: accuracy at each label count}) from its cells of the budget table, keeping the
    seeds tested at every milestone."""
    labels = sorted(int(k) for k in cells)
    by_seed: dict[int, dict[int, float]] = {}
    for label in labels:
        cell = cells[str(label)]
        for seed, value in zip(cell["seeds"], cell["values"], strict=True):
            by_seed.setdefault(int(seed), {})[label] = float(value)
    complete = {s: [v[x] for x in labels] for s, v in by_seed.items() if len(v) == len(labels)}
    return [float(x) for x in labels], complete


def merge_budget_tables(tables: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{config: {method: cells}} of several ``paper_tables.json`` contents, merged seed by seed: a (milestone, seed)
    found in several tables is taken from the last; methods with no tested seed are left out."""
    values: dict[str, dict[str, dict[str, dict[int, float]]]] = {}
    for content in tables:
        for config, table in content.get("budget", {}).items():
            for method, cells in table.items():
                for label, cell in cells.items():
                    by_seed = values.setdefault(config, {}).setdefault(method, {}).setdefault(label, {})
                    by_seed.update(zip((int(s) for s in cell["seeds"]), cell["values"], strict=True))
    merged: dict[str, dict[str, dict[str, Any]]] = {}
    for config, methods in values.items():
        for method, cells in methods.items():
            if any(cells.values()):
                merged.setdefault(config, {})[method] = {
                    label: {"seeds": sorted(by_seed), "values": [by_seed[s] for s in sorted(by_seed)]}
                    for label, by_seed in cells.items()
                }
    return merged


def best_validation(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[int, float]]]:
    """{config: {method: {seed: best validation accuracy (%)}}} of the tables' runs (a later run of the same config,
    method and seed replaces an earlier one)."""
    found: dict[str, dict[str, dict[int, float]]] = {}
    for run in runs:
        best = run.get("best_val") or {}
        if best.get("value") is not None:
            by_method = found.setdefault(run["config"], {})
            by_method.setdefault(run["method"], {})[int(run["seed"])] = 100.0 * float(best["value"])
    return found


def compare(
    table: Mapping[str, Mapping[str, Any]], reference: str, validation: Mapping[str, Mapping[int, float]] | None = None
) -> dict[str, Any]:
    """Per method of one config's budget table: labels saved against ``reference`` and the paired area difference,
    mean and 95% interval over the seeds both finished; with ``validation`` ({method: {seed: best val acc}}), each
    method's mean best validation accuracy and the method with the highest (``validation_choice``)."""
    validation = validation or {}
    labels, ref = seed_curves(table[reference])
    rows = {}
    for method, cells in table.items():
        method_labels, curves = seed_curves(cells)
        if method_labels != labels or not curves:  # other milestones, or a method of the grid with no run yet
            continue
        seeds = sorted(set(curves) & set(ref))
        saved = [labels_saved(labels, curves[s], ref[s]) for s in seeds]
        reached = [x for x in saved if x is not None]
        areas = [curve_area(labels, curves[s]) - curve_area(labels, ref[s]) for s in seeds]
        rows[method] = {
            "seeds": seeds,
            "labels_saved": {**mean_ci95(reached), "reached": f"{len(reached)}/{len(saved)}", "values": saved},
            "area_minus_reference": {**mean_ci95(areas), "values": areas},
            "final": mean_ci95([curves[s][-1] for s in seeds]),
            "best_val": mean_ci95(list(validation.get(method, {}).values())),
        }
    chosen = [m for m in rows if rows[m]["best_val"]["mean"] is not None]
    choice = max(chosen, key=lambda m: rows[m]["best_val"]["mean"]) if chosen else None
    return {"labels": labels, "reference": reference, "methods": rows, "validation_choice": choice}


def markdown(config: str, result: Mapping[str, Any]) -> str:
    lines = [
        f"{config}: labels saved against {result['reference']} (to reach its final accuracy at "
        f"{int(result['labels'][-1]):,} labeled query sets), paired by seed",
        "",
        f"| method | labels saved (%) | reached | area - {result['reference']} (points) | final test acc (%) "
        "| best val acc (%) |",
        "|---|---|---|---|---|---|",
    ]
    for method, row in result["methods"].items():
        saved = row["labels_saved"]
        lines.append(
            f"| {method} | {format_cell(saved, 100.0, signed=True)} | {saved['reached']} "
            f"| {format_cell(row['area_minus_reference'], digits=2, signed=True)} "
            f"| {format_cell(row['final'], digits=2)} | {_validation_cell(row['best_val'])} |"
        )
    if result.get("validation_choice"):
        choice = result["validation_choice"]
        lines += ["", f"validation choice: {choice} ({result['methods'][choice]['best_val']['mean']:.2f}%)"]
    return "\n".join(lines)


def _validation_cell(summary: Mapping[str, Any]) -> str:
    if summary["mean"] is None:
        return ""
    return f"{summary['mean']:.2f} ({summary['n']} seed{'s' if summary['n'] != 1 else ''})"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", type=Path, nargs="+", help="paper_tables.json files of label-budget runs")
    parser.add_argument(
        "--reference", default="Units-NTS", help="the method whose labels are saved (default Units-NTS)"
    )
    parser.add_argument("--out", type=Path, default=None, help="the comparison as JSON")
    args = parser.parse_args(argv)
    loaded = [json.loads(path.read_text()) for path in args.tables]
    runs: list[Mapping[str, Any]] = [run for tables in loaded for run in tables.get("runs", [])]
    budget = merge_budget_tables(loaded)
    if not budget:
        parser.error(f"no label-budget table in {', '.join(map(str, args.tables))}")
    results = {}
    validation_runs = best_validation(runs)
    for config, table in budget.items():
        if args.reference not in table:
            print(f"{config}: no {args.reference} runs; skipped", file=sys.stderr)
            continue
        results[config] = compare(table, args.reference, validation_runs.get(config, {}))
        print(markdown(config, results[config]), end="\n\n")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
