"""Running the grid: each run's commands as subprocesses, several at a time on their GPUs (``slots``: K runs on each
GPU, every GPU kept filled), each recorded in the run's ``run.json``, all stopped in time (SIGTERM, then SIGKILL at
the limit) so that the next call continues them; and the sweep's rate, runs per GPU-hour."""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, gpu_name
from benchmarks.tables.folders import (
    DONE,
    RECORD,
    fit_finished,
    now,
    read_json,
    read_results,
    status,
    write_json,
)
from benchmarks.tables.grid import (
    Options,
    Run,
    Target,
    evaluation_command,
    fit_command,
    fit_identity,
    milestone_checkpoint,
    milestone_tests_command,
    shown,
    targets_of,
)
from benchmarks.tables.metrics import keep_metrics

STOPPED = (128 + signal.SIGTERM, -signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGINT, -signal.SIGINT)


class Launcher:
    """Runs commands as subprocesses, logs each to a file, and stops them all on request.

    Args:
        environment: the environment of every command; ``CUDA_VISIBLE_DEVICES`` is set per command.
    """

    def __init__(self, environment: Mapping[str, str]):
        self.environment = dict(environment)
        self.stopping = False
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def run(self, command: Sequence[str], log: Path, gpu: str | None) -> int | None:
        """Run ``command`` to its end; its exit status, or None when stopping (nothing launched)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        environment = dict(self.environment)
        if gpu is not None:
            environment["CUDA_VISIBLE_DEVICES"] = gpu
        with self._lock:
            if self.stopping:
                return None
            with open(log, "a") as out:
                out.write(f"$ {shlex.join(command)}\n")
                out.flush()
                process = subprocess.Popen(
                    command, cwd=REPO, env=environment, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            self._live.add(process)
        try:
            return process.wait()
        finally:
            with self._lock:
                self._live.discard(process)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Launch nothing more and send ``signum`` to every running command; how many were running."""
        with self._lock:
            self.stopping = True
            for process in self._live:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)
            return len(self._live)


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@cache
def commit() -> str | None:
    """The checked-out commit, ``+dirty`` when tracked files differ from it. Outside a git checkout of this
    project (a copy of it, also one inside another repository, whose commit would be the wrong one):
    ``$PAPER_TABLES_COMMIT``, else None."""
    top = _git("rev-parse", "--show-toplevel")
    head = _git("rev-parse", "HEAD") if top is not None and Path(top).resolve() == REPO.resolve() else None
    if head is None:
        return os.environ.get("PAPER_TABLES_COMMIT")
    return head + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def _record_command(run: Run, options: Options, key: str, entry: dict[str, Any]) -> dict:
    record = read_json(run.folder / RECORD) or {
        "config": run.config.name,
        "method": run.method,
        "seed": run.seed,
        "identity": fit_identity(run, options),
        "fit": {"finished": False, "segments": []},
        "tests": {},
    }
    if key == "fit":
        record["fit"]["segments"].append(entry)
        record["fit"]["finished"] = record["fit"]["finished"] or entry["returncode"] == 0
    else:
        record["tests"][key] = entry
    write_json(run.folder / RECORD, record)
    return record


def _execute(
    run: Run,
    command: list[str],
    key: str,
    launcher: Launcher,
    gpu: str | None,
    options: Options,
    log: str | None = None,
):
    """Run one command of ``run``, record it as ``key``, its output in ``console/<log or key>.log``; its exit status
    (None: not launched)."""
    started, clock = now(), time.monotonic()
    log = run.folder / "console" / f"{log or key}.log"
    returncode = launcher.run(command, log, gpu)
    if returncode is None:
        return None
    entry = {
        "command": command,
        "started": started,
        "wall_s": round(time.monotonic() - clock, 2),
        "returncode": returncode,
        "commit": commit(),
        "device": gpu_name(gpu),
        "log": shown(log),
    }
    _record_command(run, options, key, entry)
    return returncode


