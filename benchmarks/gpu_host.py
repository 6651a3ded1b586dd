"""Paper-table runs on a borrowed GPU host that each call reaches with a small upload: the datasets travel in parts,
the runs outlive the call that starts them, and a later call watches them and packs what they wrote.

Made for a command runner that sends the repository with at most 64 MiB of files per call, runs one command there,
ends that command's processes unless they started their own session, and gives the host back soon after a call
when no next call follows (the way this project's GPU figures in docs/RESULTS.md were made). Three steps:

    # here, once: the wheels the host lacks and the datasets of ../shared/data cut into parts of at most 58 MB
    python benchmarks/gpu_host.py prepare --datasets omniglot cifarfs --out .device
    python benchmarks/gpu_host.py wandb --out .device   # only for a command there that logs to W&B: .device/wb
    # there, one call per part, each carrying .device/ws and .device/pK (K = 1, 2, ...); the jobs of --jobs start
    # (in the background) as soon as the datasets they need are complete, each at most once; later calls may leave
    # --jobs out (the host keeps every call's jobs); the runs record the commit given (the copy of the tree there may
    # have no git history)
    PAPER_TABLES_COMMIT=<commit> python3 benchmarks/gpu_host.py run --carry .device --deadline 1500 --wait 540 \
        --jobs "c5|cifarfs_5w5s|MAML Units-ML|0 1 2|3|0,1,2"
    # there, the last call: wait until every job has ended (or the deadline), then pack the run folders into $OUT
    python3 benchmarks/gpu_host.py run --carry .device --wait 600 --collect "$OUT"

Runs longer than one lease continue on the next host: ``--collect`` packs the checkpoints of every run that is not
done, and a later host's first call carries those pieces back as ``.device/resume/runs.tgz.NN`` (all in that call);
``run`` unpacks them into ``<work>/runs`` once (not the jobs' ``.started`` markers), so the same ``--jobs`` continues
each run from its ``last.ckpt`` (``paper_tables.py`` skips the done ones). Keep ``--work`` the same: the run
folders' checkpoints and loggers name their absolute paths.

Settings are chosen on validation tasks with screens, ``--screens "name|config|seeds|gpus|steps|overrides"``: one
``units-lightning fit`` a seed (on the GPUs in turn) of ``steps`` steps with the overrides, validated every 500 steps,
no checkpoint and no test, its metrics in ``<work>/runs/<name>/<config>/screen/seed<k>``; back here,
``python benchmarks/gpu_host.py screens <unpacked runs> --steps 2500 3500`` prints each seed's mean validation
accuracy over those steps, its best validation, its last with its vacuity, and where ``CollapseMonitor`` first
warned.

A job is ``name|configs|methods|seeds|per_gpu|gpus`` (the arguments of ``benchmarks/paper_tables.py``, whose run
folders go to ``<work>/runs/<name>``): it needs the datasets its configs read, and runs with ``--time-limit`` up to
the deadline, which the first ``run`` sets (``--deadline`` seconds from then) and the later ones keep. Every job of
one host runs under one CUDA MPS daemon where ``nvidia-cuda-mps-control`` exists, so that several runs share a GPU
without time slices. The repository is copied to ``<work>/repo-<commit>`` before a job starts from it, so that the
next call's copy of the tree, which replaces this one, changes nothing under a running job.

Parts: ``prepare`` cuts each dataset file larger than ``--part-mb`` into pieces and packs files and pieces into
folders ``p1``, ``p2``, ... of at most ``--part-mb`` each, with a ``manifest.json`` (each file's size, sha256 and
pieces) in every folder. ``run`` copies the parts it carries under ``<work>/parts`` (and merges their manifests, so
that parts of several ``prepare`` calls, each with its own ``--out``, may come), joins each file once all its
pieces are there, checks its sha256 and moves it to ``<work>/data/<dataset>/``. The data never enters the
repository: ``.device/`` is ignored by git.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

if not __package__:  # `python benchmarks/gpu_host.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO  # noqa: E402
from units_lightning.csv_history import run_metrics  # noqa: E402  (every segment of a run's history, each step once)

DATASETS = ("omniglot", "cifarfs", "miniimagenet")
WHEELS = ("jsonargparse", "typeshed_client", "docstring_parser")  # what the GPU image lacks (learn2learn is not needed)
MANIFEST = "manifest.json"
RESUME = "resume"  # the carried folder of a former host's runs.tgz.NN, to continue here
OUT_PIECE = 15 * 2**20  # files that come back: at most 16 MiB each
# what the copy of the repository the jobs run from leaves out
NOT_COPIED = shutil.ignore_patterns(".git", ".device", ".venv", "runs", "wandb", "__pycache__", ".cache", ".*_cache")


def dataset_of(config: str) -> str:
    """The dataset a config reads, from its name (``cifarfs_5w5s``, ``budget_omniglot_5w1s``)."""
    for name in DATASETS:
        if name in config:
            return name
    raise ValueError(f"no dataset named in config {config!r} (one of {', '.join(DATASETS)})")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- here: prepare ---------------------------------------------------------------------------------------------------
def plan_parts(files: dict[str, int], part_bytes: int) -> list[list[tuple[str, int, int]]]:
    """Pack files (relative name -> size) into parts of at most ``part_bytes``: a list of parts, each a list of
    ``(name, offset, length)`` pieces. Files larger than a part are cut; pieces fill parts first-fit, largest first.

        >>> plan_parts({"a": 5, "b": 3, "c": 9}, 6)
        [[('c', 0, 6)], [('a', 0, 5)], [('b', 0, 3), ('c', 6, 3)]]
    """
    if part_bytes <= 0:
        raise ValueError(f"part size must be positive, got {part_bytes}")
    pieces = []
    for name, size in files.items():
        offsets = range(0, max(size, 1), part_bytes)
        pieces += [(name, offset, min(part_bytes, size - offset)) for offset in offsets]
    parts: list[list[tuple[str, int, int]]] = []
    free: list[int] = []
    for piece in sorted(pieces, key=lambda p: -p[2]):
        slot = next((i for i, room in enumerate(free) if room >= piece[2]), None)
        if slot is None:
            parts.append([])
            free.append(part_bytes)
            slot = len(parts) - 1
        parts[slot].append(piece)
        free[slot] -= piece[2]
    return parts


def download_wandb(out: Path) -> Path:
    """``out/wb``: the wheels of W&B (the version installed here) and everything it needs, for the GPU host's Python
    3.12 on x86_64 Linux (27 MB for wandb 0.31.0). The image lacks W&B, and the paper runs log to CSV; a command that
    should log to W&B (a whole run timed as a user runs it) installs them first, beside what the image has:
    ``python3 -m pip install -q --no-index --find-links .device/wb wandb``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        wanted = f"wandb=={version('wandb')}"
    except PackageNotFoundError:
        wanted = "wandb"
    folder = out / "wb"
    shutil.rmtree(folder, ignore_errors=True)
    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
         *platforms, "-d", str(folder), wanted],
        check=True,
    )  # fmt: skip
    return folder


