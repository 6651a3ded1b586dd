"""Packing the paper tables' runs onto the GPUs of one host (``benchmarks/tables/launcher.py``): K runs on each GPU at
once, every GPU kept filled, every run once, failures named, runs per GPU-hour; the GPUs are fake (the commands only
read ``CUDA_VISIBLE_DEVICES``), the runs short Python scripts."""

import os
import stat
import sys
import textwrap
from collections import Counter, defaultdict

import pytest

from benchmarks.tables import cli, grid, launcher

# A fake fit: sleeps, then appends "<label> <CUDA_VISIBLE_DEVICES> <start> <end> <CUDA_MPS_PIPE_DIRECTORY>" to a log;
# the run labelled as the third argument exits with 1.
FAKE_FIT = textwrap.dedent("""
    import os, sys, time
    log, label, fail = sys.argv[1:4]
    start = time.time()
    time.sleep(1.0)
    gpu, pipe = os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    with open(log, "a") as out:
        out.write(f"{label} {gpu} {start} {time.time()} {pipe}\\n")
    sys.exit(1 if label == fail else 0)
""")


def _runs(tmp_path, seeds=(0, 1, 2)):
    (tmp_path / "data" / "omniglot").mkdir(parents=True, exist_ok=True)
    options = grid.Options(root=tmp_path / "root", data_root=tmp_path / "data")
    configs = cli.resolve_configs(["budget_omniglot_5w1s"])
    return options, grid.build_grid(configs, ["MAML", "Units-NTS", "Units-ML"], list(seeds), options.root)


def _fake_commands(monkeypatch, log, fail=None):
    """Every run is one fake fit, without tests; the run ``fail`` (a label with '/' for ' / ') fails."""

    def fit_command(run, options):
        label = run.label.replace(" / ", "/").replace(" ", "_")
        return [sys.executable, "-c", FAKE_FIT, str(log), label, fail or "-"]

    monkeypatch.setattr(launcher, "fit_command", fit_command)
    monkeypatch.setattr(launcher, "targets_of", lambda config: [])


def _lines(log):
    rows = [line.split(" ") for line in log.read_text().splitlines()]
    return [(label, gpu, float(start), float(end), pipe) for label, gpu, start, end, pipe in rows]


def _most_at_once(intervals) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, change in events:  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most


@pytest.mark.parametrize(
    "gpus, per_gpu, parallel, expected",
    [
        (["0", "1"], 2, None, ["0", "1", "0", "1"]),
        (["0", "1"], None, None, ["0", "1"]),
        (["0", "1", "2"], None, 4, ["0", "1", "2", "0"]),  # --parallel alone: slot i on GPU i % 3, as before
        (["0", "1"], 3, 5, ["0", "1", "0", "1", "0"]),
        ([], None, 3, [None, None, None]),
        ([], None, None, [None]),
    ],
    ids=["per-gpu", "one-per-gpu-by-default", "parallel-alone", "both", "cpu", "cpu-default"],
)
def test_slots_put_k_runs_on_each_gpu(gpus, per_gpu, parallel, expected):
    assert launcher.slots(gpus, per_gpu, parallel) == expected


def test_per_gpu_without_gpus_or_below_one_is_refused(capsys):
    with pytest.raises(ValueError, match="--per-gpu needs the GPUs"):
        launcher.slots([], per_gpu=2)
    with pytest.raises(ValueError, match=">= 1"):
        launcher.slots(["0"], per_gpu=0)
    with pytest.raises(SystemExit):
        cli.parse_arguments(["--per-gpu", "2"])
    assert "--per-gpu needs the GPUs to pack the runs onto" in capsys.readouterr().err


def test_each_gpu_runs_k_at_once_every_run_once_and_a_failure_is_named(tmp_path, monkeypatch):
    options, runs = _runs(tmp_path)  # 9 runs on 2 GPUs x 2
    log = tmp_path / "log"
    _fake_commands(monkeypatch, log, fail="budget_omniglot_5w1s/Units-NTS/seed_1")
    outcomes = launcher.run_grid(runs, options, gpus=["0", "1"], per_gpu=2, report=lambda message: None)
    lines = _lines(log)
    assert Counter(label for label, *_ in lines) == Counter(
        run.label.replace(" / ", "/").replace(" ", "_") for run in runs
    ), "every run exactly once"
    by_gpu = defaultdict(list)
    for _, gpu, start, end, _ in lines:
        by_gpu[gpu].append((start, end))
    assert set(by_gpu) == {"0", "1"}
    assert {gpu: _most_at_once(intervals) for gpu, intervals in by_gpu.items()} == {"0": 2, "1": 2}
    failed = {run.label: outcome for run, outcome in outcomes.items() if outcome != "done"}
    assert list(failed) == ["budget_omniglot_5w1s / Units-NTS / seed 1"]
    assert failed["budget_omniglot_5w1s / Units-NTS / seed 1"].startswith("failed: fit exited with 1, see ")


