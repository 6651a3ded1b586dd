"""The image collections (``FewShotImages`` and its kinds) and each dataset's loader, reading files through ``io``."""

from units_lightning.data.datasets.images import FewShotImages, RotatedClasses, TensorImages

__all__ = ["FewShotImages", "RotatedClasses", "TensorImages"]