def prepare(shared: Path, datasets: Sequence[str], out: Path, part_mb: float, wheels: bool) -> list[Path]:
    """Write ``out/ws`` (wheels, unless ``wheels`` is false) and ``out/p1``... from ``shared/<dataset>``."""
    files = {}
    for dataset in datasets:
        folder = shared / dataset
        if not folder.is_dir():
            raise FileNotFoundError(f"no {folder}: pass --shared, the folder that holds {', '.join(DATASETS)}")
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            files[str(path.relative_to(shared))] = path.stat().st_size
    manifest = {name: {"size": size, "sha256": sha256(shared / name)} for name, size in files.items()}
    parts = plan_parts(files, int(part_mb * 1e6))
    for name in manifest:
        manifest[name]["pieces"] = sum(p[0] == name for part in parts for p in part)
    for stale in out.glob("p[0-9]*"):  # the parts of an earlier prepare into the same folder
        shutil.rmtree(stale)
    folders = []
    for index, part in enumerate(parts, 1):
        folder = out / f"p{index}"
        folder.mkdir(parents=True)
        for name, offset, length in part:
            with open(shared / name, "rb") as source, open(folder / f"{name.replace('/', '~')}@{offset}", "wb") as sink:
                source.seek(offset)
                sink.write(source.read(length))
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
        folders.append(folder)
    if wheels:
        shutil.rmtree(out / "ws", ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
             "3.12", "-d", str(out / "ws"), *WHEELS],
            check=True,
        )  # fmt: skip
    return folders


