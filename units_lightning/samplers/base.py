"""The task sampler plugin: how candidate tasks are drawn, and which query sets get labeled."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from units_lightning.episode import EpisodeIndices, EpisodeSpec
from units_lightning.samplers.acquisition import units_score

__all__ = ["TaskSampler"]


class TaskSampler:
    """Base class of every task sampler: draws candidate tasks and chooses which query sets to label.

    A training step asks the sampler twice. In the data loader, ``sample(rng, step)`` draws the candidate
    tasks of a step as image indices: ``num_candidates`` tasks, each with a support set and
    ``query_sets`` unlabeled, class-balanced query sets. In the model, after every support set has been
    adapted to and every candidate query set scored by its task uncertainty, ``select(scores, step)``
    returns the mask of query sets to label and train on. Before ``warmup_steps`` the first query set
    of the first ``tasks`` tasks is used (no selection yet, as the paper's warm-up).

    Override ``sample`` (or ``draw_classes``) to change how candidates are drawn, ``score`` to change what a
    candidate query set is worth (default: the paper's task uncertainty), and ``choose`` to change which are kept;
    plug the class in with ``class_path`` in the ``data.sampler`` section of a config, or pass it to
    ``units-lightning select --acquisition`` to choose what people label by the same rule.
    Samplers never load images and never see labels of query sets: ``score`` gets the unlabeled queries' evidence,
    ``select`` the scores.

    Args:
        tasks: tasks trained on per step (the paper's meta-batch I).
        query_sets: unlabeled query sets drawn per task (Q).
        warmup_steps: steps before selection starts.

    A sampler whose choice always holds the same number of query sets declares it in ``chosen_count``: the
    training step then gathers the chosen sets without reading the mask back from the device (on a GPU, one
    synchronisation less per step). The built-in samplers do; a custom one returns None by default and costs one
    device-to-host read per step.

    Attributes:
        spec: the episode shape, set by ``bind``.
        uses_scores: False when ``choose`` ignores the scores, so that the model can skip scoring.
    """

    uses_scores: bool = True

    def __init__(self, tasks: int = 8, query_sets: int = 1, warmup_steps: int = 0):
        if tasks < 1:
            raise ValueError(f"tasks must be >= 1, got {tasks}")
        if query_sets < 1:
            raise ValueError(f"query_sets must be >= 1, got {query_sets}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.tasks = tasks
        self.query_sets = query_sets
        self.warmup_steps = warmup_steps
        self.spec: EpisodeSpec | None = None
        self._pools: list[np.ndarray] = []

    # --- drawing candidates (data loader side) --------------------------------------------------------

    @property
    def num_candidates(self) -> int:
        """Tasks drawn per step (T). The base class draws exactly ``tasks``."""
        return self.tasks

    def bind(self, labels: Sequence[int] | np.ndarray | Tensor, spec: EpisodeSpec, split: str = "train") -> None:
        """Attach the sampler to a split's labels and check that the requested episodes are possible.

        Args:
            labels: class id of every image of the split.
            spec: the episode shape.
            split: split name, for error messages.

        Raises:
            ValueError: if the split has fewer classes than ``n_way``, or a class has fewer images than
                ``k_shot + query_sets * query_shots``.
        """
        labels = np.asarray(labels.cpu() if isinstance(labels, Tensor) else labels, dtype=np.int64)
        num_classes = int(labels.max()) + 1 if labels.size else 0
        if spec.n_way > num_classes:
            raise ValueError(
                f"n_way={spec.n_way} but split '{split}' has only {num_classes} classes: "
                f"lower data.n_way to at most {num_classes} or use a split with more classes"
            )
        order = np.argsort(labels, kind="stable")
        counts = np.bincount(labels, minlength=num_classes)
        self._pools = np.split(order, np.cumsum(counts)[:-1])
        needed = spec.k_shot + self.query_sets * spec.query_shots
        short = np.flatnonzero(counts < needed)
        if short.size:
            raise ValueError(
                f"split '{split}': {short.size} of {num_classes} classes have fewer than {needed} images "
                f"(k_shot={spec.k_shot} + query_sets={self.query_sets} x query_shots={spec.query_shots}); "
                f"class {int(short[0])} has {int(counts[short[0]])}. Lower k_shot, query_shots or query_sets."
            )
        self.spec = spec

    def draw_classes(self, rng: np.random.Generator, step: int) -> np.ndarray:
        """The ``n_way`` dataset classes of one task, uniformly without replacement."""
        assert self.spec is not None
        return rng.choice(len(self._pools), size=self.spec.n_way, replace=False)

    def sample(self, rng: np.random.Generator, step: int) -> EpisodeIndices:
        """Draw the candidate tasks of one step.

        Args:
            rng: the step's generator (derived from seed, rank and step by the data module); use only
                this generator, so that the stream is reproducible and resumable.
            step: the global step the tasks are for (for evaluation: the task number).

        Returns:
            EpisodeIndices with ``num_candidates`` tasks of ``query_sets`` query sets each.
        """
        if self.spec is None:
            raise RuntimeError(f"{type(self).__name__}.bind(labels, spec) must be called before sample()")
        spec, num_tasks, num_sets = self.spec, self.num_candidates, self.query_sets
        per_set = spec.n_way * spec.query_shots
        classes = np.empty((num_tasks, spec.n_way), dtype=np.int64)
        support = np.empty((num_tasks, spec.n_way * spec.k_shot), dtype=np.int64)
        support_labels = np.empty_like(support)
        query = np.empty((num_tasks, num_sets, per_set), dtype=np.int64)
        query_labels = np.empty_like(query)
        way_support = np.repeat(np.arange(spec.n_way), spec.k_shot)
        way_query = np.repeat(np.arange(spec.n_way), spec.query_shots)
        for t in range(num_tasks):
            classes[t] = self.draw_classes(rng, step)
            picks = np.stack(
                [
                    rng.choice(self._pools[c], size=spec.k_shot + num_sets * spec.query_shots, replace=False)
                    for c in classes[t]
                ]
            )  # (n_way, k_shot + Q * query_shots)
            order = rng.permutation(way_support.size)
            support[t] = picks[:, : spec.k_shot].reshape(-1)[order]
            support_labels[t] = way_support[order]
            for q in range(num_sets):
                start = spec.k_shot + q * spec.query_shots
                order = rng.permutation(per_set)
                query[t, q] = picks[:, start : start + spec.query_shots].reshape(-1)[order]
                query_labels[t, q] = way_query[order]
        return EpisodeIndices(classes, support, support_labels, query, query_labels)

    # --- choosing what to label (model side) ----------------------------------------------------------

    def score(self, evidence: Tensor, lam: float | Tensor, available: Tensor | None = None) -> Tensor:
        """What each candidate query set is worth labeling, higher first: what ``select`` receives.

        The default is the paper's task uncertainty ``lam * mean vacuity + (1 - lam) * mean dissonance``
        (``acquisition.units_score``). Called without gradients, on the evidence of unlabeled queries only; in a
        training step that replays as a CUDA graph it is captured too, so it must not read the device.

        Args:
            evidence: (T, Q, M, N) evidence of the M queries of every candidate set after adaptation.
            lam: the task-uncertainty weight of vacuity at this step (a float, or a 0-d tensor in a captured step).
            available: (T, Q) bool, the candidates that exist (``select`` pads tasks with fewer); None: all. Scores
                of unavailable candidates are ignored.

        Returns:
            (T, Q) scores.
        """
        return units_score(evidence, lam)

    def priority(self, scores: Tensor, step: int) -> Tensor:
        """The order in which ``units-lightning select`` puts the sets that ``select`` chose (highest first) before
        cutting to its batch size. Default: the scores."""
        return scores

    def warming_up(self, step: int) -> bool:
        """True before ``warmup_steps``: no selection yet."""
        return step < self.warmup_steps

    def needs_scores(self, step: int) -> bool:
        """Whether ``select`` at ``step`` looks at the scores (if not, the model skips the scoring pass)."""
        return self.uses_scores and not self.warming_up(step)

    def select(self, scores: Tensor, step: int) -> Tensor:
        """Mask of the query sets to label at ``step``.

        Args:
            scores: (T, Q) task uncertainty of every candidate query set (higher = more informative);
                all zeros when ``needs_scores(step)`` is False.
            step: the global step.

        Returns:
            (T, Q) bool mask.
        """
        if self.warming_up(step):
            return self.warmup_choice(scores)
        return self.choose(scores)

    def chosen_count(self, step: int) -> int | None:
        """How many query sets ``select`` chooses at ``step``, when that is known without the scores; None if not.

        Override it together with ``choose`` (or ``select``) when the count is fixed: the model then checks it on
        the device, and a mask of another size stops training at the next logging step with an error naming the
        sampler. The base class returns None (its ``choose`` keeps every set of however many tasks were drawn).
        """
        return None

    def warmup_choice(self, scores: Tensor) -> Tensor:
        """The first query set of the first ``tasks`` tasks."""
        mask = torch.zeros_like(scores, dtype=torch.bool)
        mask[: self.tasks, 0] = True
        return mask

    def choose(self, scores: Tensor) -> Tensor:
        """The selection rule after warm-up. Subclasses override; the base class keeps every set."""
        return torch.ones_like(scores, dtype=torch.bool)

    def __repr__(self) -> str:
        fields = f"tasks={self.tasks}, query_sets={self.query_sets}, warmup_steps={self.warmup_steps}"
        extra = self._repr_fields()
        return f"{type(self).__name__}({fields}{', ' + extra if extra else ''})"

    def _repr_fields(self) -> str:
        """A subclass's own constructor arguments, as ``__repr__`` shows them after the shared ones."""
        return ""
