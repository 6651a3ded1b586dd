"""Draw the dashboard's charts (``charts.py``) and a run's test results with matplotlib.

``draw`` draws one chart from one run's rows; ``draw_compared`` draws one logged series of a chart for several
runs on one axis; ``draw_histograms`` draws a section's histograms (chosen and rejected query sets) on shared bins
and one y-scale; ``threshold_curves``, ``selective_accuracy`` and ``shift_probes`` draw ``results.json`` (one line
per run). Legends use the words of ``charts.series_label``, not the logged keys.

Every figure has the same size and fonts, so that the page's grid shows them alike. Accuracy and coverage are drawn
in % (as the report's tables give them), and every accuracy plot of N-way tasks has a dashed chance line at 100 / N.
Lines that coincide (two runs with the same labels spent, query and support images of one-shot tasks) stay
visible: the first becomes a wide pale band, the next a thin line with open markers on it, and the legend says
which it is the same as.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from units_lightning.dashboard.charts import EPOCH, STEP, Chart, series_label
from units_lightning.dashboard.run_log import finite, validated_step
from units_lightning.keys import LABEL_BUDGET_QUERY_SETS, threshold_from_key

__all__ = [
    "FIGURE_SIZE",
    "chance_line",
    "draw",
    "draw_compared",
    "draw_histograms",
    "rebin",
    "selective_accuracy",
    "shift_probes",
    "threshold_curves",
]

_LINE_STYLES = ("-", "--", "-.", ":")
_MARKERS = "os^Dv"
_X_LABEL = {STEP: "training step", EPOCH: "epoch (from 0)", LABEL_BUDGET_QUERY_SETS: "labeled query sets"}
_FONT = 9  # legend and tick labels: readable in a grid cell about 460 px wide
_TITLE_FONT = 10
FIGURE_SIZE = (6.4, 4.2)  # inches, every figure of the page: the grid scales them alike
_CHANCE_STYLE = {"color": "0.3", "linestyle": (0, (6, 3)), "linewidth": 1.3}


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=FIGURE_SIZE, dpi=110)
    axes.tick_params(labelsize=_FONT)
    return figure, axes


def _colours(count: int) -> list[Any]:
    from matplotlib import colormaps  # no pyplot: callers may ask before _figure has chosen the Agg backend

    palette = colormaps["tab10"]
    return [palette(i % 10) for i in range(count)]


def _legend(axes: Any) -> None:
    """Inside the axes for a few entries; below them, in columns, for many (so no line is hidden)."""
    labels = axes.get_legend_handles_labels()[1]
    if not labels:
        return
    if len(labels) <= 4:
        axes.legend(fontsize=_FONT, loc="best", framealpha=0.85)
        return
    columns = 3 if max(len(label) for label in labels) <= 20 else 2
    axes.legend(fontsize=_FONT - 1, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(columns, len(labels)))


def _finish(axes: Any, title: str, x_label: str, y_label: str, y_range: tuple = (None, None)) -> None:
    axes.set_title(title, fontsize=_TITLE_FONT)
    axes.set_xlabel(x_label, fontsize=_FONT)
    axes.set_ylabel(y_label, fontsize=_FONT)
    if y_range != (None, None):
        axes.set_ylim(*y_range)
    axes.grid(alpha=0.3)
    _legend(axes)
    axes.figure.tight_layout()


def _close(figure: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(figure)


def _scale(chart: Chart) -> float:
    """What a logged value is multiplied by on the page: 100 for fractions drawn in %."""
    return 100.0 if chart.percent else 1.0


def _y_label(chart: Chart) -> str:
    return f"{chart.y_label} (%)" if chart.percent else chart.y_label


def _y_range(chart: Chart) -> tuple[float | None, float | None]:
    return tuple(None if end is None else end * _scale(chart) for end in chart.y_range)  # type: ignore[return-value]


def chance_line(axes: Any, n_ways: Iterable[int | None], scale: float = 100.0, keep_view: bool = False) -> None:
    """A dashed line at chance accuracy, ``scale / N``, labelled ``chance (20%)`` (``chance, 5-way (20%)`` where
    runs of several N share the axes), for each N known; unknown N (None) draw nothing.

    Args:
        axes: the accuracy axes.
        n_ways: the N of each run drawn (repeats and None are fine).
        scale: 100 for accuracy in %, 1 for fractions.
        keep_view: leave the y range to the data (curves that sit within a few points of each other): a chance
            level outside it is named in the legend, ``(below the axis)``, instead of stretching the axis.
    """
    from matplotlib.lines import Line2D

    known = sorted({n for n in n_ways if isinstance(n, int) and not isinstance(n, bool) and n > 1})
    bottom, top = axes.get_ylim()
    for n in known:
        level = scale / n
        words = f"{100 / n:.3g}%"
        label = f"chance ({words})" if len(known) == 1 else f"chance, {n}-way ({words})"
        if keep_view and not bottom <= level <= top:
            axes.add_line(Line2D([], [], label=f"{label} (below the axis)", **_CHANCE_STYLE))
            continue
        axes.axhline(level, label=label, zorder=1.5, **_CHANCE_STYLE)


def _points(rows: Sequence[dict[str, Any]], x: str, key: str, scale: float = 1.0) -> list[tuple[float, float]]:
    return [(row[x], scale * row[key]) for row in rows if finite(row.get(x)) and finite(row.get(key))]


def _coincides(points: list[tuple[float, float]], other: list[tuple[float, float]]) -> bool:
    """Whether two lines lie on each other: the same values at every x both have (at least two x in common)."""
    values = dict(other)
    shared = [(x, y) for x, y in points if x in values]
    return len(shared) >= 2 and all(math.isclose(y, values[x], rel_tol=1e-9, abs_tol=1e-12) for x, y in shared)


def draw(chart: Chart, rows: Sequence[dict[str, Any]], n_way: int | None = None) -> Any | None:
    """One chart as a matplotlib figure, or ``None`` when the rows hold nothing it can draw.

    Args:
        chart: the chart.
        rows: the run's logged rows.
        n_way: the run's N (N-way tasks), for the chance line of an accuracy chart; None draws none.

    ``"histogram"`` charts are drawn by ``draw_histograms`` (a section's histograms on one figure).
    """
    keys = set().union(*rows) if rows else set()
    if chart.kind == "histogram":
        return draw_histograms([chart], rows)
    series = chart.matching(keys)
    if not series:
        return None
    if chart.kind == "threshold_curve":
        return _threshold_curve(chart, rows, series, n_way)
    return _lines(chart, rows, series, n_way)


def _lines(chart: Chart, rows: Sequence[dict[str, Any]], series: list[str], n_way: int | None) -> Any | None:
    scale = _scale(chart)
    lines = [
        # markersize: series that coincide (train and val at 1.0) stay visible
        (_points(rows, chart.x, key, scale), {"markersize": 6 - index % 3, "label": series_label(key)})
        for index, key in enumerate(series)
    ]
    return _line_chart(chart, chart.title, lines, [n_way])


def _line_chart(
    chart: Chart, title: str, lines: Sequence[tuple[list, dict[str, Any]]], n_ways: Sequence[int | None] = ()
) -> Any | None:
    """One line per ``(points, style)`` that has points, against the chart's x axis; None where none has any.

    The i-th line gets the i-th marker (when it has at most 30 points) and line style, counting empty ones too. A
    line lying on an earlier one is drawn thin with open markers over it, the earlier one widened into a pale band
    beneath, and its legend entry says ``(same as <the earlier one>)``.
    """
    figure, axes = _figure()
    drawn: list[tuple[list, Any, str]] = []  # points, the Line2D, its own label
    for index, (points, style) in enumerate(lines):
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        style = dict(style)
        label = str(style.get("label", ""))
        marker = _MARKERS[index % 5] if len(points) <= 30 else None
        twin = next((line for line in drawn if _coincides(points, line[0])), None)
        if twin is not None:
            same = "same as" if sorted(points) == sorted(twin[0]) else "on the line of"
            style["label"] = f"{label} ({same} {twin[2]})"
            style.update(linewidth=1.3, markerfacecolor="none", markersize=style.get("markersize", 6) + 3, zorder=3)
            twin[1].set_linewidth(5.0)
            twin[1].set_alpha(0.45)
        (line,) = axes.plot(xs, ys, marker=marker, linestyle=_LINE_STYLES[index % len(_LINE_STYLES)], **style)
        drawn.append((points, line, label))
    if not drawn:
        _close(figure)
        return None
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, epochs and label counts are whole numbers
    if chart.chance:
        chance_line(axes, n_ways, _scale(chart))
    _finish(axes, title, _X_LABEL.get(chart.x, chart.x), _y_label(chart), _y_range(chart))
    return figure


def draw_compared(
    chart: Chart,
    key: str,
    runs: Sequence[tuple[str, Sequence[dict[str, Any]]]],
    n_ways: Sequence[int | None] = (),
) -> Any | None:
    """One logged series of ``chart`` for several runs on one axis (a line per run), or None where no run has it.

    Args:
        chart: the chart the series belongs to (its x axis, y label and range).
        key: the logged key drawn.
        runs: ``(label, rows)`` of each run.
        n_ways: each run's N, for the chance line of an accuracy chart.
    """
    lines = [
        (_points(rows, chart.x, key, _scale(chart)), {"color": colour, "markersize": 5, "label": label})
        for (label, rows), colour in zip(runs, _colours(len(runs)), strict=True)
    ]
    return _line_chart(chart, f"{series_label(key)[:1].upper()}{series_label(key)[1:]}", lines, n_ways)


def _threshold_curve(chart: Chart, rows: Sequence[dict[str, Any]], series: list[str], n_way: int | None) -> Any | None:
    import matplotlib.pyplot as plt

    thresholds = [threshold_from_key(key) for key in series]
    curves = [row for row in rows if any(key in row for key in series)]
    if not curves:
        return None
    figure, axes = _figure()
    colours = plt.get_cmap("viridis")
    scale = _scale(chart)
    for index, row in enumerate(curves):
        points = [(t, scale * row[key]) for t, key in zip(thresholds, series, strict=True) if finite(row.get(key))]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        when = f"epoch {int(row['epoch'])}" if finite(row.get("epoch")) else f"validation {index + 1}"
        if finite(row.get("step")):
            when += f", step {validated_step(row)}"
        latest = index == len(curves) - 1
        shown = latest or index == 0 or len(curves) <= 6
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
    if chart.chance:
        chance_line(axes, [n_way], scale)
    _finish(axes, chart.title, "vacuity threshold t (queries with vacuity < t)", _y_label(chart), _y_range(chart))
    return figure


def rebin(counts: Sequence[float], edges: Sequence[float], new_edges: Sequence[float]) -> list[float]:
    """A histogram's counts moved onto other bins, each bin's count spread evenly over its width.

    Exact where the new edges are the old ones (or a subset of them); the total is kept where the new bins cover the
    old ones.

    >>> rebin([4, 2], [0.0, 1.0, 2.0], [0.0, 0.5, 2.0])
    [2.0, 4.0]

    Args:
        counts: ``len(edges) - 1`` counts.
        edges: the old bin edges, increasing.
        new_edges: the new bin edges, increasing.

    Returns:
        ``len(new_edges) - 1`` counts.
    """
    moved = [0.0] * (len(new_edges) - 1)
    for count, low, high in zip(counts, edges[:-1], edges[1:], strict=True):
        if not count:
            continue
        if high <= low:  # a zero-width bin (all values equal): its count goes to the bin holding it
            spots = [i for i in range(len(moved)) if new_edges[i] <= low <= new_edges[i + 1]]
            if spots:
                moved[spots[0]] += float(count)
            continue
        for i in range(len(moved)):
            overlap = min(high, new_edges[i + 1]) - max(low, new_edges[i])
            if overlap > 0:
                moved[i] += float(count) * overlap / (high - low)
    return moved


def _shared_edges(histograms: Sequence[tuple[Sequence[float], Sequence[float]]], bins: int = 30) -> list[float]:
    """Bin edges common to ``(counts, edges)`` histograms: theirs where all have the same, else ``bins`` even bins
    over the range they cover together."""
    first = list(histograms[0][1])
    if all(list(edges) == first for _, edges in histograms):
        return first
    low = min(edges[0] for _, edges in histograms)
    high = max(edges[-1] for _, edges in histograms)
    if high <= low:
        high = low + 1e-6
    return [low + (high - low) * i / bins for i in range(bins + 1)]


def draw_histograms(charts: Sequence[Chart], rows: Sequence[dict[str, Any]]) -> Any | None:
    """A section's histogram charts (chosen and rejected query sets) on one figure, from the latest row that holds
    any of them: rebinned onto shared bins and drawn as the share (%) of each side's query sets per bin, so the two
    compare on one y-scale whatever their counts. None where no row holds a histogram (W&B logs them; CSV and
    TensorBoard runs do not)."""
    fields = [(f"{chart.y[0]}/values", f"{chart.y[0]}/bins") for chart in charts]
    latest = [row for row in rows if any(values in row and bins in row for values, bins in fields)]
    if not latest:
        return None
    row = latest[-1]
    found = [
        (chart, row[values], row[bins])
        for chart, (values, bins) in zip(charts, fields, strict=True)
        if values in row and bins in row and sum(row[values]) > 0
    ]
    if not found:
        return None
    edges = _shared_edges([(counts, bins) for _, counts, bins in found])
    figure, axes = _figure()
    for (chart, counts, bins), colour in zip(found, _colours(len(found)), strict=True):
        moved = rebin(counts, bins, edges)
        total = sum(moved) or 1.0
        shares = [100.0 * count / total for count in moved]
        name = series_label(chart.y[0])
        label = f"{name} ({round(sum(counts)):,} query sets)"
        axes.stairs(shares, edges, fill=True, alpha=0.35, color=colour)
        axes.stairs(shares, edges, linewidth=1.8, color=colour, label=label)
    when = f"epoch {int(row['epoch'])}" if finite(row.get("epoch")) else f"step {row.get('step', '?')}"
    names = " vs ".join(series_label(chart.y[0]) for chart, _, _ in found)
    _finish(axes, f"Task uncertainty, {names} query sets, {when}", "task uncertainty", "share of the side's sets (%)")
    return figure


# --- test results (results.json) ------------------------------------------------------------------------------


def _nan(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def _percent(value: Any) -> float:
    return 100.0 * _nan(value)


def _n_way(results: Mapping[str, Any]) -> int | None:
    """The N of the tasks a test ran (``results.json``'s ``task``), or None where it does not say."""
    n_way = (results.get("task") or {}).get("n_way")
    return n_way if isinstance(n_way, int) else None


def threshold_curves(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> Any | None:
    """Test accuracy (solid) and coverage (dashed) of the queries with vacuity below each threshold, per run, in %."""
    runs = [(label, results) for label, results in runs if results.get("threshold_curve")]
    if not runs:
        return None
    figure, axes = _figure()
    for (label, results), colour in zip(runs, _colours(len(runs)), strict=True):
        curve = results["threshold_curve"]
        prefix = f"{label}: " if len(runs) > 1 else ""
        for field, style, name in (("accuracy", "o-", "accuracy"), ("coverage", "s--", "coverage (share kept)")):
            values = [_percent(v) for v in curve[field]]
            axes.plot(curve["threshold"], values, style, color=colour, markersize=3, label=f"{prefix}{name}")
    axes.set_xlim(0.0, 1.02)
    chance_line(axes, [_n_way(results) for _, results in runs])
    title = "Test accuracy and coverage vs vacuity threshold"
    _finish(axes, title, "vacuity threshold t (queries with vacuity < t)", "accuracy / coverage (%)", (0, 102))
    return figure


def selective_accuracy(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> Any | None:
    """Test accuracy of the most confident queries (lowest vacuity) against the share kept, per run, in %."""
    runs = [(label, results) for label, results in runs if results.get("selective_accuracy")]
    if not runs:
        return None
    figure, axes = _figure()
    for index, ((label, results), colour) in enumerate(zip(runs, _colours(len(runs)), strict=True)):
        rows = sorted(results["selective_accuracy"], key=lambda r: r["coverage"])
        axes.plot(
            [100 * r["coverage"] for r in rows],
            [_percent(r["accuracy"]) for r in rows],
            marker=_MARKERS[index % 5],
            linestyle=_LINE_STYLES[index % 4],
            color=colour,
            label=label,
        )
    # the differences sit within a few points: the y range stays on them, a chance level far below is named
    chance_line(axes, [_n_way(results) for _, results in runs], keep_view=True)
    _finish(
        axes,
        "Selective accuracy: the most confident queries",
        "queries kept, lowest vacuity first (%)",
        "accuracy (%)",
    )
    return figure


_SHIFT_AXIS = {"rotation": "rotation (degrees)", "scale": "scale (factor)"}


def shift_probes(kind: str, runs: Sequence[tuple[str, Mapping[str, Any]]], measure: str = "accuracy") -> Any | None:
    """Accuracy (in %, with the chance line) or mean vacuity of the query sets at each level of one shift, per run;
    None where no run has the probe (or, for accuracy, where none measured it: foreign queries have no labels).

    Args:
        kind: the shift (``rotation``, ``scale``, ``dataset``).
        runs: ``(label, results.json)`` of each run.
        measure: ``"accuracy"`` or ``"vacuity"``.
    """
    if measure not in ("accuracy", "vacuity"):
        raise ValueError(f"measure={measure!r}: draw 'accuracy' or 'vacuity'")
    runs = [(label, results) for label, results in runs if (results.get("ood") or {}).get(kind)]
    if measure == "accuracy":
        runs = [(label, results) for label, results in runs if any(r.get("accuracy") for r in results["ood"][kind])]
    if not runs:
        return None
    figure, axes = _figure()
    for index, ((label, results), colour) in enumerate(zip(runs, _colours(len(runs)), strict=True)):
        rows = results["ood"][kind]
        numeric = all(isinstance(r["level"], int | float) for r in rows)
        xs = [r["level"] for r in rows] if numeric else list(range(len(rows)))
        if measure == "accuracy":
            ys = [_percent((r.get("accuracy") or {}).get("mean")) for r in rows]
        else:
            ys = [_nan((r.get("vacuity") or {}).get("mean")) for r in rows]
        axes.plot(xs, ys, color=colour, marker=_MARKERS[index % 5], linestyle=_LINE_STYLES[index % 4], label=label)
        if not numeric:
            axes.set_xticks(xs, [str(r["level"]) for r in rows], fontsize=_FONT)
    if measure == "accuracy":
        chance_line(axes, [_n_way(results) for _, results in runs])
        _finish(axes, f"{kind}: accuracy", _SHIFT_AXIS.get(kind, kind), "accuracy (%)", (0, 102))
    else:
        _finish(axes, f"{kind}: mean vacuity", _SHIFT_AXIS.get(kind, kind), "mean vacuity")
    return figure