# -- there: stage, launch, watch, collect ----------------------------------------------------------------------------
def stage(carry: Path, work: Path) -> set[str]:
    """Install carried wheels, take carried parts in, join the files whose pieces are all here; the datasets that are
    complete."""
    if (carry / "ws").is_dir() and not (work / "site").is_dir():
        wheels = sorted(str(p) for p in (carry / "ws").glob("*.whl"))
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
             str(work / "site"), *wheels],
            check=True,
        )  # fmt: skip
    restore(carry, work)
    parts = work / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    known = work / MANIFEST  # every manifest carried so far, merged: parts of several prepares may come
    manifest = json.loads(known.read_text()) if known.is_file() else {}
    for folder in sorted(carry.glob("p[0-9]*")):
        manifest.update(json.loads((folder / MANIFEST).read_text()))
        for path in folder.iterdir():
            if path.name != MANIFEST:
                shutil.copy2(path, parts / path.name)
    known.write_text(json.dumps(manifest, indent=1))
    complete = set()
    for name, entry in manifest.items():
        target = work / "data" / name
        if not target.is_file():
            pieces = sorted(parts.glob(f"{name.replace('/', '~')}@*"), key=lambda p: int(p.name.rsplit("@", 1)[1]))
            if len(pieces) < entry["pieces"]:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            with open(partial, "wb") as sink:
                for piece in pieces:
                    sink.write(piece.read_bytes())
            if sha256(partial) != entry["sha256"]:
                partial.unlink()
                raise RuntimeError(f"{name}: sha256 differs from the manifest's once joined; run prepare again")
            partial.replace(target)
            for piece in pieces:
                piece.unlink()
        complete.add(name)
    datasets = {name.split("/", 1)[0] for name in manifest}
    return {d for d in datasets if all(n in complete for n in manifest if n.split("/", 1)[0] == d)}


def restore(carry: Path, work: Path) -> list[str]:
    """Unpack the run folders of a former host's ``--collect`` (carried as ``resume/runs.tgz.NN``) into
    ``<work>/runs``, once per archive; the top-level files (each job's ``.started`` marker and log) stay behind, so
    that the jobs start again and continue their runs. The names unpacked."""
    pieces = sorted((carry / RESUME).glob("runs.tgz.[0-9]*"))
    if not pieces:
        return []
    archive = work / "resume.tgz"
    work.mkdir(parents=True, exist_ok=True)
    with open(archive, "wb") as sink:
        for piece in pieces:
            sink.write(piece.read_bytes())
    marker = work / f"resumed-{sha256(archive)[:16]}"
    if marker.exists():
        return []
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if "/" in m.name]
            tar.extractall(work / "runs", members=members, filter="data")
    except (tarfile.TarError, EOFError) as error:
        names = ", ".join(p.name for p in pieces)
        raise RuntimeError(f"{carry / RESUME}: {names} do not make one archive ({error}); carry every piece") from error
    marker.touch()
    print(f"[gpu_host] resumed {len(members)} files from {len(pieces)} piece(s)")
    return [m.name for m in members]


