"""Errors from bad input, as a person reads them: one paragraph, no traceback unless asked for.

The ``units-lightning`` command prints a configuration, data or checkpoint mistake (``n_way=60 but split 'val' has
only 50 classes``, a missing data root, an unknown config key, ...) as ``units-lightning fit: error: <message>``
and exits with status 1 (2 for the command line itself, as argparse does). ``--debug`` on the command line, or
``UNITS_LIGHTNING_DEBUG=1`` in the environment, shows the traceback instead. Exceptions of other types (a bug)
keep their traceback.
"""

from __future__ import annotations

import difflib
import os
import re
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "DEBUG_ENV",
    "DEBUG_FLAG",
    "closest",
    "debug_requested",
    "did_you_mean",
    "explain_parser_error",
    "format_error",
    "origin",
    "unknown_keys",
    "user_error",
]

DEBUG_FLAG = "--debug"
DEBUG_ENV = "UNITS_LIGHTNING_DEBUG"
# What bad input raises: the package's own checks (ValueError with the numbers and the fix, FileNotFoundError
# for a missing root), a file the system refuses, a corrupt archive, and a run stopped on a non-finite loss.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    OSError,
    zipfile.BadZipFile,
    FloatingPointError,
)
_PACKAGE = Path(__file__).resolve().parent


def debug_requested(argv: Iterable[str], environ: Mapping[str, str] | None = None) -> bool:
    """``--debug`` among the arguments or ``UNITS_LIGHTNING_DEBUG`` set to anything but ``""``, ``0``, ``false``."""
    environ = os.environ if environ is None else environ
    flag = environ.get(DEBUG_ENV, "").strip().lower()
    return DEBUG_FLAG in argv or flag not in ("", "0", "false", "no")


def _raised_in_package(error: BaseException) -> bool:
    return origin(error).startswith(_PACKAGE.name + os.sep)


def user_error(error: BaseException) -> BaseException | None:
    """The exception a person should read, or None for one that looks like a bug (its traceback stays).

    Follows ``__cause__`` (``raise ... from``): a check of this package that a library wrapped (jsonargparse
    reports a data module's ``ValueError`` as "Does not validate against any of the Union subtypes") shows its
    own message. The deepest user-facing exception raised in this package wins, else the outermost one.
    """
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__
    user_facing = [e for e in chain if isinstance(e, USER_ERRORS)]
    own = [e for e in user_facing if _raised_in_package(e)]
    if own:
        return own[-1]
    return user_facing[0] if user_facing else None


def origin(error: BaseException) -> str:
    """Where ``error`` was raised, as ``path:line`` (relative to the package's parent when inside it)."""
    traceback = error.__traceback__
    if traceback is None:
        return "unknown location"
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    path = Path(traceback.tb_frame.f_code.co_filename)
    try:
        shown = path.resolve().relative_to(_PACKAGE.parent)
    except ValueError:
        shown = path
    return f"{shown}:{traceback.tb_lineno}"


def _message(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.strerror}: {error.filename}"
    text = str(error).strip()
    if isinstance(error, KeyError) and text.startswith("'") and text.endswith("'"):
        text = text[1:-1]
    return text or type(error).__name__


def format_error(command: str, error: BaseException) -> str:
    """``<command>: error: <message>`` and a second line with the exception type, where it was raised and how to
    see the traceback."""
    return (
        f"{command}: error: {_message(error)}\n"
        f"({type(error).__name__} at {origin(error)}; add {DEBUG_FLAG} or set {DEBUG_ENV}=1 for the traceback)"
    )


