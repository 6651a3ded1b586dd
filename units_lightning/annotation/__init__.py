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

from units_lightning.annotation.annotator import SimulatedAnnotator
from units_lightning.annotation.answers import CANT_TELL, Answer, read_answers
from units_lightning.annotation.batch import AnnotationBatch, read_manifest, write_batch
from units_lightning.annotation.datamodule import AnnotatedTasksDataModule
from units_lightning.annotation.ingest import IngestError, IngestOutcome, ingest, ingest_answers, ingest_outcome
from units_lightning.annotation.label_store import LabelStore
from units_lightning.annotation.layout import AnnotationProject, AnnotationTask, load_project
from units_lightning.annotation.selection import select_batch

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
