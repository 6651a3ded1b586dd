"""Compile a run for the next run of its kind, in the background: ``capture: auto`` paid once per machine.

A label-budget run (5,000 steps) is too short to pay for compiling from scratch (about 2 minutes on a GPU), so
``capture: auto`` steps it with CUDA graphs, unless a fit of the same ``compile_signature`` compiled on this machine
before: then the compiled kernels (and, under ``compile_ahead``, the compiled functions) load from the compile cache
in seconds, and each step is faster (``captured_step.WARM_COMPILE_MIN_STEPS``). Before, only a run started once with
``--model.capture compile`` made a machine warm, so running a config again as shipped never got faster.

``CompileForNextRun`` (added to every ``fit`` by the command line; ``--compile_for_next_run false`` leaves it out)
closes that loop: where a fit steps with CUDA graphs only because its signature never compiled here
(``UnitsMAML.compiles_once_warm``), it starts a second process, detached and at a lower priority, that runs the same
config compiled for a few steps past the sampler's warm-up (both branches of the step, before and after selection
starts), without the config's callbacks, validation, logger or checkpoints, on the same GPU. That fit records the
signature in the compile cache (``compile_cache.record_compiled``) and the next run of the config compiles from the
cache. The run in the foreground goes on as before; the two share the GPU while the other compiles. The background
fit outlives the run (about 2 minutes after a budget run on an H200), but a batch job or container that ends with the
run may end it too: the run says so at its end where it is still running, and the next run starts it again.

Its files, in the compile cache's records folder (``<compile cache>/units-lightning-compiled/``), named by the
signature: ``<signature>.yaml`` (the config it runs), ``<signature>.log`` (what it printed), ``<signature>.compiling``
while it runs (one at a time per signature: parallel runs of a sweep start it once; a marker whose process is gone
from this host, or one older than an hour from another host, is replaced), and ``<signature>.failed`` where
it ended without recording the signature (no compiler, or it failed: the log says); a run then does not try again
until that file is deleted.

    python -m units_lightning.cli.background_fit <signature> <config.yaml> [fit options ...]   # what the callback runs
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from units_lightning.compile_cache import records_directory

__all__ = [
    "BACKGROUND_FIT",
    "STALE_SECONDS",
    "CompileForNextRun",
    "Started",
    "child_options",
    "files_of",
    "marker_is_stale",
    "start",
]

BACKGROUND_FIT = "units_lightning.cli.background_fit"
"""The module the background process runs (``python -m``): the fit itself, and its markers settled after it."""

STALE_SECONDS = 3600.0
"""A ``.compiling`` marker older than this is taken as left from a process that did not end cleanly, where it cannot be
checked (written on another host sharing the cache): a later run starts the compile again. On the same host a marker
whose process is gone is stale at once (``marker_is_stale``)."""


def child_options(warmup_steps: int, device_index: int | None) -> list[str]:
    """The options the background fit adds to the run's config: compiled, ``warmup_steps + 4`` steps (the warm-up
    branch and the selecting one each compile in their first step), nothing validated, logged or kept, on the GPU of
    the run that started it (its files go to a temporary folder of its own, ``background_fit``).

    >>> child_options(100, 0)[:3]
    ['--model.capture=compile', '--trainer.max_steps=104', '--trainer.limit_val_batches=0']
    """
    options = [
        "--model.capture=compile",
        f"--trainer.max_steps={warmup_steps + 4}",
        "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.logger=false",
        "--trainer.accelerator=gpu",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=false",
        "--ckpt_path=null",
        "--dashboard_callbacks=false",
        "--compile_for_next_run=false",
    ]
    if device_index is not None:
        options.append(f"--trainer.devices=[{device_index}]")
    return options


class Files(NamedTuple):
    """A background fit's files in the records folder, named by its signature (the module says what each holds)."""

    config: Path
    log: Path
    compiling: Path
    failed: Path


def files_of(signature: str, environment: dict[str, str] | None = None) -> Files:
    """The files of ``signature``'s background fit: what ``start`` writes and ``background_fit`` settles."""
    folder = records_directory(environment)
    return Files(*(folder / f"{signature}.{suffix}" for suffix in ("yaml", "log", "compiling", "failed")))