def test_each_run_gets_its_share_of_the_cores_for_its_threads_and_its_compile_workers(tmp_path, monkeypatch):
    record = "import os, sys; open(sys.argv[1], 'a').write(os.environ['OMP_NUM_THREADS'] + ' ' + "
    record += "os.environ['TORCHINDUCTOR_COMPILE_THREADS'] + '\\n')"
    monkeypatch.setattr(
        launcher, "fit_command", lambda run, options: [sys.executable, "-c", record, str(run.folder / "threads")]
    )
    monkeypatch.setattr(launcher, "targets_of", lambda config: [])
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 64)
    for name in ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        monkeypatch.delenv(name, raising=False)

    def threads(folder):  # what each run's command saw, on 2 GPUs x 3: 6 places
        options, runs = _runs(folder, seeds=(0,))
        launcher.run_grid(runs, options, gpus=["0", "1"], per_gpu=3, report=lambda message: None)
        return [(run.folder / "threads").read_text() for run in runs]

    assert threads(tmp_path / "a") == ["10 10\n"] * 3
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "2")  # the user's own setting is kept
    assert threads(tmp_path / "b") == ["10 2\n"] * 3


def test_where_python_keeps_no_bytecode_the_sweeps_commands_keep_theirs_beside_the_runs(tmp_path, monkeypatch):
    # the H200 image sets PYTHONDONTWRITEBYTECODE: every command would compile torch's sources again (4-6 s)
    record = "import sys; open(sys.argv[1], 'w').write(repr((sys.dont_write_bytecode, sys.pycache_prefix)))"
    monkeypatch.setattr(
        launcher, "fit_command", lambda run, options: [sys.executable, "-c", record, str(run.folder / "b")]
    )
    monkeypatch.setattr(launcher, "targets_of", lambda config: [])
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    said = []
    options, runs = _runs(tmp_path / "a", seeds=(0,))
    launcher.run_grid(runs, options, report=said.append)
    assert {(run.folder / "b").read_text() for run in runs} == {repr((False, str(options.root / ".pycache")))}
    assert f"the sweep's commands keep it in {options.root}/.pycache" in said[0]
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "mine"))  # the user's own place is kept, and said nothing
    said.clear()
    options, runs = _runs(tmp_path / "b", seeds=(0,))
    launcher.run_grid(runs, options, report=said.append)
    assert {(run.folder / "b").read_text() for run in runs} == {repr((True, str(tmp_path / "mine")))}
    assert not any("bytecode" in message for message in said)


def test_the_command_line_prints_the_packing_and_runs_per_gpu_hour(tmp_path, monkeypatch, capsys):
    options, runs = _runs(tmp_path, seeds=(0,))  # 3 runs on 3 GPUs x 1; the first already done
    done_before = runs[0]
    launcher.write_json(done_before.folder / launcher.DONE, {"finished": "earlier"})
    _fake_commands(monkeypatch, tmp_path / "log")
    argv = ["--configs", "budget_omniglot_5w1s", "--seeds", "0", "--root", str(options.root)]
    argv += ["--data-root", str(options.data_root), "--gpus", "0,1,2"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "packing: 3 runs at once on GPUs 0 (1), 1 (1), 2 (1)\n" in out
    (rate,) = [line for line in out.splitlines() if "runs per GPU-hour" in line]
    assert rate.startswith("2 runs finished in ") and " h on 3 GPUs: " in rate  # the one done before is not counted
    assert len(_lines(tmp_path / "log")) == 2


def test_the_rate_is_runs_over_wall_hours_times_gpus():
    assert launcher.sweep_rate(12, 5400, 4) == "12 runs finished in 1.50 h on 4 GPUs: 2.00 runs per GPU-hour"
    assert launcher.sweep_rate(1, 1800, 0) == "1 run finished in 0.50 h on the CPU: 2.00 runs per hour"
    assert launcher.sweep_rate(0, 0, 1).endswith("on 1 GPU: 0.00 runs per GPU-hour")


def _fake_mps_control(folder):
    """An ``nvidia-cuda-mps-control`` that appends its arguments, its standard input and its pipe folder to a log."""
    folder.mkdir()
    control = folder / launcher.MPS_CONTROL
    control.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "stdin = '' if '-d' in sys.argv else sys.stdin.read().strip()\n"
        f"open({str(folder / 'calls')!r}, 'a').write(' '.join(sys.argv[1:]) + '|' + stdin + '|' + "
        "os.environ['CUDA_MPS_PIPE_DIRECTORY'] + '\\n')\n"
    )
    control.chmod(control.stat().st_mode | stat.S_IEXEC)
    return folder / "calls"


def test_mps_starts_one_daemon_whose_pipe_every_command_gets_and_quits_it(tmp_path, monkeypatch):
    options, runs = _runs(tmp_path, seeds=(0,))
    calls = _fake_mps_control(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    _fake_commands(monkeypatch, tmp_path / "log")
    outcomes = launcher.run_grid(runs, options, gpus=["0"], per_gpu=3, mps=True, report=lambda message: None)
    assert set(outcomes.values()) == {"done"}
    pipe = str(options.root / ".mps" / "pipe")
    assert calls.read_text().splitlines() == [f"-d||{pipe}", f"|quit|{pipe}"]
    assert {line[4] for line in _lines(tmp_path / "log")} == {pipe}


def test_mps_without_its_control_program_is_refused_before_any_run(tmp_path, monkeypatch):
    options, runs = _runs(tmp_path, seeds=(0,))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    _fake_commands(monkeypatch, tmp_path / "log")
    with pytest.raises(launcher.MPSUnavailable, match="nvidia-cuda-mps-control is not on the PATH"):
        launcher.run_grid(runs, options, gpus=["0"], mps=True, report=lambda message: None)
    assert not (tmp_path / "log").exists()
