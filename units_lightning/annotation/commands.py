"""``python -m units_lightning.annotation.commands {select,ingest,serve} ...``: the annotation commands' dispatcher.

Each command lives in a module of its own (``select_command``, ``ingest_command``, ``serve_command``) and what they
share in ``command_common``; ``units-lightning select|ingest|serve`` calls the ``*_main`` functions through this
module, which imports nothing heavy (``select --help`` loads no torch, Lightning or jsonargparse). The names below
are re-exported so that every import from ``units_lightning.annotation.commands`` keeps working.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from units_lightning.annotation.command_common import TOKEN_VARIABLE, disputes_csv, schedule_at
from units_lightning.annotation.ingest_command import ingest_main
from units_lightning.annotation.select_command import default_acquisition, select_main, select_parser
from units_lightning.annotation.serve_command import (
    NEXT_EPOCH,
    finished_epochs,
    retrain_once,
    serve_main,
    serve_parser,
    train_command,
)

__all__ = [
    "NEXT_EPOCH",
    "TOKEN_VARIABLE",
    "default_acquisition",
    "disputes_csv",
    "finished_epochs",
    "ingest_main",
    "main",
    "retrain_once",
    "schedule_at",
    "select_main",
    "select_parser",
    "serve_main",
    "serve_parser",
    "train_command",
]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m units_lightning.annotation.commands {select,ingest,serve} ...``."""
    words = sys.argv[1:] if argv is None else list(argv)
    commands = {"select": select_main, "ingest": ingest_main, "serve": serve_main}
    if not words or words[0] not in commands:
        sys.exit(f"usage: python -m units_lightning.annotation.commands {{{','.join(commands)}}} [options] (--help)")
    try:
        commands[words[0]](words[1:])
    except (ValueError, OSError) as error:  # bad input: the message, not a traceback (as units-lightning does)
        print(f"units-lightning {words[0]}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
