"""Labeling-time selection: a meta-trained model meets new classes, and an acquisition function chooses what people
label next. Labels against accuracy, every acquisition against random, paired by seed.

The setting people pay for (issue 31; Bae, Wang & Sutherland, ECCV 2024): each task is N classes the model never saw
(a split's classes: ``--split val`` to choose settings, ``--split test`` to report), with ``k_shot`` labeled images per
class (the support set), a pool of ``--pool`` unlabeled images per class, and ``--held-out`` images per class that
measure accuracy. Every round the model adapts to everything labeled so far, predicts the held-out images (accuracy),
cuts the task's still-unlabeled pool into random candidate query sets of ``--set-size`` images, and the acquisition
chooses ``--per-round`` of them per task; their labels are revealed and join the labeled set. Every acquisition starts
from the same tasks, the same weights and the same first candidates; the round's accuracy is the mean over tasks.

The figure of merit (``labels_saved``): 1 - labels the method needs / labels random needs to reach random's final
accuracy, the curves read as piecewise linear in the labels; beside it the area under the labels-accuracy curve
(``curve_area``, the mean accuracy over the labels spent). Both per seed, then mean and 95% interval over seeds, and
the paired difference with random.

The acquisitions are the library's samplers (``units_lightning.samplers``), asked as ``units-lightning select`` asks
them: ``score`` of the candidates' evidence, then the top of ``priority`` per task (the Gumbel-perturbed order of a
``StochasticSampler``). Each task is scored on its own, so a cross-set score (typicality, diversity) compares the
candidates of one task.

    python benchmarks/labeling_time.py --config configs/budget_omniglot_5w1s.yaml --ckpt run/checkpoints/last.ckpt \
        --data.root <omniglot> --split test --seeds 0 1 2 --device cuda --out labeling_time.json

Newly labeled images join the support set as whatever classes they turn out to be, so the support grows unbalanced,
unlike every episode the model was meta-trained on; with the plain mean inner loss the first labels then cost
accuracy in every arm. ``--model.loss.init_args.class_balanced=true`` (any override the config takes is passed on)
adapts with every class weighing the same (``units_lightning.losses.class_balanced_mean``); docs/RESULTS.md compares
both.

``python benchmarks/labeling_time.py merge A.json B.json --out X.json`` joins runs of one setting whose seeds ran
apart (one process per GPU); ``python benchmarks/labeling_time.py table "5w1s val=A.json" "5w1s test=B.json"`` prints
acquisitions against settings, each cell labels saved / area - random, as docs/RESULTS.md shows them. ``--ckpt``
takes one checkpoint per seed (the models of seeds 0, 1, 2), or one for every seed. Every round adapts to a larger
support set, so on a GPU each round's shapes would capture CUDA graphs of their own and keep them: for 20-way tasks
pass ``--model.capture none`` (eager evaluation; 200 tasks of Omniglot 20-way otherwise filled an H200's 140 GB).
Even so, a run of 200 tasks held about 60 GB of an H200 before evaluation stopped recording a backward for its
predictions (2.8x less memory on the CPU since; not measured on a GPU yet): run one per GPU at a time until it is.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the repository on sys.path, for ``benchmarks.*``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks.common import device_name, versions
from benchmarks.tables.statistics import mean_ci95, paired_difference
from units_lightning.lazy import import_object

ACQUISITIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "random": ("units_lightning.samplers.RandomSampler", {}),
    "units": ("units_lightning.samplers.MultiQuerySampler", {}),
    "vacuity": ("units_lightning.samplers.VacuitySampler", {}),
    "entropy": ("units_lightning.samplers.EntropySampler", {}),
    "margin": ("units_lightning.samplers.MarginSampler", {}),
    "typical": ("units_lightning.samplers.TypicalitySampler", {}),
    "diverse": ("units_lightning.samplers.DiverseSampler", {}),
    "stochastic": ("units_lightning.samplers.StochasticSampler", {}),
}
"""Name -> (class path, init args) of the acquisitions compared; ``--acquisition name=class_path[:json]`` adds more."""


# --- the figure of merit (pure) -------------------------------------------------------------------------------------


def labels_to_reach(labels: Sequence[float], accuracy: Sequence[float], target: float) -> float | None:
    """The labels at which a curve first reaches ``target``, linear between its points; None if it never does.

    Example:
        >>> labels_to_reach([0, 10, 20], [50.0, 70.0, 80.0], 75.0)
        15.0
        >>> labels_to_reach([0, 10], [50.0, 60.0], 61.0) is None
        True
    """
    for i, (x, y) in enumerate(zip(labels, accuracy, strict=True)):
        if y >= target:
            if i == 0:
                return float(x)
            x0, y0 = labels[i - 1], accuracy[i - 1]
            return float(x0 + (x - x0) * (target - y0) / (y - y0))
    return None


def labels_saved(labels: Sequence[float], accuracy: Sequence[float], reference: Sequence[float]) -> float | None:
    """1 - labels this curve needs / labels the reference curve needs to reach the reference's final accuracy.

    The reference reaches its own final accuracy at its last point at the latest (earlier where it peaked before),
    so 0 means "as many labels as random", 0.3 "30% fewer"; None where this curve never reaches it.

    Example:
        >>> labels_saved([0, 10, 20], [50.0, 70.0, 80.0], [50.0, 60.0, 70.0])
        0.5
    """
    target = reference[-1]
    needed, baseline = labels_to_reach(labels, accuracy, target), labels_to_reach(labels, reference, target)
    if needed is None or not baseline:
        return None
    return 1.0 - needed / baseline


def curve_area(labels: Sequence[float], accuracy: Sequence[float]) -> float:
    """The mean accuracy over the labels spent: the trapezoid area under the curve over its label range.

    Example:
        >>> curve_area([0, 10, 20], [50.0, 70.0, 80.0])
        67.5
    """
    segments = zip(labels[:-1], labels[1:], accuracy[:-1], accuracy[1:], strict=True)
    area = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in segments)
    return area / (labels[-1] - labels[0])


# --- the experiment ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    split: str
    tasks: int
    pool: int
    held_out: int
    set_size: int
    per_round: int
    rounds: int


@dataclass
class Tasks:
    """T tasks of N new classes: labeled supports, an unlabeled pool (its answer key kept apart) and held-out images."""

    support_x: torch.Tensor  # (T, N k, C, H, W)
    support_y: torch.Tensor  # (T, N k)
    pool_x: torch.Tensor  # (T, N P, C, H, W), classes shuffled
    pool_y: torch.Tensor  # (T, N P): revealed only for the chosen sets
    held_x: torch.Tensor  # (T, N H, C, H, W)
    held_y: torch.Tensor  # (T, N H)


def draw_tasks(images: Any, n_way: int, k_shot: int, setting: Setting, seed: int, device: torch.device) -> Tasks:
    """``setting.tasks`` tasks of ``n_way`` classes of a split (``FewShotImages``), disjoint images per role."""
    rng = np.random.default_rng([seed, 20_261_127])
    labels = images.labels.cpu().numpy()
    per_class = k_shot + setting.pool + setting.held_out
    counts = np.bincount(labels, minlength=images.num_classes)
    eligible = np.flatnonzero(counts >= per_class)
    if len(eligible) < n_way:
        raise ValueError(
            f"the {setting.split} split has {len(eligible)} classes with {per_class} images (k_shot + pool + "
            f"held-out), fewer than n_way={n_way}: lower --pool or --held-out"
        )
    members = {int(c): np.flatnonzero(labels == c) for c in eligible}
    parts: dict[str, list[np.ndarray]] = {"support": [], "pool": [], "held": []}
    ys: dict[str, list[np.ndarray]] = {"support": [], "pool": [], "held": []}
    for _ in range(setting.tasks):
        classes = rng.choice(eligible, n_way, replace=False)
        task = {name: [] for name in parts}
        for way, c in enumerate(classes):
            order = rng.permutation(members[int(c)])[:per_class]
            cuts = {
                "support": order[:k_shot],
                "pool": order[k_shot : k_shot + setting.pool],
                "held": order[-setting.held_out :],
            }
            for name, idx in cuts.items():
                task[name] += [(i, way) for i in idx]
        shuffle = rng.permutation(len(task["pool"]))
        task["pool"] = [task["pool"][i] for i in shuffle]
        for name in parts:
            parts[name].append(np.array([i for i, _ in task[name]]))
            ys[name].append(np.array([w for _, w in task[name]]))

    def gathered(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(np.stack(parts[name]))
        x = images.gather(index.flatten()).view(*index.shape, *images.image_shape)
        return x.to(device), torch.from_numpy(np.stack(ys[name])).to(device)

    return Tasks(*gathered("support"), *gathered("pool"), *gathered("held"))


def build_acquisition(
    class_path: str, init_args: Mapping[str, Any], seed: int, offered: Mapping[str, Any] | None = None
) -> Any:
    """The sampler named by ``class_path`` with ``init_args``; the run's seed (``StochasticSampler``) and each of
    ``offered`` (e.g. a training sampler's ``tasks`` and ``query_sets``) where its constructor takes them and
    ``init_args`` do not set them."""
    cls = import_object(class_path)
    accepted = inspect.signature(cls).parameters
    args = {key: value for key, value in {"seed": seed, **(offered or {})}.items() if key in accepted}
    return cls(**{**args, **init_args})


def choose(sampler: Any, evidence: torch.Tensor, lam: float, count: int, step: int) -> torch.Tensor:
    """(count,) the candidates one task labels: the top ``count`` of the sampler's priority of its score.

    Args:
        evidence: (Q, M, N) evidence of the task's Q candidate sets.
    """
    if not sampler.uses_scores:
        return torch.arange(count)  # the candidates are a random partition already
    available = torch.ones(1, evidence.shape[0], dtype=torch.bool, device=evidence.device)
    scores = sampler.score(evidence[None], lam, available)
    return sampler.priority(scores, step)[0].topk(count).indices.cpu()


def run_arm(model: Any, tasks: Tasks, sampler: Any, setting: Setting, lam: float, seed: int) -> list[float]:
    """One acquisition over every round: the held-out accuracy (%) after 0, 1, ..., ``rounds`` rounds of labels."""
    num_tasks, pool = tasks.pool_y.shape
    labeled = torch.zeros(num_tasks, 0, dtype=torch.long, device=tasks.pool_y.device)  # pool positions revealed
    remaining = [list(range(pool)) for _ in range(num_tasks)]
    curve = []
    rows = torch.arange(num_tasks, device=labeled.device)[:, None]
    for round_ in range(setting.rounds + 1):
        support_x = torch.cat([tasks.support_x, tasks.pool_x[rows, labeled]], dim=1)
        support_y = torch.cat([tasks.support_y, tasks.pool_y[rows, labeled]], dim=1)
        held_logits = model.adapt_and_predict(support_x, support_y, tasks.held_x)
        curve.append(100.0 * float((held_logits.argmax(-1) == tasks.held_y).float().mean()))
        if round_ == setting.rounds:
            break
        rng = np.random.default_rng([seed, round_, 7])  # the same partition for every arm where their pools agree
        sets = []
        for t in range(num_tasks):
            order = [remaining[t][i] for i in rng.permutation(len(remaining[t]))]
            count = len(order) // setting.set_size
            sets.append([order[q * setting.set_size : (q + 1) * setting.set_size] for q in range(count)])
        num_sets = len(sets[0])
        if num_sets < setting.per_round:
            raise ValueError(f"round {round_ + 1}: {num_sets} candidate sets left, fewer than --per-round")
        index = torch.tensor(sets, device=labeled.device)  # (T, Q, M)
        evidence = None
        if sampler.uses_scores:
            query_sets = [tasks.pool_x[rows, index[:, q]] for q in range(num_sets)]
            logits = model.adapt_and_predict_sets(support_x, support_y, query_sets)
            evidence = model.loss.evidence(torch.stack(logits, dim=1))  # (T, Q, M, N)
        picked = []
        for t in range(num_tasks):
            step = round_ * num_tasks + t  # a stochastic sampler's noise differs by task and round
            chosen = choose(sampler, evidence[t] if evidence is not None else None, lam, setting.per_round, step)
            taken = [p for q in chosen.tolist() for p in sets[t][q]]
            labeled_now = set(taken)
            remaining[t] = [p for p in remaining[t] if p not in labeled_now]
            picked.append(taken)
        labeled = torch.cat([labeled, torch.tensor(picked, device=labeled.device)], dim=1)
    return curve


def summarise(curves: Mapping[str, Mapping[int, Sequence[float]]], labels: Sequence[float]) -> dict[str, Any]:
    """Per acquisition: labels saved and curve area (mean, 95% interval over seeds, paired difference of the area
    with random), the final accuracy, and the mean curve."""
    random = curves["random"]
    summary = {}
    for name, by_seed in curves.items():
        seeds = sorted(by_seed)
        saved = [labels_saved(labels, by_seed[s], random[s]) for s in seeds if s in random]
        areas = {"values": [curve_area(labels, by_seed[s]) for s in seeds], "seeds": seeds}
        random_areas = {"values": [curve_area(labels, random[s]) for s in sorted(random)], "seeds": sorted(random)}
        reached = [x for x in saved if x is not None]
        summary[name] = {
            "labels_saved": {**mean_ci95(reached), "reached": f"{len(reached)}/{len(saved)}", "values": saved},
            "curve_area": {**mean_ci95(areas["values"]), "values": areas["values"]},
            "area_minus_random": paired_difference(areas, random_areas),
            "final": mean_ci95([by_seed[s][-1] for s in seeds]),
            "mean_curve": [float(np.mean([by_seed[s][i] for s in seeds])) for i in range(len(labels))],
        }
    return summary


def format_cell(summary: Mapping[str, Any], scale: float = 1.0, digits: int = 1, signed: bool = False) -> str:
    """A table cell of a mean and its 95% interval (``mean_ci95``), scaled, "n/a" without a mean."""
    if summary.get("mean") is None:
        return "n/a"
    value = summary["mean"] * scale
    value = 0.0 if round(value, digits) == 0 else value  # no "-0"
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return text + (f" ± {summary['ci95'] * scale:.{digits}f}" if summary.get("ci95") is not None else "")


def markdown_table(summary: Mapping[str, Any]) -> str:
    """One row per acquisition: labels saved (%), curve area, its paired difference with random, final accuracy."""
    lines = [
        "| acquisition | labels saved vs random (%) | reached | curve area (%) | area - random (points) "
        "| final acc (%) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        saved = row["labels_saved"]
        lines.append(
            f"| {name} | {format_cell(saved, 100.0, signed=True)} | {saved['reached']} "
            f"| {format_cell(row['curve_area'], digits=2)} "
            f"| {format_cell(row['area_minus_random'], digits=2, signed=True)} "
            f"| {format_cell(row['final'], digits=2)} |"
        )
    return "\n".join(lines)


def settings_table(columns: Mapping[str, Mapping[str, Any]]) -> str:
    """Acquisitions against settings, each cell ``labels saved % (seeds that reach) / area - random (points)``, from
    the ``summary`` of each setting's record (docs/RESULTS.md's labeling-time tables); random, the reference, has no
    row.

    Example:
        >>> row = {"labels_saved": {"mean": 0.32, "ci95": 0.14, "reached": "3/3"},
        ...        "area_minus_random": {"mean": 0.98, "ci95": 0.71}}
        >>> print(settings_table({"5w1s val": {"units": row}}))
        | acquisition | 5w1s val |
        |---|---|
        | units | +32 ± 14 (3/3) / +0.98 ± 0.71 |
    """
    names = list(dict.fromkeys(name for summary in columns.values() for name in summary if name != "random"))
    lines = ["| acquisition | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name in names:
        cells = []
        for summary in columns.values():
            row = summary.get(name)
            if row is None:
                cells.append("not run")
                continue
            saved, area = row["labels_saved"], row["area_minus_random"]
            cells.append(
                f"{format_cell(saved, 100.0, digits=0, signed=True)} ({saved['reached']}) / "
                f"{format_cell(area, digits=2, signed=True)}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: Mapping[str, Any], labels: Sequence[float], path: Path, title: str) -> None:
    """The mean labels-accuracy curve of every acquisition, one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2), dpi=150)
    for name, row in summary.items():
        axes.plot(labels, row["mean_curve"], marker="o", markersize=3, label=name, lw=2.2 if name == "random" else 1.4)
    axes.set_xlabel("labeled pool images per task")
    axes.set_ylabel("held-out accuracy (%)")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def load_model(config: str, ckpt: str, overrides: Sequence[str], device: torch.device) -> tuple[Any, Any, float]:
    """The config's model and data module (parsed as ``fit`` parses them), the checkpoint's weights, and the lambda
    its run scored with at that step."""
    from units_lightning.annotation.commands import schedule_at
    from units_lightning.cli import cli_main
    from units_lightning.evaluation.checkpoints import load_checkpoint

    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns where its args and the script's both exist
    try:
        cli = cli_main(["--config", config, *overrides, "--trainer.logger", "false"], run=False)
    finally:
        sys.argv = argv
    model, data = cli.model, cli.datamodule
    checkpoint = load_checkpoint(ckpt)
    model.load_state_dict(checkpoint["state_dict"])
    _, lam = schedule_at(model, checkpoint)
    return model.to(device).eval(), data, lam


