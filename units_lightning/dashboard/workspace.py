"""The belief dashboard as a W&B workspace (``wandb-workspaces``), and the ``units-lightning dashboard`` command.

``build_workspace`` turns ``charts.CHARTS`` into a ``wandb_workspaces.workspaces.Workspace`` without touching the
network; ``units-lightning dashboard --entity E --project P`` saves it to W&B (after ``wandb login``), and
``--dry-run`` prints its sections and keys instead (no account details needed).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from units_lightning.dashboard.charts import CHARTS, EPOCH, STEP, Chart

__all__ = ["DEFAULT_NAME", "build_workspace", "main", "panel_keys"]

DEFAULT_NAME = "Units-ML belief dashboard"
_X_AXIS = {STEP: "trainer/global_step", EPOCH: "epoch"}  # WandbLogger logs both in every row
_BUILT_IN_X = {"Step", "_step", "Wall Time", "Relative Time (Wall)", "Relative Time (Process)"}


def _panel(chart: Chart) -> Any:
    import wandb_workspaces.reports.v2 as wr

    title = chart.title
    x = _X_AXIS.get(chart.x, chart.x)
    if chart.kind == "threshold_curve":
        # W&B line plots draw keys over steps: one line per threshold over training (the report draws the
        # curve against the threshold).
        title = title.split(" (")[0] + " (one line per threshold, over training)"
        x = _X_AXIS[STEP]
    return wr.LinePlot(
        title=title,
        x=x,
        y=list(chart.y),
        metric_regex=chart.y_pattern,
        range_y=chart.y_range,
        title_y=chart.y_label or None,
    )


def build_workspace(entity: str, project: str, name: str = DEFAULT_NAME, charts: Sequence[Chart] = CHARTS) -> Any:
    """The dashboard as a W&B workspace: one section per chart section, one panel per chart. Needs no network.

    Args:
        entity: W&B user or team.
        project: W&B project.
        name: the workspace's name.
        charts: the charts to show (default: ``charts.CHARTS``).

    Returns:
        A ``wandb_workspaces.workspaces.Workspace``; ``.save()`` uploads it.
    """
    import wandb_workspaces.workspaces as ws

    sections: dict[str, list[Any]] = {}
    for chart in charts:
        sections.setdefault(chart.section, []).append(_panel(chart))
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name,
        sections=[ws.Section(name=section, panels=panels, is_open=True) for section, panels in sections.items()],
    )


def panel_keys(workspace: Any) -> tuple[set[str], set[str]]:
    """The logged keys a workspace's panels read, and the key patterns (regular expressions) they match.

    Args:
        workspace: a ``wandb_workspaces.workspaces.Workspace``.

    Returns:
        ``(keys, patterns)``: exact keys (x and y axes, W&B's own axes left out) and the
        ``metric_regex`` patterns of panels whose series depend on the run.
    """
    import wandb_workspaces.reports.v2 as wr

    keys: set[str] = set()
    patterns: set[str] = set()
    for section in workspace.sections:
        for panel in section.panels:
            if isinstance(panel, wr.LinePlot):
                keys.update(str(y) for y in panel.y)
                if panel.x and panel.x not in _BUILT_IN_X:
                    keys.add(str(panel.x))
                if panel.metric_regex:
                    patterns.add(panel.metric_regex)
            else:
                raise TypeError(f"panel_keys does not know {type(panel).__name__} panels")
    return keys, patterns


DEFAULT_PROJECT = "units-lightning"  # the W&B project of the shipped configs


def main(argv: Sequence[str] | None = None) -> None:
    """``units-lightning dashboard --entity E [--project P] [--name N]``, or ``--dry-run`` (no account needed)."""
    parser = argparse.ArgumentParser(
        prog="units-lightning dashboard",
        description="Create the Units-ML belief dashboard as a saved workspace (view) of a W&B project; "
        "--dry-run prints its sections and keys without an account.",
    )
    parser.add_argument("--entity", default=None, help="W&B user or team (needed to save, not for --dry-run)")
    parser.add_argument("--project", default=DEFAULT_PROJECT, help=f"W&B project (default: {DEFAULT_PROJECT!r})")
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"workspace name (default: {DEFAULT_NAME!r})")
    parser.add_argument("--dry-run", action="store_true", help="print the sections and keys; do not contact W&B")
    args = parser.parse_args(argv)
    if args.entity is None and not args.dry_run:
        parser.error("--entity is needed to save the workspace to W&B (your user or team); --dry-run needs none")
    workspace = build_workspace(args.entity or "<entity>", args.project, args.name)
    if args.dry_run:
        layout = {section.name: [panel.title for panel in section.panels] for section in workspace.sections}
        keys, patterns = panel_keys(workspace)
        summary = {"workspace": args.name, "sections": layout, "keys": sorted(keys), "patterns": sorted(patterns)}
        print(json.dumps(summary, indent=2))
        return
    workspace.save()
    print(f"saved workspace {args.name!r}: {workspace.url}")
