"""Labeling rounds on Omniglot 5-way 1-shot: query sets chosen by each acquisition against random ones, through the
path ``units-lightning select`` and ``ingest`` take.

A simulated lab: ``--tasks`` tasks of 5 Omniglot training characters each, one labeled drawing per character (the
support set) and ``--unlabeled`` unlabeled drawings per character (the pool), written as PNG files into a temporary
annotation project; the labels of the pool are the simulated annotator's answer key. Round 1 labels ``--budget``
query sets (5 images each) chosen at random, as ``select`` does without a model, and trains ``--steps`` steps of
Units-ML on them. From there the arms (``--arms``) go on alike except for which query sets get labeled: each later
round the arm's acquisition chooses ``--budget`` query sets by ``select_batch(model, data, budget, step=, lam=,
sampler=acquisition)``, exactly as ``select --ckpt_path --acquisition`` calls it (the step and lambda read from the
arm's last checkpoint, the candidates per task from the training sampler), the simulated annotator answers,
``ingest_answers`` adds the answers to the arm's label store, and training resumes ``--steps`` more steps from the
arm's previous checkpoint. Every arm trains with the same sampler (``MultiQuerySampler``, the paper's rule); only
what people are asked to label differs. After every round the model is tested on the same ``--test-tasks`` 5-way
1-shot tasks of Omniglot's test characters (5 queries per class), so the arms are compared at equal numbers of
labeled query sets, and each arm's labels saved against random at random's last-round accuracy
(``benchmarks.labeling_time.labels_saved``) sums the curve up. Everything runs on the CPU (or ``--device cuda``).

An arm is named by its acquisition: ``random`` (``RandomSampler``), ``units`` (``MultiQuerySampler``, the paper's
task uncertainty), ``margin`` (``MarginSampler``, ``select``'s default), any other name of
``benchmarks.labeling_time.ACQUISITIONS``, or ``name=class_path`` for any sampler. Each is built with the training
sampler's ``tasks`` and ``query_sets`` where its constructor takes them (as ``select``'s default margin is).

    python benchmarks/annotation_rounds.py --root ../shared/data/omniglot --arms random units margin
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the repository on sys.path, for ``benchmarks.*``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning.pytorch as pl
import numpy as np
import torch

from benchmarks.labeling_time import ACQUISITIONS, build_acquisition, labels_saved
from units_lightning.annotation import AnnotatedTasksDataModule, SimulatedAnnotator, ingest_answers, select_batch
from units_lightning.annotation.batch import AnnotationBatch
from units_lightning.annotation.commands import schedule_at
from units_lightning.annotation.label_store import LabelStore
from units_lightning.annotation.simulation import write_simulated_project
from units_lightning.data import OmniglotDataModule
from units_lightning.ledger import LabelLedger
from units_lightning.module import UnitsMAML
from units_lightning.samplers import MultiQuerySampler, RandomSampler, TaskSampler
from units_lightning.schedules import LinearAnneal, LinearWarmup

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ARMS = ("random", "units", "margin")
REFERENCE = "random"


@dataclass(frozen=True)
class Settings:
    root: Path
    tasks: int
    unlabeled: int
    budget: int
    rounds: int
    steps: int
    test_tasks: int
    filters: int
    inner_steps: int
    candidates: int
    device: str
    cache_dir: str | None
    adapt_on_labels: bool = False


def parse_arms(specs: list[str]) -> dict[str, str]:
    """Arm name -> sampler class path, ``random`` first (the reference every other arm is compared with).

    Args:
        specs: names of ``benchmarks.labeling_time.ACQUISITIONS`` or ``name=class_path``.

    Raises:
        ValueError: an unknown name, a name given twice, or a ``name=`` without a class path.

    Example:
        >>> parse_arms(["margin", "mine=my_lab.samplers.Hardest"])
        {'random': 'units_lightning.samplers.RandomSampler', 'margin': 'units_lightning.samplers.MarginSampler', \
'mine': 'my_lab.samplers.Hardest'}
    """
    arms: dict[str, str] = {}
    for spec in specs:
        name, given, path = spec.partition("=")
        if given and not (name and path):
            raise ValueError(f"arm {spec!r}: write name=class_path, e.g. mine=my_lab.samplers.HardestSampler")
        if not given and name not in ACQUISITIONS:
            raise ValueError(
                f"unknown arm {name!r}: use one of {', '.join(ACQUISITIONS)} or name=class_path for another sampler"
            )
        if name in arms:
            raise ValueError(f"arm {name!r} is given twice")
        arms[name] = path if given else ACQUISITIONS[name][0]
    return {REFERENCE: ACQUISITIONS[REFERENCE][0], **arms}


def build_arm(class_path: str, like: TaskSampler, seed: int) -> TaskSampler:
    """The acquisition ``class_path`` with ``like``'s ``tasks`` and ``query_sets`` where its constructor takes them
    (as ``select``'s default ``MarginSampler`` gets the config sampler's), and the seed where it takes one
    (``labeling_time.build_acquisition``)."""
    return build_acquisition(class_path, {}, seed, offered={"tasks": like.tasks, "query_sets": like.query_sets})


def test_data(settings: Settings) -> OmniglotDataModule:
    """Omniglot's test characters, 5-way 1-shot tasks with 5 queries per class, the same for every evaluation."""
    data = OmniglotDataModule(
        root=str(settings.root),
        cache_dir=settings.cache_dir,
        rotations=[0],
        n_way=5,
        k_shot=1,
        eval_query_shots=5,
        test_tasks=settings.test_tasks,
        eval_batch_tasks=20,
        seed=1234,
    )
    data.setup("test")
    return data