def commit_of(repo: Path) -> str:
    """The commit the runs record: ``$PAPER_TABLES_COMMIT``, else git's short hash, else ``unknown``."""
    if os.environ.get("PAPER_TABLES_COMMIT"):
        return os.environ["PAPER_TABLES_COMMIT"]
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else "unknown"


def environment(work: Path, repo_copy: Path, commit: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(work / "site"), str(repo_copy), env.get("PYTHONPATH", "")]
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in paths if p),
        PAPER_TABLES_COMMIT=commit,
        PYTHONUNBUFFERED="1",
        CUDA_MPS_PIPE_DIRECTORY=str(work / "mps" / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(work / "mps" / "log"),
        # NVLink multicast stays off on shared hosts (it can put their GPUs out of service)
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
    )
    return env


def start_mps(env: dict[str, str]) -> bool:
    """One CUDA MPS daemon for every job of this host (``paper_tables.py --mps`` would start one per job)."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return False
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    if not (Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "control").exists():
        subprocess.run([control, "-d"], env=env, check=False, timeout=60)
    return True


def parse_job(text: str) -> dict[str, str]:
    """``name|configs|methods|seeds|per_gpu|gpus``.

    >>> parse_job("c5|cifarfs_5w5s|MAML Units-ML|0 1 2|3|0,1,2")["methods"]
    'MAML Units-ML'
    """
    fields = text.split("|")
    keys = ("name", "configs", "methods", "seeds", "per_gpu", "gpus")
    if len(fields) != len(keys) or not all(f.strip() for f in fields):
        raise ValueError(f"a job is {'|'.join(keys)}, all six given; got {text!r}")
    return dict(zip(keys, (f.strip() for f in fields), strict=True))


def parse_screen(text: str) -> dict[str, str]:
    """``name|config|seeds|gpus|steps|overrides``: validation-only fits, the overrides (fit options) on each.

    >>> parse_screen("eta03|miniimagenet_5w1s|0 1|0,1|6000|--model.eta.init_args.peak 0.3")["overrides"]
    '--model.eta.init_args.peak 0.3'
    """
    fields = [f.strip() for f in text.split("|")]
    keys = ("name", "config", "seeds", "gpus", "steps", "overrides")
    if len(fields) != len(keys) or not all(fields[:5]) or not fields[4].isdigit():
        raise ValueError(f"a screen is {'|'.join(keys)}, the first five given, steps a number; got {text!r}")
    return dict(zip(keys, fields, strict=True))


def job_commands(job: dict[str, str], work: Path, limit: int, extra: str) -> list[tuple[list[str], dict, Path]]:
    """A paper_tables job: one command, which packs its runs onto its GPUs itself."""
    command = [
        sys.executable, "benchmarks/paper_tables.py", "--configs", *job["configs"].split(),
        "--methods", *job["methods"].split(), "--seeds", *job["seeds"].split(), "--per-gpu", job["per_gpu"],
        "--gpus", job["gpus"], "--root", str(work / "runs" / job["name"]), "--data-root", str(work / "data"),
        "--time-limit", str(limit), "--grace", "45", *(["--extra", *extra.split()] if extra else []),
    ]  # fmt: skip
    return [(command, {}, work / "runs" / f"{job['name']}.log")]


def screen_commands(screen: dict[str, str], work: Path, limit: int) -> list[tuple[list[str], dict, Path]]:
    """A screen: one fit a seed, on the GPUs in turn, validated every 500 steps with no checkpoint and no test (the
    choice is made on validation tasks only), stopped by SIGTERM at the deadline with what it has logged."""
    config, gpus = screen["config"], screen["gpus"].split(",")
    commands = []
    for index, seed in enumerate(screen["seeds"].split()):
        folder = work / "runs" / screen["name"] / config / "screen" / f"seed{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(folder)}}
        command = [
            "timeout", "-s", "TERM", "-k", "30", str(limit),
            sys.executable, "-m", "units_lightning", "fit", "--config", f"configs/{config}.yaml",
            f"--data.init_args.root={work / 'data' / dataset_of(config)}", f"--seed_everything={seed}",
            f"--data.init_args.seed={seed}", f"--trainer.max_steps={screen['steps']}",
            "--trainer.val_check_interval=500", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
            f"--trainer.logger={json.dumps(logger)}",
            *shlex.split(screen["overrides"]),
        ]  # fmt: skip
        environment = {"CUDA_VISIBLE_DEVICES": gpus[index % len(gpus)], "OMP_NUM_THREADS": "4"}
        commands.append((command, environment, folder / "console.log"))
    return commands


def launch(
    jobs: Sequence[str], ready: set[str], work: Path, deadline: float, extra: str = "", screens: Sequence[str] = ()
) -> list[str]:
    """Start each job and screen whose datasets are ready and that has not started yet, each command in its own
    session; their names."""
    commit = commit_of(REPO)
    repo_copy = work / f"repo-{commit}"
    if not repo_copy.is_dir():
        shutil.copytree(REPO, repo_copy, ignore=NOT_COPIED)
    env = environment(work, repo_copy, commit)
    started = []
    items = [(parse_job(t), "job") for t in jobs] + [(parse_screen(t), "screen") for t in screens]
    for item, kind in items:
        marker = work / "runs" / f"{item['name']}.started"
        configs = item["configs"].split() if kind == "job" else [item["config"]]
        needs = {dataset_of(c) for c in configs}
        if marker.exists():
            continue
        if not needs <= ready:
            print(f"[gpu_host] {item['name']} waits for {', '.join(sorted(needs - ready))}")
            continue
        use_mps = start_mps(env)
        limit = int(deadline - time.time())
        marker.parent.mkdir(parents=True, exist_ok=True)
        if kind == "job":
            commands = job_commands(item, work, limit, extra)
        else:
            commands = screen_commands(item, work, limit)
        for command, variables, log_path in commands:
            with open(log_path, "w") as log:
                subprocess.Popen(
                    command, cwd=repo_copy, env={**env, **variables}, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
        marker.write_text(json.dumps({"commands": [c for c, _, _ in commands], "started": time.time()}))
        started.append(item["name"])
        print(f"[gpu_host] {time.strftime('%X')} started {item['name']} ({limit} s to the deadline, MPS {use_mps})")
    return started


def progress(runs: Path) -> list[str]:
    """One line per run folder: its newest step, validation accuracy, tests done, and whether it is done."""
    lines = []
    for run in sorted(runs.glob("*/*/*/seed*")):
        rows = run_metrics(run)
        step = max((int(row["step"]) for row in rows if (row.get("step") or "").isdigit()), default=-1)
        accuracy = next((row["val/acc"] for row in reversed(rows) if row.get("val/acc")), "")
        tests = len(list(run.glob("test/*/results.json")))
        done = " done" if (run / "done.json").is_file() else ""
        lines.append(f"  {run.relative_to(runs)}: step {step}, val/acc {accuracy[:6]}, {tests} tests{done}")
    return lines


def screen_validations(run: Path) -> dict[int, tuple[float, float]]:
    """A screen fit's validations: step (counted from 1) -> (accuracy %, vacuity)."""
    found = {
        int(row["step"]) + 1: (100 * float(row["val/acc"]), float(row["val/vacuity"]))
        for row in run_metrics(run)
        if row.get("val/acc")
    }
    return dict(sorted(found.items()))


