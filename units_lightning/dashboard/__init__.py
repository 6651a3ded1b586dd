"""The belief dashboard: one list of charts, drawn as a W&B workspace or offline as PNGs and an HTML page.

* ``charts``: the dashboard as data (``Chart``, ``CHARTS``; ``charts.charts(thresholds)`` for another threshold
  grid): which charts, over which logged keys (``units_lightning.keys``). Both views below draw from it, so they
  cannot drift apart.
* ``workspace``: the charts as a saved W&B workspace (``wandb-workspaces``); ``workspace.main`` is the
  ``units-lightning dashboard`` command.
* ``report``: a run's report (headline numbers, test results, the charts drawn from its own logs) as PNG files
  and one self-contained ``report.html``, or several runs side by side; ``report.main`` is the
  ``units-lightning report`` command. ``page`` writes the HTML, ``plots`` draws the figures.
* ``run_info``: what the report reads of a run folder (summary, test results, config, log) and which runs a
  path names.
* ``run_log``: a run's logged rows read back from an offline W&B run (every part of it), ``CSVLogger``'s
  ``metrics.csv`` or TensorBoard event files.
* ``wandb_offline``: the reader of offline W&B run files (``run-<id>.wandb``).

The dashboard reads logged keys only: it imports neither the callbacks that log them nor the module.
"""

from units_lightning.dashboard.charts import CHARTS, EPOCH, STEP, Chart
from units_lightning.dashboard.report import Report, build_report
from units_lightning.dashboard.run_info import RunInfo, describe_run, runs_to_report, setting_name
from units_lightning.dashboard.run_log import RunLog, find_log, read_log, read_run_log
from units_lightning.dashboard.wandb_offline import find_offline_runs, read_history, read_records
from units_lightning.dashboard.workspace import DEFAULT_NAME, build_workspace, panel_keys

__all__ = [
    "CHARTS",
    "DEFAULT_NAME",
    "EPOCH",
    "STEP",
    "Chart",
    "Report",
    "RunInfo",
    "RunLog",
    "build_report",
    "build_workspace",
    "describe_run",
    "find_log",
    "find_offline_runs",
    "panel_keys",
    "read_history",
    "read_log",
    "read_records",
    "read_run_log",
    "runs_to_report",
    "setting_name",
]