def accuracy(model: UnitsMAML, data: OmniglotDataModule) -> float:
    """Mean query accuracy over the fixed test tasks (adapting to each support set, as ``test`` does)."""
    correct, total = 0, 0
    for batch in data.test_dataloader():
        logits = model.adapt_and_predict(
            batch.support_x.to(model.device), batch.support_y.to(model.device), batch.query_x[:, 0].to(model.device)
        )
        labels = LabelLedger.evaluation_labels(batch)[:, 0].to(model.device)
        correct += int((logits.argmax(-1) == labels).sum())
        total += labels.numel()
    return correct / total


def new_model(settings: Settings, sampler: TaskSampler) -> UnitsMAML:
    """The quick start's model; lambda anneals over the rounds (an epoch is a round), eta warms up in three."""
    model = UnitsMAML(
        n_way=5, image_shape=(1, 28, 28), filters=settings.filters, inner_steps=settings.inner_steps, lr=0.002
    )
    # Set after construction, so that the checkpoint's hyperparameters stay plain values (weights-only loading).
    model.lam, model.eta = LinearAnneal(0.99, 0.5, epochs=settings.rounds), LinearWarmup(peak=1.0, epochs=3)
    model.sampler = sampler
    return model


def train_round(settings: Settings, data: AnnotatedTasksDataModule, round_number: int, resume: Path | None, save: Path):
    """Train up to ``round_number * steps`` steps (resuming from ``resume``) and save the checkpoint to ``save``."""
    model = new_model(settings, data.sampler)
    trainer = pl.Trainer(
        accelerator="gpu" if settings.device.startswith("cuda") else "cpu",
        devices=1,
        max_epochs=round_number,
        limit_train_batches=settings.steps,
        limit_val_batches=0,
        logger=False,
        default_root_dir=save.parent,  # summary.json beside the checkpoint, not in the working directory
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        inference_mode=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, data, ckpt_path=resume)
    trainer.save_checkpoint(save)
    return model


def label(data: AnnotatedTasksDataModule, model: UnitsMAML, budget: int, sampler, key: dict[str, str], **kwargs):
    """One batch chosen by ``sampler``'s rule, answered by the simulated annotator and ingested."""
    batch = select_batch(model, data, budget, sampler=sampler, **kwargs)
    store = ingest_answers(batch, SimulatedAnnotator(key).answer(batch), data.label_store(), "simulated annotator")
    store.save(data.labels)
    return batch


def pre_annotation_accuracy(batch: AnnotationBatch, key: dict[str, str]) -> float:
    """The share of a batch's images whose predicted class (the pre-annotation Label Studio shows, where the model
    is sure enough) is the annotator's answer."""
    images = [image for query_set in batch.query_sets for image in query_set.images]
    return float(np.mean([image.predicted == key[image.image] for image in images]))


def tasks_labeled(data: AnnotatedTasksDataModule) -> int:
    """How many of the project's tasks have at least one labeled query set."""
    return len({s.task for b in data.label_store().batches for s in b.query_sets})