def loss_overrides(overrides: Sequence[str]) -> list[str]:
    """The ``--model.loss...`` options among a run's config overrides, each as ``option=value``: what changes how the
    model adapts (``class_balanced``), unlike where the data lies or how it is computed.

    Example:
        >>> loss_overrides(["--data.root", "/x", "--model.loss.init_args.class_balanced", "true", "--model.capture=a"])
        ['--model.loss.init_args.class_balanced=true']
    """
    found, words = [], list(overrides)
    for i, word in enumerate(words):
        if word.startswith("--model.loss"):
            has_value = "=" in word or i + 1 == len(words) or words[i + 1].startswith("--")
            found.append(word if has_value else f"{word}={words[i + 1]}")
    return sorted(found)


def plot_title(record: Mapping[str, Any]) -> str:
    """A results record's plot title: config, split, tasks, seeds and the loss overrides the model adapted with.

    Example:
        >>> plot_title({"config": "configs/budget_omniglot_5w1s.yaml", "setting": {"split": "val", "tasks": 200},
        ...             "seeds": [0, 1, 2], "overrides": ["--model.loss.init_args.class_balanced", "true"]})
        'budget_omniglot_5w1s, val classes, 200 tasks x 3 seeds, class_balanced=true'
    """
    setting, seeds = record["setting"], len(record["seeds"])
    title = f"{Path(record['config']).stem}, {setting['split']} classes, {setting['tasks']} tasks x {seeds} seeds"
    adapted = [o.rsplit(".", 1)[-1] for o in loss_overrides(record.get("overrides", []))]
    return ", ".join([title, *adapted])


