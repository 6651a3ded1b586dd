"""The grid of runs: the configs (read as YAML), the methods as overrides of a config, one run per (config, method,
seed) with its folder, and the ``units-lightning fit`` and ``test`` commands of each."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import REPO
from benchmarks.tables.evaluate import checkpoint_test_arguments

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
ACQUISITIONS = {
    "Vacuity": "units_lightning.samplers.VacuitySampler",
    "Entropy": "units_lightning.samplers.EntropySampler",
    "Margin": "units_lightning.samplers.MarginSampler",
    "Typicality": "units_lightning.samplers.TypicalitySampler",
    "Stochastic": "units_lightning.samplers.StochasticSampler",
    "Diverse": "units_lightning.samplers.DiverseSampler",
}
"""Issue 31's acquisition functions as methods: the evidential loss, the config's ``MultiQuerySampler`` arguments
(tasks, query sets, warm-up) given to another scorer of the same candidates."""


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
        *(Method(name, EVIDENTIAL, sampler) for name, sampler in ACQUISITIONS.items()),
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
    query_shots: int | None = None  # queries of each class in a training query set (data.query_shots)
    eval_query_shots: int | None = None  # the same at validation and test (data.eval_query_shots)

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
        query_shots=data_args.get("query_shots"),
        eval_query_shots=data_args.get("eval_query_shots"),
    )


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def method_overrides(method: Method, config: ConfigInfo) -> list[str]:
    """The command-line overrides that turn ``config`` into ``method``, labeling as many query sets per step.

    Raises:
        ValueError: Units-ML (or an acquisition) asked of a config whose sampler is not a ``MultiQuerySampler``.
    """
    overrides = []
    if config.loss != method.loss:
        overrides.append(f"--model.loss={method.loss}")
    tasks = int(config.sampler_args.get("tasks", 8))
    if method.sampler == MULTI_QUERY or method.sampler in ACQUISITIONS.values():
        if config.sampler != MULTI_QUERY:
            raise ValueError(
                f"{config.name}: {method.name} uses the config's MultiQuerySampler, but its sampler is {config.sampler}"
            )
        if method.sampler != MULTI_QUERY:
            keys = ("tasks", "query_sets", "warmup_steps")
            args = {k: config.sampler_args[k] for k in keys if k in config.sampler_args}
            overrides.append(f"--data.sampler={_json({'class_path': method.sampler, 'init_args': args})}")
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
        "--ckpt_path=last",
    ]


@dataclass(frozen=True)
class Target:
    """One test of a run: its name (the results folder), what it tests and the test's own overrides."""

    name: str
    milestone: int | None  # labeled query sets, for a milestone checkpoint
    top_k: int | None  # for the ensemble of the best validation checkpoints
    overrides: tuple[str, ...] = ()


def authors_query_shots(config: ConfigInfo) -> int | None:
    """The queries of each class the authors' code tests a standard config with, where the config tests another
    count: as many as a training query set holds (``../shared/REFERENCE.md`` section 3: 1-2). Batch norm normalises
    with the statistics of the test batch (transductive), so the count is part of the protocol (docs/RESULTS.md,
    "Investigation: the test protocol's query count"); the configs keep the common 15 for CIFAR-FS and
    mini-ImageNet, and the tables show both."""
    shots, tested = config.query_shots, config.eval_query_shots
    if config.kind != "standard" or shots is None or tested is None or shots == tested:
        return None
    return int(shots)


def targets_of(config: ConfigInfo) -> list[Target]:
    """A budget config's milestones; a standard config's top-k ensemble, and where the authors' code tests with
    another query count (``authors_query_shots``), the same ensemble tested with that count (``top3-val-2q``)."""
    if config.kind == "budget":
        from units_lightning.callbacks import MilestoneCheckpoint

        names = MilestoneCheckpoint(config.milestones, filename=config.milestone_filename)
        return [Target(Path(names.file_name(m)).stem, m, None) for m in config.milestones]
    ensemble = Target(f"top{config.top_k}-val", None, config.top_k)
    shots = authors_query_shots(config)
    if shots is None:
        return [ensemble]
    overrides = (f"--data.init_args.eval_query_shots={shots}",)
    return [ensemble, Target(f"{ensemble.name}-{shots}q", None, config.top_k, overrides)]


def _newest(paths: Iterable[Path]) -> Path | None:
    found = [p for p in paths if p.is_file()]
    return max(found, key=lambda p: (p.stat().st_mtime_ns, str(p))) if found else None


def milestone_checkpoint(run: Run, target: Target) -> Path | None:
    return _newest(run.folder.rglob(f"milestones/{target.name}.ckpt"))


def last_checkpoint(run: Run) -> Path | None:
    from units_lightning.resume import find_last_checkpoint

    return find_last_checkpoint([run.folder / "*" / "*" / "checkpoints"])


def _milestone_location(run: Run, target: Target) -> str:
    """The milestone checkpoint of ``target``, or before the fit has written it, where it will be."""
    found = milestone_checkpoint(run, target)
    return shown(found) if found else f"{shown(run.folder)}/*/*/checkpoints/milestones/{target.name}.ckpt"


def shared_test_options(run: Run, options: Options) -> list[str]:
    """The options every ``units-lightning test`` of ``run`` shares: config, data, method, no logger, ``--extra``."""
    return [
        "--config",
        shown(run.config.path),
        *data_root_arguments(run.config, options),
        *method_overrides(METHODS[run.method], run.config),
        "--trainer.logger=false",
        *options.extra,
    ]


def evaluation_command(run: Run, target: Target, options: Options) -> list[str]:
    """``units-lightning test`` of one target, into ``<run>/test/<name>``, with the config's test tasks."""
    into = shown(run.folder / "test")
    if target.milestone is not None:
        words = checkpoint_test_arguments(
            shared_test_options(run, options), into, target.name, _milestone_location(run, target)
        )
        return [options.python, "-m", "units_lightning", *words]
    last = last_checkpoint(run)
    folder = shown(last.parent) if last else f"{shown(run.folder)}/*/*/checkpoints"
    ensemble = {
        "class_path": "units_lightning.evaluation.CheckpointEnsemble",
        "init_args": {"checkpoints": folder, "top_k": target.top_k},
    }
    return [
        options.python,
        "-m",
        "units_lightning",
        "test",
        *shared_test_options(run, options),
        f"--trainer.default_root_dir={into}/{target.name}",
        f"--model.ensemble={_json(ensemble)}",
        *target.overrides,
    ]


def milestone_tests_command(run: Run, targets: Sequence[Target], options: Options) -> list[str]:
    """One process for the milestone ``targets`` of ``run`` (``benchmarks.tables.evaluate``): each tested as its
    ``evaluation_command`` tests it, the imports paid once.

    Raises:
        ValueError: a target that is not a milestone (the ensemble of the best checkpoints has its own command).
    """
    others = [t.name for t in targets if t.milestone is None]
    if others:
        raise ValueError(f"only milestone checkpoints are tested in one process, not {others}")
    checkpoints = [f"--checkpoint={t.name}={_milestone_location(run, t)}" for t in targets]
    into = f"--into={shown(run.folder / 'test')}"
    return [
        options.python,
        "-m",
        "benchmarks.tables.evaluate",
        into,
        *checkpoints,
        "--",
        *shared_test_options(run, options),
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
