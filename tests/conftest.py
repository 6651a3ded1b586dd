import os
import sys

import pytest
import torch

# Tests never talk to the W&B servers.
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_MODE", "offline")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _finish_wandb_runs():
    """Finish a W&B run a test left open (a command-line run's process exit does this): a run still open is
    reused by the next test's WandbLogger, whose rows then land in the earlier test's folder."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()
