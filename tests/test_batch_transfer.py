"""A meta-batch moves to the GPU without making the host wait: every part of a pinned batch is copied asynchronously.

Lightning passes ``non_blocking=True`` only to tensors; the sealed query labels move through their own ``to``, which
must ask for the asynchronous copy itself. A blocking copy there synchronised every training step with the GPU
(found with ``torch.cuda.set_sync_debug_mode`` on an H200: one synchronisation per step, in ``SealedLabels.to``).
"""

import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from units_lightning.episode import SealedLabels, TaskBatch


class RecordingLabels:
    """Stands in for a label tensor: records how it was asked to move."""

    shape = torch.Size([2, 3, 5])

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self.calls = []

    def is_pinned(self) -> bool:
        return self.pinned

    def to(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self


def batch(labels) -> TaskBatch:
    return TaskBatch(
        torch.zeros(2, 5, 1, 2, 2),
        torch.zeros(2, 5, dtype=torch.long),
        torch.zeros(2, 3, 5, 1, 2, 2),
        SealedLabels(labels),
        torch.zeros(2, 5, dtype=torch.long),
    )


def test_pinned_labels_are_copied_without_blocking_the_host():
    labels = RecordingLabels(pinned=True)
    move_data_to_device(batch(labels), torch.device("cpu"))  # Lightning's own transfer of a batch
    assert labels.calls == [((torch.device("cpu"),), {"non_blocking": True})]


def test_labels_in_pageable_memory_move_as_asked():
    labels = RecordingLabels(pinned=False)
    move_data_to_device(batch(labels), torch.device("cpu"))
    assert labels.calls == [((torch.device("cpu"),), {})]


def test_an_explicit_blocking_copy_is_kept():
    labels = RecordingLabels(pinned=True)
    SealedLabels(labels).to("cpu", non_blocking=False)
    assert labels.calls == [(("cpu",), {"non_blocking": False})]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_pinned_batch_reaches_the_gpu_without_a_synchronisation():
    labels = torch.arange(30).reshape(2, 3, 5)
    pinned = batch(labels).pin_memory()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moved = move_data_to_device(pinned, torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert moved.query_y._labels.device.type == "cuda"
    assert torch.equal(moved.query_y._labels.cpu(), labels)
