"""Every rank of a one-machine data-parallel ``fit`` started at once, before anything heavy is imported.

Lightning's DDP strategy starts ranks 1 to N - 1 from inside ``trainer.fit`` (``_SubprocessScriptLauncher``): only
after rank 0 has imported torch and Lightning, parsed the config and built its model and data, and then each new
process does all of that again while rank 0 waits for it at the process group. On an H200 host those imports alone
take about 12 s (docs/PERFORMANCE.md), and a 2-GPU fit reached its steady rate about 16 s after a 1-GPU one (issue 35).

``units-lightning fit`` with an integer ``trainer.devices`` above 1, ``trainer.strategy: ddp`` and one node (from the
config files and options, in the order jsonargparse reads them) therefore starts the other processes itself, from
the dispatcher, with the environment Lightning's launcher gives them (``MASTER_ADDR``, ``MASTER_PORT``,
``NODE_RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``). This process then carries ``LOCAL_RANK=0``, so Lightning takes the
processes as created outside it and starts none. As with Lightning's launcher, a thread watches the other ranks and
stops every rank when one fails; in addition this process stops them if it fails itself, at the end destroys its
process group (NCCL's teardown is collective), waits for them (killing any still running ``AFTER_RANK_ZERO_S``
later) and exits with the first failure among them, and on Linux they end with it however it ends (killed too).

Everything else is left to Lightning: other device counts ("auto", -1, lists), other strategies, several nodes, a
process that a launcher already started (torchrun, SLURM, Lightning's own children), ``--print_config``, and any run
with ``UNITS_LIGHTNING_LAUNCH=lightning`` in its environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from units_lightning.cli.config_sources import command_sources
from units_lightning.cli.preflight import config_values

__all__ = ["AFTER_RANK_ZERO_S", "LAUNCH_ENV", "Ranks", "data_parallel_processes", "start_ranks"]

LAUNCH_ENV = "UNITS_LIGHTNING_LAUNCH"
"""Set to ``lightning`` to let Lightning start the ranks as it does by default."""

LAUNCHED = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "SLURM_NTASKS", "SLURM_PROCID")
"""Any of these: a launcher (torchrun, SLURM, Lightning, this module) started this process; it starts no other."""

DDP = frozenset({"ddp", "units_lightning.strategies.DDPStrategy", "lightning.pytorch.strategies.DDPStrategy"})
SETTINGS = ("devices", "strategy", "num_nodes")
"""The trainer settings that decide the launch."""

AFTER_RANK_ZERO_S = 300.0
"""How long a finished rank 0 waits for the other ranks (they finished the same fit) before it kills them: a rank
stuck at exit fails the command loudly instead of holding it for ever."""


def _trainer_settings(arguments: Sequence[str]) -> dict[str, Any] | None:
    """``trainer.devices``, ``strategy``, ``num_nodes`` as the config files and options set them, later over
    earlier; None where they may come in a form not read here (a whole ``--trainer`` value, an inline config)."""
    if any(not os.path.isfile(value) for value in config_values(arguments)):
        return None  # a config given inline (YAML on the command line): not read here
    settings: dict[str, Any] = {}
    for kind, source in command_sources(arguments):
        if kind == "config":
            trainer = source.get("trainer") if isinstance(source, dict) else None
            if isinstance(trainer, dict):
                settings.update({k: trainer[k] for k in SETTINGS if k in trainer})
        else:
            key, value = source
            if key == "trainer":
                return None
            if key.startswith("trainer.") and key.removeprefix("trainer.") in SETTINGS:
                settings[key.removeprefix("trainer.")] = value
    return settings


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _strategy_name(value: Any) -> str | None:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict) and not value.get("init_args"):
        return value.get("class_path")
    return None


def data_parallel_processes(command: str, arguments: Sequence[str], environment: dict[str, str]) -> int | None:
    """How many processes this command should start at once (N > 1), or None to leave it to Lightning."""
    if command != "fit" or environment.get(LAUNCH_ENV) == "lightning" or "--print_config" in arguments:
        return None
    if any(name in environment for name in LAUNCHED):
        return None
    settings = _trainer_settings(arguments)
    if settings is None or _strategy_name(settings.get("strategy")) not in DDP:
        return None
    if _integer(settings.get("num_nodes", 1)) != 1:
        return None
    devices = _integer(settings.get("devices"))
    return devices if devices is not None and devices > 1 else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _this_command() -> list[str]:
    """The command line that started this process, as Lightning's launcher repeats it for each rank."""
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if spec is None:
        return [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
    return [sys.executable, "-m", spec.name, *sys.argv[1:]]


class Ranks:
    """The processes of ranks 1 to N - 1, started by ``start_ranks``, and the thread that watches them."""

    def __init__(self, processes: list[subprocess.Popen], poll_seconds: float = 2.0):
        self.processes = processes
        self._stopped = threading.Event()
        self._watcher = threading.Thread(target=self._watch, args=(poll_seconds,), daemon=True, name="rank-watcher")
        self._watcher.start()

    def _watch(self, poll_seconds: float) -> None:
        """As Lightning's ``_ChildProcessObserver``: when a rank fails, stop the others and this process."""
        while not self._stopped.wait(poll_seconds):
            codes = [process.poll() for process in self.processes]
            failed = [(rank, code) for rank, code in enumerate(codes, start=1) if code not in (None, 0)]
            if failed:
                rank, code = failed[0]
                print(
                    f"units-lightning: rank {rank} ended with status {code}; stopping the other ranks",
                    file=sys.stderr,
                    flush=True,
                )
                self.stop(signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            if all(code == 0 for code in codes):
                return

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to every rank still running."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signum)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for every rank (at most ``timeout`` seconds, then kill what is left, saying so); the first nonzero
        status, or 0."""
        self._stopped.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        for rank, process in enumerate(self.processes, start=1):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                process.wait(left)
            except subprocess.TimeoutExpired:
                print(
                    f"units-lightning: rank {rank} had not ended {timeout:.0f} s after rank 0; killing it",
                    file=sys.stderr,
                    flush=True,
                )
                process.kill()
                process.wait()
        return next((process.returncode for process in self.processes if process.returncode), 0)

    def end(self, finished: bool) -> None:
        """Rank 0 is done: wait for the other ranks, stopping them first if rank 0 did not finish (they would wait
        for it in a collective); exit with the first failure among them.

        A rank 0 that finished destroys its process group before it waits: with NCCL the teardown is collective (each
        rank's ``ncclCommAbort``), and the other ranks reach theirs at exit (Lightning's atexit handler), so a rank 0
        that kept its group while it waited for them could wait for ever (the likely cause of a 2-H200 fit whose
        summary was printed and whose command was still running 20 s later, when it was stopped)."""
        if finished:
            _destroy_process_group()
        else:
            self.stop(signal.SIGTERM)
        status = self.wait(timeout=AFTER_RANK_ZERO_S if finished else 60)
        if finished and status:
            print(f"units-lightning: another rank of this run ended with status {status}", file=sys.stderr, flush=True)
            sys.exit(status)


def _destroy_process_group() -> None:
    """This process's default process group destroyed, if it has one (torch imported and a group initialised)."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def _end_with_rank_zero() -> None:
    """Run in each new rank before its command (Linux): the kernel kills it when rank 0 ends, however rank 0 ends
    (the OOM killer's SIGKILL included), so that no rank is left waiting in a collective for a rank 0 that is gone."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start_ranks(processes: int) -> Ranks:
    """Start ranks 1 to ``processes`` - 1 as copies of this command, and make this process rank 0."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.update(NODE_RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(processes))
    command = _this_command()
    before = _end_with_rank_zero if sys.platform.startswith("linux") else None
    children = [
        subprocess.Popen(command, env={**os.environ, "LOCAL_RANK": str(rank)}, preexec_fn=before)  # noqa: PLW1509 (no threads yet)
        for rank in range(1, processes)
    ]
    return Ranks(children)
