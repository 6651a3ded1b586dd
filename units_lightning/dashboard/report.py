"""``units-lightning report RUN_DIR``: the belief dashboard drawn offline, as PNGs and one self-contained HTML page.

For users without a W&B account, or offline: the charts of ``charts.py`` (the same the W&B workspace shows)
drawn from the run's own logs, whichever logger wrote them (an offline W&B run, ``CSVLogger``'s ``metrics.csv``
or TensorBoard event files; see ``run_log.py``).
"""

from __future__ import annotations

import argparse
import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from units_lightning.dashboard.charts import CHARTS, Chart
from units_lightning.dashboard.plots import draw
from units_lightning.dashboard.run_log import read_log

__all__ = ["Report", "build_report", "main"]


@dataclass
class Report:
    """What ``build_report`` wrote.

    Attributes:
        html: the HTML page.
        images: the PNG files, in page order.
        skipped: titles of charts with nothing to draw in this run, and why.
    """

    html: Path
    images: list[Path]
    skipped: list[str]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60]


def build_report(run_dir: str | Path, out_dir: str | Path | None = None, charts: Sequence[Chart] = CHARTS) -> Report:
    """Draw every chart the run's logs allow into ``out_dir`` (default ``RUN_DIR/report``).

    Args:
        run_dir: a run folder (or a folder above it, or the log file itself); see ``run_log.find_log``.
        out_dir: where ``report.html`` and the PNGs go.
        charts: which charts (default: the dashboard's).

    Returns:
        The written files and the charts left out.

    Raises:
        FileNotFoundError: if ``run_dir`` holds no log.
    """
    import matplotlib.pyplot as plt

    log = read_log(run_dir)
    base = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
    out = Path(out_dir) if out_dir is not None else base / "report"
    out.mkdir(parents=True, exist_ok=True)
    images: list[Path] = []
    skipped: list[str] = []
    sections: dict[str, list[tuple[Chart, Path]]] = {}
    for index, chart in enumerate(charts):
        figure = draw(chart, log.rows)
        if figure is None:
            reason = "not logged in this run"
            if chart.kind == "histogram" and log.source != "wandb":
                reason = "needs W&B histograms; the quantile chart shows the same values"
            skipped.append(f"{chart.title}: {reason}")
            continue
        path = out / f"{index:02d}_{_slug(chart.title)}.png"
        figure.savefig(path)
        plt.close(figure)
        images.append(path)
        sections.setdefault(chart.section, []).append((chart, path))
    page = out / "report.html"
    page.write_text(_html(Path(run_dir), log.source, log.path, len(log.rows), sections, skipped))
    return Report(page, images, skipped)


def _html(
    run_dir: Path, source: str, path: Path, rows: int, sections: dict[str, list[tuple[Chart, Path]]], skipped: list[str]
) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Units-ML belief dashboard</title>',
        "<style>body{font-family:sans-serif;max-width:1500px;margin:auto;padding:1em}"
        ".grid{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}img{width:700px;max-width:100%}"
        "figcaption{font-size:.85em;color:#555}</style></head><body>",
        "<h1>Units-ML belief dashboard</h1>",
        f"<p>Run: <code>{html.escape(str(run_dir))}</code><br>Read from the {html.escape(source)} log "
        f"<code>{html.escape(str(path))}</code> ({rows} rows).</p>",
    ]
    for section, items in sections.items():
        parts.append(f'<h2>{html.escape(section)}</h2><div class="grid">')
        for chart, image in items:
            data = base64.b64encode(image.read_bytes()).decode("ascii")
            parts.append(
                f'<figure><img alt="{html.escape(chart.title)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(image.name)}</figcaption></figure>"
            )
        parts.append("</div>")
    if skipped:
        parts.append("<h2>Not drawn</h2><ul>")
        parts.extend(f"<li>{html.escape(item)}</li>" for item in skipped)
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """``units-lightning report RUN_DIR [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="units-lightning report",
        description="Draw the belief dashboard of a run from its logs (offline W&B run, CSV or TensorBoard) "
        "to PNG files and one self-contained HTML page.",
    )
    parser.add_argument("run_dir", help="the run folder, a folder above it (e.g. runs/quickstart) or the log file")
    parser.add_argument("--out", default=None, help="output folder (default: RUN_DIR/report)")
    args = parser.parse_args(argv)
    try:
        report = build_report(args.run_dir, args.out)
    except (FileNotFoundError, ImportError) as error:
        parser.exit(2, f"units-lightning report: error: {error}\n")
    print(f"wrote {report.html} and {len(report.images)} PNGs beside it")
    for item in report.skipped:
        print(f"  not drawn: {item}")
