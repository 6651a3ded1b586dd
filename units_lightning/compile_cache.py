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
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info

__all__ = ["COMPILE_CACHE_VARIABLE", "compile_cache_directory", "use_compile_cache"]

COMPILE_CACHE_VARIABLE = "UNITS_LIGHTNING_COMPILE_CACHE"
_INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"
_TRITON = "TRITON_CACHE_DIR"

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
