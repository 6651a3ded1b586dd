"""``units-lightning fit --trainer.devices N --trainer.strategy ddp`` starts every rank at once, before its imports
(``units_lightning.cli.launch``), instead of Lightning starting ranks 1..N-1 from inside ``trainer.fit``.

What is decided from the command line, and two real 2-process fits on the CPU (gloo) of the quick start shrunk to
seconds: one that trains as Lightning's launch does (the same weights on both ranks, both ranks' labels counted,
Lightning starting no process), one whose rank 1 fails (rank 0 stops and the command fails instead of hanging).
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_setup import QUICKSTART, REPO, TINY_QUICKSTART, cli_environment, finish_or_kill, unlaunched_environment

from units_lightning.cli.launch import LAUNCH_ENV, Ranks, data_parallel_processes

STEPS, TASKS = 6, 4  # the quick start's 4 tasks a step, on each rank


def _config(tmp_path: Path, trainer: dict) -> str:
    path = tmp_path / f"config{len(list(tmp_path.glob('config*.yaml')))}.yaml"
    path.write_text(json.dumps({"trainer": trainer}))  # JSON is YAML
    return str(path)


def test_an_integer_device_count_with_ddp_on_one_node_starts_that_many_processes(tmp_path):
    """From options over the config's values, or from a config alone (the strategy by name or class path)."""
    config = _config(tmp_path, {"devices": 1, "strategy": "auto"})
    arguments = ["--config", config, "--trainer.devices", "4", "--trainer.strategy=ddp"]
    assert data_parallel_processes("fit", arguments, {}) == 4
    assert data_parallel_processes("fit", ["--config", _config(tmp_path, {"devices": 2, "strategy": "ddp"})], {}) == 2
    ours = {"devices": "3", "strategy": {"class_path": "units_lightning.strategies.DDPStrategy"}, "num_nodes": 1}
    assert data_parallel_processes("fit", ["--config", _config(tmp_path, ours)], {}) == 3
    assert data_parallel_processes("fit", ["--config", config, "--trainer.devices", "4"], {}) is None  # auto


@pytest.mark.parametrize(
    "arguments",
    [
        ["--trainer.devices", "1", "--trainer.strategy", "ddp"],
        ["--trainer.devices", "auto", "--trainer.strategy", "ddp"],
        ["--trainer.devices", "-1", "--trainer.strategy", "ddp"],
        ["--trainer.devices", "[0, 1]", "--trainer.strategy", "ddp"],
        ["--trainer.devices", "2"],  # the config's strategy (auto): Lightning's choice
        ["--trainer.devices", "2", "--trainer.strategy", "ddp_spawn"],
        ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.num_nodes", "2"],
        ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--print_config"],
        ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer", '{"devices": 1}'],
        ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--config", "{trainer: {devices: 1}}"],
    ],
)
def test_anything_else_is_left_to_lightning(arguments):
    assert data_parallel_processes("fit", ["--config", str(QUICKSTART), *arguments], {}) is None


