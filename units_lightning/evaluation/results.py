"""The test results: ``results.json``, PNG plots and (with a W&B logger) W&B tables and images."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["format_results", "plot_shift", "plot_threshold_curve", "write_results"]

RESULTS_FILE = "results.json"
THRESHOLD_PLOT = "accuracy_vs_vacuity_threshold.png"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def plot_threshold_curve(results: Mapping[str, Any], path: Path) -> Path:
    """Accuracy and coverage of the queries below each vacuity threshold, with the overall accuracy for scale."""
    plt = _pyplot()
    curve = results["threshold_curve"]
    figure, axis = plt.subplots(figsize=(6, 4), dpi=120)
    axis.plot(curve["threshold"], [_nan(a) for a in curve["accuracy"]], "o-", label="accuracy (vacuity < threshold)")
    axis.plot(curve["threshold"], [_nan(c) for c in curve["coverage"]], "s--", label="coverage (fraction kept)")
    overall = results["accuracy"]["mean"]
    if overall is not None:
        axis.axhline(overall, color="grey", linestyle=":", label=f"overall accuracy {100 * overall:.1f}%")
    for row in results["vacuity_thresholds"]:
        axis.axvline(row["threshold"], color="lightgrey", linewidth=0.8)
    axis.set_xlabel("vacuity threshold")
    axis.set_ylabel("accuracy / coverage")
    axis.set_ylim(0, 1.02)
    axis.set_xlim(0, 1.0)
    axis.set_title(f"Accuracy vs vacuity threshold ({results['tasks']} tasks, {results['queries']} queries)")
    axis.legend(loc="lower right", fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def plot_shift(kind: str, rows: list[Mapping[str, Any]], path: Path) -> Path:
    """Accuracy (when defined) and mean vacuity of the query sets at each level of one shift (e.g. rotation)."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 4), dpi=120)
    numeric = all(isinstance(r["level"], (int, float)) for r in rows)
    positions = [r["level"] for r in rows] if numeric else list(range(len(rows)))
    handles = []
    if any(r["accuracy"] is not None for r in rows):
        accuracy = [_nan(r["accuracy"]["mean"]) if r["accuracy"] else math.nan for r in rows]
        accuracy_ci = [_nan(r["accuracy"]["ci95"]) if r["accuracy"] else math.nan for r in rows]
        handles.append(
            axis.errorbar(
                positions, accuracy, yerr=accuracy_ci, fmt="o-", color="tab:blue", capsize=3, label="accuracy"
            )
        )
        axis.set_ylabel("accuracy", color="tab:blue")
        axis.set_ylim(0, 1.02)
        vacuity_axis = axis.twinx()  # vacuity often moves within a narrow band: give it its own scale
    else:
        vacuity_axis = axis
    vacuity = [_nan(r["vacuity"]["mean"]) for r in rows]
    vacuity_ci = [_nan(r["vacuity"]["ci95"]) for r in rows]
    handles.append(
        vacuity_axis.errorbar(
            positions, vacuity, yerr=vacuity_ci, fmt="s--", color="tab:red", capsize=3, label="mean vacuity"
        )
    )
    vacuity_axis.set_ylabel("mean vacuity", color="tab:red")
    if not numeric:
        axis.set_xticks(positions, [str(r["level"]) for r in rows])
        axis.set_xlim(-0.5, len(rows) - 0.5)
    unit = {"rotation": "rotation of the query set (degrees)", "scale": "scale factor of the query set"}
    axis.set_xlabel(unit.get(kind, "query set"))
    axis.set_title(f"Shifted query sets: {kind} (95% CI over tasks)")
    axis.legend(handles=handles, loc="best", fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def format_results(results: Mapping[str, Any]) -> str:
    """A short human-readable summary of a test report."""
    accuracy = results["accuracy"]
    lines = [
        "units-lightning test report",
        f"  accuracy {_pct(accuracy['mean'])} +- {_pct(accuracy['ci95'])} (95% CI over {results['tasks']} tasks, "
        f"{results['queries']} queries)",
        "  beliefs  vacuity {} | dissonance {} | incorrect {} | correct {}".format(
            *(_num(results[k]["mean"]) for k in ("vacuity", "dissonance", "incorrect_belief", "correct_belief"))
        ),
    ]
    for row in results["vacuity_thresholds"]:
        lines.append(
            f"  vacuity < {row['threshold']:g}: accuracy {_pct(row['accuracy'])}, coverage {_pct(row['coverage'])}"
        )
    for name, ranked in (("vacuity", ""), ("max probability", "_max_probability")):
        rows = results.get(f"selective_accuracy{ranked}")
        if rows:
            selective = ", ".join(f"{100 * r['coverage']:.0f}% {_pct(r['accuracy'])}" for r in rows)
            lines.append(f"  most confident by {name}: {selective}; AURC {_num(results.get(f'aurc{ranked}'))}")
    lines.append(f"  ECE {_num(results['ece'])}")
    for kind, rows in results.get("ood", {}).items():
        parts = []
        for r in rows:
            accuracy_text = f" acc {_pct(r['accuracy']['mean'])}" if r["accuracy"] else ""
            parts.append(f"{r['level']}:{accuracy_text} vac {_num(r['vacuity']['mean'])} AUROC {_num(r['auroc'])}")
        lines.append(f"  {kind}: " + " | ".join(parts))
    return "\n".join(lines)


def write_results(results: dict[str, Any], directory: str | Path, wandb_run: Any | None = None) -> Path:
    """Write ``results.json`` and the plots into ``directory``; log tables and images to ``wandb_run`` if given.

    Args:
        results: ``UnitsMAML.test_results`` (plus anything to record, e.g. the task shape or checkpoints).
        directory: the run directory (created if needed).
        wandb_run: a ``wandb`` run (``WandbLogger.experiment``), or None.

    Returns:
        The path of ``results.json``. Its ``plots`` entry lists the PNG files written beside it.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    plots = {"vacuity_threshold": plot_threshold_curve(results, directory / THRESHOLD_PLOT)}
    for kind, rows in results.get("ood", {}).items():
        if not all(isinstance(r["level"], (int, float)) for r in rows):  # other datasets: show the clean queries too
            rows = [{"level": "test queries", "accuracy": None, "vacuity": results["vacuity"]}, *rows]
        plots[kind] = plot_shift(kind, rows, directory / f"ood_{kind}.png")
    results = {**results, "plots": {name: path.name for name, path in plots.items()}}
    path = directory / RESULTS_FILE
    path.write_text(json.dumps(results, indent=2) + "\n")
    if wandb_run is not None:
        _log_wandb(results, plots, wandb_run)
    return path


def _log_wandb(results: Mapping[str, Any], plots: Mapping[str, Path], run: Any) -> None:
    import wandb

    curve = results["threshold_curve"]
    payload: dict[str, Any] = {
        "test/threshold_curve": wandb.Table(
            columns=["threshold", "accuracy", "coverage"],
            data=[list(row) for row in zip(curve["threshold"], curve["accuracy"], curve["coverage"], strict=True)],
        ),
        "test/selective_accuracy": wandb.Table(
            columns=["coverage", "accuracy"],
            data=[[r["coverage"], r["accuracy"]] for r in results["selective_accuracy"]],
        ),
    }
    shift_rows = [
        [kind, str(r["level"]), r["accuracy"]["mean"] if r["accuracy"] else None, r["vacuity"]["mean"], r["auroc"]]
        for kind, rows in results.get("ood", {}).items()
        for r in rows
    ]
    if shift_rows:
        payload["test/ood"] = wandb.Table(columns=["shift", "level", "accuracy", "vacuity", "auroc"], data=shift_rows)
    for name, path in plots.items():
        payload[f"test/plots/{name}"] = wandb.Image(str(path))
    run.log(payload)
    run.summary.update(
        {
            "test/accuracy": results["accuracy"]["mean"],
            "test/accuracy_ci95": results["accuracy"]["ci95"],
            "test/aurc": results["aurc"],
            "test/aurc_max_probability": results.get("aurc_max_probability"),
            "test/ece": results["ece"],
        }
    )
