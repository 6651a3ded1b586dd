"""A class given by ``class_path`` in a config file starts from its own defaults, not from the arguments of the
class it replaces.

jsonargparse, when a later config file or option names another ``class_path`` for the same option, keeps every
``init_args`` value of the earlier class that the new class also accepts (by design: omni-us/jsonargparse#460).
So the README's custom sampler, given in a second config file after ``configs/quickstart.yaml``, silently ran with
the quick start's ``warmup_steps: 50`` instead of its own default of 0. ``inherited_arguments`` finds such values
from the sources of one command line (its ``--config`` files and options, in order) and the parsed config.

``units-lightning`` resets those of a class given in a config file (a class spec written out in YAML reads as
the whole of it) to the new class's defaults, and keeps those of a class given on the command line
(``--data units_lightning.data.FolderPredictionDataModule`` layered on a training config keeps its
``image_size``), jsonargparse's rule; it prints a line for each either way.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from units_lightning.lazy import import_object

__all__ = ["Inherited", "class_defaults", "command_sources", "inherited_arguments", "reset_inherited"]

_SPEC_KEYS = ("class_path", "init_args", "dict_kwargs")


@dataclass(frozen=True)
class Inherited:
    """An ``init_args`` value that a ``class_path`` change carried over from the previous class.

    Attributes:
        path: the option holding the class, without ``init_args`` (``data.sampler``).
        argument: the ``init_args`` key (``warmup_steps``).
        value: the carried-over value.
        default: the new class's default, which replaces it.
        previous_class: the class it came from.
        new_class: the class now configured.
        from_file: the new class was given in a config file (its value is reset), not on the command line (kept).
    """

    path: str
    argument: str
    value: Any
    default: Any
    previous_class: str
    new_class: str
    from_file: bool = True

    def describe(self) -> str:
        if self.from_file:
            return (
                f"{self.path}: {self.new_class} takes its own default {self.argument}={self.default!r}, not "
                f"{self.value!r} from {self.previous_class} (set it beside class_path to choose another value)"
            )
        return (
            f"{self.path}: {self.new_class} keeps {self.argument}={self.value!r} from {self.previous_class} (its "
            f"default is {self.default!r}; --{self.path}.{self.argument} sets another value)"
        )


@dataclass(frozen=True)
class _Event:
    """One source setting something at a class option: a class (``class_path``) and/or some of its arguments."""

    path: str
    class_path: str | None
    arguments: frozenset[str]
    from_file: bool = True


def class_defaults(class_path: str) -> dict[str, Any]:
    """The ``__init__`` defaults of ``class_path``, following ``**kwargs`` up the class's bases; {} when it cannot
    be imported."""
    try:
        cls = import_object(class_path)
    except (ImportError, AttributeError, ValueError):
        return {}
    defaults: dict[str, Any] = {}
    for klass in getattr(cls, "__mro__", (cls,)):
        init = klass.__dict__.get("__init__") if isinstance(klass, type) else None
        if init is None:
            continue
        try:
            parameters = list(inspect.signature(init).parameters.values())
        except (TypeError, ValueError):
            break
        for parameter in parameters:
            if parameter.default is not inspect.Parameter.empty:
                defaults.setdefault(parameter.name, parameter.default)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            break
    return defaults


def _normal(path: str) -> str:
    return ".".join(part for part in path.split(".") if part and part != "init_args")


def _events_from_mapping(value: Any, path: str) -> Iterator[_Event]:
    """What a config file (or a JSON value) sets at every class option inside ``value``."""
    if not isinstance(value, dict):
        return
    if "class_path" in value or "init_args" in value:
        init_args = value.get("init_args") or {}
        given = {k for k in value if k not in _SPEC_KEYS}
        if isinstance(init_args, dict):
            given |= set(init_args)
        yield _Event(path, value.get("class_path"), frozenset(given))
        for key, inner in init_args.items() if isinstance(init_args, dict) else ():
            yield from _events_from_mapping(inner, f"{path}.{key}" if path else key)
        return
    for key, inner in value.items():
        if key not in _SPEC_KEYS:
            yield from _events_from_mapping(inner, _normal(f"{path}.{key}" if path else str(key)))


def command_sources(args: Sequence[str]) -> list[tuple[str, Any]]:
    """The sources of one command, in order: ``("config", <loaded file>)`` and ``("option", (key, value))``.

    Args:
        args: the words after the subcommand (``--config a.yaml --model.lr 0.1 ...``).
    """
    sources: list[tuple[str, Any]] = []
    words = list(args)
    index = 0
    while index < len(words):
        word = words[index]
        if not word.startswith("--") and word != "-c":
            index += 1
            continue
        key, has_value, value = word.partition("=")
        if not has_value:
            if index + 1 < len(words) and not words[index + 1].startswith("--"):
                value = words[index + 1]
                index += 1
            else:
                value = None
        index += 1
        if key in ("--config", "-c"):
            if value is not None and Path(value).is_file():
                try:
                    sources.append(("config", yaml.safe_load(Path(value).read_text())))
                except yaml.YAMLError:
                    pass  # the parser reports it
        else:
            sources.append(("option", (key.removeprefix("--"), value)))
    return sources


def _option_events(key: str, value: str | None, class_paths: set[str]) -> Iterator[_Event]:
    path = _normal(key)
    parsed: Any = None
    if value is not None and value.lstrip().startswith("{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError:
                parsed = None
    if isinstance(parsed, dict) and path in class_paths:
        for event in _events_from_mapping(parsed, path):
            yield _Event(event.path, event.class_path, event.arguments, from_file=False)
        return
    if path.endswith(".class_path") and path.removesuffix(".class_path") in class_paths:
        yield _Event(path.removesuffix(".class_path"), value, frozenset(), from_file=False)
        return
    if path in class_paths and value is not None:
        yield _Event(path, value, frozenset(), from_file=False)
        return
    owner = max((p for p in class_paths if path.startswith(p + ".")), key=len, default=None)
    if owner is not None:
        yield _Event(owner, None, frozenset({path[len(owner) + 1 :].split(".")[0]}), from_file=False)


def _class_specs(config: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(option path without init_args, spec)`` of every class spec in a parsed config (a jsonargparse Namespace)."""
    if isinstance(config, dict) or not hasattr(config, "items"):
        return
    items = config.items(branches=True, nested=False)
    if config.get("class_path") is not None:
        yield path, config
        init_args = config.get("init_args")
        if init_args is not None and hasattr(init_args, "items"):
            for key, inner in init_args.items(branches=True, nested=False):
                yield from _class_specs(inner, f"{path}.{key}" if path else key)
        return
    for key, inner in items:
        yield from _class_specs(inner, f"{path}.{key}" if path else key)


