import os

import torch

# Tests never talk to the W&B servers.
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_MODE", "offline")
torch.set_num_threads(min(2, torch.get_num_threads()))