def _stopped(returncode: int | None, launcher: Launcher) -> bool:
    """Not launched, ended by a signal, or ended any way but success while stopping (Ctrl-C exits with 1)."""
    return returncode is None or returncode in STOPPED or (returncode != 0 and launcher.stopping)


MILESTONE_LOG = "test-milestones"
"""The console log of the processes that test a run's milestone checkpoints (``console/test-milestones.log``)."""


def _test_milestones(
    run: Run, targets: Sequence[Target], launcher: Launcher, gpu: str | None, options: Options
) -> str | None:
    """Test the milestone ``targets`` in one process (``milestone_tests_command``), recorded as
    ``test-<name>+<name>...``; None when each has its results, else ``stopped`` or ``failed: ...`` naming those
    without."""
    names = [target.name for target in targets]
    command = milestone_tests_command(run, targets, options)
    returncode = _execute(run, command, "test-" + "+".join(names), launcher, gpu, options, log=MILESTONE_LOG)
    if _stopped(returncode, launcher):
        return "stopped"
    missing = [target.name for target in targets if read_results(run, target) is None]
    if returncode != 0 or missing:
        log = shown(run.folder / "console" / f"{MILESTONE_LOG}.log")
        return f"failed: test {', '.join(missing or names)} exited with {returncode}, see {log}"
    return None


def execute_run(run: Run, launcher: Launcher, gpu: str | None, options: Options) -> str:
    """Continue ``run`` as far as it goes: fit (resumed), then the tests without results (the milestone
    checkpoints' in one process, ``_test_milestones``; an ensemble's in its own), then ``done.json``.

    Returns:
        ``done``, ``stopped`` (by the time limit or a signal; run again), ``conflict: ...`` or ``failed: ...``.
    """
    state = status(run, options)
    if state == "done" or state.startswith("conflict"):
        return state
    if not fit_finished(run, options):
        keep_metrics(run.folder)
        returncode = _execute(run, fit_command(run, options), "fit", launcher, gpu, options)
        if _stopped(returncode, launcher):
            return "stopped"
        if returncode != 0:
            return f"failed: fit exited with {returncode}, see {shown(run.folder / 'console' / 'fit.log')}"
    pending = [target for target in targets_of(run.config) if read_results(run, target) is None]
    milestones = [target for target in pending if target.milestone is not None]
    for target in milestones:
        if milestone_checkpoint(run, target) is None:
            return (
                f"failed: the fit finished without a checkpoint at {target.milestone} labeled query sets "
                f"({target.name}.ckpt): the label budget or the training length ends before it"
            )
    if milestones:
        outcome = _test_milestones(run, milestones, launcher, gpu, options)
        if outcome is not None:
            return outcome
    for target in pending:
        if target.milestone is not None:
            continue
        returncode = _execute(
            run, evaluation_command(run, target, options), f"test-{target.name}", launcher, gpu, options
        )
        if _stopped(returncode, launcher):
            return "stopped"
        if returncode != 0 or read_results(run, target) is None:
            log = shown(run.folder / "console" / f"test-{target.name}.log")
            return f"failed: test {target.name} exited with {returncode}, see {log}"
    write_json(run.folder / DONE, {"finished": now(), "commit": commit()})
    return "done"


def slots(gpus: Sequence[str] = (), per_gpu: int | None = None, parallel: int | None = None) -> list[str | None]:
    """The places runs take, one run each at a time: every GPU ``per_gpu`` times, interleaved so that runs spread
    over the GPUs first, at most ``parallel`` in all; without GPUs, ``parallel`` (default 1) places of no GPU.

    ``per_gpu`` defaults to 1, or with ``parallel`` to as many as ``parallel`` runs need (slot i on
    ``gpus[i % len(gpus)]``, as ``--parallel`` alone always did).

    Example:
        >>> slots(["0", "1"], per_gpu=2)
        ['0', '1', '0', '1']
        >>> slots(["0", "1", "2"], parallel=4), slots(parallel=2)
        (['0', '1', '2', '0'], [None, None])

    Raises:
        ValueError: ``per_gpu`` or ``parallel`` below 1, or ``per_gpu`` without GPUs.
    """
    if per_gpu is not None and per_gpu < 1 or parallel is not None and parallel < 1:
        raise ValueError(f"runs per GPU and runs at once must be >= 1, got {per_gpu} and {parallel}")
    if not gpus:
        if per_gpu is not None:
            raise ValueError("--per-gpu needs the GPUs to pack the runs onto (--gpus 0,1,...)")
        return [None] * (parallel or 1)
    if per_gpu is None:
        per_gpu = math.ceil(parallel / len(gpus)) if parallel else 1
    return [gpus[i % len(gpus)] for i in range(len(gpus) * per_gpu)][:parallel]