def _same_class(a: str | None, b: str | None) -> bool:
    """Class paths name the same class (``RandomSampler`` and ``units_lightning.samplers.RandomSampler`` do)."""
    if a is None or b is None:
        return a == b
    return a == b or a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1] and ("." not in a or "." not in b)


def inherited_arguments(args: Sequence[str], config: Any) -> list[Inherited]:
    """The ``init_args`` values that a ``class_path`` change carried over from the previous class.

    Args:
        args: the command's words after the subcommand.
        config: the subcommand's parsed config (a jsonargparse ``Namespace``).

    Returns:
        For each class option whose class a later source changed, each argument that no source gave for the new
        class and whose value differs from the new class's default (``from_file`` says where the change was).
    """
    specs = dict(_class_specs(config))
    events: list[_Event] = []
    for kind, payload in command_sources(args):
        if kind == "config":
            events.extend(e for e in _events_from_mapping(payload, "") if e.path in specs)
        else:
            events.extend(_option_events(*payload, set(specs)))
    found = []
    for path, spec in specs.items():
        here = [e for e in events if e.path == path]
        classes = [(i, e.class_path) for i, e in enumerate(here) if e.class_path is not None]
        changes = [
            (i, new, old)
            for (i, new), (_, old) in zip(classes[1:], classes[:-1], strict=True)
            if not _same_class(new, old)
        ]
        if not changes:
            continue
        start, _, previous = changes[-1]
        from_file = here[start].from_file
        given = set().union(*(e.arguments for e in here[start:]))
        defaults = class_defaults(spec.class_path)
        init_args = spec.get("init_args")
        for argument, value in init_args.items(branches=True, nested=False) if init_args is not None else ():
            if argument in given or argument not in defaults:
                continue
            if value != defaults[argument]:
                found.append(Inherited(path, argument, value, defaults[argument], previous, spec.class_path, from_file))
    return found


def reset_inherited(config: Any, inherited: Sequence[Inherited]) -> None:
    """Set each inherited value of a class given in a config file to the new class's default (in ``config``, a
    parsed jsonargparse ``Namespace``); those of a class given on the command line stay."""
    specs = dict(_class_specs(config))
    for item in inherited:
        if item.from_file:
            specs[item.path].init_args[item.argument] = item.default