def run_seed(
    settings: Settings, seed: int, arms: dict[str, str], evaluation: OmniglotDataModule, workdir: Path
) -> dict[str, dict]:
    """Every arm for one seed: test accuracy and the number of tasks with labels after every round."""
    pl.seed_everything(seed, verbose=False)
    train_images = OmniglotDataModule(root=str(settings.root), cache_dir=settings.cache_dir, rotations=[0]).split(
        "train"
    )
    project = workdir / f"seed{seed}" / "project"
    key = write_simulated_project(
        train_images, project, settings.tasks, n_way=5, k_shot=1, unlabeled_per_class=settings.unlabeled, seed=seed
    )

    def data_for(arm: str) -> AnnotatedTasksDataModule:
        sampler = MultiQuerySampler(tasks=4, query_sets=settings.candidates)  # the training rule, every arm alike
        labels = workdir / f"seed{seed}" / f"{arm}-labels.json"
        return AnnotatedTasksDataModule(
            root=str(project),
            labels=str(labels),
            n_way=5,
            k_shot=1,
            sampler=sampler,
            seed=seed,
            adapt_on_labels=settings.adapt_on_labels,
        )

    first = data_for("first")
    untrained = new_model(settings, first.sampler).to(settings.device)
    label(first, untrained, settings.budget, RandomSampler(), key)  # no model yet: the first batch is random
    checkpoint = workdir / f"seed{seed}" / "round1.ckpt"
    model = train_round(settings, first, 1, None, checkpoint)
    shared, shared_tasks = accuracy(model.to(settings.device), evaluation), tasks_labeled(first)
    results = {}
    for arm, class_path in arms.items():
        data = data_for(arm)
        acquisition = build_arm(class_path, data.sampler, seed)
        LabelStore.load(first.labels).save(data.labels)  # every arm continues from round 1's labels and model
        previous, scores, covered, pre_annotations = checkpoint, [shared], [shared_tasks], []
        for round_number in range(2, settings.rounds + 1):
            model = new_model(settings, data.sampler).to(settings.device)
            state = torch.load(previous, map_location=settings.device, weights_only=True)
            model.load_state_dict(state["state_dict"])
            step, lam = schedule_at(model, state)  # as `select --ckpt_path` reads them
            batch = label(data, model, settings.budget, acquisition, key, step=step, lam=lam)
            pre_annotations.append(pre_annotation_accuracy(batch, key))
            save = workdir / f"seed{seed}" / f"{arm}-round{round_number}.ckpt"
            model = train_round(settings, data, round_number, previous, save)
            scores.append(accuracy(model.to(settings.device), evaluation))
            covered.append(tasks_labeled(data))
            previous = save
        results[arm] = {
            "accuracy": scores,
            "tasks_labeled": covered,
            "pre_annotation_accuracy": pre_annotations,  # of the batches of rounds 2, 3, ...
            "acquisition": repr(acquisition),
        }
        print(f"seed {seed}, {arm}: {json.dumps(results[arm])}", flush=True)
    return results


def saved_against_random(labels: list[float], results: list[dict[str, dict]], arm: str) -> list[float | None]:
    """Per seed: ``labels_saved`` of ``arm``'s curve against the random arm's, at random's last-round accuracy.

    Example:
        >>> seed = {"random": {"accuracy": [0.4, 0.5, 0.6]}, "margin": {"accuracy": [0.4, 0.6, 0.6]}}
        >>> saved_against_random([10, 20, 40], [seed], "margin")
        [0.5]
    """
    return [
        labels_saved(labels, [100 * a for a in r[arm]["accuracy"]], [100 * a for a in r[REFERENCE]["accuracy"]])
        for r in results
    ]


def _saved_cell(values: list[float | None]) -> str:
    shown = ", ".join("never" if v is None else f"{100 * v:+.0f}%" for v in values)
    if any(v is None for v in values):
        return f"({shown})"
    return f"{100 * float(np.mean(values)):+.0f}% ({shown})"


