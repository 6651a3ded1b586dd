"""``DDPStrategy``: Lightning's, with ``DistributedDataParallel`` built on the stream that trains.

Lightning 2.6.6 builds ``DistributedDataParallel`` inside ``torch.cuda.stream(torch.cuda.Stream())``
(``lightning/pytorch/strategies/ddp.py``, ``DDPStrategy._setup_model``). DDP's reducer then takes, and keeps, each
parameter's gradient accumulator (its ``AccumulateGrad`` node), which records the stream current when it is made:
that side stream. Every backward afterwards runs on the default stream, so torch (2.10 and later) warns at each
parameter that "the AccumulateGrad node's stream does not match the stream of the node that produced the incoming
gradient" and makes the side stream wait for the default one. Lightning fixed it after 2.6.6
(Lightning-AI/pytorch-lightning#21746: the default stream, unless a CUDA graph is being captured); this is the same
change for the Lightning installed here.

``tests/test_ddp_stream.py`` (CUDA only) runs a data-parallel fit with Lightning's strategy and with this one and
counts the warnings: some and none on an H200 (docs/SCALING.md). The CLI gives it for ``--trainer.strategy ddp``.
"""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import DDPStrategy as LightningDDPStrategy
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel

__all__ = ["DDPStrategy"]


class DDPStrategy(LightningDDPStrategy):
    """Lightning's ``DDPStrategy`` (the same arguments), building ``DistributedDataParallel`` on the current stream
    (the default stream, where Lightning's training steps run) instead of a side stream."""

    def _setup_model(self, model: Module) -> DistributedDataParallel:
        device_ids = self.determine_ddp_device_ids()
        if device_ids is None or torch.cuda.is_current_stream_capturing():
            return super()._setup_model(model)  # on the CPU no stream; a whole-network capture wants the side stream
        return DistributedDataParallel(module=model, device_ids=device_ids, **self._ddp_kwargs)