class Started(NamedTuple):
    """What ``start`` did: a sentence for the run's log, and the process it started (None where it started none)."""

    said: str
    process: subprocess.Popen | None = None


def marker_is_stale(marker: Path, now: float | None = None) -> bool:
    """Whether a ``.compiling`` marker is left from a process that no longer runs: its process is gone from this host
    (a batch job's end killed it, say); where that cannot be checked (written on another host), whether the marker is
    older than ``STALE_SECONDS``."""
    try:
        pid, host = marker.read_text().split()
        if host == socket.gethostname():
            os.kill(int(pid), 0)  # raises where no such process runs
            return False  # it runs, whatever the marker's age
    except ProcessLookupError:
        return True
    except (OSError, ValueError):  # unreadable, still being written, or a process of another user: go by its age
        pass
    try:
        return (time.time() if now is None else now) - marker.stat().st_mtime >= STALE_SECONDS
    except FileNotFoundError:
        return True


def start(signature: str, config_text: str, options: list[str], environment: dict[str, str] | None = None) -> Started:
    """Start the background fit of ``signature`` (``python -m units_lightning.cli.background_fit``), unless one runs or
    failed."""
    config, log, marker, failed = files_of(signature, environment)
    if failed.is_file():
        return Started(f"an earlier background compile of this run failed ({failed}; delete it to try again)")
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        if not marker_is_stale(marker):
            return Started(f"another process compiles this run for the next one ({marker})")
        marker.unlink(missing_ok=True)  # left by a process that did not end cleanly
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    config.write_text(config_text)
    env = dict(os.environ if environment is None else environment)
    package_root = str(Path(__file__).resolve().parents[2])  # the child imports this copy of the package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", BACKGROUND_FIT, signature, str(config), *options]
    try:
        with open(log, "w") as output:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,  # outlives this run and its terminal, as a compile that the next run reads
            )  # fmt: skip
    except OSError:
        os.close(descriptor)
        marker.unlink(missing_ok=True)
        raise
    os.write(descriptor, f"{process.pid} {socket.gethostname()}\n".encode())
    os.close(descriptor)
    return Started(f"compiling it for the next run in the background (process {process.pid}, log {log})", process)


class CompileForNextRun(Callback):
    """At a fit's first step: where the module steps with CUDA graphs only because its signature never compiled on
    this machine (``compiles_once_warm``), start the background fit that compiles it (``start``), once, on rank 0.

    Args:
        parser: the fit command's parser, and ``config`` its parsed config: the background fit runs them, dumped.
    """

    def __init__(self, parser: Any, config: Any):
        self.parser, self.config = parser, config
        self.started: str | None = None  # what start() said
        self.process: subprocess.Popen | None = None  # the background fit, where this run started one

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, index: int) -> None:
        if self.started is not None or not trainer.is_global_zero:
            return
        self.started = ""
        if not getattr(pl_module, "compiles_once_warm", False):
            return
        signature = pl_module.compile_signature()
        warmup = getattr(getattr(pl_module, "sampler", None), "warmup_steps", 0) or 0
        options = child_options(int(warmup), pl_module.device.index)
        config = copy.deepcopy(self.config)
        # The run's own callbacks (checkpoints, a benchmark's timers, one defined in a script's __main__, which another
        # process cannot import) take no part in what compiles.
        config.trainer.callbacks = None
        try:
            self.started, self.process = start(signature[0], self.parser.dump(config, skip_none=False), options)
        except OSError as error:  # a read-only cache: this run is as before, the next one too
            self.started = f"could not start compiling it for the next run ({error})"
        print(  # rank 0 only (above); printed: the command line's quiet display hides Lightning's info messages
            "capture auto: CUDA graphs for this run (it has not compiled on this machine before, and compiling now "
            f"would cost more than it saves); {self.started}. --compile_for_next_run false leaves this out.",
            flush=True,
        )

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Say where the background fit stands when this run ends before it: it goes on by itself, but a batch job
        (SLURM, a container's command) that ends with this run may end it too."""
        if self.process is None or self.process.poll() is not None:
            return
        print(
            f"capture auto: the background compile for the next run (process {self.process.pid}) is still running; "
            "it ends by itself, usually within a few minutes. Where this command ends a batch job or a container, "
            "that may end it too: then the next run steps with CUDA graphs and starts it again.",
            flush=True,
        )
