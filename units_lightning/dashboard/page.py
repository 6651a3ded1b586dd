"""The HTML of ``report.html``: a headline table, the test results, the charts in a responsive grid, and the
terms spelled out. One self-contained page (images inline), readable on a laptop and a phone alike."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Figure", "Section", "Table", "TERMS", "render"]

# What a reader of the page needs spelled out; the page's words for them.
TERMS = (
    (
        "vacuity",
        "lack of evidence: N / S for N classes and Dirichlet strength S. 1 when the model has seen nothing "
        "that speaks for any class, near 0 when the evidence is strong.",
    ),
    (
        "dissonance",
        "conflicting belief: evidence split between several classes (the paper's dissonance, "
        "Eq. 3). High when two classes are each strongly supported.",
    ),
    ("incorrect belief", "the belief given to the wrong classes, sum of b_n over n != y (needs the label)."),
    ("correct belief", "the belief given to the true class, b_y."),
    (
        "Theorem 1",
        "incorrect belief >= dissonance / 2, for every query and hence every task (Pandey & Yu, 2022). "
        "It compares incorrect belief with dissonance (conflicting belief), not with correct belief.",
    ),
    (
        "task uncertainty",
        "lambda x mean vacuity + (1 - lambda) x mean dissonance of a query set; Units-ML labels "
        "the query set of each task where it is highest.",
    ),
    ("coverage", "the fraction of queries kept at a vacuity threshold (those with vacuity below it)."),
    ("selective accuracy", "the accuracy of the given fraction of most confident queries (lowest vacuity)."),
    ("AURC", "area under the risk-coverage curve: the error averaged over every coverage (lower is better)."),
    ("ECE", "expected calibration error of the expected probabilities alpha / S, 15 bins (lower is better)."),
    ("AUROC", "how well vacuity tells shifted queries from clean ones: 0.5 is chance, 1 perfect."),
    ("95% CI", "1.96 x sample standard deviation / sqrt(tasks), over the evaluation tasks."),
    ("labels spent", "labeled query sets (and their images) and support images read by training (LabelLedger)."),
)

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1600px;padding:0 1.2em 3em;
color:#1b1b1b;line-height:1.45}
header{border-bottom:1px solid #ddd;margin-bottom:1em}h1{font-size:1.6em;margin:.6em 0 .2em}
h2{font-size:1.25em;margin:1.6em 0 .4em;border-bottom:1px solid #eee;padding-bottom:.2em}h3{font-size:1.05em}
nav a{margin-right:1em}code{font-size:.92em;background:#f4f4f4;padding:0 .25em;border-radius:3px}
.note{color:#555;font-size:.92em}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,460px),1fr));gap:16px;align-items:start}
figure{margin:0;border:1px solid #e4e4e4;border-radius:6px;padding:6px;background:#fff}
figure img{width:100%;height:auto;display:block}figcaption{font-size:.88em;color:#444;margin-top:.3em}
.tables{display:flex;flex-wrap:wrap;gap:0 2.5em;align-items:flex-start}.scroll{overflow-x:auto;max-width:100%}
.scroll .note{max-width:38em}table{border-collapse:collapse;margin:.4em 0 .3em;font-size:.95em}
th,td{border:1px solid #ddd;padding:.35em .7em;text-align:left;vertical-align:top}
thead th{background:#f3f5f8}tbody th{font-weight:600;background:#fafafa}td.num{font-variant-numeric:tabular-nums}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.3em 1em}dt{font-weight:600}dd{margin:0}
details{margin:.6em 0}summary{cursor:pointer;font-weight:600}
.warning{background:#fff4d6;border:1px solid #e0a800;border-left:6px solid #e0a800;border-radius:4px;
padding:.6em .9em;margin:.8em 0;max-width:70em}.warning strong{color:#7a4d00}
"""


@dataclass
class Table:
    """A table: a header row and body rows whose first cell names the row.

    Attributes:
        header: the column names.
        rows: the rows, each a name and then one cell per column after the first.
        caption: a line under the table.
    """

    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str = ""


@dataclass
class Figure:
    """An image file shown in the grid, with its caption."""

    path: Path
    title: str
    caption: str = ""


@dataclass
class Section:
    """A heading, an optional paragraph, tables, then figures in a grid; ``folded`` puts it in ``<details>``."""

    title: str
    anchor: str
    text: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    subsections: list[Section] = field(default_factory=list)
    folded: bool = False


def _inline_code(text: str) -> str:
    """``text`` escaped for HTML, with its `backquoted` parts as ``<code>``."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in table.header)
    body = []
    for row in table.rows:
        name, *cells = row
        tds = "".join(f'<td class="num">{html.escape(cell)}</td>' for cell in cells)
        body.append(f"<tr><th>{html.escape(name)}</th>{tds}</tr>")
    caption = f'<p class="note">{_inline_code(table.caption)}</p>' if table.caption else ""
    table_html = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return f'<div class="scroll">{table_html}{caption}</div>'


def _figure(figure: Figure) -> str:
    data = base64.b64encode(figure.path.read_bytes()).decode("ascii")
    caption = html.escape(figure.caption or figure.title)
    return (
        f'<figure><img alt="{html.escape(figure.title)}" loading="lazy" src="data:image/png;base64,{data}">'
        f'<figcaption>{caption} <span class="note">({html.escape(figure.path.name)})</span></figcaption></figure>'
    )


def _section(section: Section, level: int = 2) -> str:
    parts = [f'<h{level} id="{html.escape(section.anchor)}">{html.escape(section.title)}</h{level}>']
    if section.text:
        parts.append(f"<p>{section.text}</p>")  # trusted: built by the report from escaped pieces
    if section.tables:  # side by side where the window is wide enough, one under the other where not
        parts.append('<div class="tables">' + "".join(_table(table) for table in section.tables) + "</div>")
    if section.figures:
        parts.append('<div class="grid">' + "".join(_figure(f) for f in section.figures) + "</div>")
    parts.extend(_section(sub, min(level + 1, 4)) for sub in section.subsections)
    body = "\n".join(parts)
    if section.folded:
        return f"<details><summary>{html.escape(section.title)}</summary>\n{body}\n</details>"
    return body


def render(
    title: str, subtitle: str, sections: Sequence[Section], skipped: Sequence[str], warnings: Sequence[str] = ()
) -> str:
    """The whole page: a title, a line of what was read, a table of contents, the warnings (plain text, with
    `backquoted` commands), the sections, the terms, and the charts that had nothing to draw."""
    terms = "".join(f"<dt>{html.escape(name)}</dt><dd>{html.escape(text)}</dd>" for name, text in TERMS)
    nav = "".join(f'<a href="#{html.escape(s.anchor)}">{html.escape(s.title)}</a>' for s in sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f'<header><h1>{html.escape(title)}</h1><p class="note">{subtitle}</p>',
        f'<nav>{nav}<a href="#terms">Terms</a></nav></header>',
        *(f'<p class="warning" role="alert"><strong>Warning.</strong> {_inline_code(text)}</p>' for text in warnings),
        *(_section(section) for section in sections),
        f'<h2 id="terms">Terms</h2><dl>{terms}</dl>',
    ]
    if skipped:
        items = "".join(f"<li>{html.escape(item)}</li>" for item in skipped)
        parts.append(f"<details><summary>Charts not drawn ({len(skipped)})</summary><ul>{items}</ul></details>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
