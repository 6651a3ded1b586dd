"""Labeling rounds on Omniglot 5-way 1-shot: query sets chosen by the model's uncertainty against random ones.

A simulated lab: ``--tasks`` tasks of 5 Omniglot training characters each, one labeled drawing per character (the
support set) and ``--unlabeled`` unlabeled drawings per character (the pool), written as PNG files into a temporary
annotation project; the labels of the pool are the simulated annotator's answer key. Round 1 labels ``--budget``
query sets (5 images each) chosen at random, as ``select`` does without a model, and trains ``--steps`` steps of
Units-ML on them. From there two arms go on alike except for which query sets get labeled: ``uncertainty`` asks
the trained model (``select`` with the Units-ML rule: the most uncertain candidate query sets), ``random`` takes
random candidates. Each round labels ``--budget`` more query sets, ingests them, and trains ``--steps`` more steps
resumed from the arm's previous checkpoint. After every round the model is tested on the same ``--test-tasks``
5-way 1-shot tasks of Omniglot's test characters (5 queries per class), so the two arms are compared at equal
numbers of labeled query sets. Everything runs on the CPU (or ``--device cuda``).

    python benchmarks/annotation_rounds.py --root ../shared/data/omniglot
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

from units_lightning.annotation import AnnotatedTasksDataModule, SimulatedAnnotator, ingest_answers, select_batch
from units_lightning.annotation.commands import schedule_at
from units_lightning.annotation.label_store import LabelStore
from units_lightning.annotation.simulation import write_simulated_project
from units_lightning.data import OmniglotDataModule
from units_lightning.ledger import LabelLedger
from units_lightning.module import UnitsMAML
from units_lightning.samplers import MultiQuerySampler, RandomSampler
from units_lightning.schedules import LinearAnneal, LinearWarmup

REPO = Path(__file__).resolve().parents[1]
ARMS = ("uncertainty", "random")


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


def new_model(settings: Settings, sampler: MultiQuerySampler) -> UnitsMAML:
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


def tasks_labeled(data: AnnotatedTasksDataModule) -> int:
    """How many of the project's tasks have at least one labeled query set."""
    return len({s.task for b in data.label_store().batches for s in b.query_sets})


def run_seed(settings: Settings, seed: int, evaluation: OmniglotDataModule, workdir: Path) -> dict[str, dict]:
    """Both arms for one seed: test accuracy and the number of tasks with labels after every round."""
    pl.seed_everything(seed, verbose=False)
    train_images = OmniglotDataModule(root=str(settings.root), cache_dir=settings.cache_dir, rotations=[0]).split(
        "train"
    )
    project = workdir / f"seed{seed}" / "project"
    key = write_simulated_project(
        train_images, project, settings.tasks, n_way=5, k_shot=1, unlabeled_per_class=settings.unlabeled, seed=seed
    )

    def data_for(arm: str) -> AnnotatedTasksDataModule:
        sampler = MultiQuerySampler(tasks=4, query_sets=settings.candidates)
        labels = workdir / f"seed{seed}" / f"{arm}-labels.json"
        return AnnotatedTasksDataModule(
            root=str(project), labels=str(labels), n_way=5, k_shot=1, sampler=sampler, seed=seed
        )

    first = data_for("first")
    untrained = new_model(settings, first.sampler).to(settings.device)
    label(first, untrained, settings.budget, RandomSampler(), key)  # no model yet: the first batch is random
    checkpoint = workdir / f"seed{seed}" / "round1.ckpt"
    model = train_round(settings, first, 1, None, checkpoint)
    shared, shared_tasks = accuracy(model.to(settings.device), evaluation), tasks_labeled(first)
    results = {}
    for arm in ARMS:
        data = data_for(arm)
        LabelStore.load(first.labels).save(data.labels)  # both arms continue from round 1's labels and model
        previous, scores, covered = checkpoint, [shared], [shared_tasks]
        for round_number in range(2, settings.rounds + 1):
            model = new_model(settings, data.sampler).to(settings.device)
            state = torch.load(previous, map_location=settings.device, weights_only=True)
            model.load_state_dict(state["state_dict"])
            step, lam = schedule_at(model, state)  # as `select --ckpt_path` reads them
            rule = data.sampler if arm == "uncertainty" else RandomSampler()
            label(data, model, settings.budget, rule, key, step=step, lam=lam)
            save = workdir / f"seed{seed}" / f"{arm}-round{round_number}.ckpt"
            model = train_round(settings, data, round_number, previous, save)
            scores.append(accuracy(model.to(settings.device), evaluation))
            covered.append(tasks_labeled(data))
            previous = save
        results[arm] = {"accuracy": scores, "tasks_labeled": covered}
    return results


def markdown(settings: Settings, seeds: list[int], results: list[dict[str, dict]], seconds: float) -> str:
    rows = [
        "| labeled query sets (images) | uncertainty-chosen batches | random batches | difference | tasks with "
        "labels (uncertainty / random) |",
        "|---|---|---|---|---|",
    ]
    for r in range(settings.rounds):
        sets = settings.budget * (r + 1)
        arms = {arm: np.array([res[arm]["accuracy"][r] for res in results]) for arm in ARMS}
        covered = {arm: np.mean([res[arm]["tasks_labeled"][r] for res in results]) for arm in ARMS}
        diff = arms["uncertainty"] - arms["random"]
        cells = [f"{100 * a.mean():.2f}% ({', '.join(f'{100 * x:.1f}' for x in a)})" for a in arms.values()]
        rows.append(
            f"| {sets} ({5 * sets}) | {cells[0]} | {cells[1]} | {100 * diff.mean():+.2f} points | "
            f"{covered['uncertainty']:.1f} / {covered['random']:.1f} of {settings.tasks} |"
        )
    return "\n".join(
        [
            *rows,
            "",
            f"Mean test accuracy over seeds {seeds} (each seed in brackets) on {settings.test_tasks} Omniglot "
            f"5-way 1-shot test tasks; {settings.tasks} project tasks with {5 * settings.unlabeled} unlabeled "
            f"images each, {settings.budget} query sets labeled per round, {settings.steps} training steps per "
            f"round, {settings.candidates} candidate query sets per task, {settings.filters} filters, "
            f"{settings.inner_steps} inner steps; round 1 is random in both arms. "
            f"{platform.machine()}, {settings.device}, torch {torch.__version__}, {seconds / 60:.1f} min.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO.parent / "shared" / "data" / "omniglot")
    parser.add_argument("--cache-dir", default=None, help="decoded-image cache (default $UNITS_LIGHTNING_CACHE)")
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
    args = parser.parse_args()
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
    )
    started = time.perf_counter()
    evaluation = test_data(settings)
    results = []
    with tempfile.TemporaryDirectory(prefix="annotation-rounds-") as workdir:
        for seed in args.seeds:
            results.append(run_seed(settings, seed, evaluation, Path(workdir)))
            print(f"seed {seed}: {json.dumps(results[-1])}", flush=True)
    table = markdown(settings, args.seeds, results, time.perf_counter() - started)
    print(table)
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {"settings": {**vars(args), "root": str(args.root), "out": str(args.out)}, "results": results}, indent=1
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
