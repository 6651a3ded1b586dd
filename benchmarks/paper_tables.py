"""The paper's tables (issue 16): a grid of (config, method, seed) runs, each tested, tabled beside the paper.

Thin over the configs and the command line: every run is ``python -m units_lightning fit`` of a shipped config
with a method's overrides, then ``python -m units_lightning test`` of its checkpoints on the config's seeded test
tasks (600 in the shipped configs), each in a subprocess:

- label-budget configs (``model.label_budget`` set; they carry a ``MilestoneCheckpoint``): the checkpoint of each
  milestone (4,000 / 8,000 / 10,000 labeled query sets), ``--ckpt_path .../milestones/labels-04000.ckpt``;
- standard configs: the ensemble of the top-k validation checkpoints, as the paper (k is the ``save_top_k`` of the
  config's ``val/acc`` checkpoint: 1 for Omniglot, 3 for CIFAR-FS and mini-ImageNet), ``--model.ensemble``.

Methods are config overrides only (``METHODS``): MAML (``CrossEntropyLoss``, ``RandomSampler``), Units-NTS
(``EvidentialLoss``, ``RandomSampler``), Units-ST (``SingleTaskSelectionSampler``) and Units-ML (the config's
``MultiQuerySampler``). Every method labels the same number of query sets per step, the sampler's ``tasks`` (the
budget configs: 2), so a budget of 10,000 lasts 5,000 steps for each; Units-ST scores as many candidate query sets
per step as Units-ML (``candidates = tasks x query_sets``) and keeps the ``tasks`` most uncertain.

Each run has its folder, ``<root>/<config>/<method>/seed<k>``: a CSV logger there (no W&B needed;
``--logger config`` keeps the config's logger, the shipped configs' offline W&B, which keeps every segment, its
``save_dir`` moved there), checkpoints in ``<logger>/<version>/checkpoints/``, the ``metrics.csv`` of each earlier
fit segment in ``metrics/segment-<NN>.csv`` (Lightning's ``CSVLogger`` deletes the ``metrics.csv`` of the version
a resumed fit continues, so ``keep_metrics`` moves it there before each segment; ``run_metrics`` stitches the
whole history back together, each step once), the console output of every command in ``console/``, test results in
``test/<checkpoint>/results.json``, a record of every command (arguments, commit, device, wall time, exit status)
in ``run.json``, and ``done.json`` once every test has succeeded. Runs with ``done.json`` are skipped; any other
is continued: ``fit --ckpt_path last`` (a new run where no ``last.ckpt`` exists yet), then the tests that have no
results. Runs start seed by seed, those under way first within a seed (``launch_order``), so that short stretches
of GPU time fill one seed of every cell before the next. A folder made with other arguments (``--extra``,
``--logger``) is refused, not continued. Seed ``k``
sets ``seed_everything`` and the episode streams (``data.seed``) of training and validation; tests always use the
config's own seeds, so every run is tested on the same tasks.

``--time-limit`` stops launching commands ``--grace`` seconds before the limit and sends SIGTERM to those still
running: a training run finishes its step, writes ``last.ckpt`` when that step is one in the middle of an epoch
with no validation after it (``CheckpointOnSigterm``, added to every fit; otherwise the ``last.ckpt`` of the last
validation stands) and exits with 143; at the limit the rest are killed (checkpoints are written atomically).
The next call continues. SIGTERM to this script does the same at once.

Tables (Markdown and JSON) and plots (test accuracy against labeled query sets, one band per method) go to
``<root>/tables/``: mean and 95% confidence interval over seeds (Student t with n - 1 degrees of freedom) beside
the paper's numbers (``PAPER_SOURCE``), with the standard setting's accuracy at vacuity < 0.2 and < 0.1 and its
coverage from each ``results.json``, and Units-ML against Units-NTS paired by seed (``paired_difference``).

    python benchmarks/paper_tables.py --dry-run                     # the runs, their commands, what is done
    python benchmarks/paper_tables.py --configs budget --parallel 8 --gpus 0,1,2,3 --time-limit 3300
    python benchmarks/paper_tables.py --configs omniglot_5w1s --methods Units-ML --seeds 0 \
        --extra "trainer.max_steps=200 data.test_tasks=50"               # a quick check (another --root!)
    python benchmarks/paper_tables.py --tables-only

Exit status: 0 when every selected run is done, 3 when the time limit or a signal stopped the call (run it again),
1 when a command failed (its console log is named).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

STARTED = time.monotonic()  # --time-limit counts from here, before the imports below (seconds on a cold start)

import yaml  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(__file__).resolve().parent

# --- the paper's numbers ----------------------------------------------------------------------------------------

PAPER_SOURCE = (
    "Pandey & Yu, Multidimensional Belief Quantification for Label-Efficient Meta-Learning, CVPR 2022: "
    "Table 2 and the limited-label-budget tables, as collected in ../shared/REFERENCE.md section 4"
)
BUDGET_POINTS = (4000, 8000, 10000)
"""Labeled query sets after which the paper reports test accuracy in the label-budget setting."""
PAPER_BUDGET: dict[str, dict[str, tuple[float, float, float]]] = {
    "budget_omniglot_5w1s": {
        "MAML": (73.44, 80.18, 85.56),
        "Units-NTS": (92.38, 96.13, 96.98),
        "Units-ML": (95.00, 97.90, 98.23),
    },
    "budget_omniglot_5w5s": {
        "MAML": (92.00, 96.26, 96.38),
        "Units-NTS": (98.13, 98.43, 98.46),
        "Units-ML": (98.86, 99.23, 99.16),
    },
    "budget_omniglot_20w1s": {
        "MAML": (65.24, 72.41, 73.91),
        "Units-NTS": (73.35, 75.88, 83.56),
        "Units-ML": (79.17, 78.60, 83.45),
    },
    "budget_omniglot_20w5s": {
        "MAML": (86.62, 89.75, 88.26),
        "Units-NTS": (91.32, 94.05, 95.66),
        "Units-ML": (93.20, 94.16, 96.61),
    },
    "budget_cifarfs_5w5s": {
        "MAML": (29.72, 30.14, 29.95),
        "Units-NTS": (53.87, 58.37, 61.30),
        "Units-ML": (55.88, 60.53, 61.39),
    },
}
"""Test accuracy (%) after each of ``BUDGET_POINTS`` labeled query sets, by config and method."""
PAPER_STANDARD: dict[str, dict[str, float | None]] = {
    "omniglot_20w1s": {"Units-NTS": 91.96, "Units-ML": 93.17, "vacuity<0.2": 96.83, "vacuity<0.1": 98.85},
    "omniglot_20w5s": {"Units-NTS": 97.38, "Units-ML": 97.72, "vacuity<0.2": 99.04, "vacuity<0.1": 99.42},
    "omniglot_5w1s": {"Units-NTS": 99.20, "Units-ML": 99.59, "vacuity<0.2": None, "vacuity<0.1": None},
    "omniglot_5w5s": {"Units-NTS": 99.66, "Units-ML": 99.83, "vacuity<0.2": None, "vacuity<0.1": None},
    "miniimagenet_5w1s": {"Units-NTS": 51.38, "Units-ML": 50.86, "vacuity<0.2": 61.25, "vacuity<0.1": 82.26},
    "miniimagenet_5w5s": {"Units-NTS": 66.75, "Units-ML": 68.16, "vacuity<0.2": 80.70, "vacuity<0.1": 91.07},
    "cifarfs_5w1s": {"Units-NTS": 59.80, "Units-ML": 59.84, "vacuity<0.2": 76.62, "vacuity<0.1": 87.92},
    "cifarfs_5w5s": {"Units-NTS": 76.15, "Units-ML": 76.69, "vacuity<0.2": 83.54, "vacuity<0.1": 90.46},
}
"""Standard setting, test accuracy (%): Units-NTS, Units-ML, and Units-ML on the queries of vacuity < 0.2 / < 0.1
(None where the paper reports none)."""
VACUITY_THRESHOLDS = (0.2, 0.1)
NOT_COMPARABLE = {
    "miniimagenet": "the mini-ImageNet copy in ../shared/data is a subset (100 train images per class, 200 per "
    "validation and test class, against 600 in the paper's data): numbers from runs on it are not comparable with "
    "the paper's",
}
"""Config-name prefix -> a note printed under its table."""

# --- statistics -------------------------------------------------------------------------------------------------


def student_t_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with ``df`` (integer >= 1) degrees of freedom, in closed form.

    Abramowitz & Stegun 26.7.3 (odd ``df``) and 26.7.4 (even ``df``), with ``theta = atan(t / sqrt(df))``.

    Example:
        >>> round(student_t_two_sided(math.tan(0.475 * math.pi), 1), 12)  # df = 1 is the Cauchy distribution
        0.95
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    if df % 2 == 1:
        total, term = 0.0, cos
        for k in range(1, (df - 1) // 2 + 1):  # cos + 2/3 cos^3 + (2 4)/(3 5) cos^5 + ... up to cos^(df - 2)
            total += term
            term *= cos * cos * (2 * k) / (2 * k + 1)
        return 2.0 / math.pi * (theta + sin * total)
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):  # 1 + 1/2 cos^2 + (1 3)/(2 4) cos^4 + ... up to cos^(df - 2)
        total += term
        term *= cos * cos * (2 * k - 1) / (2 * k)
    return sin * total


def student_t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile (> 0.5) of Student's t with ``df`` degrees of freedom (bisection to 1e-12).

    Example:
        >>> round(student_t_quantile(0.975, 2), 6)  # sqrt(2 * 0.95^2 / (1 - 0.95^2))
        4.302653
    """
    if not 0.5 < probability < 1.0:
        raise ValueError(f"probability must be in (0.5, 1), got {probability}")
    inside = 2.0 * probability - 1.0
    low, high = 0.0, 1.0
    while student_t_two_sided(high, df) < inside:
        low, high = high, 2.0 * high
    while high - low > 1e-12 * max(1.0, high):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if student_t_two_sided(middle, df) < inside else (low, middle)
    return 0.5 * (low + high)