def markdown(
    settings: Settings, arms: list[str], seeds: list[int], results: list[dict[str, dict]], seconds: float
) -> str:
    """The table: test accuracy of every arm at each number of labeled query sets, tasks with labels, labels saved."""
    others = [arm for arm in arms if arm != REFERENCE]
    rows = [
        "| labeled query sets (images) | "
        + " | ".join(arms)
        + " | "
        + " | ".join(f"{arm} - random" for arm in others)
        + f" | tasks with labels ({' / '.join(arms)}) |",
        "|" + "---|" * (2 + len(arms) + len(others)),
    ]
    for r in range(settings.rounds):
        sets = settings.budget * (r + 1)
        curves = {arm: np.array([res[arm]["accuracy"][r] for res in results]) for arm in arms}
        covered = [np.mean([res[arm]["tasks_labeled"][r] for res in results]) for arm in arms]
        cells = [f"{100 * a.mean():.2f}% ({', '.join(f'{100 * x:.1f}' for x in a)})" for a in curves.values()]
        differences = [f"{100 * (curves[arm] - curves[REFERENCE]).mean():+.2f} points" for arm in others]
        rows.append(
            f"| {sets} ({5 * sets}) | {' | '.join(cells)} | {' | '.join(differences)} | "
            f"{' / '.join(f'{c:.1f}' for c in covered)} of {settings.tasks} |"
        )
    labels = [float(settings.budget * (r + 1)) for r in range(settings.rounds)]
    saved = [_saved_cell(saved_against_random(labels, results, arm)) for arm in others]
    rows.append(
        "| labels saved against random, at random's last-round accuracy (mean; each seed) | "
        + " | ".join(["0%"] + saved)
        + " |"
        + " |" * (len(others) + 1)
    )
    pre = [np.mean([np.mean(res[arm]["pre_annotation_accuracy"]) for res in results]) for arm in arms]
    rows.append(
        "| pre-annotations right, batches of rounds 2 on (mean) | "
        + " | ".join(f"{100 * p:.1f}%" for p in pre)
        + " |" * (len(others) + 2)
    )
    return "\n".join(
        [
            *rows,
            "",
            f"Mean test accuracy over seeds {seeds} (each seed in brackets) on {settings.test_tasks} Omniglot "
            f"5-way 1-shot test tasks; {settings.tasks} project tasks with {5 * settings.unlabeled} unlabeled "
            f"images each, {settings.budget} query sets labeled per round, {settings.steps} training steps per "
            f"round, {settings.candidates} candidate query sets per task, {settings.filters} filters, "
            f"{settings.inner_steps} inner steps; select adapts to "
            f"{'support sets and labeled images' if settings.adapt_on_labels else 'support sets only'}; "
            "round 1 is random in every arm. Labels saved: 1 - labels the arm "
            "needs / labels random needs to reach random's last-round accuracy (linear between rounds; never: the "
            f"arm does not reach it). {platform.machine()}, {settings.device}, torch {torch.__version__}, "
            f"{seconds / 60:.1f} min.",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO.parent / "shared" / "data" / "omniglot")
    parser.add_argument("--cache-dir", default=None, help="decoded-image cache (default $UNITS_LIGHTNING_CACHE)")
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), help="acquisitions: names or name=class_path")
    parser.add_argument("--tasks", type=int, default=20, help="project tasks (5 characters each)")
    parser.add_argument("--unlabeled", type=int, default=15, help="unlabeled drawings per character")
    parser.add_argument("--budget", type=int, default=8, help="query sets labeled per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=25, help="training steps per round")
    parser.add_argument("--candidates", type=int, default=4, help="candidate query sets per task (sampler query_sets)")
    parser.add_argument("--test-tasks", type=int, default=100)
    parser.add_argument("--filters", type=int, default=32)
    parser.add_argument("--inner-steps", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--adapt-on-labels", action="store_true", help="select adapts to a task's labeled images too (class-balanced)"
    )
    args = parser.parse_args(argv)
    try:
        arms = parse_arms(args.arms)
    except ValueError as error:
        parser.error(str(error))
    if not (args.root / "images_background.zip").exists() and not (args.root / "images_background").exists():
        parser.exit(
            2, f"no Omniglot in {args.root}: pass --root, a folder with images_background and images_evaluation\n"
        )
    settings = Settings(
        args.root,
        args.tasks,
        args.unlabeled,
        args.budget,
        args.rounds,
        args.steps,
        args.test_tasks,
        args.filters,
        args.inner_steps,
        args.candidates,
        args.device,
        args.cache_dir,
        args.adapt_on_labels,
    )
    started = time.perf_counter()
    evaluation = test_data(settings)
    results = []
    with tempfile.TemporaryDirectory(prefix="annotation-rounds-") as workdir:
        for seed in args.seeds:
            results.append(run_seed(settings, seed, arms, evaluation, Path(workdir)))
    table = markdown(settings, list(arms), args.seeds, results, time.perf_counter() - started)
    print(table)
    if args.out is not None:
        settings_json: dict[str, Any] = {**vars(args), "root": str(args.root), "out": str(args.out), "arms": arms}
        args.out.write_text(json.dumps({"settings": settings_json, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
