"""Splits kept on the GPU gather the same batches as on the CPU (the data module keeps them there on CUDA)."""

import pytest
import torch

from units_lightning.data.datasets.images import RotatedClasses, TensorImages


def collection() -> RotatedClasses:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (12, 1, 5, 5), dtype=torch.uint8, generator=generator)
    labels = torch.arange(12) // 3
    return RotatedClasses(TensorImages(images, labels, list("abcd"), mean=[0.5], std=[0.2]))


def test_a_collection_on_the_cpu_stays_itself():
    rotated = collection()
    assert rotated.to("cpu").base.images.data_ptr() == rotated.base.images.data_ptr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_collection_on_the_gpu_gathers_what_the_cpu_gathers():
    rotated = collection()
    on_gpu = rotated.to("cuda")
    indices = torch.randperm(len(rotated), generator=torch.Generator().manual_seed(1))
    assert on_gpu.base.images.is_cuda and not rotated.base.images.is_cuda  # the original is left as it was
    assert torch.equal(on_gpu.gather(indices).cpu(), rotated.gather(indices))
