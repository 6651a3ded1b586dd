"""Draw the dashboard's charts (``charts.py``) from a run's logged rows with matplotlib."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from units_lightning.dashboard.charts import EPOCH, STEP, Chart
from units_lightning.dashboard.run_log import finite
from units_lightning.keys import LABEL_BUDGET_QUERY_SETS, threshold_from_key

__all__ = ["draw"]

_LINE_STYLES = ("-", "--", "-.", ":")
_X_LABEL = {STEP: "training step", EPOCH: "epoch (from 0)", LABEL_BUDGET_QUERY_SETS: "labeled query sets"}


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(7.0, 4.2), dpi=110)


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


def _finish(chart: Chart, axes: Any, x_label: str) -> None:
    axes.set_title(chart.title, fontsize=10)
    axes.set_xlabel(x_label)
    axes.set_ylabel(chart.y_label)
    if chart.y_range != (None, None):
        axes.set_ylim(*chart.y_range)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    axes.figure.tight_layout()


def _lines(chart: Chart, rows: Sequence[dict[str, Any]], series: list[str]) -> Any | None:
    figure, axes = _figure()
    drawn = 0
    for index, key in enumerate(series):
        points = [(row[chart.x], row[key]) for row in rows if finite(row.get(chart.x)) and finite(row.get(key))]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        axes.plot(
            xs,
            ys,
            marker="os^Dv"[index % 5] if len(points) <= 30 else None,
            markersize=6 - index % 3,  # series that coincide (train and val at 1.0) stay visible
            linestyle=_LINE_STYLES[index % len(_LINE_STYLES)],
            label=key,
        )
        drawn += 1
    if not drawn:
        import matplotlib.pyplot as plt

        plt.close(figure)
        return None
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, epochs and label counts are whole numbers
    _finish(chart, axes, _X_LABEL.get(chart.x, chart.x))
    return figure


def _threshold_curve(chart: Chart, rows: Sequence[dict[str, Any]], series: list[str]) -> Any | None:
    import matplotlib.pyplot as plt

    thresholds = [threshold_from_key(key) for key in series]
    curves = [row for row in rows if any(key in row for key in series)]
    if not curves:
        return None
    figure, axes = _figure()
    colours = plt.get_cmap("viridis")
    for index, row in enumerate(curves):
        points = [(t, row[key]) for t, key in zip(thresholds, series, strict=True) if finite(row.get(key))]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        when = f"epoch {int(row['epoch'])}" if finite(row.get("epoch")) else f"validation {index + 1}"
        if finite(row.get("step")):
            when += f", step {int(row['step'])}"
        latest = index == len(curves) - 1
        axes.plot(
            xs,
            ys,
            marker="o",
            markersize=3,
            color=colours(index / max(1, len(curves) - 1)),
            linewidth=2.2 if latest else 1.0,
            label=when if latest or index == 0 or len(curves) <= 8 else None,
        )
    axes.set_xlim(0.0, 1.02)  # thresholds that keep no query leave a visible gap on the left
    _finish(chart, axes, "vacuity threshold t (queries with vacuity < t)")
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
    axes.bar(edges[:-1], counts, width=widths, align="edge", alpha=0.8, label=f"{key} (latest)")
    when = f"epoch {int(row['epoch'])}" if finite(row.get("epoch")) else f"step {row.get('step', '?')}"
    chart_title = Chart(chart.section, f"{chart.title}, {when}", chart.y, y_label="query sets")
    _finish(chart_title, axes, "task uncertainty")
    return figure
