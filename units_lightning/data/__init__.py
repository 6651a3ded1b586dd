"""Few-shot image data: class-indexed image collections and the episodic DataModules."""

from units_lightning.data.datamodules import (
    CIFARFSDataModule,
    FewShotImageFolderDataModule,
    MiniImageNetDataModule,
    OmniglotDataModule,
    SyntheticGlyphsDataModule,
)
from units_lightning.data.datasets.images import FewShotImages, RotatedClasses, TensorImages
from units_lightning.data.episodic import EpisodicDataModule
from units_lightning.data.prediction import FolderPredictionDataModule
from units_lightning.episode import EpisodeIndices, EpisodeSpec, SealedLabels, TaskBatch

__all__ = [
    "CIFARFSDataModule",
    "EpisodeIndices",
    "EpisodeSpec",
    "EpisodicDataModule",
    "FewShotImageFolderDataModule",
    "FewShotImages",
    "FolderPredictionDataModule",
    "MiniImageNetDataModule",
    "OmniglotDataModule",
    "RotatedClasses",
    "SealedLabels",
    "SyntheticGlyphsDataModule",
    "TaskBatch",
    "TensorImages",
]