def mean_ci95(values: Sequence[float]) -> dict[str, Any]:
    """Mean, half-width of the 95% confidence interval (Student t, n - 1 degrees of freedom, sample standard
    deviation) and n of ``values``; the half-width is None for fewer than two values.

    Example:
        >>> mean_ci95([1.0, 2.0, 3.0])["ci95"] == round(student_t_quantile(0.975, 2) / math.sqrt(3), 12)
        True
    """
    n = len(values)
    if n == 0:
        return {"mean": None, "ci95": None, "n": 0}
    mean = math.fsum(values) / n
    if n == 1:
        return {"mean": mean, "ci95": None, "n": 1}
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return {"mean": mean, "ci95": round(student_t_quantile(0.975, n - 1) * std / math.sqrt(n), 12), "n": n}


# --- configs and methods ----------------------------------------------------------------------------------------

GROUPS = {
    "budget": (
        "budget_omniglot_5w1s",
        "budget_omniglot_5w5s",
        "budget_omniglot_20w1s",
        "budget_omniglot_20w5s",
        "budget_cifarfs_5w5s",
    ),
    "standard": ("omniglot_20w1s", "omniglot_5w1s", "cifarfs_5w1s", "cifarfs_5w5s"),
}
"""``--configs`` names that stand for several configs: the issue's label-budget and standard-setting runs."""
DATASET_FOLDERS = {
    "OmniglotDataModule": "omniglot",
    "CIFARFSDataModule": "cifarfs",
    "MiniImageNetDataModule": "miniimagenet",
}
EVIDENTIAL = "units_lightning.losses.EvidentialLoss"
CROSS_ENTROPY = "units_lightning.losses.CrossEntropyLoss"
RANDOM = "units_lightning.samplers.RandomSampler"
SINGLE_TASK = "units_lightning.samplers.SingleTaskSelectionSampler"
MULTI_QUERY = "units_lightning.samplers.MultiQuerySampler"


@dataclass(frozen=True)
class Method:
    """A method as overrides of a config: its loss (set only where the config's differs) and sampler classes."""

    name: str
    loss: str
    sampler: str


METHODS = {
    m.name: m
    for m in (
        Method("MAML", CROSS_ENTROPY, RANDOM),
        Method("Units-NTS", EVIDENTIAL, RANDOM),
        Method("Units-ST", EVIDENTIAL, SINGLE_TASK),
        Method("Units-ML", EVIDENTIAL, MULTI_QUERY),
    )
}
DEFAULT_METHODS = {"budget": ("MAML", "Units-NTS", "Units-ML"), "standard": ("Units-NTS", "Units-ML")}


@dataclass(frozen=True)
class ConfigInfo:
    """What the grid needs to know of a config file (read as YAML, nothing instantiated)."""

    name: str
    path: Path
    dataset: str | None  # folder name under --data-root, from the data module
    loss: str
    sampler: str
    sampler_args: Mapping[str, Any] = field(compare=False)  # a dict: not hashed
    label_budget: int | None
    milestones: tuple[int, ...]
    milestone_filename: str
    top_k: int

    @property
    def kind(self) -> str:
        return "budget" if self.label_budget is not None else "standard"


def _class_args(section: Any, default_class: str) -> tuple[str, dict[str, Any]]:
    if isinstance(section, str):
        return section, {}
    if isinstance(section, Mapping):
        return str(section.get("class_path", default_class)), dict(section.get("init_args") or {})
    return default_class, {}


