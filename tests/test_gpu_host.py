"""``benchmarks/gpu_host.py``: datasets cut into parts that travel one call at a time and join back byte for byte,
and a job that starts only once its data is complete, outlives the call that started it and is packed for the trip
back (a real ``paper_tables.py`` run of Omniglot, shrunk to seconds, on the CPU)."""

import json
import random
import shutil
import subprocess
import sys
import tarfile
import time

import pytest
from tiny_setup import SHARED_DATA

from benchmarks import gpu_host


@pytest.mark.parametrize("part", [1, 3, 7, 100])
def test_parts_cover_every_byte_once_and_stay_under_the_part_size(part):
    files = {"a": 0, "b": 5, "c": 23, "d/e": 7}
    parts = gpu_host.plan_parts(files, part)
    assert all(sum(length for _, _, length in p) <= part for p in parts)
    for name, size in files.items():
        pieces = sorted((offset, length) for p in parts for n, offset, length in p if n == name)
        covered = [offset + i for offset, length in pieces for i in range(length)]
        assert covered == list(range(size))


def _shared(tmp_path, sizes):
    shared = tmp_path / "shared"
    for name, size in sizes.items():
        path = shared / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes((i * 7 + len(name)) % 251 for i in range(size)))
    return shared


def _call(tmp_path, prepared, parts, name):
    """What one call carries: only ``parts`` of the prepared folders."""
    carry = tmp_path / name
    for part in parts:
        shutil.copytree(prepared / part, carry / part)
    return carry


def test_a_dataset_is_ready_once_every_piece_has_come_and_joins_to_the_same_bytes(tmp_path):
    shared = _shared(tmp_path, {"omniglot/x.zip": 2500, "omniglot/y.zip": 900, "cifarfs/splits/t.txt": 10})
    folders = gpu_host.prepare(shared, ["omniglot", "cifarfs"], tmp_path / "out", part_mb=0.001, wheels=False)
    assert len(folders) == 4  # x.zip in 3 pieces of 1,000 bytes or less, y.zip and t.txt beside them
    work = tmp_path / "work"
    seen = []
    for index, folder in enumerate(folders):
        seen.append(gpu_host.stage(_call(tmp_path, tmp_path / "out", [folder.name], f"call{index}"), work))
    assert seen[-1] == {"omniglot", "cifarfs"} and seen[0] != seen[-1]
    for name in ("omniglot/x.zip", "omniglot/y.zip", "cifarfs/splits/t.txt"):
        assert (work / "data" / name).read_bytes() == (shared / name).read_bytes()
    assert not list((work / "parts").glob("*@*"))  # pieces are dropped once joined


def test_a_second_prepare_into_the_same_folder_leaves_none_of_the_first_s_parts(tmp_path):
    shared = _shared(tmp_path, {"omniglot/x.zip": 2500})
    assert len(gpu_host.prepare(shared, ["omniglot"], tmp_path / "out", part_mb=0.001, wheels=False)) == 3
    assert gpu_host.prepare(shared, ["omniglot"], tmp_path / "out", part_mb=1, wheels=False) == [
        tmp_path / "out" / "p1"
    ]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["p1"]


def test_parts_of_two_prepares_make_both_datasets_ready(tmp_path):
    shared = _shared(tmp_path, {"omniglot/x.zip": 300, "miniimagenet/y.zip": 200})
    first = gpu_host.prepare(shared, ["omniglot"], tmp_path / "one", part_mb=1, wheels=False)
    second = gpu_host.prepare(shared, ["miniimagenet"], tmp_path / "two", part_mb=1, wheels=False)
    work = tmp_path / "work"
    assert gpu_host.stage(_call(tmp_path, tmp_path / "one", [first[0].name], "a"), work) == {"omniglot"}
    assert gpu_host.stage(_call(tmp_path, tmp_path / "two", [second[0].name], "b"), work) == {
        "omniglot",
        "miniimagenet",
    }


def test_a_piece_that_does_not_join_to_the_manifest_sha256_is_refused(tmp_path):
    shared = _shared(tmp_path, {"omniglot/x.zip": 2500})
    folders = gpu_host.prepare(shared, ["omniglot"], tmp_path / "out", part_mb=0.001, wheels=False)
    piece = next(p for p in folders[1].iterdir() if "@" in p.name)
    piece.write_bytes(b"\0" + piece.read_bytes()[1:])
    with pytest.raises(RuntimeError, match="sha256 differs"):
        for folder in folders:
            gpu_host.stage(_call(tmp_path, tmp_path / "out", [folder.name], f"c-{folder.name}"), tmp_path / "work")
    assert not (tmp_path / "work" / "data" / "omniglot" / "x.zip").exists()


