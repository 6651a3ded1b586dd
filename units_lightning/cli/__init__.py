"""The ``units-lightning`` command: LightningCLI over ``UnitsMAML`` and the episodic data modules, plus the
package's own commands (``report``, ``dashboard``, ``select``, ``ingest``).

What a person sees: one line per validation (``--progress steps`` for Lightning's bar), a summary that lists every
file written, and bad input as one paragraph without a traceback (``--debug`` or ``UNITS_LIGHTNING_DEBUG=1``
shows it). Every run has one folder (``units_lightning.runs``) that ``test``, ``report`` and ``--ckpt_path
last`` / ``best`` find again.

- ``dispatch``: ``main`` (the console script), ``--help`` and the package's own commands; it imports nothing
  heavy, and neither does this package until one of its names is read;
- ``preflight``: what a Lightning command answers before Lightning loads (its short ``--help``, a missing
  ``--config`` file);
- ``parser``: ``UnitsCLI`` and ``cli_main``, the Lightning commands;
- ``arguments``: ``UnitsArgumentParser``, the command line's errors as one paragraph each;
- ``config_sources``: a class given in a config file starts from its own defaults, not the replaced class's;
- ``checkpoints``: ``--ckpt_path last`` / ``best``, the run a command continues, the model options a checkpoint
  replaced;
- ``console``: the quiet display and the fit summary as printed; ``cleanup``: no empty run left behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from units_lightning.lazy import lazy_exports

if TYPE_CHECKING:
    from units_lightning.callbacks.summary_writer import fit_summary
    from units_lightning.cli.arguments import UnitsArgumentParser
    from units_lightning.cli.dispatch import COMMANDS, main, overview
    from units_lightning.cli.parser import UnitsCLI, cli_main
    from units_lightning.cli.preflight import LIGHTNING_COMMANDS

# Public name -> its module, imported when the name is first read: the console script's ``main`` loads no
# Lightning until a command needs it.
_LAZY = {
    "COMMANDS": "units_lightning.cli.dispatch",
    "LIGHTNING_COMMANDS": "units_lightning.cli.preflight",
    "UnitsArgumentParser": "units_lightning.cli.arguments",
    "UnitsCLI": "units_lightning.cli.parser",
    "cli_main": "units_lightning.cli.parser",
    "fit_summary": "units_lightning.callbacks.summary_writer",
    "main": "units_lightning.cli.dispatch",
    "overview": "units_lightning.cli.dispatch",
}

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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
