"""The compiler's caches kept across runs: ``torch.compile`` paid once per machine, not once per run.

Inductor (``torch.compile``'s compiler) caches what it compiled, keyed on the traced graph, the inputs' shapes
and dtypes, the device, and the versions of torch and Triton: the FX-graph cache (generated and built kernels)
and the AOTAutograd cache (the forward and backward graphs), Triton's kernels beside them. By default it keeps
them in ``/tmp/torchinductor_<user>``, which a reboot (or a fresh cloud machine) wipes, so every run compiled
from scratch (about two minutes for the inner loop of ``capture: compile`` on a GPU). ``use_compile_cache``
points them at a folder that lasts, before the first compile of the process:

1. ``$UNITS_LIGHTNING_COMPILE_CACHE``, when set and not empty;
2. a ``TORCHINDUCTOR_CACHE_DIR`` of your own (anything but torch's ``/tmp`` default, which importing
   ``torch._dynamo`` writes into the environment);
3. ``$UNITS_LIGHTNING_CACHE/inductor``, else ``~/.cache/units-lightning/inductor``: beside the decoded
   datasets (``units_lightning.data.io.archive.default_cache_dir``).

Deleting the folder is always safe (the next compile fills it again); entries of other torch versions are never
read, only left behind. ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`` turns every cache off (torch's switch).

A fit that compiled also leaves a record in ``<folder>/units-lightning-compiled/``: one small JSON file per run
signature (``run_signature``: the torch version, this package's sources, the device, the model's options and
parameter shapes, the episode shapes). ``capture="auto"`` reads it: a run too short to pay for a compile from
scratch still compiles where the same signature compiled before, since Inductor then loads its kernels from the
cache in seconds (``captured_step.auto_capture``). A record whose cache was deleted costs one compile from scratch.
Such a run that finds no record for its signature starts a background fit that compiles it and writes the record, for
the next run (``units_lightning.cli.compile_next``; its files lie beside the records).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

__all__ = [
    "COMPILE_CACHE_VARIABLE",
    "compile_cache_directory",
    "compiled_before",
    "record_compiled",
    "records_directory",
    "run_signature",
    "sources_digest",
    "use_compile_cache",
]

COMPILE_CACHE_VARIABLE = "UNITS_LIGHTNING_COMPILE_CACHE"
_INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"
_TRITON = "TRITON_CACHE_DIR"
_RECORDS = "units-lightning-compiled"  # the runs that compiled, beside Inductor's own folders

_in_use: Path | None = None  # the folder this process compiles into, once set


def _torch_default() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def compile_cache_directory(environment: MutableMapping[str, str] | None = None) -> Path:
    """Where the compiler's caches go (the module docstring gives the order); not created.

    Args:
        environment: the variables to read (default ``os.environ``).
    """
    environment = os.environ if environment is None else environment
    configured = environment.get(COMPILE_CACHE_VARIABLE, "").strip()
    if configured:
        return Path(configured).expanduser().absolute()
    own = environment.get(_INDUCTOR, "").strip()
    if own and os.path.abspath(own) != _torch_default():
        return Path(own).expanduser().absolute()
    root = environment.get("UNITS_LIGHTNING_CACHE", "").strip()
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "units-lightning").absolute() / "inductor"


def use_compile_cache() -> Path:
    """Point Inductor's and Triton's caches at ``compile_cache_directory()`` and make sure the FX-graph and
    AOTAutograd caches are on; once per process (later calls return the same folder), logged once on rank 0.

    Call it before the process compiles anything (``BatchedEngine`` does, where it calls ``torch.compile``):
    Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` at each compile, so a compile before it went to the other folder.
    A ``TRITON_CACHE_DIR`` already set is kept. Processes that share the folder (the ranks of a data-parallel run,
    runs side by side) are safe: entries are written to a temporary file and renamed.

    Returns:
        The folder, created.
    """
    global _in_use
    if _in_use is not None:
        return _in_use
    directory = compile_cache_directory()
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[_INDUCTOR] = str(directory)
    os.environ.setdefault(_TRITON, str(directory / "triton"))
    import torch._functorch.config
    import torch._inductor.config

    # On by default in recent torch; a TORCHINDUCTOR_FX_GRAPH_CACHE=0 of the user's still wins (a forcing variable).
    if hasattr(torch._inductor.config, "fx_graph_cache"):
        torch._inductor.config.fx_graph_cache = True
    if hasattr(torch._functorch.config, "enable_autograd_cache"):
        torch._functorch.config.enable_autograd_cache = True
    _in_use = directory
    rank_zero_info(f"compile cache: {directory} (delete it to recompile from scratch)")
    return directory


def _described(value: Any) -> Any:
    """``value`` as JSON: numbers, strings and None as they are, containers item by item, a class by its name, an
    object without attributes (a dtype) or a function by its repr, any other object as its type and its public
    attributes that are numbers, strings or None (a loss's options, a sampler's counts; not a module's train mode)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(key): _described(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_described(item) for item in value]
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"  # an engine class of one's own
    if not hasattr(value, "__dict__") or isinstance(value, functools.partial) or inspect.isroutine(value):
        return repr(value)  # a dtype, a device; a function's repr holds its address: never the same twice
    plain = (bool, int, float, str, type(None))
    attributes = {
        key: item
        for key, item in sorted(vars(value).items())
        if not key.startswith("_") and key != "training" and isinstance(item, plain)
    }
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}", **attributes}


@functools.cache
def sources_digest() -> str:
    """sha256 of this package's Python sources: another version of the library traces other graphs."""
    digest = hashlib.sha256()
    package = Path(__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def run_signature(parts: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A run's signature for the records of ``compiled_before``: (hex digest, the description it digests).

    Args:
        parts: what shapes the compiled graphs (``UnitsMAML.compile_signature`` gives the model's options and
            parameter shapes, the episode shapes and the device); the torch version and a digest of this package's
            sources are added.
    """
    import torch

    description = {"torch": torch.__version__, "units_lightning_sources": sources_digest()[:16], **_described(parts)}
    text = json.dumps(description, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32], description


def records_directory(environment: MutableMapping[str, str] | None = None) -> Path:
    """The folder of the records of ``compiled_before`` (and of ``cli.compile_next``'s files), in the compile cache."""
    return compile_cache_directory(environment) / _RECORDS


def _record(signature: str, environment: MutableMapping[str, str] | None = None) -> Path:
    return records_directory(environment) / f"{signature}.json"


def compiled_before(signature: str, environment: MutableMapping[str, str] | None = None) -> bool:
    """Whether a fit of this signature compiled into this machine's compile cache (``record_compiled``); False where
    the folder cannot be read."""
    try:
        return _record(signature, environment).is_file()
    except OSError:
        return False


def record_compiled(
    signature: str, description: Mapping[str, Any], environment: MutableMapping[str, str] | None = None
) -> Path:
    """Note that a fit of ``signature`` compiled into the compile cache; the file holds ``description``. Written
    atomically (runs side by side may record at once); returns its path."""
    from units_lightning.atomic import write_text_atomically

    path = _record(signature, environment)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(dict(description), indent=1, sort_keys=True, default=repr) + "\n")
    return path
