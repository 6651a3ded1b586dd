"""A compiled function saved whole and loaded in later runs without tracing it again (``compile_ahead``).

``torch.compile`` keeps the kernels it built in its caches (``units_lightning.compile_cache``), but every new
process still traces the function with Dynamo to find them: on the CPU most of a warm start's compile time; a warm
budget run on an H200 spends 13-15 s of one-off cost (docs/PERFORMANCE.md). ``torch.compile(...).aot_compile``
(experimental in torch) traces and compiles once and returns an artifact holding the graphs, the kernels and the
guards that say which inputs it is valid for; saved, it loads in a later run. ``AheadCompiled`` keeps such artifacts
per function in ``<compile cache>/units-lightning-ahead/``, answers a call with the first one whose guards accept the
inputs, and compiles (and saves) a new one otherwise. On an H200 (torch 2.11) it cut a warm budget run's one-off
from 13.3-15.2 s to 8.6-12.5 s.

Older torch needs three things that torch 2.14 does by itself, done here: Dynamo's ``enable_aot_compile`` switch on
(``aot_compile_enabled``), only the guards that a later process can check saved (``savable_guards``), and a load
that runs inside a tracing context (``load_artifact``). Where torch cannot compile ahead (a torch without
``aot_compile``, a function it cannot save, an artifact that does not load back) it says so once, goes on with plain
``torch.compile`` and leaves a note in the folder, so that later runs do not try again.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from units_lightning.compile_cache import sources_digest, use_compile_cache

__all__ = ["COUNTS", "AheadCompiled", "ahead_folder", "aot_compile_enabled", "load_artifact", "savable_guards"]

_FOLDER = "units-lightning-ahead"
_UNSUPPORTED = "cannot-compile-ahead.txt"  # written where compiling ahead failed: later runs do not try again
MAX_ARTIFACTS = 8  # per function: inputs that change from run to run must not fill the disk (about 9 MB each)
COUNTS: Counter[str] = Counter()  # this process's artifacts "loaded" and "compiled", and functions compiled "as usual"
# guards that name objects of one process (their identity, a dict's version) and cannot be saved: torch 2.14's list
_UNSAVABLE_GUARDS = (
    "DICT_VERSION",
    "NN_MODULE",
    "ID_MATCH",
    "FUNCTION_MATCH",
    "CLASS_MATCH",
    "MODULE_MATCH",
    "CLOSURE_MATCH",
    "WEAKREF_ALIVE",
)


def aot_compile_enabled() -> contextlib.AbstractContextManager[Any]:
    """Dynamo's switch for ``aot_compile`` turned on. torch 2.14 has it on; older versions have it off, and their
    ``torch.compile`` gives its result no ``aot_compile`` unless the switch is on while it wraps the function."""
    import torch._dynamo  # noqa: PLC0415 - loaded by the first compile anyway

    config = torch._dynamo.config
    if hasattr(config, "enable_aot_compile"):
        return config.patch(enable_aot_compile=True)
    return contextlib.nullcontext()


def savable_guards(entries: Any) -> list[bool]:
    """Which of Dynamo's guards an artifact keeps: not those on globals, nor those on objects of one process.

    torch 2.14 filters so by default when it compiles ahead; torch 2.11 keeps every guard and then fails to save
    (``PackageError: DICT_VERSION guard cannot be serialized``). What the dropped guards would check is fixed by the
    folder's key (the package's code, torch's functions: the package sources and the torch version), or still
    checked through the objects' types and values: an artifact saved for one inner loss is refused by a run with
    another (``tests/engines/test_compile_ahead.py``)."""
    from torch._dynamo.guards import CheckFunctionManager  # noqa: PLC0415 - loaded by the first compile anyway

    unsavable = set(getattr(CheckFunctionManager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", _UNSAVABLE_GUARDS))
    return [
        not (entry.is_global or entry.guard_type in unsavable or unsavable & set(entry.derived_guard_types or ()))
        for entry in entries
    ]


def load_artifact(path: Path) -> Any:
    """A saved artifact, loaded. torch 2.11 rebuilds some of its guards' sources by installing guards, which needs
    a trace under way (``RuntimeError: TracingContext.get() must be called within an ongoing trace``): where it says
    so, the load runs again inside an empty tracing context, whose guards are thrown away (the artifact's own guards
    come from its saved state)."""
    from torch._guards import TracingContext, tracing  # noqa: PLC0415 - loaded by the first compile anyway

    with path.open("rb") as file, aot_compile_enabled():
        try:
            return torch.compiler.load_compiled_function(file)
        except RuntimeError as error:
            if "TracingContext" not in str(error):
                raise
        file.seek(0)
        with tracing(TracingContext(None)):
            return torch.compiler.load_compiled_function(file)


def ahead_folder(function: Callable[..., Any], options: dict[str, Any] | None) -> Path:
    """Where the artifacts of ``function`` (a bound method) live: one folder per function, torch version, package
    sources and compile options, inside the compile cache; the guards of each artifact tell its inputs apart."""
    key = repr((function.__qualname__, torch.__version__, sources_digest(), sorted((options or {}).items())))
    return use_compile_cache() / _FOLDER / f"{function.__name__}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


class AheadCompiled:
    """``function`` (a bound method of the engine) compiled ahead of time, its artifacts saved and loaded.

    Args:
        function: the bound method to compile; its instance is passed to the artifacts as their first argument.
        options: Inductor's options, as for ``torch.compile``.
        folder: where its artifacts are kept (default ``ahead_folder``, found at the first call).
        dynamic: ``torch.compile``'s ``dynamic``, for the artifacts and for plain compiling alike.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        options: dict[str, Any] | None = None,
        folder: Path | None = None,
        dynamic: bool | None = None,
    ):
        self.function = function
        self.options = options
        self.folder = folder
        self.dynamic = dynamic
        self.artifacts: list[Any] | None = None  # loaded at the first call
        self.fallback: Callable[..., Any] | None = None  # plain torch.compile, where compiling ahead failed
        self.loaded = self.compiled = 0  # how many artifacts came from disk, and were compiled here

    def __call__(self, *args: Any) -> Any:
        if self.artifacts is None:
            self.artifacts = self._load()
        if self.fallback is not None:
            return self.fallback(*args)
        owner = self.function.__self__  # type: ignore[attr-defined]
        for artifact in self.artifacts:
            if artifact.guard_check(owner, *args):
                return artifact(owner, *args)
        artifact, reason = None, f"torch {torch.__version__} has no torch.compile(...).aot_compile"
        with aot_compile_enabled():
            options = {**(self.options or {}), "guard_filter_fn": savable_guards}  # torch.compile pops the filter
            compiling = torch.compile(self.function, fullgraph=True, dynamic=self.dynamic, options=options)
            if hasattr(compiling, "aot_compile"):
                try:
                    artifact = compiling.aot_compile((args, {}))
                except Exception as error:  # noqa: BLE001 - any failure to compile ahead leaves plain torch.compile
                    reason = f"{type(error).__name__}: {error}"
        if artifact is None:
            return self._give_up(reason, args)
        self._save(artifact)
        self.artifacts.append(artifact)
        self.compiled += 1
        COUNTS["compiled"] += 1
        return artifact(owner, *args)

    def _give_up(self, reason: str, args: tuple[Any, ...]) -> Any:
        """Say once why this function cannot be compiled ahead, remember it on disk, and answer with plain compiling."""
        self._unsupported(reason, "it compiles as usual, traced again in every run")
        self.fallback = self._plain()
        COUNTS["as usual"] += 1
        return self.fallback(*args)

    def _plain(self) -> Callable[..., Any]:
        """Plain ``torch.compile``, where this function cannot be compiled ahead."""
        return torch.compile(self.function, dynamic=self.dynamic, options=self.options)

    def _unsupported(self, reason: str, then: str) -> None:
        """Say once why this function cannot be compiled ahead, and what happens ``then``; remember it on disk, so
        that later runs compile as usual without trying again (a failed attempt traces the function once more)."""
        rank_zero_info(
            f"compile ahead: {self.function.__name__} cannot be compiled ahead here ({reason}); {then} "
            f"(delete {self.folder} to try again)"
        )
        assert self.folder is not None
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / _UNSUPPORTED).write_text(reason + "\n")

    def _load(self) -> list[Any]:
        if self.folder is None:
            self.folder = ahead_folder(self.function, self.options)
        if (self.folder / _UNSUPPORTED).exists():
            self.fallback = self._plain()
            COUNTS["as usual"] += 1
            return []
        artifacts = []
        for path in sorted(self.folder.glob("*.bin")):
            try:
                artifacts.append(load_artifact(path))
            except Exception as error:  # noqa: BLE001 - a stale or damaged artifact is skipped, not fatal
                rank_zero_info(f"compile ahead: skipped {path} ({type(error).__name__}: {error})")
        self.loaded = len(artifacts)
        COUNTS.update(loaded=self.loaded)
        return artifacts

    def _save(self, artifact: Any) -> None:
        assert self.folder is not None  # set by _load, before any compile
        self.folder.mkdir(parents=True, exist_ok=True)
        if len(list(self.folder.glob("*.bin"))) >= MAX_ARTIFACTS:
            rank_zero_info(
                f"compile ahead: {self.folder} holds {MAX_ARTIFACTS} artifacts already; this one serves this run only "
                "(inputs that differ from run to run? delete the folder to start again)"
            )
            return
        path = self.folder / f"{uuid.uuid4().hex}.bin"  # unique: the ranks of a data-parallel run may save at once
        try:
            with aot_compile_enabled():
                artifact.save_compiled_function(str(path))  # written atomically
        except Exception as error:  # noqa: BLE001 - an unsaved artifact still serves this run
            rank_zero_info(f"compile ahead: could not save {self.function.__name__} ({type(error).__name__}: {error})")
            return
        try:  # what a later run will do: an artifact that does not load would be compiled again in every run
            load_artifact(path)
        except Exception as error:  # noqa: BLE001 - this run keeps the artifact it has; later runs compile as usual
            path.unlink(missing_ok=True)
            reason = f"a saved artifact does not load ({type(error).__name__}: {error})"
            self._unsupported(reason, "later runs compile it as usual")
