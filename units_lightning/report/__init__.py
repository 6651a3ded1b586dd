"""``units-lightning report RUN_DIR``: the belief dashboard drawn offline, as PNGs and one self-contained HTML page.

For users without a W&B account, or offline: the charts of ``units_lightning.charts`` (the same the W&B workspace
shows) drawn from the run's own logs, whichever logger wrote them (an offline W&B run, ``CSVLogger``'s
``metrics.csv`` or TensorBoard event files).
"""

from units_lightning.report.build import build_report, main
from units_lightning.report.sources import RunLog, find_log, read_log

__all__ = ["RunLog", "build_report", "find_log", "main", "read_log"]
