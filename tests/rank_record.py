"""``RecordRank``: a callback that a test adds to a ``units-lightning fit`` started in other processes (torchrun), so
that each rank leaves what it ended with: its place, its weights' digest, its step and its label ledger."""

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


def weights_digest(module: pl.LightningModule) -> str:
    return hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in module.parameters())).hexdigest()


class RecordRank(Callback):
    """Write ``rank_<global rank>.json`` into ``folder`` when training ends (on every rank).

    Args:
        folder: where the records go (one folder for every node of the test).
    """

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.initial: str | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.initial = weights_digest(pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        record = {
            "global_rank": trainer.global_rank,
            "node_rank": trainer.node_rank,
            "local_rank": trainer.local_rank,
            "world_size": trainer.world_size,
            "environment": type(trainer.strategy.cluster_environment).__name__,
            "torchrun": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK")},
            "lightning_children": len(getattr(trainer.strategy.launcher, "procs", None) or []),
            "initial": self.initial,
            "weights": weights_digest(pl_module),
            "global_step": trainer.global_step,
            "ledger": pl_module.ledger.state_dict(),
            "val_acc": float(trainer.callback_metrics["val/acc"]),
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank_{trainer.global_rank}.json").write_text(json.dumps(record))


class FailOnRank(Callback):
    """Raise when training starts on global rank ``rank``: a rank that fails while the others train.

    Args:
        rank: the global rank that fails.
    """

    def __init__(self, rank: int):
        self.rank = rank

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank == self.rank:
            raise RuntimeError(f"rank {self.rank} fails on purpose")


class SigkillRankZero(Callback):
    """Write each rank's process id into ``folder`` when training starts; at optimizer step ``step`` kill rank 0 with
    SIGKILL (no chance to clean up, as the OOM killer) while the other ranks sleep for a minute, as a rank blocked in
    a collective that never hears of it (NCCL's wait; gloo's would notice the closed connection).

    Args:
        folder: where ``pid_<global rank>`` files go.
        step: the step at which rank 0 is killed.
    """

    def __init__(self, folder: str, step: int = 2):
        self.folder, self.step = Path(folder), step

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"pid_{trainer.global_rank}").write_text(str(os.getpid()))

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            if trainer.global_rank == 0:
                time.sleep(1.0)  # the other ranks are asleep by now
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60.0)
