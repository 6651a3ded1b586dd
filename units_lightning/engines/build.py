"""``build_engine``: the engine a ``UnitsMAML`` configuration asks for, by name or as a class (``class_path``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from torch import nn

from units_lightning.engines.batched import BatchedEngine
from units_lightning.engines.inner_lr import InnerLRMode
from units_lightning.engines.learn2learn import Learn2LearnEngine

__all__ = ["EngineFactory", "EngineName", "build_engine"]

EngineName = Literal["auto", "batched", "learn2learn"]

EngineFactory = Callable[[nn.Module], nn.Module]
"""An engine class, or a callable, that takes the backbone and returns the engine (``Engine``): in a config,
``class_path`` and the engine's ``init_args`` without the backbone, which ``UnitsMAML`` builds and hands over."""


def build_engine(
    backbone: nn.Module,
    engine: EngineName | EngineFactory = "auto",
    inner_lr: float = 0.1,
    inner_lr_mode: InnerLRMode = "fixed",
    inner_steps: int = 5,
    chunk_size: int | None = None,
    capture: Literal["auto", "none", "cuda_graph", "compile"] = "auto",
    compile_scoring: bool | Literal["auto"] = "auto",
    compile_inner: Literal["loop", "step"] = "loop",
    compile_channels_last: bool = False,
    compile_ahead: bool = False,
    compile_options: dict[str, Any] | None = None,
) -> nn.Module:
    """``Learn2LearnEngine`` for ``engine="learn2learn"``, ``BatchedEngine`` for "auto" and "batched" (see
    ``UnitsMAML`` for the options), else ``engine(backbone)``: an engine class or factory, configured by its own
    arguments (the options here configure the named engines only).

    Raises:
        ValueError: an unknown engine, or a batched-engine option asked of the learn2learn engine.
        TypeError: an engine built already (an engine takes the backbone that ``UnitsMAML`` builds), or a factory
            that returns no module.
    """
    if isinstance(engine, nn.Module):
        raise TypeError(
            f"engine={type(engine).__name__}(...) is built already: give its class (or functools.partial of it with "
            "its options), which UnitsMAML calls with the backbone; in a config, class_path and init_args"
        )
    if callable(engine):
        built = engine(backbone)
        if not isinstance(built, nn.Module):
            raise TypeError(f"engine {engine!r} returned a {type(built).__name__}, not an engine (an nn.Module)")
        return built
    if engine not in ("auto", "batched", "learn2learn"):
        raise ValueError(f"engine must be 'auto', 'batched' or 'learn2learn', or an engine class, got {engine!r}")
    if engine == "learn2learn":
        if capture not in ("auto", "none"):
            raise ValueError(f"capture={capture!r} applies to the batched engine: set model.engine=batched")
        if compile_inner != "loop":
            raise ValueError(f"compile_inner={compile_inner!r} applies to the batched engine: set model.engine=batched")
        for name, value in (
            ("compile_channels_last", compile_channels_last),
            ("compile_ahead", compile_ahead),
            ("compile_options", compile_options),
        ):
            if value:
                raise ValueError(f"{name} applies to the batched engine: set model.engine=batched")
        return Learn2LearnEngine(backbone, inner_lr, inner_lr_mode, inner_steps)
    return BatchedEngine(
        backbone,
        inner_lr,
        inner_lr_mode,
        inner_steps,
        chunk_size,
        capture,
        compile_scoring=compile_scoring,
        compile_inner=compile_inner,
        compile_channels_last=compile_channels_last,
        compile_ahead=compile_ahead,
        compile_options=compile_options,
    )