def sweep_rate(finished: int, wall_s: float, gpus: int) -> str:
    """One line on what a call of the sweep did: runs finished, wall time, GPUs, runs per GPU-hour (per hour on
    the CPU, ``gpus`` 0).

    Example:
        >>> sweep_rate(12, 5400, 4)
        '12 runs finished in 1.50 h on 4 GPUs: 2.00 runs per GPU-hour'
    """
    hours = wall_s / 3600
    where = f"on {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "on the CPU"
    per = "runs per GPU-hour" if gpus else "runs per hour"
    rate = finished / (hours * max(gpus, 1)) if hours > 0 else 0.0
    return f"{finished} run{'s' if finished != 1 else ''} finished in {hours:.2f} h {where}: {rate:.2f} {per}"


MPS_CONTROL = "nvidia-cuda-mps-control"


class MPSUnavailable(RuntimeError):
    """``--mps`` asked for, and no CUDA MPS daemon could be started."""


@contextlib.contextmanager
def cuda_mps(folder: Path, environment: dict[str, str]) -> Iterator[None]:
    """Start a CUDA MPS control daemon (NVIDIA's Multi-Process Service: the processes on one GPU share a context, so
    their kernels run side by side instead of taking turns) for the block, its pipe and log folders under ``folder``
    and named in ``environment`` (which the commands get); ``quit`` it at the end.

    Raises:
        MPSUnavailable: no ``nvidia-cuda-mps-control`` on the PATH, or the daemon did not start.
    """
    control = shutil.which(MPS_CONTROL, path=environment.get("PATH"))
    if control is None:
        raise MPSUnavailable(
            f"--mps: {MPS_CONTROL} is not on the PATH (it comes with the NVIDIA driver); run without --mps, "
            "several runs per GPU still share it by time slices"
        )
    pipe, log = folder / "pipe", folder / "log"
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    environment.update(CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(log))
    started = subprocess.run([control, "-d"], env=environment, capture_output=True, text=True, timeout=60)
    if started.returncode != 0:
        raise MPSUnavailable(
            f"--mps: {MPS_CONTROL} -d exited with {started.returncode} ({(started.stderr or started.stdout).strip()}); "
            f"its log is in {log}. Run without --mps, or ask whoever runs the machine whether MPS is allowed"
        )
    try:
        yield
    finally:
        subprocess.run([control], input="quit\n", env=environment, capture_output=True, text=True, timeout=60)


