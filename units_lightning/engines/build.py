"""``build_engine``: the engine a ``UnitsMAML`` configuration asks for."""

from __future__ import annotations

from typing import Literal

from torch import nn

from units_lightning.engines.batched import BatchedEngine
from units_lightning.engines.inner_lr import InnerLRMode
from units_lightning.engines.learn2learn import Learn2LearnEngine

__all__ = ["EngineName", "build_engine"]

EngineName = Literal["auto", "batched", "learn2learn"]


def build_engine(
    backbone: nn.Module,
    engine: EngineName = "auto",
    inner_lr: float = 0.1,
    inner_lr_mode: InnerLRMode = "fixed",
    inner_steps: int = 5,
    chunk_size: int | None = None,
    capture: Literal["auto", "none", "cuda_graph", "compile"] = "auto",
    compile_scoring: bool | Literal["auto"] = "auto",
) -> nn.Module:
    """``Learn2LearnEngine`` for ``engine="learn2learn"``, else ``BatchedEngine`` (see ``UnitsMAML`` for the options).

    Raises:
        ValueError: an unknown engine, or a batched-engine option asked of the learn2learn engine.
    """
    if engine not in ("auto", "batched", "learn2learn"):
        raise ValueError(f"engine must be 'auto', 'batched' or 'learn2learn', got {engine!r}")
    if engine == "learn2learn":
        if capture not in ("auto", "none"):
            raise ValueError(f"capture={capture!r} applies to the batched engine: set model.engine=batched")
        return Learn2LearnEngine(backbone, inner_lr, inner_lr_mode, inner_steps)
    return BatchedEngine(
        backbone, inner_lr, inner_lr_mode, inner_steps, chunk_size, capture, compile_scoring=compile_scoring
    )