def collapse_step(run: Path) -> int | None:
    """The step at which ``CollapseMonitor`` warned in a fit's folder: the fit summary's ``collapse_step``, else (a
    fit killed before its summary) the first warning in its console log; None when it did not warn."""
    for summary in sorted(run.rglob("summary.json")):
        found = json.loads(summary.read_text()).get("collapse_step")
        if found is not None:
            return int(found)
    console = run / "console.log"
    warning = re.search(r"looks collapsed at step (\d+)", console.read_text()) if console.is_file() else None
    return int(warning.group(1)) if warning else None


def screen_report(root: Path, first: int, last: int) -> list[str]:
    """Per screen (``<name>/<config>``) and seed: the mean validation accuracy over steps ``first``-``last``, the
    best validation with its step, the last with its vacuity (a last far below the best is a freeze the monitor has
    not called yet), and the step of ``CollapseMonitor``'s first warning; then the mean over seeds."""
    lines, groups = [], {}
    for run in sorted(root.glob("*/*/screen/seed*")):
        validations = screen_validations(run)
        window = [accuracy for step, (accuracy, _) in validations.items() if first <= step <= last]
        warning = collapse_step(run)
        name = f"{run.parents[2].name}/{run.parents[1].name}"
        mean = sum(window) / len(window) if window else float("nan")
        groups.setdefault(name, []).append(mean)
        best, end = "none", "none"
        if validations:
            top = max(validations, key=lambda step: validations[step][0])
            step = max(validations)
            best = f"{validations[top][0]:.2f} ({top})"
            end = f"{step}: {validations[step][0]:.2f} / {validations[step][1]:.3f}"
        lines.append(
            f"{name} {run.name}: {mean:.2f} over {len(window)} validations in {first}-{last}; best {best}; "
            f"last {end}; first warning {'none' if warning is None else warning}"
        )
    lines += [f"{name}: {sum(means) / len(means):.2f} over {len(means)} seeds" for name, means in groups.items()]
    return lines


