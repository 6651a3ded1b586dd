"""Checkpoint files from anywhere: read without running code, and checked against the model they are loaded into.

``load_checkpoint`` reads a file the way Lightning reads ``--ckpt_path`` (``torch.load(weights_only=True)``): tensors,
numbers, strings and containers only, so a file that carries a pickled call (``os.system``, ...) is refused before
anything in it runs. ``check_shapes`` turns PyTorch's ``size mismatch for ...`` into a message that names each
parameter, both shapes and the option to change.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["check_shapes", "load_checkpoint"]

_SHOWN = 6  # parameters listed in a shape-mismatch message


def _why_refused(path: Path, error: Exception) -> str:
    """The globals the file would import (read from its pickle opcodes, nothing run), else the unpickler's reason."""
    try:
        names = list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # not a torch.save zip file: fall back to what the unpickler said
        names = []
    if names:
        return f"it needs {', '.join(names)}"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reasons = [line for line in lines if re.search(r"GLOBAL|Unsupported|load key", line)] or lines[-1:]
    return f"the weights-only reader stopped at: {reasons[0][:200]}" if reasons else "it holds more than weights"


def load_checkpoint(path: str | Path, leave_out: str = "delete it") -> dict[str, Any]:
    """Read a checkpoint file without running any code from it, as Lightning reads ``--ckpt_path``.

    Args:
        path: the ``.ckpt`` file.
        leave_out: how to go on without the file, for the error message (e.g. "remove it from the folder").

    Returns:
        The checkpoint's dictionary.

    Raises:
        ValueError: the file needs more than weights to load (a pickled class or call: refused, nothing of it
            ran), or it is not a checkpoint file that ``torch.save`` wrote; the message names the file and how to
            proceed.
    """
    path = Path(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"refused to load checkpoint {path}: it is not weights-only ({_why_refused(path, error)}). Unpickling it "
            f"could run code, so nothing in it was run. If you do not know where it came from, {leave_out}. If you "
            "made it and trust it, allow those classes for the load (`with torch.serialization.safe_globals([...]):` "
            "around it), or save it again holding plain values only (what the units-lightning command writes)."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise ValueError(
            f"cannot read checkpoint {path}: {error}. It is truncated or not a file that torch.save wrote: "
            f"{leave_out}, or save it again."
        ) from error
    if not isinstance(checkpoint, dict):
        raise ValueError(
            f"checkpoint {path} holds a {type(checkpoint).__name__}, not a Lightning checkpoint's dictionary: "
            f"{leave_out}"
        )
    return checkpoint


def _filters(saved: int, model: int) -> str:
    return f"filters: the checkpoint has {saved} per conv layer, the model {model}: set model.filters to {saved}"


def _fix(key: str, saved: tuple[int, ...], model: tuple[int, ...]) -> str:
    """Which option makes parameter ``key`` of the default ``ConvNet`` and engines take the checkpoint's shape."""
    rates = re.search(r"(^|\.)inner_lr\.rates\.(\w+)$", key)
    if rates:  # one rate per layer and step: shape (1,); per parameter: the parameter's shape
        if (saved == (1,)) != (model == (1,)):
            mode = "per_layer_per_step" if saved == (1,) else "per_parameter"
            return f"learned inner-loop rates: the checkpoint's are {mode}: set model.inner_lr_mode to {mode}"
        return _fix("model." + rates.group(2).replace("__", "."), saved, model)  # they follow the weights' shapes
    if key.endswith(("classifier.weight", "classifier.bias")) and saved and model:
        if saved[0] != model[0]:
            return (
                f"classes per task: the checkpoint is {saved[0]}-way, the model {model[0]}-way: set data.n_way to "
                f"{saved[0]} (the units-lightning command links it into model.n_way; for predict, data.support needs "
                f"{saved[0]} class folders)"
            )
        return (
            "classifier inputs (filters x image height x width after pooling): set model.filters and the image size "
            "(data.image_size, linked into model.image_shape) to the ones the checkpoint was trained with"
        )
    conv = re.search(r"convs\.(\d+)\.(weight|bias)$", key)
    if conv and len(saved) == len(model) and saved[0] != model[0]:
        return _filters(saved[0], model[0])
    if conv and conv.group(1) == "0" and len(saved) == len(model) == 4 and saved[1] != model[1]:
        return (
            f"image channels: the checkpoint takes {saved[1]}-channel images, the model {model[1]}-channel: use data "
            f"of {saved[1]} channel(s) (model.image_shape is linked from the data; predict folders: data.channels)"
        )
    if conv and len(saved) == len(model) == 4 and saved[1] != model[1]:
        return _filters(saved[1], model[1])
    if re.search(r"norms\.\d+\.(weight|bias)$", key) and saved and model:
        if saved[:-1] != model[:-1]:
            pairs = saved[0] if len(saved) == 2 else 1
            return (
                f"per-step batch norm: the checkpoint holds {pairs} weight pair(s) per layer: set model.per_step_bn "
                f"to {str(pairs > 1).lower()}"
                + (f" and max(model.inner_steps, model.eval_inner_steps) to {pairs - 1}" if pairs > 1 else "")
            )
        return _filters(saved[-1], model[-1])
    return (
        f"{key}: set the options that build this layer (model.backbone, model.filters, the data's image shape) to "
        "the ones the checkpoint was trained with"
    )


def check_shapes(model_state: Mapping[str, Any], saved_state: Mapping[str, Any], source: str) -> None:
    """Refuse a checkpoint whose parameters have other shapes than the model's, naming the options to change.

    Only parameters present in both are compared (missing and unexpected names are ``load_state_dict``'s to
    report, under its own ``strict``).

    Args:
        model_state: the model's ``state_dict()``.
        saved_state: the checkpoint's ``state_dict``, with the same key prefixes.
        source: what to call the checkpoint in the message (e.g. ``"checkpoint runs/x/last.ckpt"``).

    Raises:
        ValueError: some shapes differ; the message lists each parameter with the checkpoint's and the model's
            shape, and the option that sets it.
    """
    differ = []
    for key, value in model_state.items():
        saved = saved_state.get(key)
        if hasattr(saved, "shape") and hasattr(value, "shape") and tuple(saved.shape) != tuple(value.shape):
            differ.append((key, tuple(saved.shape), tuple(value.shape)))
    if not differ:
        return
    lines = [f"  {key}: checkpoint {saved}, model {model}" for key, saved, model in differ[:_SHOWN]]
    if len(differ) > _SHOWN:
        lines.append(f"  ... and {len(differ) - _SHOWN} more")
    fixes = dict.fromkeys(_fix(key, saved, model) for key, saved, model in differ)
    if any(fix.startswith("filters:") for fix in fixes):  # the classifier's inputs follow the filters
        fixes = {fix: None for fix in fixes if not fix.startswith("classifier inputs")}
    raise ValueError(
        f"{source} does not fit the configured model: {len(differ)} parameter(s) have other shapes\n"
        + "\n".join(lines)
        + "\nConfigure the model as the checkpoint was trained:\n"
        + "\n".join(f"  - {fix}" for fix in fixes)
    )
