"""Draw the dashboard's charts (``charts.py``) and a run's test results with matplotlib.

``draw`` draws one chart from one run's rows; ``draw_compared`` draws one logged series of a chart for several
runs on one axis; ``threshold_curves``, ``selective_accuracy`` and ``shift_probes`` draw ``results.json`` (one line
per run). Legends use the words of ``charts.series_label``, not the logged keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from units_lightning.dashboard.charts import EPOCH, STEP, Chart, series_label
from units_lightning.dashboard.run_log import finite
from units_lightning.keys import LABEL_BUDGET_QUERY_SETS, threshold_from_key

__all__ = ["draw", "draw_compared", "selective_accuracy", "shift_probes", "threshold_curves"]

_LINE_STYLES = ("-", "--", "-.", ":")
_MARKERS = "os^Dv"
_X_LABEL = {STEP: "training step", EPOCH: "epoch (from 0)", LABEL_BUDGET_QUERY_SETS: "labeled query sets"}
_FONT = 9  # legend and tick labels: readable in a grid cell about 460 px wide


def _figure(width: float = 6.4, height: float = 4.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(width, height), dpi=110)
    axes.tick_params(labelsize=_FONT)
    return figure, axes


def _colours(count: int) -> list[Any]:
    from matplotlib import colormaps  # no pyplot: callers may ask before _figure has chosen the Agg backend

    palette = colormaps["tab10"]
    return [palette(i % 10) for i in range(count)]


def _legend(axes: Any, entries: int) -> None:
    """Inside the axes for a few entries; below them, in columns, for many (so no line is hidden)."""
    if entries == 0:
        return
    if entries <= 4:
        axes.legend(fontsize=_FONT, loc="best", framealpha=0.85)
        return
    labels = axes.get_legend_handles_labels()[1]
    columns = 3 if max(len(label) for label in labels) <= 20 else 2
    axes.legend(fontsize=_FONT - 1, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(columns, entries))


def _finish(axes: Any, title: str, x_label: str, y_label: str, y_range: tuple, entries: int) -> None:
    axes.set_title(title, fontsize=10)
    axes.set_xlabel(x_label, fontsize=_FONT)
    axes.set_ylabel(y_label, fontsize=_FONT)
    if y_range != (None, None):
        axes.set_ylim(*y_range)
    axes.grid(alpha=0.3)
    _legend(axes, entries)
    axes.figure.tight_layout()


def _close(figure: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(figure)


def _points(rows: Sequence[dict[str, Any]], x: str, key: str) -> list[tuple[float, float]]:
    return [(row[x], row[key]) for row in rows if finite(row.get(x)) and finite(row.get(key))]


def draw(chart: Chart, rows: Sequence[dict[str, Any]]) -> Any | None:
    """One chart as a matplotlib figure, or ``None`` when the rows hold nothing it can draw.

    ``"histogram"`` charts need W&B histograms (the quantile chart shows the same values for other loggers).
    """
    keys = set().union(*rows) if rows else set()
    if chart.kind == "histogram":
        return _histogram(chart, rows)
    series = chart.matching(keys)
    if not series:
        return None
    if chart.kind == "threshold_curve":
        return _threshold_curve(chart, rows, series)
    return _lines(chart, rows, series)


def _lines(chart: Chart, rows: Sequence[dict[str, Any]], series: list[str]) -> Any | None:
    lines = [
        # markersize: series that coincide (train and val at 1.0) stay visible
        (_points(rows, chart.x, key), {"markersize": 6 - index % 3, "label": series_label(key)})
        for index, key in enumerate(series)
    ]
    return _line_chart(chart, chart.title, lines)


def _line_chart(chart: Chart, title: str, lines: Sequence[tuple[list, dict[str, Any]]]) -> Any | None:
    """One line per ``(points, style)`` that has points, against the chart's x axis; None where none has any.

    The i-th line gets the i-th marker (when it has at most 30 points) and line style, counting empty ones too.
    """
    figure, axes = _figure()
    drawn = 0
    for index, (points, style) in enumerate(lines):
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        axes.plot(
            xs,
            ys,
            marker=_MARKERS[index % 5] if len(points) <= 30 else None,
            linestyle=_LINE_STYLES[index % len(_LINE_STYLES)],
            **style,
        )
        drawn += 1
    if not drawn:
        _close(figure)
        return None
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, epochs and label counts are whole numbers
    _finish(axes, title, _X_LABEL.get(chart.x, chart.x), chart.y_label, chart.y_range, drawn)
    return figure


def draw_compared(chart: Chart, key: str, runs: Sequence[tuple[str, Sequence[dict[str, Any]]]]) -> Any | None:
    """One logged series of ``chart`` for several runs on one axis (a line per run), or None where no run has it.

    Args:
        chart: the chart the series belongs to (its x axis, y label and range).
        key: the logged key drawn.
        runs: ``(label, rows)`` of each run.
    """
    lines = [
        (_points(rows, chart.x, key), {"color": colour, "markersize": 5, "label": label})
        for (label, rows), colour in zip(runs, _colours(len(runs)), strict=True)
    ]
    return _line_chart(chart, f"{series_label(key)[:1].upper()}{series_label(key)[1:]}", lines)


def _threshold_curve(chart: Chart, rows: Sequence[dict[str, Any]], series: list[str]) -> Any | None:
    import matplotlib.pyplot as plt

    thresholds = [threshold_from_key(key) for key in series]
    curves = [row for row in rows if any(key in row for key in series)]
    if not curves:
        return None
    figure, axes = _figure()
    colours = plt.get_cmap("viridis")
    labeled = 0
    for index, row in enumerate(curves):
        points = [(t, row[key]) for t, key in zip(thresholds, series, strict=True) if finite(row.get(key))]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        when = f"epoch {int(row['epoch'])}" if finite(row.get("epoch")) else f"validation {index + 1}"
        if finite(row.get("step")):
            when += f", step {int(row['step'])}"
        latest = index == len(curves) - 1
        shown = latest or index == 0 or len(curves) <= 6
        labeled += shown
        axes.plot(
            xs,
            ys,
            marker="o",
            markersize=3,
            color=colours(index / max(1, len(curves) - 1)),
            linewidth=2.2 if latest else 1.0,
            label=when if shown else None,
        )
    axes.set_xlim(0.0, 1.02)  # thresholds that keep no query leave a visible gap on the left
    _finish(axes, chart.title, "vacuity threshold t (queries with vacuity < t)", chart.y_label, chart.y_range, labeled)
    return figure


def _histogram(chart: Chart, rows: Sequence[dict[str, Any]]) -> Any | None:
    (key,) = chart.y
    latest = [row for row in rows if f"{key}/values" in row and f"{key}/bins" in row]
    if not latest:
        return None
    row = latest[-1]
    counts, edges = row[f"{key}/values"], row[f"{key}/bins"]
    figure, axes = _figure()
    widths = [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]
    when = f"epoch {int(row['epoch'])}" if finite(row.get("epoch")) else f"step {row.get('step', '?')}"
    axes.bar(edges[:-1], counts, width=widths, align="edge", alpha=0.8, label=f"latest ({when})")
    _finish(axes, f"{chart.title}, {when}", "task uncertainty", "query sets", (None, None), 1)
    return figure


# --- test results (results.json) ------------------------------------------------------------------------------


def _nan(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def threshold_curves(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> Any | None:
    """Test accuracy (solid) and coverage (dashed) of the queries with vacuity below each threshold, per run."""
    runs = [(label, results) for label, results in runs if results.get("threshold_curve")]
    if not runs:
        return None
    figure, axes = _figure()
    for (label, results), colour in zip(runs, _colours(len(runs)), strict=True):
        curve = results["threshold_curve"]
        prefix = f"{label}: " if len(runs) > 1 else ""
        for field, style, name in (("accuracy", "o-", "accuracy"), ("coverage", "s--", "coverage (fraction kept)")):
            values = [_nan(v) for v in curve[field]]
            axes.plot(curve["threshold"], values, style, color=colour, markersize=3, label=f"{prefix}{name}")
    axes.set_xlim(0.0, 1.02)
    title = "Test accuracy and coverage vs vacuity threshold"
    _finish(
        axes, title, "vacuity threshold t (queries with vacuity < t)", "accuracy / coverage", (0, 1.02), 2 * len(runs)
    )
    return figure


def selective_accuracy(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> Any | None:
    """Test accuracy of the most confident queries (lowest vacuity) against the fraction kept, per run."""
    runs = [(label, results) for label, results in runs if results.get("selective_accuracy")]
    if not runs:
        return None
    figure, axes = _figure()
    for index, ((label, results), colour) in enumerate(zip(runs, _colours(len(runs)), strict=True)):
        rows = sorted(results["selective_accuracy"], key=lambda r: r["coverage"])
        axes.plot(
            [r["coverage"] for r in rows],
            [_nan(r["accuracy"]) for r in rows],
            marker=_MARKERS[index % 5],
            linestyle=_LINE_STYLES[index % 4],
            color=colour,
            label=label,
        )
    _finish(
        axes,
        "Selective accuracy: the most confident queries",
        "fraction of queries kept (lowest vacuity first)",
        "accuracy",
        (None, None),  # the differences sit within a few points: no fixed 0..1 range
        len(runs),
    )
    return figure


def shift_probes(kind: str, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> Any | None:
    """Accuracy (left) and mean vacuity (right) of the query sets at each level of one shift, per run."""
    runs = [(label, results) for label, results in runs if (results.get("ood") or {}).get(kind)]
    if not runs:
        return None
    import matplotlib.pyplot as plt

    figure, (accuracy_axes, vacuity_axes) = plt.subplots(1, 2, figsize=(8.0, 3.8), dpi=110)
    for axes in (accuracy_axes, vacuity_axes):
        axes.tick_params(labelsize=_FONT)
    for index, ((label, results), colour) in enumerate(zip(runs, _colours(len(runs)), strict=True)):
        rows = results["ood"][kind]
        numeric = all(isinstance(r["level"], int | float) for r in rows)
        xs = [r["level"] for r in rows] if numeric else list(range(len(rows)))
        style = dict(color=colour, marker=_MARKERS[index % 5], linestyle=_LINE_STYLES[index % 4], label=label)
        if any(r.get("accuracy") for r in rows):
            accuracy = [_nan((r.get("accuracy") or {}).get("mean")) for r in rows]
            accuracy_axes.plot(xs, accuracy, **style)
        vacuity_axes.plot(xs, [_nan((r.get("vacuity") or {}).get("mean")) for r in rows], **style)
        if not numeric:
            for axes in (accuracy_axes, vacuity_axes):
                axes.set_xticks(xs, [str(r["level"]) for r in rows], fontsize=_FONT)
    for axes, name in ((accuracy_axes, "accuracy"), (vacuity_axes, "mean vacuity")):
        axes.set_title(f"{kind}: {name}", fontsize=10)
        axes.set_xlabel({"rotation": "rotation (degrees)", "scale": "scale (factor)"}.get(kind, kind), fontsize=_FONT)
        axes.grid(alpha=0.3)
    accuracy_axes.set_ylim(0, 1.02)
    _legend(vacuity_axes, len(runs))
    figure.tight_layout()
    return figure