def ancestors() -> set[int]:
    """This process and its parents (``/proc``): a shell that started this script may name a run folder too."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def running(work: Path) -> bool:
    """Whether a process of this host's jobs or screens is alive (each names a folder under ``<work>/runs``)."""
    found = subprocess.run(["pgrep", "-f", f"{work / 'runs'}/"], capture_output=True, text=True)
    return bool({int(pid) for pid in found.stdout.split()} - ancestors())


def watch(work: Path, deadline: float, wait: float, every: float) -> None:
    end = time.time() + wait
    while True:
        print(f"[gpu_host] {time.strftime('%X')}, {int(deadline - time.time())} s to the deadline")
        print("\n".join(progress(work / "runs")), flush=True)
        if not running(work):
            print("[gpu_host] no job running")
            return
        if time.time() + every > end:
            return
        time.sleep(every)


def collect(work: Path, out: Path) -> list[Path]:
    """Pack the run folders into ``out/runs.tgz.NN`` (each under 16 MiB): every file but checkpoints, and the
    checkpoints of runs that are not done (to test or continue elsewhere)."""
    runs = work / "runs"
    archive = work / "runs.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(p for p in runs.rglob("*") if p.is_file()):
            relative = path.relative_to(runs)
            seed = next((parent for parent in path.parents if parent.name.startswith("seed")), None)
            if path.suffix == ".ckpt" and (seed is None or (seed / "done.json").is_file()):
                continue
            tar.add(path, arcname=str(relative))
    out.mkdir(parents=True, exist_ok=True)
    pieces = []
    with open(archive, "rb") as source:
        for index, block in enumerate(iter(lambda: source.read(OUT_PIECE), b"")):
            piece = out / f"runs.tgz.{index:02d}"
            piece.write_bytes(block)
            pieces.append(piece)
    return pieces