def _sampler_defaults(class_path: str) -> dict[str, Any]:
    import inspect

    from units_lightning import samplers

    cls = getattr(samplers, class_path.rsplit(".", 1)[-1], None)
    if cls is None:
        return {}
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def read_config(path: str | Path) -> ConfigInfo:
    """Read a config's data module, loss, sampler, label budget, milestones and top-k checkpoints.

    Raises:
        ValueError: a label-budget config without a ``MilestoneCheckpoint``, or one whose ``dirpath`` is set
            (the runs of the grid would share its files).
    """
    path = Path(path)
    config = yaml.safe_load(path.read_text()) or {}
    model, trainer = config.get("model") or {}, config.get("trainer") or {}
    data_class, data_args = _class_args(config.get("data"), "")
    sampler, sampler_args = _class_args(data_args.get("sampler"), RANDOM)
    loss, _ = _class_args(model.get("loss"), EVIDENTIAL)
    callbacks = trainer.get("callbacks") or []
    milestone_args = [
        _class_args(c, "")[1] for c in callbacks if _class_args(c, "")[0].endswith(".MilestoneCheckpoint")
    ]
    budget = model.get("label_budget")
    if budget is not None and not milestone_args:
        raise ValueError(
            f"{path}: a label-budget config (model.label_budget: {budget}) needs a MilestoneCheckpoint in "
            "trainer.callbacks to test at its budget points, e.g. units_lightning.callbacks.MilestoneCheckpoint "
            "with milestones [4000, 8000, 10000]"
        )
    if milestone_args and milestone_args[0].get("dirpath"):
        raise ValueError(
            f"{path}: MilestoneCheckpoint.dirpath is set ({milestone_args[0]['dirpath']}), so every run of the grid "
            "would write its milestones there: leave it unset (the files then go beside each run's checkpoints)"
        )
    top_k = [
        int(args.get("save_top_k", 1))
        for class_path, args in (_class_args(c, "") for c in callbacks)
        if class_path.endswith("ModelCheckpoint") and args.get("monitor") == "val/acc"
    ]
    return ConfigInfo(
        name=path.stem,
        path=path,
        dataset=DATASET_FOLDERS.get(data_class.rsplit(".", 1)[-1]),
        loss=loss,
        sampler=sampler,
        sampler_args={**_sampler_defaults(sampler), **sampler_args},
        label_budget=budget,
        milestones=tuple(sorted(int(m) for m in milestone_args[0].get("milestones", ()))) if milestone_args else (),
        milestone_filename=str(milestone_args[0].get("filename", "labels-{labels:05d}")) if milestone_args else "",
        top_k=max(1, top_k[0]) if top_k else 1,
    )


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def method_overrides(method: Method, config: ConfigInfo) -> list[str]:
    """The command-line overrides that turn ``config`` into ``method``, labeling as many query sets per step.

    Raises:
        ValueError: Units-ML asked of a config whose sampler is not a ``MultiQuerySampler``.
    """
    overrides = []
    if config.loss != method.loss:
        overrides.append(f"--model.loss={method.loss}")
    tasks = int(config.sampler_args.get("tasks", 8))
    if method.sampler == MULTI_QUERY:
        if config.sampler != MULTI_QUERY:
            raise ValueError(
                f"{config.name}: Units-ML uses the config's MultiQuerySampler, but its sampler is {config.sampler}"
            )
    elif method.sampler == RANDOM:
        overrides.append(f"--data.sampler={_json({'class_path': RANDOM, 'init_args': {'tasks': tasks}})}")
    elif method.sampler == SINGLE_TASK:
        candidates = tasks * int(config.sampler_args.get("query_sets", 1))
        warmup = int(config.sampler_args.get("warmup_steps", 0))
        args = {"tasks": tasks, "candidates": max(candidates, tasks), "warmup_steps": warmup}
        overrides.append(f"--data.sampler={_json({'class_path': SINGLE_TASK, 'init_args': args})}")
    return overrides


# --- runs and their commands ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """Options shared by every run of a call."""

    root: Path
    data_root: Path | None
    extra: tuple[str, ...] = ()
    logger: str = "csv"
    python: str = sys.executable


@dataclass(frozen=True)
class Run:
    config: ConfigInfo
    method: str
    seed: int
    folder: Path

    @property
    def label(self) -> str:
        return f"{self.config.name} / {self.method} / seed {self.seed}"


def shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (commands run there), else absolute."""
    path = Path(os.path.abspath(path))
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def parse_extra(text: Sequence[str]) -> tuple[str, ...]:
    """``key=value`` pairs (shell-quoted) as ``--key=value`` options.

    Raises:
        ValueError: an item that is not ``key=value``.
    """
    options = []
    for item in (word for chunk in text for word in shlex.split(chunk)):
        if item.startswith("--"):
            options.append(item)
        elif "=" in item and not item.startswith("="):
            options.append(f"--{item}")
        else:
            raise ValueError(f"--extra takes key=value overrides (e.g. trainer.max_steps=100), got {item!r}")
    return tuple(options)


def data_root_arguments(config: ConfigInfo, options: Options) -> list[str]:
    if options.data_root is None or config.dataset is None:
        return []
    return [f"--data.root={shown(options.data_root / config.dataset)}"]


def fit_identity(run: Run, options: Options) -> list[str]:
    """The fit arguments that decide a run's results (what a folder is checked against before it is continued)."""
    logger = []
    if options.logger == "csv":
        csv = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": shown(run.folder)}}
        logger = [f"--trainer.logger={_json(csv)}"]
    elif options.logger == "config":
        logger = [f"--trainer.logger.init_args.save_dir={shown(run.folder)}"]
    return [
        "--config",
        shown(run.config.path),
        *method_overrides(METHODS[run.method], run.config),
        f"--seed_everything={run.seed}",
        f"--data.seed={run.seed}",
        f"--trainer.default_root_dir={shown(run.folder)}",
        *logger,
        *options.extra,
    ]


SIGTERM_CALLBACK = _json({"class_path": "paper_tables.CheckpointOnSigterm"})


def fit_command(run: Run, options: Options) -> list[str]:
    identity = fit_identity(run, options)
    return [
        options.python,
        "-m",
        "units_lightning",
        "fit",
        *identity[:2],
        *data_root_arguments(run.config, options),
        *identity[2:],
        f"--trainer.callbacks+={SIGTERM_CALLBACK}",
        "--ckpt_path=last",
    ]


@dataclass(frozen=True)
class Target:
    """One test of a run: its name (the results folder) and what it tests."""

    name: str
    milestone: int | None  # labeled query sets, for a milestone checkpoint
    top_k: int | None  # for the ensemble of the best validation checkpoints


def targets_of(config: ConfigInfo) -> list[Target]:
    if config.kind == "budget":
        from units_lightning.callbacks import MilestoneCheckpoint

        names = MilestoneCheckpoint(config.milestones, filename=config.milestone_filename)
        return [Target(Path(names.file_name(m)).stem, m, None) for m in config.milestones]
    return [Target(f"top{config.top_k}-val", None, config.top_k)]


def _newest(paths: Iterable[Path]) -> Path | None:
    found = [p for p in paths if p.is_file()]
    return max(found, key=lambda p: (p.stat().st_mtime_ns, str(p))) if found else None


def milestone_checkpoint(run: Run, target: Target) -> Path | None:
    return _newest(run.folder.rglob(f"milestones/{target.name}.ckpt"))


def last_checkpoint(run: Run) -> Path | None:
    from units_lightning.resume import find_last_checkpoint

    return find_last_checkpoint([run.folder / "*" / "*" / "checkpoints"])