@pytest.mark.parametrize(
    "environment",
    [{"LOCAL_RANK": "1"}, {"RANK": "0", "WORLD_SIZE": "2"}, {"SLURM_NTASKS": "4"}, {LAUNCH_ENV: "lightning"}],
)
def test_a_process_a_launcher_started_or_that_asks_for_lightnings_launch_starts_none(environment):
    arguments = ["--config", str(QUICKSTART), "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    assert data_parallel_processes("fit", arguments, {}) == 2
    assert data_parallel_processes("fit", arguments, environment) is None
    assert data_parallel_processes("test", arguments, {}) is None


def _fit(folder: Path, *extra: str, environment: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    """``python -m units_lightning fit`` of the shrunk quick start on 2 CPU processes; its status and output."""
    env = {**cli_environment(folder / "cache"), **(environment or {})}
    command = [
        *(sys.executable, "-m", "units_lightning", "fit", "--config", str(QUICKSTART)),
        *("--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator=cpu"),
        *TINY_QUICKSTART,
        "--trainer.limit_train_batches=3",
        f"--trainer.default_root_dir={folder / 'run'}",
        "--trainer.logger=false",
        *extra,
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env, start_new_session=True
    )
    output, _ = finish_or_kill(process, timeout, "the 2-process fit")
    return process.returncode, output


def _records(folder: Path) -> dict[int, dict]:
    return {r["global_rank"]: r for r in (json.loads(p.read_text()) for p in folder.glob("rank_*.json"))}


needs_gloo = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="needs gloo"
)


@needs_gloo
@pytest.mark.parametrize("launch", ["units-lightning", "lightning"])
def test_both_ranks_train_the_same_weights_and_lightning_starts_no_process(tmp_path, launch):
    """The same fit, with this package's launch and with Lightning's (``UNITS_LIGHTNING_LAUNCH=lightning``): the
    same outcome, and only the second has a process that Lightning started."""
    records = tmp_path / "records"
    environment = {LAUNCH_ENV: "lightning"} if launch == "lightning" else {}
    status, output = _fit(
        tmp_path,
        "--trainer.callbacks+=rank_record.RecordRank",
        f"--trainer.callbacks.folder={records}",
        environment=environment,
    )
    assert status == 0, output[-4000:]
    ranks = _records(records)
    assert set(ranks) == {0, 1}
    assert ranks[0]["weights"] == ranks[1]["weights"] != ranks[0]["initial"]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == STEPS
    assert ranks[0]["ledger"]["query_sets"] == ranks[1]["ledger"]["query_sets"] == STEPS * 2 * TASKS
    assert ranks[0]["lightning_children"] == (1 if launch == "lightning" else 0)


@needs_gloo
def test_a_rank_that_fails_fails_the_command_without_leaving_a_process_waiting(tmp_path):
    status, output = _fit(
        tmp_path, "--trainer.callbacks+=rank_record.FailOnRank", "--trainer.callbacks.rank=1", timeout=240
    )
    assert status != 0, output[-4000:]
    assert "rank 1 fails on purpose" in output


def test_the_other_ranks_start_before_torch_or_lightning_is_imported():
    """The point of the early launch: the command line reaches ``start_ranks`` with nothing heavy imported."""
    probe = (
        "import sys\n"
        "from units_lightning.cli import launch\n"
        "heavy = ('torch', 'lightning', 'jsonargparse')\n"
        "def start_ranks(processes):\n"
        "    print('processes', processes, 'imported', [m for m in heavy if m in sys.modules], flush=True)\n"
        "    raise SystemExit(0)\n"
        "launch.start_ranks = start_ranks\n"
        "from units_lightning.cli.dispatch import main\n"
        f"sys.argv = ['units-lightning', 'fit', '--config', {str(QUICKSTART)!r}, '--trainer.devices', '2',\n"
        "            '--trainer.strategy', 'ddp']\n"
        "main()\n"
    )
    env = unlaunched_environment()
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert "processes 2 imported []" in done.stdout, done.stdout + done.stderr


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _ends_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has ended (see ``_alive``) or ends within ``seconds``."""
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@needs_gloo
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_no_rank_outlives_a_rank_zero_that_is_killed(tmp_path):
    """Rank 0 killed with SIGKILL (as by the OOM killer) while rank 1 is busy and would not notice: rank 1 ends
    with it within seconds, instead of sleeping its minute (or, on NCCL, waiting in a collective until the process
    group's timeout)."""
    pids, started = tmp_path / "pids", time.monotonic()
    status, output = _fit(
        tmp_path, "--trainer.callbacks+=rank_record.SigkillRankZero", f"--trainer.callbacks.folder={pids}", timeout=240
    )
    ended = time.monotonic() - started  # the output ends when the last rank holding it ends
    assert status == -signal.SIGKILL, output[-4000:]
    # Its output closed, rank 1 may still be tearing down (not yet a zombie) on a loaded machine: a few seconds' grace.
    assert _ends_within(int((pids / "pid_1").read_text()), seconds=10)
    assert ended < 45, f"rank 1 outlived rank 0: the command's output ended after {ended:.0f} s (rank 1 sleeps 60 s)"


class _RanksRecordingTheGroup(Ranks):
    """``launch.Ranks`` with no processes: notes whether this process still had a process group when rank 0 waited."""

    def __init__(self):
        super().__init__([])
        self.group_while_waiting = None
        self.stopped = False

    def stop(self, signum=signal.SIGTERM):
        self.stopped = True

    def wait(self, timeout=None):
        self.group_while_waiting = torch.distributed.is_initialized()
        return 0


def test_rank_zero_destroys_its_process_group_before_it_waits_for_the_other_ranks():
    """With NCCL the group's teardown is collective and the other ranks reach theirs at exit: a rank 0 that waited
    for them with its group alive could wait for ever. A rank 0 that failed stops them instead (and keeps it)."""
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ranks = _RanksRecordingTheGroup()
        ranks.end(finished=True)
        assert ranks.group_while_waiting is False and not ranks.stopped
        assert not torch.distributed.is_initialized()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        ranks = _RanksRecordingTheGroup()
        ranks.end(finished=False)
        assert ranks.stopped and ranks.group_while_waiting is True
    finally:
        torch.distributed.destroy_process_group()


def test_a_rank_that_does_not_end_is_killed_and_named_after_the_wait(capfd):
    """A finished rank 0 waits a bounded time: a rank stuck at exit fails the command instead of holding it."""
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = time.monotonic()
    status = Ranks([stuck], poll_seconds=30).wait(timeout=1)
    assert status == -signal.SIGKILL and time.monotonic() - started < 20
    assert "rank 1 had not ended 1 s after rank 0; killing it" in capfd.readouterr().err