def merge(paths: Sequence[Path], out: Path | None) -> dict[str, Any]:
    """One record of several runs of the same setting (seeds run apart, e.g. one process per GPU): their curves
    joined, the summary computed anew over every seed. Runs whose settings, configs, label counts or loss overrides
    differ (plain against class-balanced adaptation) are refused."""
    records = [json.loads(Path(p).read_text()) for p in paths]
    first = records[0]

    def setting(record: Mapping[str, Any]) -> tuple:
        return record["setting"], record["config"], record["labels"], loss_overrides(record.get("overrides", []))

    for path, record in zip(paths[1:], records[1:], strict=True):
        if setting(record) != setting(first):
            raise ValueError(
                f"cannot merge runs of different settings: {paths[0]} and {path} differ in the setting, the config, "
                "the label counts or the loss overrides (e.g. --model.loss.init_args.class_balanced)"
            )
    curves: dict[str, dict[int, list[float]]] = {}
    for record in records:
        for name, by_seed in record["curves"].items():
            curves.setdefault(name, {}).update({int(s): c for s, c in by_seed.items()})
    merged = {
        **first,
        "checkpoints": [c for r in records for c in r["checkpoints"]],
        "seeds": sorted({int(s) for r in records for s in r["seeds"]}),
        "curves": {n: {str(s): c for s, c in sorted(by_seed.items())} for n, by_seed in curves.items()},
        "summary": summarise(curves, first["labels"]),
        "seconds": max(r["seconds"] for r in records),
        "merged_from": [str(p) for p in paths],
    }
    print(markdown_table(merged["summary"]))
    if out is not None:
        out.write_text(json.dumps(merged, indent=1))
        plot(merged["summary"], merged["labels"], out.with_suffix(".png"), plot_title(merged))
    return merged


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["table"]:  # labeling_time.py table "5w1s val=A.json" "5w1s test=B.json" ...
        tabling = argparse.ArgumentParser(prog="labeling_time.py table")
        tabling.add_argument("columns", nargs="+", help="NAME=results.json, one column each")
        options = tabling.parse_args(argv[1:])
        columns = {}
        for spec in options.columns:
            name, _, path = spec.rpartition("=")
            if not name:
                tabling.error(f"{spec!r}: give each column as NAME=results.json")
            columns[name] = json.loads(Path(path).read_text())["summary"]
        print(settings_table(columns))
        return {"columns": columns}
    if argv[:1] == ["merge"]:  # labeling_time.py merge A.json B.json ... [--out X.json]
        merging = argparse.ArgumentParser(prog="labeling_time.py merge")
        merging.add_argument("paths", type=Path, nargs="+")
        merging.add_argument("--out", type=Path, default=None)
        options = merging.parse_args(argv[1:])
        return merge(options.paths, options.out)
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--config", required=True, help="the config the model was trained with")
    parser.add_argument("--ckpt", nargs="+", required=True, help="a checkpoint per seed, or one for all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--split", default="test", choices=["val", "test"])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--pool", type=int, default=15, help="unlabeled images per class")
    parser.add_argument("--held-out", type=int, default=4, help="images per class that measure accuracy")
    parser.add_argument("--set-size", type=int, default=5, help="images per candidate query set")
    parser.add_argument("--per-round", type=int, default=1, help="query sets labeled per task and round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--acquisitions", nargs="+", default=list(ACQUISITIONS))
    parser.add_argument("--acquisition", action="append", default=[], help="name=class_path[:json init args]")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (a PNG plot beside it)")
    args, overrides = parser.parse_known_args(argv)
    for spec in args.acquisition:
        name, _, rest = spec.partition("=")
        path, _, init = rest.partition(":")
        ACQUISITIONS[name] = (path, json.loads(init) if init else {})
        args.acquisitions.append(name)
    if "random" not in args.acquisitions:
        args.acquisitions.insert(0, "random")
    if len(args.ckpt) not in (1, len(args.seeds)):
        parser.error("give one --ckpt, or one per seed")
    setting = Setting(args.split, args.tasks, args.pool, args.held_out, args.set_size, args.per_round, args.rounds)
    device = torch.device(args.device)
    labels = [float(r * args.per_round * args.set_size) for r in range(args.rounds + 1)]
    curves: dict[str, dict[int, list[float]]] = {name: {} for name in args.acquisitions}
    started = time.perf_counter()
    for i, seed in enumerate(args.seeds):
        model, data, lam = load_model(args.config, args.ckpt[i % len(args.ckpt)], overrides, device)
        data.setup("test" if args.split == "test" else "validate")
        tasks = draw_tasks(data.split(args.split), data.n_way, data.spec.k_shot, setting, seed, device)
        for name in args.acquisitions:
            class_path, init = ACQUISITIONS[name]
            sampler = build_acquisition(class_path, init, seed)
            curves[name][seed] = run_arm(model, tasks, sampler, setting, lam, seed)
            shown = " ".join(f"{a:.2f}" for a in curves[name][seed])
            print(f"seed {seed} {name:>10}: {shown}  ({time.perf_counter() - started:.0f} s)", flush=True)
        del model, data, tasks  # the next seed's model and its CUDA graphs start from free memory
        if device.type == "cuda":
            torch.cuda.empty_cache()
    summary = summarise(curves, labels)
    record = {
        "setting": asdict(setting),
        "config": args.config,
        "checkpoints": args.ckpt,
        "overrides": overrides,
        "seeds": args.seeds,
        "labels": labels,
        "acquisitions": {n: ACQUISITIONS[n] for n in args.acquisitions},
        "curves": {n: {str(s): c for s, c in by_seed.items()} for n, by_seed in curves.items()},
        "summary": summary,
        "device": device_name(args.device),
        "versions": versions(),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(markdown_table(summary))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
        plot(summary, labels, args.out.with_suffix(".png"), plot_title(record))
    return record


if __name__ == "__main__":
    main()