def evaluation_command(run: Run, target: Target, options: Options) -> list[str]:
    """``units-lightning test`` of one target, into ``<run>/test/<name>``, with the config's test tasks."""
    if target.milestone is not None:
        found = milestone_checkpoint(run, target)
        location = shown(found) if found else f"{shown(run.folder)}/*/*/checkpoints/milestones/{target.name}.ckpt"
        what = [f"--ckpt_path={location}"]
    else:
        last = last_checkpoint(run)
        folder = shown(last.parent) if last else f"{shown(run.folder)}/*/*/checkpoints"
        ensemble = {
            "class_path": "units_lightning.evaluation.CheckpointEnsemble",
            "init_args": {"checkpoints": folder, "top_k": target.top_k},
        }
        what = [f"--model.ensemble={_json(ensemble)}"]
    return [
        options.python,
        "-m",
        "units_lightning",
        "test",
        "--config",
        shown(run.config.path),
        *data_root_arguments(run.config, options),
        *method_overrides(METHODS[run.method], run.config),
        f"--trainer.default_root_dir={shown(run.folder / 'test' / target.name)}",
        "--trainer.logger=false",
        *options.extra,
        *what,
    ]


def build_grid(configs: Sequence[ConfigInfo], methods: Sequence[str] | None, seeds: Sequence[int], root: Path):
    """Every (config, method, seed) run, in that order; methods default to the config kind's (``DEFAULT_METHODS``)."""
    runs = []
    for config in configs:
        for method in methods or DEFAULT_METHODS[config.kind]:
            method_overrides(METHODS[method], config)  # refuses an impossible combination before anything runs
            for seed in seeds:
                runs.append(Run(config, method, seed, root / config.name / method.lower() / f"seed{seed}"))
    return runs


# --- what a run's folder holds ----------------------------------------------------------------------------------

RECORD, DONE = "run.json", "done.json"


