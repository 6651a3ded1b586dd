"""Image bytes to uint8 pixels of a fixed shape, with errors that name the file."""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from PIL import Image

# The authors' code resizes photos with PIL's default filter (bicubic, antialiased when shrinking).
DEFAULT_RESAMPLE = Image.Resampling.BICUBIC


def decode_image(
    data: bytes,
    location: str,
    image_shape: Sequence[int],
    resample: Image.Resampling = DEFAULT_RESAMPLE,
    fix: str = "re-download the dataset",
) -> np.ndarray:
    """Decode one image file into a (C, H, W) uint8 array.

    Colour images become grey with PIL's ITU-R 601-2 luma (``convert("L")``) where ``C`` is 1, and grey
    ones are replicated to RGB where ``C`` is 3; palette and alpha images are flattened the same way.

    Args:
        data: the file's bytes (PNG, JPEG, ... anything PIL reads).
        location: the file, for error messages.
        image_shape: (channels, height, width) with channels 1 or 3.
        resample: the PIL filter used when the size differs.
        fix: what to tell the user to do when the file is corrupt.

    Returns:
        (C, H, W) uint8.

    Raises:
        ValueError: the bytes are not a decodable image (the message names ``location``), or ``image_shape``
            asks for other than 1 or 3 channels.

    Example:
        >>> buffer = io.BytesIO()
        >>> Image.new("RGB", (4, 2), (255, 0, 0)).save(buffer, format="PNG")
        >>> decode_image(buffer.getvalue(), "red.png", (1, 2, 4))[0, 0].tolist()
        [76, 76, 76, 76]
    """
    channels, height, width = (int(n) for n in image_shape)
    if channels not in (1, 3):
        raise ValueError(f"images must have 1 (grey) or 3 (RGB) channels, got image_shape {tuple(image_shape)}")
    try:
        with Image.open(io.BytesIO(data)) as image:
            converted = image.convert("L" if channels == 1 else "RGB")
    except Exception as error:  # PIL reports bad data as OSError, SyntaxError, ValueError, zlib.error, ...
        raise ValueError(
            f"cannot decode {location}: the file is corrupt ({error}). {fix[:1].upper()}{fix[1:]}, or delete "
            "the file (or its archive) and load again."
        ) from error
    if converted.size != (width, height):
        converted = converted.resize((width, height), resample)
    pixels = np.asarray(converted, dtype=np.uint8)
    return pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)
