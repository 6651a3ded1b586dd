"""Files written whole or not at all, for the annotation files: the package's one writer, ``units_lightning.atomic``."""

from __future__ import annotations

from units_lightning.atomic import write_text_atomically

__all__ = ["write_text_atomically"]
