"""``select``: which unlabeled query sets people should label next, by the rule the model trains with.

For every task of the project: cut its still-unlabeled images into candidate query sets of ``n_way * query_shots``
images (as many as the sampler's ``query_sets``, at random), adapt to the task's support set (with the data
module's ``adapt_on_labels``, also to the images people labeled in the task so far, every class weighing the same)
and predict every candidate (``UnitsMAML.adapt_and_predict_sets``, the evaluation path), and score every set by the
sampler's acquisition (``TaskSampler.score``, as a training step scores; by default the task uncertainty
``lambda * vacuity + (1 - lambda) * dissonance``), all tasks' candidates in one call, so that a representativeness
or diversity score compares them with each other. The sampler's ``select`` then chooses among the
(tasks x candidates) scores, exactly as in training, so a custom sampler chooses here too; it is asked again over the
sets still unchosen until ``budget`` sets are chosen or none is left, and the first ``budget`` of its choices by its
``priority`` (by default the scores, highest first) form the batch (ties, and every set of a sampler that ignores
scores, in random order). The project's label budget, when it has one, trims the batch through
``LabelLedger.within_budget``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from units_lightning.annotation.batch import AnnotationBatch, ImagePrediction, SelectedQuerySet, utc_timestamp
from units_lightning.annotation.datamodule import AnnotatedTasksDataModule
from units_lightning.annotation.images import load_pixels, to_float
from units_lightning.annotation.label_store import LabelStore
from units_lightning.annotation.layout import AnnotationProject, AnnotationTask
from units_lightning.belief import belief, dissonance, expected_probability, vacuity
from units_lightning.ledger import LabelLedger
from units_lightning.module import UnitsMAML
from units_lightning.samplers import TaskSampler
from units_lightning.samplers.acquisition import units_score

__all__ = [
    "Candidates",
    "adapted_evidence",
    "candidate_query_sets",
    "choose_query_sets",
    "score_candidates",
    "select_batch",
    "task_support",
]


@dataclass(frozen=True)
class Candidates:
    """Every task's candidate query sets, scored.

    Attributes:
        tasks: the tasks that have at least one candidate.
        sets: for each of those tasks, its candidate query sets (image names).
        scores: (T, Q) acquisition score of each candidate (``TaskSampler.score``; by default the task uncertainty);
            ``-inf`` where a task has fewer than Q candidates.
        evidence: for each task, (Q_t, M, N) evidence of every image of its candidates.
    """

    tasks: list[AnnotationTask]
    sets: list[list[tuple[str, ...]]]
    scores: Tensor
    evidence: list[Tensor]


def candidate_query_sets(
    pool: Sequence[str], set_size: int, count: int, rng: np.random.Generator
) -> list[tuple[str, ...]]:
    """Up to ``count`` disjoint query sets of ``set_size`` images drawn at random from ``pool``.

    Example:
        >>> candidate_query_sets(["a", "b", "c", "d", "e"], 2, 3, np.random.default_rng(0))
        [('c', 'e'), ('d', 'a')]
    """
    order = rng.permutation(len(pool))
    return [
        tuple(pool[i] for i in order[k * set_size : (k + 1) * set_size])
        for k in range(min(count, len(pool) // set_size))
    ]


def _task_pixels(project: AnnotationProject, names: Sequence[str], image_shape, device) -> Tensor:
    return to_float(load_pixels(project, names, image_shape)).to(device)


def score_candidates(
    model: UnitsMAML,
    project: AnnotationProject,
    store: LabelStore,
    image_shape: tuple[int, int, int],
    set_size: int,
    count: int,
    lam: float,
    rng: np.random.Generator,
    sampler: TaskSampler | None = None,
    adapt_on_labels: bool = False,
) -> Candidates:
    """Draw each task's candidate query sets from its unlabeled images and score them.

    Each task is adapted to on its whole support set (every support image), once, and its candidates are
    predicted from that adapted model, each set in its own pass (batch norm uses the set's statistics). With
    ``adapt_on_labels`` the task's labeled images join its support set (``task_support``). Every task's candidates
    are then scored together by ``sampler.score`` (the tasks with fewer candidates padded and marked unavailable).

    Args:
        model: the trained model.
        project: the project; store: its labels so far (labeled images, images people could not tell and images of
            pending batches are not candidates).
        image_shape: (C, H, W) the model takes; set_size: images per query set; count: candidates per task.
        lam: lambda of the task uncertainty.
        rng: draws the candidate sets.
        sampler: whose ``score`` is the acquisition (default: the paper's task uncertainty).
        adapt_on_labels: adapt to each task's support set and the images people labeled in it so far.
    """
    tasks, sets, evidence = [], [], []
    taken = store.unavailable  # labeled, could not be told, or out in a pending batch
    labels = store if adapt_on_labels else None  # whose labeled images join each task's support
    for task in project.tasks:
        pool = [image for image in task.unlabeled if image not in taken]
        candidates = candidate_query_sets(pool, set_size, count, rng)
        if not candidates:
            continue
        tasks.append(task)
        sets.append(candidates)
        evidence.append(adapted_evidence(model, project, task, candidates, image_shape, labels))  # (Q_t, M, N)
    return Candidates(tasks, sets, _scores(evidence, lam, sampler), evidence)


def task_support(task: AnnotationTask, store: LabelStore | None = None) -> tuple[list[str], list[int]]:
    """The images a task adapts to and their class positions in ``task.classes``: its support set, and with a
    ``store`` also every image people labeled in its query sets so far, in the order they were ingested.

    Raises:
        ValueError: the store gives a labeled image a class its task does not have (``AnnotationTask.label_of``).
    """
    names = [image for images in task.support for image in images]
    classes = [c for c, images in enumerate(task.support) for _ in images]
    for query_set in store.query_sets(task.name) if store is not None else ():
        for image in query_set.images:
            names.append(image)
            classes.append(task.label_of(image, store.labels[image]))
    return names, classes


def adapted_evidence(
    model: UnitsMAML,
    project: AnnotationProject,
    task: AnnotationTask,
    query_sets: Sequence[Sequence[str]],
    image_shape: tuple[int, int, int],
    store: LabelStore | None = None,
) -> Tensor:
    """(Q, M, N) evidence of the images of ``query_sets`` (Q sets of M images of ``task``), on the CPU: the model
    adapts once to the task's whole support set (every support image) and predicts each set in its own pass (batch
    norm uses the set's statistics).

    With a ``store``, the images people labeled in the task so far join its support set (``task_support``) and the
    adaptation weighs every class the same (``adapt_and_predict_sets(class_balanced=True)``): labeled images come in
    whatever classes they turn out to be, and on Omniglot and CIFAR-FS a class-balanced adaptation on them gained
    more held-out accuracy than any choice of what to label (docs/RESULTS.md, "Labeling time").
    """
    names, classes = task_support(task, store)
    support_y = torch.tensor(classes, device=model.device)
    support_x = _task_pixels(project, names, image_shape, model.device)
    query_x = _task_pixels(project, [i for s in query_sets for i in s], image_shape, model.device)
    query_x = query_x.view(len(query_sets), len(query_sets[0]), *query_x.shape[1:])
    logits = model.adapt_and_predict_sets(
        support_x[None], support_y[None], [q[None] for q in query_x], class_balanced=store is not None
    )
    return model.loss.evidence(torch.cat(logits)).cpu()


def _scores(evidence: Sequence[Tensor], lam: float, sampler: TaskSampler | None) -> Tensor:
    """(T, Q) scores of every task's (Q_t, M, N) candidate evidence, in one call; ``-inf`` where Q_t < Q."""
    width = max((len(e) for e in evidence), default=0)
    if width == 0:
        return torch.full((len(evidence), 0), float("-inf"))
    padded = evidence[0].new_zeros(len(evidence), width, *evidence[0].shape[1:])
    available = torch.zeros(len(evidence), width, dtype=torch.bool)
    for t, task_evidence in enumerate(evidence):
        padded[t, : len(task_evidence)] = task_evidence
        available[t, : len(task_evidence)] = True
    scores = units_score(padded, lam) if sampler is None else sampler.score(padded, lam, available)
    return torch.where(available, scores, torch.full_like(scores, float("-inf")))


def choose_query_sets(
    sampler: TaskSampler,
    scores: Tensor,
    budget: int,
    step: int,
    rng: np.random.Generator,
    ledger: LabelLedger | None = None,
) -> list[tuple[int, int]]:
    """The ``budget`` query sets the sampler's rule finds most informative, most informative first.

    Args:
        sampler: the configured task sampler; its ``select`` sees the (T, Q) scores (all zeros when it does not
            use scores, as in training), the unavailable sets at ``-inf``; its ``priority`` orders what it chose.
        scores: (T, Q) its acquisition scores, ``-inf`` where there is no candidate.
        budget: query sets wanted.
        step: the step passed to ``select`` (at least the sampler's ``warmup_steps``: selection is never warm-up).
        rng: orders ties at random.
        ledger: the project's ledger, which trims the choice to what is left of its label budget.

    Returns:
        ``(task, candidate)`` positions, the highest priority first (by default the highest score; a random order
        for a sampler without scores).
    """
    step = max(step, sampler.warmup_steps)
    shown = scores if sampler.needs_scores(step) else torch.zeros_like(scores)
    available = torch.isfinite(scores)
    chosen = torch.zeros_like(available)
    while int(chosen.sum()) < budget and bool(available.any()):
        offered = torch.where(available, shown, torch.full_like(shown, float("-inf")))
        picked = sampler.select(offered, step).to(available.device) & available
        if not picked.any():
            break
        chosen |= picked
        available &= ~picked
    # Highest priority first, ties in a random order: a random permutation, then a stable sort.
    priority = sampler.priority(shown, step).flatten().to(chosen.device)
    shuffle = torch.from_numpy(rng.permutation(chosen.numel()))
    order = shuffle[torch.sort(priority[shuffle], descending=True, stable=True).indices]
    order = order[chosen.flatten()[order]][:budget]
    if ledger is not None:
        kept = torch.zeros_like(chosen.flatten())
        kept[order] = True
        rank = torch.zeros(chosen.numel())
        rank[order] = -torch.arange(len(order), dtype=torch.float32)
        kept = ledger.within_budget(kept.view_as(chosen), priority=rank.view_as(scores)).flatten()
        order = order[kept[order]]
    width = scores.shape[1]
    return [(int(i) // width, int(i) % width) for i in order]


def _record(task: AnnotationTask, images: Sequence[str], evidence: Tensor, score: float, project) -> SelectedQuerySet:
    probability = expected_probability(evidence)
    vac, dis = vacuity(evidence), dissonance(belief(evidence))
    predictions = tuple(
        ImagePrediction(
            image=image,
            file=str(project.path(image)),
            predicted=task.classes[int(probability[i].argmax())],
            probabilities={c: round(float(p), 6) for c, p in zip(task.classes, probability[i], strict=True)},
            vacuity=round(float(vac[i]), 6),
            dissonance=round(float(dis[i]), 6),
        )
        for i, image in enumerate(images)
    )
    return SelectedQuerySet(
        task.name, task.classes, round(score, 6), round(float(vac.mean()), 6), round(float(dis.mean()), 6), predictions
    )


def select_batch(
    model: UnitsMAML,
    data: AnnotatedTasksDataModule,
    budget: int,
    *,
    step: int | None = None,
    lam: float | None = None,
    checkpoint: str = "",
    label_budget: int | None = None,
    batch_id: str | None = None,
    sampler: TaskSampler | None = None,
) -> AnnotationBatch:
    """Choose the next annotation batch of ``data``'s project (see the module docstring).

    Args:
        model: the trained model (on the device to score on).
        data: the project's data module: its root, label store, image shape, query set size (``n_way *
            query_shots``), sampler (whose ``query_sets`` is the number of candidates per task) and seed.
        budget: query sets to choose (fewer when fewer candidates are left, or the label budget is nearly spent).
        step: the training step of ``model`` (default ``model.global_step``): what ``sampler.select`` is told.
        lam: lambda of the task uncertainty (default: the model's schedule at its current epoch).
        checkpoint: where the model came from, recorded in the manifest.
        label_budget: the project's budget of labeled query sets (None: none), checked against its ledger.
        batch_id: the batch's id (default ``batch-<number>-<hash of its images>``).
        sampler: the acquisition that scores and the rule that chooses (default ``data.sampler``; ``select`` passes
            its ``--acquisition``, and without a checkpoint a ``RandomSampler``). The number of candidates per task
            is ``data.sampler.query_sets`` either way.

    Raises:
        ValueError: ``budget`` < 1; the project's tasks do not fit the episode shape; the label budget is spent.
    """
    if budget < 1:
        raise ValueError(f"budget must be at least 1 query set, got {budget}")
    project, store = data.project(), data.label_store()
    ledger = LabelLedger(label_budget)
    if store.ledger:
        ledger.load_state_dict(store.ledger)
    if ledger.exhausted:
        raise ValueError(
            f"the project's label budget of {label_budget} query sets is spent ({ledger.query_sets} are labeled): "
            "raise --label_budget to label more"
        )
    step = int(model.global_step if step is None else step)
    lam = float(model.lam(model.schedule_epoch) if lam is None else lam)
    rng = np.random.default_rng([data.seed, store.batches_made])
    sampler = data.sampler if sampler is None else sampler
    candidates = score_candidates(
        model,
        project,
        store,
        data.image_shape,
        data.query_set_size,
        data.sampler.query_sets,
        lam,
        rng,
        sampler,
        adapt_on_labels=data.adapt_on_labels,
    )
    chosen = choose_query_sets(sampler, candidates.scores, budget, step, rng, ledger)
    if not chosen:
        raise ValueError(
            f"no query set to choose in {project.root}: every task has fewer than {data.query_set_size} unlabeled "
            "images left that are not labeled yet (add images to tasks/<task>/unlabeled/)"
        )
    query_sets = tuple(
        _record(
            candidates.tasks[t],
            candidates.sets[t][q],
            candidates.evidence[t][q],
            float(candidates.scores[t, q]),
            project,
        )
        for t, q in chosen
    )
    if batch_id is None:
        digest = hashlib.sha1("\n".join(p.image for s in query_sets for p in s.images).encode()).hexdigest()[:8]
        batch_id = f"batch-{store.batches_made + 1:03d}-{digest}"
    return AnnotationBatch(
        id=batch_id,
        project=str(project.root),
        labels=str(data.labels.expanduser().resolve()),
        created=utc_timestamp(),
        checkpoint=str(checkpoint),
        step=step,
        sampler=repr(sampler),
        lam=round(lam, 6),
        label_budget=label_budget,
        query_sets=query_sets,
    )