def test_jobs_name_their_six_fields_and_configs_their_dataset():
    with pytest.raises(ValueError, match="all six given"):
        gpu_host.parse_job("c5|cifarfs_5w5s|MAML|0|3")
    assert gpu_host.dataset_of("budget_omniglot_20w1s") == "omniglot"
    with pytest.raises(ValueError, match="no dataset named"):
        gpu_host.dataset_of("quickstart")


def test_a_host_keeps_every_call_s_jobs_so_a_call_that_names_none_still_starts_them(tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "empty").mkdir()
    first = "o|omniglot_5w1s|Units-ML|0|1|0;c|cifarfs_5w5s|MAML|0|1|0"
    assert gpu_host.planned(work, first, "", "trainer.max_steps=4") == (first.split(";"), [], "trainer.max_steps=4")
    # a call made only to carry a part names nothing: the plan stays, and its jobs wait for their data in that call
    assert gpu_host.main(["run", "--carry", str(tmp_path / "empty"), "--work", str(work)]) == 0
    printed = capsys.readouterr().out
    assert "o waits for omniglot" in printed and "c waits for cifarfs" in printed, printed
    # a later version of a name replaces the earlier one; a new name joins; the last --extra given holds
    screen = "s|omniglot_5w1s|0|0|4|--model.eta.init_args.peak 0.3"
    jobs, screens, extra = gpu_host.planned(work, "c|cifarfs_5w1s|MAML|1|1|0;m|omniglot_20w1s|MAML|0|1|0", screen, "")
    assert jobs == ["o|omniglot_5w1s|Units-ML|0|1|0", "c|cifarfs_5w1s|MAML|1|1|0", "m|omniglot_20w1s|MAML|0|1|0"]
    assert (screens, extra) == ([screen], "trainer.max_steps=4")


