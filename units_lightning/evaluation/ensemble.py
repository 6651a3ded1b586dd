"""Ensembles of checkpoints: the top-k by validation accuracy, each adapted separately, logits averaged."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch import nn

from units_lightning.evaluation.checkpoints import check_shapes, load_checkpoint
from units_lightning.keys import ACC, VAL, stage_key

__all__ = ["CheckpointEnsemble", "RankedCheckpoint", "checkpoint_score", "load_engines"]

VAL_ACC = stage_key(VAL, ACC)


@dataclass(frozen=True)
class RankedCheckpoint:
    """A checkpoint file with the monitored score recorded when it was saved, and its global step."""

    path: Path
    score: float | None
    step: int


_MEMBER_KEYS = ("state_dict", "global_step", "callbacks")  # all that a member needs: weights, step and score


def _load(path: Path, leave_out: str) -> dict[str, Any]:
    """A member checkpoint read as ``--ckpt_path`` is (weights-only: a file that would run code is refused)."""
    checkpoint = load_checkpoint(path, leave_out)
    missing = [key for key in ("state_dict", "global_step") if key not in checkpoint]
    if missing:
        raise ValueError(f"checkpoint {path} is not a Lightning checkpoint (it has no {missing}): {leave_out}")
    return {key: checkpoint[key] for key in _MEMBER_KEYS if key in checkpoint}


def checkpoint_score(checkpoint: dict[str, Any], monitor: str = VAL_ACC) -> float | None:
    """The score of ``monitor`` that a ``ModelCheckpoint`` callback recorded when saving this checkpoint.

    Args:
        checkpoint: a loaded Lightning checkpoint.
        monitor: the monitored quantity.

    Returns:
        The score, or None when no ``ModelCheckpoint`` monitoring ``monitor`` saved a score in it.
    """
    for key, state in checkpoint.get("callbacks", {}).items():
        if str(key).startswith("ModelCheckpoint") and state.get("monitor") == monitor:
            score = state.get("current_score")
            if score is not None:
                return float(score)
    return None


class CheckpointEnsemble:
    """Which checkpoints to ensemble at test and predict time (the paper: top 3 by validation accuracy,
    top 1 for Omniglot).

    Every member adapts to each support set on its own (each has its own meta-learned initialisation); the
    adapted members' query logits are averaged, as the paper does. Averaging logits keeps the ensemble one
    evidential classifier (evidence = activation of the mean logits), so vacuity and dissonance are computed
    exactly as for one model.

    Args:
        checkpoints: a folder of ``.ckpt`` files (e.g. ``runs/.../checkpoints``) or a list of files.
        top_k: keep the k best by ``monitor`` (all when None). Scores are what ``ModelCheckpoint`` recorded in
            each file (``current_score``); files of the same global step (``last.ckpt`` beside a best one) count
            once.
        monitor: the validation quantity to rank by.
        mode: "max" or "min".

    Raises:
        ValueError: no checkpoint found, or ranking asked for but no file records ``monitor``.
    """

    def __init__(
        self,
        checkpoints: str | Sequence[str],
        top_k: int | None = None,
        monitor: str = VAL_ACC,
        mode: Literal["max", "min"] = "max",
    ):
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.checkpoints = checkpoints
        self.top_k, self.monitor, self.mode = top_k, monitor, mode

    def files(self) -> list[Path]:
        """The candidate files, sorted by name."""
        if isinstance(self.checkpoints, (str, Path)):
            source = Path(self.checkpoints)
            files = sorted(source.glob("*.ckpt")) if source.is_dir() else [source]
        else:
            files = [Path(c) for c in self.checkpoints]
        missing = [str(f) for f in files if not f.is_file()]
        if not files or missing:
            raise ValueError(f"CheckpointEnsemble: no checkpoint files at {self.checkpoints!r} (missing: {missing})")
        return files

    def rank(self) -> list[tuple[RankedCheckpoint, dict[str, Any]]]:
        """The chosen members, best first, each with its loaded checkpoint."""
        by_step: dict[int, tuple[RankedCheckpoint, dict[str, Any]]] = {}
        leave_out = (
            "take it out of the ensemble: remove it from the folder, or list the member files in ensemble.checkpoints"
        )
        for path in self.files():
            checkpoint = _load(path, leave_out)
            member = RankedCheckpoint(path, checkpoint_score(checkpoint, self.monitor), int(checkpoint["global_step"]))
            kept = by_step.get(member.step)
            # Of two files of one step (a best and last.ckpt) keep the one that is not "last".
            if kept is None or (kept[0].path.stem.startswith("last") and not path.stem.startswith("last")):
                by_step[member.step] = (member, checkpoint)
        members = list(by_step.values())
        if self.top_k is None:
            return members
        # A last.ckpt written at a step that did not improve carries the best score recorded before it, not its own:
        # it cannot be ranked (the shipped configs write one at every validation beside the best ones).
        members = [m for m in members if not m[0].path.stem.startswith("last")] or members
        unscored = [str(m.path) for m, _ in members if m.score is None]
        if unscored:
            raise ValueError(
                f"CheckpointEnsemble: cannot rank by {self.monitor!r}: no ModelCheckpoint monitoring it recorded a "
                f"score in {unscored}; list the files to ensemble instead of a folder with top_k"
            )
        members.sort(key=lambda m: m[0].score, reverse=self.mode == "max")
        return members[: self.top_k]

    def __repr__(self) -> str:
        return f"CheckpointEnsemble({self.checkpoints!r}, top_k={self.top_k}, monitor={self.monitor!r})"


def load_engines(
    template: nn.Module,
    checkpoints: Sequence[dict[str, Any]],
    prefix: str = "engine.",
    sources: Sequence[str] | None = None,
) -> list[nn.Module]:
    """Copies of ``template`` holding the weights under ``prefix`` of each checkpoint's ``state_dict``.

    Args:
        template: the configured model's engine.
        checkpoints: loaded checkpoints (``CheckpointEnsemble.rank``).
        prefix: where the engine's weights sit in a checkpoint's ``state_dict``.
        sources: the checkpoints' file names, for the messages.

    Raises:
        ValueError: a checkpoint does not fit the template (another architecture); the message names the file,
            each parameter with both shapes, and the option to change.
    """
    engines = []
    expected = {prefix + k: v for k, v in template.state_dict().items()}
    for index, checkpoint in enumerate(checkpoints):
        source = f"ensemble member {sources[index]}" if sources is not None else f"ensemble member {index}"
        check_shapes(expected, checkpoint["state_dict"], source)
        state = {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
        engine = copy.deepcopy(template)
        try:
            engine.load_state_dict(state)
        except RuntimeError as error:  # missing or unexpected parameters: another architecture
            raise ValueError(
                f"{source} does not fit the configured model: {error}. Configure the model as the checkpoint was "
                "trained (model.inner_lr_mode, model.per_step_bn, model.backbone), or leave it out of the ensemble"
            ) from error
        engine.eval()
        engines.append(engine)
    return engines
