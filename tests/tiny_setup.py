"""Small building blocks shared by the tests (importable because pytest puts tests/ on the path)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from units_lightning.data import SyntheticGlyphsDataModule
from units_lightning.module import UnitsMAML

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
# Options that shrink the quick start to seconds: tiny images, a narrow net, few validation tasks.
TINY_QUICKSTART = [
    "--trainer.max_epochs=2",
    "--trainer.log_every_n_steps=1",
    "--trainer.enable_progress_bar=false",
    "--model.filters=4",
    "--model.inner_steps=1",
    "--data.image_size=16",
    "--data.val_tasks=4",
    "--data.eval_batch_tasks=2",
    "--data.train_classes=40",
    "--data.eval_classes=10",
    "--data.images_per_class=12",
]
SHARED_DATA = Path(os.environ.get("UNITS_LIGHTNING_SHARED_DATA", REPO.parent / "shared" / "data"))


def tiny_data(sampler, **kwargs) -> SyntheticGlyphsDataModule:
    """A small glyph data module: 5-way 1-shot, 16x16 images, kept small so a step takes milliseconds."""
    options = dict(
        n_way=5,
        k_shot=1,
        query_shots=1,
        eval_query_shots=2,
        val_tasks=4,
        test_tasks=4,
        eval_batch_tasks=2,
        train_classes=40,
        eval_classes=10,
        images_per_class=12,
        image_size=16,
    )
    options.update(kwargs)
    return SyntheticGlyphsDataModule(sampler=sampler, **options)


def tiny_model(**kwargs) -> UnitsMAML:
    options = dict(n_way=5, image_shape=(1, 16, 16), filters=4, inner_steps=1, inner_lr=0.2, lr=0.005)
    options.update(kwargs)
    return UnitsMAML(**options)


def tiny_trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    options = dict(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        limit_train_batches=1000,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        inference_mode=False,
        default_root_dir=tmp_path,
    )
    options.update(kwargs)
    return pl.Trainer(**options)


LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "RANK", "WORLD_SIZE")
LAUNCHER_VARIABLES += ("GROUP_RANK", "SLURM_NTASKS")  # torchrun's group, SLURM's task count
"""What an enclosing launch (torchrun, SLURM, Lightning) sets: left out of what a test's own processes inherit."""


def unlaunched_environment() -> dict[str, str]:
    """This process's environment without ``LAUNCHER_VARIABLES``: a process a test starts begins as from a shell."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}


def cli_environment(cache: Path) -> dict[str, str]:
    """``unlaunched_environment`` for a ``units_lightning`` command a test starts: ``tests`` importable (for its
    callbacks), one thread per process, the decoded-image cache in ``cache``."""
    environment = unlaunched_environment()
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), environment.get("PYTHONPATH")]))
    environment.update(OMP_NUM_THREADS="1", UNITS_LIGHTNING_CACHE=str(cache))
    return environment


def finish_or_kill(process: subprocess.Popen, timeout: float, what: str) -> tuple[str, str]:
    """The (stdout, stderr) of ``process``, started in its own session, once it ends; past ``timeout`` seconds its
    whole process group is killed (a rank left waiting in a collective would outlive the test) and the test fails
    with the end of its output."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{what} ran past {timeout} s (killed):\n{(stderr or stdout or '')[-4000:]}") from None


# The end of every two-rank script: both ranks meet, then each destroys its process group before the interpreter
# exits. Scripts that exited with their group alive now and then failed with "terminate called without an active
# exception" and nothing else (tests/test_distributed.py on 2 CPU cores: 3 times in 10 minutes on 2026-11-28, 1 of 15
# and 1 of 30 runs on 2026-11-28/29; with this teardown 0 of 30 run in turn with those 30): C++ threads of a live
# process group torn down at exit are the likely cause. The `units-lightning` command destroys its group itself
# (cli/launch.py).
TEARDOWN = """
import torch.distributed as _distributed
if _distributed.is_available() and _distributed.is_initialized():
    _distributed.barrier()
    _distributed.destroy_process_group()
"""


def run_two_rank_script(tmp_path: Path, script: str, timeout: float = 300) -> dict[int, dict]:
    """Run a two-process DDP script (``{tests}`` is replaced by this folder) and read each rank's result.

    Each rank writes ``result_<rank>.json`` in the working folder: lines that two processes print to one pipe
    can interleave. The script runs in its own process group, killed whole after ``timeout`` seconds (a rank
    left waiting in a collective would otherwise outlive the test), and without the launcher variables of an
    enclosing run (``torchrun``, SLURM), so that Lightning starts both ranks itself on a free port.
    """
    path = tmp_path / "ddp_script.py"
    path.write_text(script.format(tests=str(REPO / "tests")) + TEARDOWN)
    env = unlaunched_environment()
    process = subprocess.Popen(
        [sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
    )
    _, stderr = finish_or_kill(process, timeout, "the two-rank script")
    assert process.returncode == 0, f"exit status {process.returncode}:\n{stderr[-3000:]}"
    results = {r["rank"]: r for r in (json.loads(p.read_text()) for p in tmp_path.glob("result_*.json"))}
    assert set(results) == {0, 1}
    return results


class SigkillAtStep(Callback):
    """Kill the process, without any chance to clean up, when ``step`` optimizer steps are done."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