@pytest.mark.data
@pytest.mark.skipif(not (SHARED_DATA / "omniglot").is_dir(), reason=f"no Omniglot zips under {SHARED_DATA}")
def test_a_job_waits_for_its_data_then_runs_on_past_its_call_and_is_packed(tmp_path, monkeypatch):
    monkeypatch.setenv("UNITS_LIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PAPER_TABLES_COMMIT", "test")
    folders = gpu_host.prepare(SHARED_DATA, ["omniglot"], tmp_path / "out", part_mb=6, wheels=False)
    assert len(folders) == 3  # images_background.zip (8.4 MB) is cut in two
    work, out = tmp_path / "work", tmp_path / "back"
    job = "o|omniglot_5w1s|Units-ML|0|1|0"
    extra = "trainer.max_steps=4 trainer.val_check_interval=2 data.val_tasks=4 data.test_tasks=4 model.capture=none"
    tiny = "--trainer.val_check_interval=2 --data.init_args.val_tasks=4 --model.capture=none"
    screen = f"s|omniglot_5w1s|0 1|0|4|{tiny} --model.eta.init_args.peak 0.3"
    for index, folder in enumerate(folders):
        carry = _call(tmp_path, tmp_path / "out", [folder.name], f"call{index}")
        argv = ["run", "--carry", str(carry), "--work", str(work), "--every", "1"]
        plan = ["--jobs", job, "--extra", extra, "--screens", screen] if index == 0 else []  # the host keeps them
        assert gpu_host.main([*argv, *plan]) == 0
        for name in ("o", "s"):  # not before the last part has come
            assert (work / "runs" / f"{name}.started").exists() == (index == len(folders) - 1)
    # the call that started it has returned; the job runs on in its own session, and a later call collects it
    deadline = time.time() + 600
    while gpu_host.running(work) and time.time() < deadline:
        time.sleep(2)
    assert gpu_host.main(["run", "--carry", str(tmp_path / "none"), "--work", str(work), "--collect", str(out)]) == 0
    pieces = sorted(out.iterdir())
    (tmp_path / "runs.tgz").write_bytes(b"".join(p.read_bytes() for p in pieces))
    with tarfile.open(tmp_path / "runs.tgz") as tar:
        names = tar.getnames()
        done = json.load(tar.extractfile("o/omniglot_5w1s/units-ml/seed0/done.json"))
    assert "o/omniglot_5w1s/units-ml/seed0/done.json" in names, (work / "runs" / "o.log").read_text()[-3000:]
    assert not any(name.endswith(".ckpt") for name in names)  # a done run's checkpoints stay behind
    assert done["commit"] == "test"  # the commit the host ran, which has no git history there
    with tarfile.open(tmp_path / "runs.tgz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    report = gpu_host.screen_report(tmp_path / "unpacked", 1, 4)
    assert len(report) == 3 and report[-1] == f"s/omniglot_5w1s: {report[-1].split(': ')[1]}", report
    assert all("over 2 validations in 1-4; best " in line and "; last 4: " in line for line in report[:2]), report


def test_runs_a_host_packed_unfinished_continue_on_the_next_host_and_are_unpacked_once(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_host, "OUT_PIECE", 700)  # several pieces, all carried in one call
    old = tmp_path / "old" / "runs"
    run = old / "c5" / "cifarfs_5w5s" / "units-ml" / "seed0"
    (run / "ckpt").mkdir(parents=True)
    (run / "ckpt" / "last.ckpt").write_bytes(random.Random(0).randbytes(2000))  # does not compress
    (old / "c5.started").write_text("{}")
    (old / "c5.log").write_text("log")
    pieces = gpu_host.collect(tmp_path / "old", tmp_path / "back")
    assert len(pieces) > 1
    carry = tmp_path / "carry"
    (carry / gpu_host.RESUME).mkdir(parents=True)
    for piece in pieces:
        shutil.copy(piece, carry / gpu_host.RESUME / piece.name)
    work = tmp_path / "new"
    (work / "runs").mkdir(parents=True)
    gpu_host.stage(carry, work)
    restored = work / "runs" / "c5" / "cifarfs_5w5s" / "units-ml" / "seed0" / "ckpt" / "last.ckpt"
    assert restored.read_bytes() == (run / "ckpt" / "last.ckpt").read_bytes()
    assert not (work / "runs" / "c5.started").exists()  # so the job starts again, and continues the run
    restored.write_bytes(b"written by the continued run")
    gpu_host.stage(carry, work)  # the next call carries the same pieces: they do not overwrite the run
    assert restored.read_bytes() == b"written by the continued run"


def test_resume_pieces_that_do_not_make_one_archive_are_refused_by_name(tmp_path):
    carry = tmp_path / "carry"
    (carry / gpu_host.RESUME).mkdir(parents=True)
    (carry / gpu_host.RESUME / "runs.tgz.00").write_bytes(b"\x1f\x8b\x08" + bytes(50))
    with pytest.raises(RuntimeError, match=r"runs\.tgz\.00 do not make one archive"):
        gpu_host.stage(carry, tmp_path / "work")


def test_a_shell_that_names_a_run_folder_is_not_taken_for_a_running_job(tmp_path):
    work = tmp_path / "work"
    probe = f"import sys; sys.path.insert(0, {str(gpu_host.REPO)!r}); from benchmarks import gpu_host; "
    probe += f"print(gpu_host.running(__import__('pathlib').Path({str(work)!r})))"
    shell = f'{sys.executable} -c "{probe}"; true {work}/runs/c5.log'
    assert subprocess.run(["bash", "-c", shell], capture_output=True, text=True).stdout.strip() == "False"
    job = subprocess.Popen(["bash", "-c", f"sleep 30; true {work}/runs/c5"])
    try:
        assert subprocess.run(["bash", "-c", shell], capture_output=True, text=True).stdout.strip() == "True"
    finally:
        job.kill()


def test_a_screen_s_collapse_step_comes_from_its_summary_else_from_its_console(tmp_path):
    summary, console, silent = (tmp_path / name for name in ("summary", "console", "silent"))
    (summary / "cfg" / "version_0").mkdir(parents=True)
    (summary / "cfg" / "version_0" / "summary.json").write_text(json.dumps({"collapse_step": 3199}))
    (summary / "console.log").write_text("training looks collapsed at step 12: an older message")
    console.mkdir()
    (console / "console.log").write_text("UserWarning: training looks collapsed at step 1499: over the 100 steps")
    (silent / "cfg" / "version_0").mkdir(parents=True)
    (silent / "cfg" / "version_0" / "summary.json").write_text(json.dumps({"collapse_step": None}))
    assert [gpu_host.collapse_step(run) for run in (summary, console, silent)] == [3199, 1499, None]


def test_the_screen_report_gives_each_seed_s_best_beside_its_last_so_a_freeze_shows_before_the_monitor_warns(tmp_path):
    for seed, accuracies in ((0, [0.32, 0.39, 0.23]), (1, [0.30, 0.31, 0.33])):
        history = tmp_path / "eta0" / "cfg" / "screen" / f"seed{seed}" / "cfg" / "version_0"
        history.mkdir(parents=True)
        rows = [f"{500 * (index + 1) - 1},{accuracy},{0.4 + 0.2 * index}" for index, accuracy in enumerate(accuracies)]
        (history / "metrics.csv").write_text("step,val/acc,val/vacuity\n" + "\n".join(rows) + "\n")
    report = gpu_host.screen_report(tmp_path, 500, 1000)
    assert report == [
        "eta0/cfg seed0: 35.50 over 2 validations in 500-1000; best 39.00 (1000); last 1500: 23.00 / 0.800; "
        "first warning none",
        "eta0/cfg seed1: 30.50 over 2 validations in 500-1000; best 33.00 (1500); last 1500: 33.00 / 0.800; "
        "first warning none",
        "eta0/cfg: 33.00 over 2 seeds",
    ]
