"""Few-shot image data: class-indexed image collections and the episodic DataModules."""

from units_lightning.data.datamodule import EpisodicDataModule
from units_lightning.data.datamodules import (
    CIFARFSDataModule,
    FewShotImageFolderDataModule,
    MiniImageNetDataModule,
    OmniglotDataModule,
    SyntheticGlyphsDataModule,
)
from units_lightning.data.episode import EpisodeIndices, EpisodeSpec, SealedLabels, TaskBatch
from units_lightning.data.folder_prediction import FolderPredictionDataModule
from units_lightning.data.images import FewShotImages, RotatedClasses, TensorImages

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