def run_grid(
    runs: Sequence[Run],
    options: Options,
    parallel: int | None = None,
    gpus: Sequence[str] = (),
    time_limit: float | None = None,
    grace: float = 60.0,
    report: Callable[[str], None] = print,
    started: float | None = None,
    per_gpu: int | None = None,
    mps: bool = False,
) -> dict[Run, str]:
    """Continue every run (in ``launch_order``) in the places of ``slots(gpus, per_gpu, parallel)``: a run takes a
    free place (its GPU as ``CUDA_VISIBLE_DEVICES``) and gives it back when its commands are done, so each GPU runs
    ``per_gpu`` at a time while runs are left; all within ``time_limit`` seconds.

    ``grace`` seconds before the limit: nothing more is launched and the running commands get SIGTERM; at the limit
    those still running are killed. SIGTERM or SIGINT to this process stops the same way at once. ``mps``: the
    commands run under one CUDA MPS daemon (``cuda_mps``, its folders in ``<root>/.mps``), started and stopped here.
    """
    places = slots(gpus, per_gpu, parallel)
    environment = dict(os.environ)
    share = str(max(1, (os.cpu_count() or 1) // len(places)))  # each place's share of the host's cores
    environment.setdefault("OMP_NUM_THREADS", share)
    # a compiled run (``capture: compile``) builds its kernels in a pool of processes as large as the host's cores (up
    # to 32): 12 runs compiling at once on 64 cores would start 384 of them
    environment.setdefault("TORCHINDUCTOR_COMPILE_THREADS", share)
    environment.setdefault("WANDB_MODE", "offline")
    if environment.get("PYTHONDONTWRITEBYTECODE") and not environment.get("PYTHONPYCACHEPREFIX"):
        # an image that keeps no bytecode (the H200 image sets this) compiles torch's and Lightning's sources again in
        # every command of every run: 4-6 s of each (docs/PERFORMANCE.md); kept beside the runs, not in site-packages
        del environment["PYTHONDONTWRITEBYTECODE"]
        environment["PYTHONPYCACHEPREFIX"] = kept = str(options.root / ".pycache")
        report(f"Python keeps no bytecode here (PYTHONDONTWRITEBYTECODE): the sweep's commands keep it in {kept}")
    daemon = contextlib.ExitStack()
    if mps:
        daemon.enter_context(cuda_mps(options.root / ".mps", environment))
    launcher = Launcher(environment)
    free = list(places)
    free_lock = threading.Lock()
    outcomes: dict[Run, str] = {}

    def work(run: Run) -> None:
        if (run.folder / DONE).is_file():
            outcomes[run] = "done"
            return
        with free_lock:
            gpu = free.pop(0)
        try:
            if launcher.stopping:
                outcomes[run] = "stopped"
                return
            report(f"start  {run.label}" + (f" (GPU {gpu})" if gpu is not None else ""))
            outcomes[run] = execute_run(run, launcher, gpu, options)
        except Exception as error:  # one run's trouble (a bad file in its folder) must not stop the others
            outcomes[run] = f"failed: {type(error).__name__}: {error}"
        finally:
            with free_lock:
                free.append(gpu)
        report(f"{outcomes[run].split(':')[0]:6} {run.label}" + (f": {outcomes[run]}" if ":" in outcomes[run] else ""))

    def on_signal(signum, frame):
        report(f"signal {signal.Signals(signum).name}: stopping the running commands (they checkpoint and exit)")
        launcher.stop(signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    start = time.monotonic() if started is None else started
    try:
        with ThreadPoolExecutor(max_workers=len(places)) as pool:
            futures = [pool.submit(work, run) for run in launch_order(runs)]
            while not all(f.done() for f in futures):
                time.sleep(0.5)
                elapsed = time.monotonic() - start
                if time_limit is not None and elapsed >= time_limit - grace and not launcher.stopping:
                    running = launcher.stop(signal.SIGTERM)
                    report(f"time limit: {elapsed:.0f} s of {time_limit:.0f}; SIGTERM to {running} running command(s)")
                if time_limit is not None and elapsed >= time_limit:
                    launcher.stop(signal.SIGKILL)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        daemon.close()
    return {run: outcomes.get(run, "stopped") for run in runs}


def launch_order(runs: Sequence[Run]) -> list[Run]:
    """The order in which ``run_grid`` starts the runs: seed by seed (every config and method of the first seed,
    then of the next), and within a seed the runs already under way before new ones.

    GPU time comes in short stretches: this fills one seed of every table cell first (the issue asks at least one
    seed each, three where time allows) and finishes what is under way, so fewer stopped runs wait with their
    checkpoints. Tables and ``--dry-run`` keep the grid's own order.
    """
    seeds = list(dict.fromkeys(run.seed for run in runs))
    return sorted(runs, key=lambda run: (seeds.index(run.seed), not (run.folder / RECORD).is_file()))  # stable
