"""``UnitsArgumentParser``: the ``units-lightning`` command line's parser, with errors a person reads.

A mistake on the command line or in a config file is one paragraph: the option, what is wrong with it, a "did
you mean" for a misspelt key and where to look, instead of jsonargparse's usage text of every option and its tree
of the union types it tried. ``--print_config`` prints the config as the command will run it.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser

from units_lightning import errors
from units_lightning.cli.config_sources import class_defaults
from units_lightning.cli.preflight import LIGHTNING_COMMANDS
from units_lightning.lazy import import_object

__all__ = ["LIGHTNING_COMMANDS", "UnitsArgumentParser"]


def _parser_keys(parser: Any) -> list[str]:
    """Every option of a parser, dotted (``model.filters``)."""
    found = [action.dest for action in getattr(parser, "_actions", []) if isinstance(action.dest, str)]
    return [key for key in found if key not in ("help", "config")]


def _class_arguments(class_path: str | None, path: str | None) -> list[str]:
    """``<path>.<argument>`` for each ``__init__`` argument of ``class_path`` (and of its bases, via kwargs)."""
    if not class_path or not path:
        return []
    arguments = set(class_defaults(class_path))
    with contextlib.suppress(ImportError, AttributeError, ValueError, TypeError):
        signature = inspect.signature(import_object(class_path))
        arguments |= {p for p in signature.parameters if p not in ("self", "args", "kwargs")}
    return [f"{path}.{argument}" for argument in sorted(arguments)]


class UnitsArgumentParser(LightningArgumentParser):
    """``LightningArgumentParser`` whose errors are one paragraph: the option, what is wrong, a "did you mean" for
    a misspelt key, and where to look, instead of the usage text of every option. ``--debug`` (or
    ``UNITS_LIGHTNING_DEBUG=1``) restores jsonargparse's full message."""

    debug = False
    before_print: Any = None  # set by UnitsCLI: settles a parsed config before --print_config shows it

    def _parse_common(self, cfg: Namespace, *args: Any, **kwargs: Any) -> Namespace:
        """As jsonargparse's, but ``--print_config`` prints the config as the command will run it (after
        ``before_print``), not before its class defaults are settled."""
        from jsonargparse._actions import _ActionPrintConfig

        requested = self.__dict__.pop("print_config", None)
        cfg = super()._parse_common(cfg, *args, **kwargs)
        if requested is not None:
            if self.before_print is not None:
                self.before_print(cfg)
            self.print_config = requested
            _ActionPrintConfig.print_config_if_requested(self, cfg)
        return cfg

    def error(self, message: str, ex: Exception | None = None) -> Any:
        from jsonargparse._common import debug_mode_active

        if not self.exit_on_error or self.debug or debug_mode_active():
            return super().error(message, ex)
        text, path, class_path = errors.explain_parser_error(message)
        subcommand = re.search(r"Subcommand '(\w+)'", message)
        name = subcommand.group(1) if subcommand else str(getattr(ex, "subcommand_parser", self).prog).split()[-1]
        command = f"units-lightning {name}" if name in LIGHTNING_COMMANDS else "units-lightning"
        parser = _subcommand_parser(self, name) or getattr(ex, "subcommand_parser", None) or self
        hints = errors.did_you_mean(
            errors.unknown_keys(message, path), _parser_keys(parser) + _class_arguments(class_path, path)
        )
        if "No module named" in text:
            hints.append(
                "a class_path must be importable: run the command from the folder that holds its package (it is "
                "on the import path, as with `python -m`), or add that folder to PYTHONPATH"
            )
        lines = [f"{command}: error: {text}", *(f"  {hint}" for hint in hints)]
        lines.append(f"  (`{command} --help` lists the options; {errors.DEBUG_FLAG} shows the parser's own message)")
        sys.stderr.write("\n".join(lines) + "\n")
        self.exit(2)


def _subcommand_parser(parser: Any, name: str) -> Any:
    """The parser of subcommand ``name`` under a main parser, or None."""
    action = getattr(parser, "_subcommands_action", None)
    return getattr(action, "_name_parser_map", {}).get(name) if action is not None else None
