"""The paper's tables (issue 16): a grid of (config, method, seed) runs, each tested, tabled beside the paper.

The command line of the ``benchmarks.tables`` package (its docstring tells the grid, the run folders, stopping in
time and the tables); runs as a script or as a module:

    python benchmarks/paper_tables.py --dry-run                     # the runs, their commands, what is done
    python benchmarks/paper_tables.py --configs budget --gpus 0,1 --per-gpu 12 --mps  # the 45 budget runs, under MPS
    python benchmarks/paper_tables.py --configs omniglot_5w1s --methods Units-ML --seeds 0 \
        --extra "trainer.max_steps=200 data.test_tasks=50"               # a quick check (another --root!)
    python benchmarks/paper_tables.py --tables-only
    python -m benchmarks.paper_tables --dry-run

Exit status: 0 when every selected run is done, 3 when the time limit or a signal stopped the call (run it again),
1 when a command failed (its console log is named).
"""

import sys
import time
from pathlib import Path

STARTED = time.monotonic()  # --time-limit counts from here, before the imports below (seconds on a cold start)

if not __package__:  # `python benchmarks/paper_tables.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tables.cli import main  # noqa: E402
from units_lightning.callbacks import CheckpointOnSigterm  # noqa: E402, F401  (older fit commands name it here)

if __name__ == "__main__":
    sys.exit(main(started=STARTED))