def closest(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate nearest to ``name`` (``difflib`` ratio at least ``cutoff``), or None.

    >>> closest("model.filtrs", ["model.filters", "model.lr", "data.n_way"])
    'model.filters'
    """
    candidates = list(dict.fromkeys(candidates))
    found = difflib.get_close_matches(name, candidates, n=1, cutoff=cutoff)
    if found:
        return found[0]
    # A misspelt last part of a dotted key: compare the last parts among keys with the same prefix.
    prefix, _, last = name.rpartition(".")
    if prefix:
        same_prefix = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == prefix}
        found = difflib.get_close_matches(last, list(same_prefix), n=1, cutoff=cutoff)
        if found:
            return same_prefix[found[0]]
    return None


_UNRECOGNIZED = re.compile(r"nrecognized arguments?: (.*)")
_NOT_ACCEPTED_OPTION = re.compile(r"does not accept option '([\w.\-]+)'")
_NOT_ACCEPTED_ARGUMENT = re.compile(r"Option '([\w.\-]+)' is not accepted")


def unknown_keys(message: str, path: str | None = None) -> list[str]:
    """The unknown option names a parser's error ``message`` mentions, dotted and without ``--``.

    Args:
        message: the parser's error text: ``Unrecognized arguments: --model.filtrs 3`` (command line),
            ``Subcommand 'fit' does not accept option 'model.filtrs'`` (a config file), or ``Option 'n_wya' is
            not accepted`` (an argument of the class configured at ``path``).
        path: the class option the last kind concerns (``data``).

    >>> unknown_keys("Unrecognized arguments: --model.filtrs 3 --trainer.max_step 2")
    ['model.filtrs', 'trainer.max_step']
    >>> unknown_keys("Option 'n_wya' is not accepted", path="data")
    ['data.n_wya']
    """
    found = []
    for listed in _UNRECOGNIZED.findall(message):
        found += [word.removeprefix("--").split("=")[0] for word in listed.split() if word.startswith("--")]
    found += _NOT_ACCEPTED_OPTION.findall(message)
    found += [f"{path}.{name}" if path else name for name in _NOT_ACCEPTED_ARGUMENT.findall(message)]
    return list(dict.fromkeys(found))


def did_you_mean(unknown: Iterable[str], keys: Iterable[str]) -> list[str]:
    """A hint for each unknown key that has a near valid one.

    >>> did_you_mean(["model.filtrs"], ["model.filters", "model.lr"])
    ['model.filtrs: did you mean model.filters?']
    """
    keys = list(keys)
    hints = []
    for name in unknown:
        match = closest(name, keys)
        if match and match != name:
            hints.append(f"{name}: did you mean {match}?")
    return hints


_STRUCTURE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value type:",
    "Given value:",
    "- Expected a <class 'NoneType'>",
)


def explain_parser_error(message: str) -> tuple[str, str | None, str | None]:
    r"""A jsonargparse error cut down to what went wrong where.

    jsonargparse reports a problem inside a class option (``data``, ``data.sampler``) as a tree of the union
    types it tried, with the given value repeated at every level. This keeps the option's path, the class being
    configured and the innermost messages.

    Args:
        message: the parser's error message.

    Returns:
        ``(text, path, class_path)``: the short message, the dotted option it concerns (None when the message
        names none) and the class configured there (None outside a class option).

    >>> explain_parser_error('Parser key "model.lr":\n  Expected a <class \'float\'>. Got value: abc')
    ('model.lr: expected a float, got abc', 'model.lr', None)
    """
    keys: list[str] = []
    class_path = None
    leaves: list[str] = []
    for raw in message.splitlines():
        line = raw.strip()
        key = re.match(r'Parser key "([^"]+)":\s*(.*)$', line)
        if key:
            keys.append(key.group(1))
            if key.group(2):
                leaves.append(key.group(2))
            continue
        problem = re.match(r"- Problem with given class_path '([^']+)':\s*(.*)$", line)
        if problem:
            class_path = problem.group(1)
            if problem.group(2):
                leaves.append(problem.group(2))
            continue
        if not line or line.startswith(_STRUCTURE):
            continue
        leaves.append(line.removeprefix("- "))
    if not keys:
        return message.strip(), None, None
    path = ".".join(keys)
    text = "; ".join(dict.fromkeys(leaves)) or "invalid value"
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text)
    text = re.sub(r"^Expected a (\w+)\. Got value: (.*)$", r"expected a \1, got \2", text)
    where = f"{path} ({class_path})" if class_path and class_path not in text else path
    return f"{where}: {text}", path, class_path