def launch_order(runs: Sequence[Run]) -> list[Run]:
    """The order in which ``run_grid`` starts the runs: seed by seed (every config and method of the first seed,
    then of the next), and within a seed the runs already under way before new ones.

    GPU time comes in short stretches: this fills one seed of every table cell first (the issue asks at least one
    seed each, three where time allows) and finishes what is under way, so fewer stopped runs wait with their
    checkpoints. Tables and ``--dry-run`` keep the grid's own order.
    """
    seeds = list(dict.fromkeys(run.seed for run in runs))
    return sorted(runs, key=lambda run: (seeds.index(run.seed), not (run.folder / RECORD).is_file()))  # stable


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, value: Any) -> None:
    """Write JSON through a temporary file and a rename, so a kill never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(temporary, path)


def read_results(run: Run, target: Target) -> dict | None:
    results = read_json(run.folder / "test" / target.name / "results.json")
    return results if isinstance(results, dict) and "accuracy" in results else None


# --- the metrics of every fit segment ---------------------------------------------------------------------------

SEGMENTS = "metrics"
"""The folder of a run that keeps the ``metrics.csv`` of its earlier fit segments, as ``segment-<NN>.csv``."""
SEGMENT_FILE = re.compile(r"segment-(\d+)\.csv")


def _segment_index(path: Path) -> int | None:
    match = SEGMENT_FILE.fullmatch(path.name)
    return int(match.group(1)) if match else None


def current_metrics(folder: Path) -> list[Path]:
    """The ``metrics.csv`` files of the CSV loggers of a run folder (``<name>/<version>/metrics.csv``), oldest
    first: one, unless a fit started afresh in a new version (no ``last.ckpt`` to continue)."""
    found = [p for p in folder.glob("*/*/metrics.csv") if p.parts[-3] not in ("test", SEGMENTS) and p.is_file()]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def saved_segments(folder: Path) -> list[Path]:
    """The ``metrics/segment-<NN>.csv`` of a run folder, by NN (the order they were written)."""
    found = [p for p in (folder / SEGMENTS).glob("segment-*.csv") if _segment_index(p) is not None]
    return sorted(found, key=lambda p: (_segment_index(p), p.name))


def keep_metrics(folder: Path) -> list[Path]:
    """Move the ``metrics.csv`` of a run folder aside before a fit segment starts (the ``CSVLogger`` of a resumed
    fit would delete it): to ``metrics/segment-<NN>.csv``, NN the fit segment that wrote it (the last one ``run.json``
    records), but above every NN saved before, so that the files sort in the order they were written and nothing is
    overwritten. The paths written."""
    record = read_json(folder / RECORD)
    fit = record.get("fit") if isinstance(record, dict) else None
    recorded = len(fit.get("segments") or []) if isinstance(fit, dict) else 0
    following = max((_segment_index(p) for p in saved_segments(folder)), default=-1) + 1
    current, kept = current_metrics(folder), []
    for i, path in enumerate(current):
        index = max(recorded - len(current) + i, following)
        target = folder / SEGMENTS / f"segment-{index:02d}.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        kept.append(target)
        following = index + 1
    return kept


def read_metrics(path: Path) -> list[dict[str, str]]:
    """The rows of a ``metrics.csv``, as ``csv.DictReader`` gives them (its own header's keys, ``""`` where empty)."""
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _step(row: Mapping[str, Any]) -> int | None:
    try:
        return int(float(row.get("step") or ""))
    except (ValueError, OverflowError):
        return None


def stitch_metrics(segments: Iterable[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of successive fit segments as one history: a segment that starts at step ``s`` (its first row's)
    supersedes the rows at step ``s`` and after of those before it (a resumed fit restarts from its checkpoint,
    which can be before the last steps the stopped one logged). Rows keep their own keys; rows without a step are
    kept."""
    history: list[dict[str, Any]] = []
    for rows in segments:
        start = next((step for step in map(_step, rows) if step is not None), None)
        if start is not None:
            history = [row for row in history if (step := _step(row)) is None or step < start]
        history.extend(dict(row) for row in rows)
    return history


def run_metrics(folder: Path) -> list[dict[str, Any]]:
    """The whole metrics history of a run folder (every fit segment's, ``stitch_metrics``), in step order."""
    return stitch_metrics(read_metrics(p) for p in [*saved_segments(folder), *current_metrics(folder)])


def best_validation(rows: Iterable[Mapping[str, Any]], key: str = "val/acc") -> dict[str, Any] | None:
    """The best ``key`` of a metrics history and its step, and how many validations logged it (``None``: none)."""
    logged = [
        (float(row[key]), step) for row in rows if row.get(key) not in (None, "") and (step := _step(row)) is not None
    ]
    if not logged:
        return None
    value, step = max(logged, key=lambda pair: (pair[0], -pair[1]))
    return {"value": value, "step": step, "validations": len(logged)}


def fit_finished(run: Run, options: Options) -> bool:
    """The fit returned 0 once (recorded), the command's summary (written only after a whole fit) exists, or the
    newest ``last.ckpt`` has spent the label budget (a fit killed after it, which ``--ckpt_path last`` refuses)."""
    record = read_json(run.folder / RECORD) or {}
    if (record.get("fit") or {}).get("finished"):
        return True
    if any(p.relative_to(run.folder).parts[0] != "test" for p in run.folder.rglob("summary.json")):
        return True
    return _budget_spent(run, options)


def _budget_spent(run: Run, options: Options) -> bool:
    budget = run.config.label_budget
    for option in options.extra:
        if option.startswith("--model.label_budget="):
            budget = int(option.split("=", 1)[1])
    last = last_checkpoint(run) if budget is not None else None
    if last is None:
        return False
    import torch

    try:
        checkpoint = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # unreadable: fit says so, and resumes from the one before
        return False
    return int((checkpoint.get("label_ledger") or {}).get("query_sets", 0)) >= budget


def status(run: Run, options: Options) -> str:
    """``done``, ``new``, ``partial: ...`` or ``conflict: ...`` (the folder was made with other arguments)."""
    if (run.folder / DONE).is_file():
        return "done"
    record = read_json(run.folder / RECORD)
    if record and record.get("identity") not in (None, fit_identity(run, options)):
        return (
            f"conflict: {shown(run.folder)} was made with other arguments ({shlex.join(record['identity'])}); "
            "use another --root, the same --extra and --logger, or delete the folder"
        )
    if fit_finished(run, options):
        targets = targets_of(run.config)
        tested = sum(read_results(run, t) is not None for t in targets)
        return f"partial: fit finished, {tested} of {len(targets)} tests done"
    last = last_checkpoint(run)
    if last is not None:
        from units_lightning.resume import stored_run

        try:
            step = stored_run(last)["global_step"]
        except Exception:  # cut short by a writer that was not atomic: fit says so and uses the one before
            step = "?"
        return f"partial: last.ckpt at step {step}"
    return "new"


# --- running commands -------------------------------------------------------------------------------------------

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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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


@cache
def device(gpu: str | None) -> str:
    """The GPU's name (``nvidia-smi``), or the CPU's core count when there is none."""
    query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"] + (["-i", gpu] if gpu is not None else [])
    try:
        names = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        names = []
    names = [n.strip() for n in names if n.strip()]
    if names:
        return names[0] if gpu is not None or len(names) == 1 else f"{names[0]} (of {len(names)} GPUs)"
    return f"cpu ({os.cpu_count()} cores)"


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


def _execute(run: Run, command: list[str], key: str, launcher: Launcher, gpu: str | None, options: Options):
    """Run one command of ``run``, record it; its exit status (None: not launched)."""
    started, clock = _now(), time.monotonic()
    log = run.folder / "console" / f"{key}.log"
    returncode = launcher.run(command, log, gpu)
    if returncode is None:
        return None
    entry = {
        "command": command,
        "started": started,
        "wall_s": round(time.monotonic() - clock, 2),
        "returncode": returncode,
        "commit": commit(),
        "device": device(gpu),
        "log": shown(log),
    }
    _record_command(run, options, key, entry)
    return returncode


def _stopped(returncode: int | None, launcher: Launcher) -> bool:
    """Not launched, ended by a signal, or ended any way but success while stopping (Ctrl-C exits with 1)."""
    return returncode is None or returncode in STOPPED or (returncode != 0 and launcher.stopping)


def execute_run(run: Run, launcher: Launcher, gpu: str | None, options: Options) -> str:
    """Continue ``run`` as far as it goes: fit (resumed), then each test without results, then ``done.json``.

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
    for target in targets_of(run.config):
        if read_results(run, target) is not None:
            continue
        if target.milestone is not None and milestone_checkpoint(run, target) is None:
            return (
                f"failed: the fit finished without a checkpoint at {target.milestone} labeled query sets "
                f"({target.name}.ckpt): the label budget or the training length ends before it"
            )
        returncode = _execute(
            run, evaluation_command(run, target, options), f"test-{target.name}", launcher, gpu, options
        )
        if _stopped(returncode, launcher):
            return "stopped"
        if returncode != 0 or read_results(run, target) is None:
            log = shown(run.folder / "console" / f"test-{target.name}.log")
            return f"failed: test {target.name} exited with {returncode}, see {log}"
    write_json(run.folder / DONE, {"finished": _now(), "commit": commit()})
    return "done"


def run_grid(
    runs: Sequence[Run],
    options: Options,
    parallel: int = 1,
    gpus: Sequence[str] = (),
    time_limit: float | None = None,
    grace: float = 60.0,
    report: Callable[[str], None] = print,
    started: float | None = None,
) -> dict[Run, str]:
    """Continue every run (in ``launch_order``), ``parallel`` at a time (slot i on ``gpus[i % len(gpus)]``), within
    ``time_limit`` seconds.

    ``grace`` seconds before the limit: nothing more is launched and the running commands get SIGTERM; at the limit
    those still running are killed. SIGTERM or SIGINT to this process stops the same way at once.
    """
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCHMARKS), environment.get("PYTHONPATH")) if p)
    environment.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // parallel)))
    environment.setdefault("WANDB_MODE", "offline")
    launcher = Launcher(environment)
    slots = [gpus[i % len(gpus)] if gpus else None for i in range(parallel)]
    free = list(slots)
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
        with ThreadPoolExecutor(max_workers=parallel) as pool:
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
    return {run: outcomes.get(run, "stopped") for run in runs}


class CheckpointOnSigterm(Callback):
    """Write ``last.ckpt`` at the end of the training step during which SIGTERM arrived (``paper_tables`` adds it
    to every fit), so that ``--ckpt_path last`` continues from that step rather than from the last validation.

    Lightning stops at the next step boundary on SIGTERM (``SIGTERMException``) without a checkpoint. This saves
    in ``on_train_batch_end``, where ``ModelCheckpoint(every_n_train_steps=...)`` saves, and only at a step in the
    middle of an epoch that no validation follows: a run resumed from a save at an epoch's last step ended an
    epoch short (seen here: 6 of 9 steps over three epochs of three), and one saved before a
    validation that the signal then cuts short would come back without that validation. At those steps, and when
    the signal arrives during validation, nothing is saved and the run continues from the ``last.ckpt`` before
    (in the shipped configs an epoch's last step is validated and checkpointed anyway). The file goes where the
    config's ``ModelCheckpoint`` writes its ``last.ckpt``, through the trainer's atomic checkpoint IO. One
    process only: under data-parallel training the ranks need not see the signal at the same step.
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.received_sigterm or trainer.world_size > 1 or not _quiet_step(trainer, batch_idx):
            return
        folder = getattr(trainer.checkpoint_callback, "dirpath", None)
        if folder is not None:
            trainer.save_checkpoint(os.path.join(folder, "last.ckpt"))


def _quiet_step(trainer, batch_idx: int) -> bool:
    """Neither an epoch's last step, nor one that a validation may follow, nor the last step of training."""
    epoch_end = (
        trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or batch_idx + 1 >= trainer.num_training_batches
    )
    if epoch_end or trainer.should_stop:
        return False
    if trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step:
        return False
    every = getattr(trainer, "val_check_batch", None)
    if isinstance(every, int) and every > 0 and ((batch_idx + 1) % every == 0 or trainer.global_step % every == 0):
        return False
    return True


# --- tables -----------------------------------------------------------------------------------------------------


def _percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def collect(runs: Sequence[Run]) -> dict[str, Any]:
    """The numbers of every finished run (``done.json``) as tables: ``budget`` and ``standard``, each
    ``{config: {method: ...}}`` with every seed's value, mean, 95% CI and n, beside the paper's; and ``runs``,
    the record of every finished run (commands, commit, device, wall time)."""
    budget: dict[str, dict[str, Any]] = {}
    standard: dict[str, dict[str, Any]] = {}
    records = []
    finished = [r for r in runs if (r.folder / DONE).is_file()]
    for run in finished:
        record = read_json(run.folder / RECORD) or {}
        segments = (record.get("fit") or {}).get("segments", [])
        records.append(
            {
                "config": run.config.name,
                "method": run.method,
                "seed": run.seed,
                "folder": shown(run.folder),
                "fit_wall_s": round(sum(s.get("wall_s", 0.0) for s in segments), 2),
                "fit_segments": len(segments),
                "fit_command": segments[-1]["command"] if segments else None,
                "test_wall_s": round(sum(t.get("wall_s", 0.0) for t in record.get("tests", {}).values()), 2),
                "commits": sorted({s.get("commit") or "unknown" for s in segments}),
                "devices": sorted({s.get("device") or "unknown" for s in segments}),
                "best_val": best_validation(run_metrics(run.folder)),
            }
        )
    for config in {r.config.name: r.config for r in runs}.values():
        done = [r for r in finished if r.config.name == config.name]
        for method in dict.fromkeys(r.method for r in runs if r.config.name == config.name):
            mine = sorted((r for r in done if r.method == method), key=lambda r: r.seed)
            if config.kind == "budget":
                budget.setdefault(config.name, {})[method] = _budget_row(config, method, mine)
            else:
                standard.setdefault(config.name, {})[method] = _standard_row(config, method, mine)
    return {
        "source": PAPER_SOURCE,
        "budget": budget,
        "standard": standard,
        "paired": paired_rows(budget, standard),
        "runs": records,
    }


PAIRED = ("Units-ML", "Units-NTS")
"""The pair compared seed by seed: the first method minus the second."""
PAIRED_LABEL = f"{PAIRED[0]} - {PAIRED[1]}, paired by seed"


def paired_difference(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """``ours - theirs`` seed by seed, over the seeds both summaries hold, as a summary (mean, 95% CI, n, values,
    seeds). Both methods of a seed start from the same weights, and their episode streams from the same seed, so
    this is a sharper comparison than two intervals side by side.

    Example:
        >>> ours, theirs = {"values": [95.0, 96.0], "seeds": [0, 1]}, {"values": [94.0, 94.5, 90.0], "seeds": [0, 1, 2]}
        >>> d = paired_difference(ours, theirs)
        >>> d["values"], d["seeds"], d["mean"], d["n"]
        ([1.0, 1.5], [0, 1], 1.25, 2)
    """
    by_seed = dict(zip(theirs["seeds"], theirs["values"], strict=True))
    pairs = [
        (seed, v - by_seed[seed]) for seed, v in zip(ours["seeds"], ours["values"], strict=True) if seed in by_seed
    ]
    return _summary([d for _, d in pairs], [seed for seed, _ in pairs], None)


def paired_rows(budget: Mapping[str, Any], standard: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``PAIRED``'s difference per config where both methods ran: per budget point, or of the standard accuracy."""
    first, second = PAIRED
    rows: dict[str, dict[str, Any]] = {}
    for config, methods in budget.items():
        if first in methods and second in methods:
            rows[config] = {p: paired_difference(methods[first][p], methods[second][p]) for p in methods[first]}
    for config, methods in standard.items():
        if first in methods and second in methods:
            rows[config] = {"accuracy": paired_difference(methods[first]["accuracy"], methods[second]["accuracy"])}
    return rows


def _summary(values: Sequence[float], seeds: Sequence[int], paper: float | None) -> dict[str, Any]:
    return {**mean_ci95(values), "values": list(values), "seeds": list(seeds), "paper": paper}


def _budget_row(config: ConfigInfo, method: str, runs: Sequence[Run]) -> dict[str, Any]:
    paper = PAPER_BUDGET.get(config.name, {}).get(method)
    row = {}
    for target in targets_of(config):
        pairs = [(r.seed, read_results(r, target)) for r in runs]
        pairs = [(seed, _percent(res["accuracy"]["mean"])) for seed, res in pairs if res]
        paper_value = (
            paper[BUDGET_POINTS.index(target.milestone)] if paper and target.milestone in BUDGET_POINTS else None
        )
        row[str(target.milestone)] = _summary([v for _, v in pairs], [s for s, _ in pairs], paper_value)
    return row


def _threshold_row(results: Mapping[str, Any], threshold: float) -> Mapping[str, Any] | None:
    for row in results.get("vacuity_thresholds", []):
        if math.isclose(row["threshold"], threshold):
            return row
    return None


def _standard_row(config: ConfigInfo, method: str, runs: Sequence[Run]) -> dict[str, Any]:
    paper = PAPER_STANDARD.get(config.name, {})
    (target,) = targets_of(config)
    results = [(r.seed, read_results(r, target)) for r in runs]
    results = [(seed, res) for seed, res in results if res]
    accuracy = [(seed, _percent(res["accuracy"]["mean"])) for seed, res in results]
    row = {"accuracy": _summary([v for _, v in accuracy], [s for s, _ in accuracy], paper.get(method))}
    for threshold in VACUITY_THRESHOLDS:
        kept = [(seed, _threshold_row(res, threshold)) for seed, res in results]
        kept = [(seed, t) for seed, t in kept if t is not None and t["accuracy"] is not None]
        paper_value = paper.get(f"vacuity<{threshold}") if method == "Units-ML" else None
        row[f"vacuity<{threshold}"] = {
            "accuracy": _summary([_percent(t["accuracy"]) for _, t in kept], [s for s, _ in kept], paper_value),
            "coverage": _summary([_percent(t["coverage"]) for _, t in kept], [s for s, _ in kept], None),
        }
    return row


def cell(summary: Mapping[str, Any], digits: int = 2, signed: bool = False) -> str:
    """``mean +- ci (n)`` of one summary; an empty cell where no run is finished; ``signed`` for a difference.

    Example:
        >>> cell({"mean": 95.123, "ci95": 0.456, "n": 3}), cell({"mean": 95.1, "ci95": None, "n": 1})
        ('95.12 ± 0.46 (3)', '95.10 (1)')
        >>> cell({"mean": 0.714, "ci95": 0.46, "n": 3}, signed=True)
        '+0.71 ± 0.46 (3)'
    """
    if not summary.get("n"):
        return ""
    ci = f" ± {summary['ci95']:.{digits}f}" if summary.get("ci95") is not None else ""
    sign = "+" if signed else ""
    return f"{summary['mean']:{sign}.{digits}f}{ci} ({summary['n']})"


def _paper(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _data_roots(records: Sequence[Mapping[str, Any]], config: str) -> list[str]:
    roots = {
        a.split("=", 1)[1]
        for r in records
        if r["config"] == config
        for a in r["fit_command"] or []
        if a.startswith("--data.root=")
    }
    return sorted(roots)


def _config_note(config: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
    notes = [text for prefix, text in NOT_COMPARABLE.items() if config.startswith(prefix)]
    if not notes:
        return []
    roots = ", ".join(_data_roots(records, config)) or "the config's own data.root"
    return [f"Note ({config}): {notes[0]}. Data of these runs: {roots}."]


def _short_commit(commit: str) -> str:
    sha, plus, rest = commit.partition("+")
    return sha[:12] + plus + rest


def _runs_table(records: Sequence[Mapping[str, Any]], config: str) -> list[str]:
    """Per finished run: fit wall time (all segments), its best validation accuracy over every segment's metrics
    (runs before ``keep_metrics``: over the last segment's only), device and commit; then one fit command per
    method."""
    mine = [r for r in records if r["config"] == config]
    if not mine:
        return []
    lines = [
        "| Method | Seed | Fit wall time | Fit segments | Best val/acc (step; validations logged) | Device | Commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in mine:
        best = r.get("best_val")
        shown_best = f"{100 * best['value']:.2f}% ({best['step']:,}; {best['validations']})" if best else ""
        lines.append(
            f"| {r['method']} | {r['seed']} | {r['fit_wall_s'] / 60:.1f} min | {r['fit_segments']} | {shown_best} | "
            f"{', '.join(r['devices'])} | {', '.join(_short_commit(c) for c in r['commits'])} |"
        )
    first: dict[str, Mapping[str, Any]] = {}
    for r in mine:
        first.setdefault(r["method"], r)
    commands = [shlex.join(["units-lightning", *r["fit_command"][3:]]) for r in first.values() if r["fit_command"]]
    explained = (
        "Fit commands, one per method (seed k: `--seed_everything=k --data.seed=k`; `paper_tables.py` runs them "
        "with `benchmarks/` on `PYTHONPATH` for `CheckpointOnSigterm`):"
    )
    return [*lines, "", explained, "", "```", *commands, "```"]


def _threshold_cell(kept: Mapping[str, Any] | None) -> str:
    if not kept or not kept["accuracy"]["n"]:
        return ""
    return f"{cell(kept['accuracy'])}, {kept['coverage']['mean']:.1f}% kept"


def markdown(tables: Mapping[str, Any], plots: Mapping[str, str]) -> str:
    """The tables as Markdown: one per label-budget config, one for the standard setting, each with its runs."""
    lines = [
        "# Paper tables",
        "",
        "Test accuracy (%) on each config's seeded test tasks: mean ± 95% confidence interval over seeds (Student t, "
        "n - 1 degrees of freedom), the number of seeds in brackets; an empty cell has no finished run. "
        f"Paper: {tables['source']}.",
    ]
    if tables.get("paired"):
        lines += [
            "",
            f"{PAIRED_LABEL}: {PAIRED[0]}'s test accuracy minus {PAIRED[1]}'s, seed by seed (both methods of a "
            "seed start from the same weights, their episode streams from the same seed), in points: mean ± 95% CI "
            "over the seeds both finished.",
        ]
    if tables.get("extra"):
        overrides = " ".join(f"`{o}`" for o in tables["extra"])
        lines += ["", f"Every run with the overrides {overrides}: not the configs' protocol, not the paper's."]
    for config, methods in tables["budget"].items():
        points = list(next(iter(methods.values())))
        lines += ["", f"## Label budget: {config}", ""]
        lines.append("| Method | " + " | ".join(f"{int(p):,} labeled query sets" for p in points) + " |")
        lines.append("|---|" + "---|" * len(points))
        for method, row in methods.items():
            lines.append(f"| {method} | " + " | ".join(cell(row[p]) for p in points) + " |")
            lines.append(f"| {method}, paper | " + " | ".join(_paper(row[p]["paper"]) for p in points) + " |")
        paired = tables.get("paired", {}).get(config)
        if paired:
            lines.append(f"| {PAIRED_LABEL} | " + " | ".join(cell(paired[p], signed=True) for p in points) + " |")
        if config in plots:
            lines += ["", f"![{config}]({plots[config]})"]
        for extra in (_config_note(config, tables["runs"]), _runs_table(tables["runs"], config)):
            if extra:
                lines += ["", *extra]
    if tables["standard"]:
        methods = list(dict.fromkeys(m for row in tables["standard"].values() for m in row))
        thresholds = VACUITY_THRESHOLDS if "Units-ML" in methods else ()
        header = [*methods, *(f"Units-ML, vacuity < {t}" for t in thresholds)]
        lines += ["", "## Standard setting", ""]
        lines.append(
            "Each run tested as the ensemble of its top-k validation checkpoints (k = the config's save_top_k of "
            "val/acc); the vacuity columns: accuracy on the test queries of vacuity below the threshold, and the "
            "share of queries kept (mean over seeds)."
        )
        lines += ["", "| Config | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
        for config, row in tables["standard"].items():
            ours = [cell(row[m]["accuracy"]) if m in row else "" for m in methods]
            paper = [_paper(row[m]["accuracy"]["paper"]) if m in row else "" for m in methods]
            for threshold in thresholds:
                kept = row.get("Units-ML", {}).get(f"vacuity<{threshold}")
                ours.append(_threshold_cell(kept))
                paper.append(_paper(kept["accuracy"]["paper"]) if kept else "")
            lines.append(f"| {config} | " + " | ".join(ours) + " |")
            lines.append(f"| {config}, paper | " + " | ".join(paper) + " |")
        paired = [(c, row["accuracy"]) for c, row in tables.get("paired", {}).items() if c in tables["standard"]]
        if paired:
            lines += ["", f"{PAIRED_LABEL}: " + "; ".join(f"{c} {cell(d, signed=True)}" for c, d in paired) + "."]
        for config in tables["standard"]:
            note = _config_note(config, tables["runs"])
            if note:
                lines += ["", *note]
        for config in tables["standard"]:
            runs = _runs_table(tables["runs"], config)
            if runs:
                lines += ["", f"### Runs: {config}", "", *runs]
    return "\n".join(lines) + "\n"


def plot_budget(config: str, methods: Mapping[str, Mapping[str, Any]], path: Path) -> Path | None:
    """Test accuracy against labeled query sets, one line and 95% band per method, the paper's as open markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    drawn = 0
    for index, (method, row) in enumerate(methods.items()):
        colour = f"C{index}"
        points = [(int(p), s) for p, s in row.items() if s["n"]]
        if points:
            x = [p for p, _ in points]
            mean = [s["mean"] for _, s in points]
            axes.plot(x, mean, "o-", color=colour, label=f"{method} (n = {max(s['n'] for _, s in points)})")
            half = [s["ci95"] if s["ci95"] is not None else 0.0 for _, s in points]
            low = [m - h for m, h in zip(mean, half, strict=True)]
            high = [m + h for m, h in zip(mean, half, strict=True)]
            axes.fill_between(x, low, high, color=colour, alpha=0.2)
            drawn += 1
        paper = [(int(p), s["paper"]) for p, s in row.items() if s["paper"] is not None]
        if paper:
            axes.plot(
                *zip(*paper, strict=True),
                "o--",
                color=colour,
                markerfacecolor="none",
                alpha=0.7,
                label=f"{method}, paper",
            )
    if not drawn:
        plt.close(figure)
        return None
    axes.set_xticks(sorted({int(p) for row in methods.values() for p in row}))
    axes.set_xlabel("labeled query sets")
    axes.set_ylabel("test accuracy (%)")
    axes.set_title(f"{config}: mean and 95% CI over seeds", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def write_tables(runs: Sequence[Run], folder: Path, extra: Sequence[str] = ()) -> dict[str, Path]:
    """Write ``paper_tables.json``, ``paper_tables.md`` and one plot per label-budget config into ``folder``.

    ``extra``: the ``--extra`` overrides of the runs, named above the tables (a shortened protocol).
    """
    tables = {**collect(runs), "extra": list(extra)}
    plots = {}
    for config, methods in tables["budget"].items():
        path = plot_budget(config, methods, folder / f"{config}.png")
        if path is not None:
            plots[config] = path.name
    written = {"json": folder / "paper_tables.json", "markdown": folder / "paper_tables.md"}
    write_json(written["json"], {**tables, "plots": plots, "written": _now()})
    written["markdown"].write_text(markdown(tables, plots))
    return {**written, **{config: folder / name for config, name in plots.items()}}


# --- command line -----------------------------------------------------------------------------------------------


def default_data_root() -> Path | None:
    """``$UNITS_LIGHTNING_SHARED_DATA``, else ``../shared/data`` or ``shared/data`` beside the repository."""
    candidates = [
        os.environ.get("UNITS_LIGHTNING_SHARED_DATA"),
        REPO.parent / "shared" / "data",
        REPO / "shared" / "data",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def resolve_configs(names: Sequence[str]) -> list[ConfigInfo]:
    """Config names (``configs/<name>.yaml``), files, or the groups of ``GROUPS``.

    Raises:
        ValueError: a name that is neither.
    """
    paths = []
    for name in names:
        for item in GROUPS.get(name, (name,)):
            path = Path(item)
            if not path.is_file():
                path = REPO / "configs" / f"{item.removesuffix('.yaml')}.yaml"
            if not path.is_file():
                known = ", ".join([*GROUPS, *sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))])
                raise ValueError(f"--configs: no config {item!r} (a file, or one of: {known})")
            paths.append(path)
    return [read_config(p) for p in dict.fromkeys(paths)]


def resolve_methods(names: Sequence[str] | None) -> list[str] | None:
    if not names:
        return None
    by_lower = {m.lower(): m for m in METHODS}
    unknown = [n for n in names if n.lower() not in by_lower]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    return [by_lower[n.lower()] for n in names]


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["budget", "standard"],
        help="config names or files, or the groups 'budget' and 'standard' (default: both)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        help=f"of {', '.join(METHODS)} (default: MAML, Units-NTS, Units-ML for budget configs; "
        "Units-NTS, Units-ML otherwise)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--root",
        type=Path,
        default=REPO / "runs" / "paper",
        help="one folder per run: <root>/<config>/<method>/seed<k>",
    )
    parser.add_argument(
        "--data-root",
        type=Path,
        help="holds omniglot/, cifarfs/, miniimagenet/ (folders or zips); default: ../shared/data when present, "
        "else each config's data.root",
    )
    parser.add_argument(
        "--extra",
        nargs="+",
        default=[],
        help='overrides for every fit and test, e.g. "trainer.max_steps=200 data.val_tasks=20"',
    )
    parser.add_argument(
        "--logger",
        choices=("csv", "config"),
        default="csv",
        help="csv: a CSVLogger in each run folder; config: the config's logger, its save_dir moved there",
    )
    parser.add_argument("--parallel", type=int, default=1, help="runs at once")
    parser.add_argument("--gpus", help="e.g. 0,1,2,3: run slots take these GPUs in turn (CUDA_VISIBLE_DEVICES)")
    parser.add_argument(
        "--time-limit", type=float, help="seconds this call may take; the runs checkpoint and stop in time"
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=60.0,
        help="seconds before --time-limit at which the running commands get SIGTERM (default 60)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list the runs, their commands and what is done; run nothing"
    )
    parser.add_argument(
        "--tables-only", action="store_true", help="build the tables and plots from the finished runs; run nothing"
    )
    parser.add_argument("--tables", type=Path, help="where the tables go (default: <root>/tables)")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel must be >= 1, got {args.parallel}")
    if args.time_limit is not None and args.time_limit <= args.grace:
        parser.error(f"--time-limit ({args.time_limit:g} s) must exceed --grace ({args.grace:g} s)")
    return args


def _dry_run(runs: Sequence[Run], options: Options) -> None:
    states = {run: status(run, options) for run in runs}
    kinds = ("done", "partial", "new", "conflict")
    counts = {kind: sum(s.split(":")[0] == kind for s in states.values()) for kind in kinds}
    print(f"{len(runs)} runs under {shown(options.root)}: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n))
    for run, state in states.items():
        print(f"\n{run.label}: {state}")
        if state == "done":
            continue
        print(f"  fit: {shlex.join(fit_command(run, options))}")
        for target in targets_of(run.config):
            mark = "done" if read_results(run, target) is not None else "to do"
            print(f"  test {target.name} ({mark}): {shlex.join(evaluation_command(run, target, options))}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    try:
        configs = resolve_configs(args.configs)
        data_root = args.data_root or default_data_root()
        if data_root is not None:
            data_root = data_root.resolve()
            missing = sorted({c.dataset for c in configs if c.dataset and not (data_root / c.dataset).is_dir()})
            if missing:
                raise ValueError(f"no {', '.join(missing)} folder under --data-root {data_root}")
        options = Options(args.root.resolve(), data_root, parse_extra(args.extra), args.logger)
        runs = build_grid(configs, resolve_methods(args.methods), args.seeds, options.root)
    except ValueError as error:
        print(f"paper_tables: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        try:
            _dry_run(runs, options)
            sys.stdout.flush()
        except BrokenPipeError:  # `--dry-run | head`: the reader left; nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    failed = False
    if not args.tables_only:
        gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else []
        started = time.monotonic()
        outcomes = run_grid(
            runs, options, args.parallel, gpus, args.time_limit, args.grace, report=_report, started=STARTED
        )
        kinds = ("done", "stopped", "failed", "conflict")
        counts = {kind: sum(o.split(":")[0] == kind for o in outcomes.values()) for kind in kinds}
        print(f"{time.monotonic() - started:.0f} s: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n))
        for run, outcome in outcomes.items():
            if outcome.startswith(("failed", "conflict")):
                print(f"  {run.label}: {outcome}")
        if counts["stopped"]:
            print("stopped before the end: run the same command again to continue; --tables-only builds the tables")
            return 3
        failed = bool(counts["failed"] or counts["conflict"])
    written = write_tables(runs, args.tables or options.root / "tables", options.extra)
    print("tables: " + ", ".join(shown(p) for p in written.values()), flush=True)
    return 1 if failed else 0


def _report(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
