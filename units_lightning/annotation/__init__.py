"""Labeling with people in the loop: the model picks the query sets people label next, and trains on the answers.

A project folder holds tasks, each with a labeled support set and unlabeled candidate query images
(``layout``); ``select`` scores candidate query sets by the training rule and writes an annotation batch
(``selection``, ``batch``), sent to Label Studio or labeled in a CSV (``label_studio``, ``answers``); ``ingest``
checks the answers, reconciles several annotators (``agreement``) and adds the complete query sets to the label
store, which also records the batches out (``ingest``, ``label_store``); ``ml_backend`` serves the model to Label
Studio (predictions, retraining on annotations); ``AnnotatedTasksDataModule``
trains on the supports and the labeled query sets so far. ``SimulatedAnnotator`` answers from a held-out key, so
that the loop runs unattended. See docs/ANNOTATION.md.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from units_lightning.lazy import lazy_exports

if TYPE_CHECKING:
    from units_lightning.annotation.annotator import SimulatedAnnotator
    from units_lightning.annotation.answers import CANT_TELL, Answer, read_answers
    from units_lightning.annotation.batch import AnnotationBatch, read_manifest, write_batch
    from units_lightning.annotation.datamodule import AnnotatedTasksDataModule
    from units_lightning.annotation.ingest import IngestError, IngestOutcome, ingest, ingest_answers, ingest_outcome
    from units_lightning.annotation.label_store import LabelStore
    from units_lightning.annotation.layout import AnnotationProject, AnnotationTask, load_project
    from units_lightning.annotation.selection import select_batch

# Public name -> the module that defines it, imported when the name is first read: a command imports only what it
# uses (``ingest`` no Lightning, ``select --help`` nothing heavy; docs/PERFORMANCE.md, "Start-up").
_LAZY = {
    "CANT_TELL": "units_lightning.annotation.answers",
    "AnnotatedTasksDataModule": "units_lightning.annotation.datamodule",
    "AnnotationBatch": "units_lightning.annotation.batch",
    "AnnotationProject": "units_lightning.annotation.layout",
    "AnnotationTask": "units_lightning.annotation.layout",
    "Answer": "units_lightning.annotation.answers",
    "IngestError": "units_lightning.annotation.ingest",
    "IngestOutcome": "units_lightning.annotation.ingest",
    "LabelStore": "units_lightning.annotation.label_store",
    "SimulatedAnnotator": "units_lightning.annotation.annotator",
    "ingest": "units_lightning.annotation.ingest",
    "ingest_answers": "units_lightning.annotation.ingest",
    "ingest_outcome": "units_lightning.annotation.ingest",
    "load_project": "units_lightning.annotation.layout",
    "read_answers": "units_lightning.annotation.answers",
    "read_manifest": "units_lightning.annotation.batch",
    "select_batch": "units_lightning.annotation.selection",
    "write_batch": "units_lightning.annotation.batch",
}

__all__ = [
    "CANT_TELL",
    "AnnotatedTasksDataModule",
    "AnnotationBatch",
    "AnnotationProject",
    "AnnotationTask",
    "Answer",
    "IngestError",
    "IngestOutcome",
    "LabelStore",
    "SimulatedAnnotator",
    "ingest",
    "ingest_answers",
    "ingest_outcome",
    "load_project",
    "read_answers",
    "read_manifest",
    "select_batch",
    "write_batch",
]


class _Package(types.ModuleType):
    """This package: its name ``ingest`` is the function, also once the submodule ``ingest`` is imported (which
    binds the submodule to the package's attribute of that name, as every import of a submodule does)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "ingest" and isinstance(value, types.ModuleType):
            value = value.ingest
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
