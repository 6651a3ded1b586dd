"""A project's image files as the model sees them: decoded, converted and resized like the training data."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from units_lightning.annotation.layout import AnnotationProject
from units_lightning.data.io.decode import decode_image

__all__ = ["load_pixels", "to_float"]


def load_pixels(project: AnnotationProject, images: Sequence[str], image_shape: Sequence[int]) -> Tensor:
    """The images named ``images`` as one (n, C, H, W) uint8 tensor (grey or RGB, resized bicubic).

    Raises:
        ValueError: a file is missing or is not an image (the message names it).
    """
    channels, height, width = (int(n) for n in image_shape)
    pixels = np.empty((len(images), channels, height, width), dtype=np.uint8)
    for i, image in enumerate(images):
        path = project.path(image)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise ValueError(f"cannot read image {path}: {error}") from error
        pixels[i] = decode_image(data, str(path), image_shape, fix="replace the file")
    return torch.from_numpy(pixels)


def to_float(pixels: Tensor) -> Tensor:
    """uint8 pixels as float32 in [0, 1], as ``TensorImages.gather`` gives them without normalisation."""
    return pixels.float().div_(255.0)