def planned(work: Path, jobs: str, screens: str, extra: str) -> tuple[list[str], list[str], str]:
    """The jobs, screens and extra overrides of this host: every job and screen that any call named, a later call's
    version of a name replacing the earlier one (until it starts), and the last ``--extra`` given. A call that names
    none keeps the plan, so that a call made only to carry a data part still starts the jobs that part completes."""
    plan_file = work / "plan.json"
    plan = json.loads(plan_file.read_text()) if plan_file.is_file() else {"jobs": {}, "screens": {}, "extra": ""}
    for key, text in (("jobs", jobs), ("screens", screens)):
        for item in filter(None, (part.strip() for part in text.split(";"))):
            plan[key][item.split("|")[0]] = item
    plan["extra"] = extra or plan["extra"]
    plan_file.write_text(json.dumps(plan, indent=1))
    return list(plan["jobs"].values()), list(plan["screens"].values()), plan["extra"]


def run(args: argparse.Namespace) -> int:
    work = args.work
    (work / "runs").mkdir(parents=True, exist_ok=True)
    deadline_file = work / "deadline"
    if not deadline_file.exists():
        deadline_file.write_text(str(time.time() + args.deadline))
    deadline = float(deadline_file.read_text())
    ready = stage(args.carry, work)
    print(f"[gpu_host] {time.strftime('%X')} datasets ready: {', '.join(sorted(ready)) or 'none'}")
    jobs, screens, extra = planned(work, args.jobs, args.screens, args.extra)
    launch(jobs, ready, work, deadline, extra, screens)
    watch(work, deadline, args.wait, args.every)
    if args.collect:
        for piece in collect(work, args.collect):
            print(f"[gpu_host] {piece} ({piece.stat().st_size} bytes)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="here: wheels and dataset parts")
    prep.add_argument("--datasets", nargs="+", choices=DATASETS, default=["omniglot", "cifarfs"])
    prep.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data")
    prep.add_argument("--out", type=Path, default=REPO / ".device")
    prep.add_argument("--part-mb", type=float, default=58.0, help="MB a part (the repository travels beside it)")
    prep.add_argument("--no-wheels", action="store_true")
    wheels = commands.add_parser("wandb", help="here: W&B's wheels for the host, into <out>/wb")
    wheels.add_argument("--out", type=Path, default=REPO / ".device")
    there = commands.add_parser("run", help="there: stage what this call carries, start jobs, watch, collect")
    there.add_argument("--carry", type=Path, default=REPO / ".device")
    there.add_argument("--work", type=Path, default=Path("/tmp/gpu_host"))
    there.add_argument(
        "--jobs",
        default="",
        help="name|configs|methods|seeds|per_gpu|gpus, ';' between jobs; kept for the host's later calls",
    )
    there.add_argument("--extra", default="", help="overrides for every run (paper_tables.py --extra); kept as --jobs")
    there.add_argument(
        "--screens",
        default="",
        help="name|config|seeds|gpus|steps|overrides, ';' between screens; kept as --jobs",
    )
    there.add_argument("--deadline", type=float, default=1500, help="seconds from the first call; the jobs stop then")
    there.add_argument("--wait", type=float, default=0, help="seconds to watch the jobs before returning")
    there.add_argument("--every", type=float, default=60)
    there.add_argument("--collect", type=Path, help="pack the run folders into this folder (e.g. $OUT)")
    report = commands.add_parser("screens", help="here: the validations of screens brought back")
    report.add_argument("root", type=Path, help="the folder that holds <name>/<config>/screen/seed<k>")
    report.add_argument("--steps", type=int, nargs=2, default=(2500, 3500), metavar=("FIRST", "LAST"))
    args = parser.parse_args(argv)
    if args.command == "screens":
        print("\n".join(screen_report(args.root, *args.steps)))
        return 0
    if args.command == "prepare":
        for folder in prepare(args.shared, args.datasets, args.out, args.part_mb, not args.no_wheels):
            size = sum(p.stat().st_size for p in folder.iterdir())
            print(f"{folder}: {size / 1e6:.1f} MB")
        return 0
    if args.command == "wandb":
        folder = download_wandb(args.out)
        print(f"{folder}: {sum(p.stat().st_size for p in folder.iterdir()) / 1e6:.1f} MB")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
