"""The ``units-lightning`` command: LightningCLI over ``UnitsMAML`` and the episodic data modules, plus the
package's own commands (``report``, ``dashboard``, ``select``, ``ingest``).

What a person sees: one line per validation (``--progress steps`` for Lightning's bar), a summary that lists every
file written, and bad input as one paragraph without a traceback (``--debug`` or ``UNITS_LIGHTNING_DEBUG=1``
shows it). Every run has one folder (``units_lightning.runs``) that ``test``, ``report`` and ``--ckpt_path
last`` / ``best`` find again.

- ``dispatch``: ``main`` (the console script), ``--help`` and the package's own commands;
- ``parser``: ``UnitsCLI`` and ``cli_main``, the Lightning commands;
- ``arguments``: ``UnitsArgumentParser``, the command line's errors as one paragraph each;
- ``config_sources``: a class given in a config file starts from its own defaults, not the replaced class's;
- ``checkpoints``: ``--ckpt_path last`` / ``best``, the run a command continues, the model options a checkpoint
  replaced;
- ``console``: the quiet display and the fit summary as printed; ``cleanup``: no empty run left behind.
"""

from units_lightning.callbacks.summary_writer import fit_summary
from units_lightning.cli.arguments import LIGHTNING_COMMANDS, UnitsArgumentParser
from units_lightning.cli.dispatch import COMMANDS, main, overview
from units_lightning.cli.parser import UnitsCLI, cli_main

__all__ = [
    "COMMANDS",
    "LIGHTNING_COMMANDS",
    "UnitsArgumentParser",
    "UnitsCLI",
    "cli_main",
    "fit_summary",
    "main",
    "overview",
]
