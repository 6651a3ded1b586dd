"""``UnitsMAML``: MAML with evidential beliefs and uncertainty-aware task selection (Units-ML)."""

from __future__ import annotations

from functools import partial
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from units_lightning.backbones import ConvNet
from units_lightning.belief import (
    TaskBeliefs,
    belief,
    dissonance,
    expected_probability,
    query_beliefs,
    task_beliefs,
    task_uncertainty,
    vacuity,
)
from units_lightning.data.episode import TaskBatch
from units_lightning.engines.learn2learn import Learn2LearnEngine
from units_lightning.ledger import LabelLedger
from units_lightning.losses import EvidentialLoss, MetaLoss
from units_lightning.samplers.base import TaskSampler
from units_lightning.schedules import LinearAnneal, LinearWarmup, Schedule

__all__ = ["UnitsMAML"]


class UnitsMAML(pl.LightningModule):
    """Model-agnostic meta-learning with evidential beliefs and uncertainty-aware task selection.

    Each training step follows the paper's Algorithm 1: adapt to every support set, score every
    candidate query set by its task uncertainty ``lambda * vacuity + (1 - lambda) * dissonance`` (no
    labels, no gradients), let the task sampler choose, reveal the labels of the chosen query sets
    only, and meta-update on their loss. Validation and test adapt with gradients enabled whatever the
    trainer's inference mode.

    With ``CrossEntropyLoss`` and ``RandomSampler`` this is plain MAML; with ``EvidentialLoss`` and
    ``RandomSampler`` it is Units-NTS; with ``MultiQuerySampler`` it is Units-ML.

    Args:
        n_way: classes per task (the backbone's outputs); linked from the data module by the CLI.
        image_shape: (C, H, W) of the images; linked from the data module by the CLI.
        filters: channels of the default 4-conv backbone.
        backbone: a network to use instead of the default ``ConvNet``.
        loss: per-task loss for inner and outer loop (default ``EvidentialLoss()``).
        inner_lr: inner-loop learning rate.
        inner_steps: inner-loop gradient steps in training.
        eval_inner_steps: inner-loop steps in validation and test (default: ``inner_steps``).
        first_order: drop second-order terms of the meta-gradient (default: second order).
        lr: Adam learning rate of the outer loop.
        lam: schedule of lambda, the weight of vacuity in the task score (default 0.99 -> 0.5 in 50 epochs).
        eta: schedule of the incorrect-belief regulariser weight (default ``min(2, 0.2 E)``).
        schedule_steps_per_epoch: count a schedule epoch every this many steps instead of using the
            trainer's epoch (the paper's label-budget setting uses 100).
        sampler: the task sampler, only for training without an ``EpisodicDataModule``; by default the
            data module's sampler, which both draws the candidate tasks and chooses among them.
        label_budget: stop training once this many query sets have been labeled (the paper: 10,000).
    """

    def __init__(
        self,
        n_way: int = 5,
        image_shape: tuple[int, int, int] = (1, 28, 28),
        filters: int = 64,
        backbone: nn.Module | None = None,
        loss: MetaLoss | None = None,
        inner_lr: float = 0.1,
        inner_steps: int = 5,
        eval_inner_steps: int | None = None,
        first_order: bool = False,
        lr: float = 1e-3,
        lam: Schedule | None = None,
        eta: Schedule | None = None,
        schedule_steps_per_epoch: int | None = None,
        sampler: TaskSampler | None = None,
        label_budget: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone", "sampler"])
        if inner_steps < 0 or (eval_inner_steps is not None and eval_inner_steps < 0):
            raise ValueError("inner_steps and eval_inner_steps must be >= 0")
        backbone = backbone if backbone is not None else ConvNet(tuple(image_shape), n_way, filters)
        self.engine = Learn2LearnEngine(backbone, inner_lr=inner_lr)
        self.loss = loss if loss is not None else EvidentialLoss()
        self.lam = lam if lam is not None else LinearAnneal(0.99, 0.5, 50)
        self.eta = eta if eta is not None else LinearWarmup(2.0, 10)
        self.sampler = sampler
        self.ledger = LabelLedger(label_budget)
        self.n_way = n_way
        self.inner_steps = inner_steps
        self.eval_inner_steps = inner_steps if eval_inner_steps is None else eval_inner_steps
        self.first_order = first_order
        self.lr = lr
        self.schedule_steps_per_epoch = schedule_steps_per_epoch

    # --- wiring ---------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        data_sampler = getattr(datamodule, "sampler", None)
        if data_sampler is not None and self.sampler is not None and self.sampler is not data_sampler:
            raise ValueError(
                "the model and the data module hold different task samplers: the sampler that draws "
                "the tasks must also choose among them, so give it to the data module only"
            )
        if self.sampler is None and stage == "fit":
            self.sampler = data_sampler
            if self.sampler is None:
                raise ValueError("UnitsMAML needs a task sampler: pass sampler=... or train with an EpisodicDataModule")
        if self.trainer.world_size > 1:
            self.ledger.reduce = partial(self.trainer.strategy.reduce, reduce_op="sum")
        data_way = getattr(datamodule, "n_way", self.n_way)
        if data_way != self.n_way:
            raise ValueError(f"model.n_way={self.n_way} but data.n_way={data_way}: set both to the same number")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    @property
    def schedule_epoch(self) -> float:
        """The epoch count E the schedules see (from 0)."""
        if self.schedule_steps_per_epoch:
            return self.global_step / self.schedule_steps_per_epoch
        return float(self.current_epoch)

    # --- Algorithm 1 ----------------------------------------------------------------------------------

    def training_step(self, batch: TaskBatch, batch_idx: int) -> dict[str, Any]:
        """One meta-update (Algorithm 1).

        Returns:
            dict for callbacks (``on_train_batch_end`` outputs): ``loss``; (T, Q) ``scores`` (task uncertainty
            of every candidate query set, zeros while the sampler does not use them), ``chosen`` (bool) and
            ``scored`` (bool: whether the sampler used the scores); (K, M) ``vacuity``, ``dissonance``,
            ``incorrect_belief`` and ``correct`` of the K labeled query sets' queries; floats ``lam`` and ``eta``.
        """
        lam, eta = self.lam(self.schedule_epoch), self.eta(self.schedule_epoch)
        adapted = self.engine.adapt(
            batch.support_x,
            batch.support_y,
            partial(self.loss, eta=eta),
            self.inner_steps,
            create_graph=not self.first_order,
        )
        scored = self.sampler.needs_scores(self.global_step)
        scores = self.score_query_sets(adapted, batch.query_x, lam)
        chosen = self.sampler.select(scores, self.global_step)
        labels = self.ledger.reveal(batch, chosen)
        task_index, set_index = chosen.nonzero(as_tuple=True)
        logits = self.engine.predict(adapted, batch.query_x[task_index, set_index], task_index)
        loss = self.loss(logits, labels, eta)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite meta-loss ({loss.item()}) at step {self.global_step}: lower model.lr, model.inner_lr "
                f"or the eta peak; checkpoints already written are intact (label ledger: {self.ledger})"
            )
        queries = self._log_training(loss, logits.detach(), labels, scores, chosen, lam)
        return {
            "loss": loss,
            "scores": scores.detach(),
            "chosen": chosen,
            "scored": scored,
            "vacuity": queries.vacuity,
            "dissonance": queries.dissonance,
            "incorrect_belief": queries.incorrect,
            "correct": logits.detach().argmax(-1) == labels,
            "lam": lam,
            "eta": eta,
        }

    @torch.no_grad()
    def score_query_sets(self, adapted: Any, query_x: Tensor, lam: float) -> Tensor:
        """Task uncertainty of every candidate query set, (T, Q); zeros when the sampler will not use them."""
        num_tasks, num_sets = query_x.shape[:2]
        if not self.sampler.needs_scores(self.global_step):
            return query_x.new_zeros(num_tasks, num_sets)
        task_index = torch.arange(num_tasks, device=query_x.device).repeat_interleave(num_sets)
        logits = self.engine.predict(adapted, query_x.flatten(0, 1), task_index)
        beliefs = task_beliefs(self.loss.evidence(logits))
        return task_uncertainty(beliefs.vacuity, beliefs.dissonance, lam).view(num_tasks, num_sets)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.ledger.exhausted:
            self.trainer.should_stop = True

    # --- evaluation -----------------------------------------------------------------------------------

    def validation_step(self, batch: TaskBatch, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluate(batch, "val")

    def test_step(self, batch: TaskBatch, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluate(batch, "test")

    def predict_step(self, batch: TaskBatch, batch_idx: int) -> dict[str, Tensor]:
        """Adapt to each task's support set and describe every query of its first query set, without labels.

        Returns:
            dict of (T, M) ``prediction`` (class position), ``vacuity``, ``dissonance``; (T, M, N)
            ``probability`` (expected Dirichlet probabilities); (T, N) ``classes`` (dataset class ids).
        """
        logits = self.adapt_and_predict(batch.support_x, batch.support_y, batch.query_x[:, 0])
        evidence = self.loss.evidence(logits)
        return {
            "prediction": logits.argmax(-1),
            "probability": expected_probability(evidence),
            "vacuity": vacuity(evidence),
            "dissonance": dissonance(belief(evidence)),
            "classes": batch.classes,
        }

    def adapt_and_predict(self, support_x: Tensor, support_y: Tensor, query_x: Tensor) -> Tensor:
        """Adapt to each support set and return logits of its query set, gradients on in any mode.

        Args:
            support_x: (T, S, C, H, W); support_y: (T, S); query_x: (T, M, C, H, W).

        Returns:
            (T, M, N) logits, detached.
        """
        eta = self.eta(self.schedule_epoch)
        with torch.inference_mode(False), torch.enable_grad():
            # Tensors made under inference mode cannot enter autograd: copy them out of it.
            support_x, support_y, query_x = support_x.clone(), support_y.clone(), query_x.clone()
            adapted = self.engine.adapt(
                support_x, support_y, partial(self.loss, eta=eta), self.eval_inner_steps, create_graph=False
            )
            task_index = torch.arange(query_x.shape[0], device=query_x.device)
            return self.engine.predict(adapted, query_x, task_index).detach()

    def _evaluate(self, batch: TaskBatch, stage: str) -> dict[str, Tensor]:
        """Adapt, predict the first query set of each task, log the means, return per-query values.

        Returns:
            dict for callbacks and metrics: ``loss``; (T, M, N) ``logits`` and ``probability`` (expected
            Dirichlet probabilities); (T, M) ``labels``, ``vacuity``, ``dissonance``, ``incorrect_belief``,
            ``correct_belief`` and ``correct`` (bool).
        """
        logits = self.adapt_and_predict(batch.support_x, batch.support_y, batch.query_x[:, 0])
        labels = LabelLedger.evaluation_labels(batch)[:, 0]
        loss = self.loss(logits, labels, self.eta(self.schedule_epoch))
        evidence = self.loss.evidence(logits)
        queries = query_beliefs(evidence, labels)
        correct = logits.argmax(-1) == labels
        values = {
            "loss": loss,
            "acc": correct.float().mean(),
            "vacuity": queries.vacuity.mean(),
            "dissonance": queries.dissonance.mean(),
            "incorrect_belief": queries.incorrect.mean(),
            "correct_belief": queries.correct.mean(),
        }
        self.log(
            f"{stage}/acc", values.pop("acc"), on_epoch=True, prog_bar=True, batch_size=batch.num_tasks, sync_dist=True
        )
        self.log_dict(
            {f"{stage}/{k}": v for k, v in values.items()}, on_epoch=True, batch_size=batch.num_tasks, sync_dist=True
        )
        return {
            "loss": loss,
            "logits": logits,
            "probability": expected_probability(evidence),
            "labels": labels,
            "vacuity": queries.vacuity,
            "dissonance": queries.dissonance,
            "incorrect_belief": queries.incorrect,
            "correct_belief": queries.correct,
            "correct": correct,
        }

    # --- logging and checkpoints ----------------------------------------------------------------------

    def _log_training(
        self, loss: Tensor, logits: Tensor, labels: Tensor, scores: Tensor, chosen: Tensor, lam: float
    ) -> TaskBeliefs:
        """Log the step's means; return the per-query beliefs of the labeled query sets."""
        queries = query_beliefs(self.loss.evidence(logits), labels)
        beliefs = TaskBeliefs(*(x.mean(dim=-1) for x in queries))
        num_chosen = int(chosen.sum())
        values = {
            "train/loss": loss.detach(),
            "train/acc": (logits.argmax(-1) == labels).float().mean(),
            "train/vacuity": beliefs.vacuity.mean(),
            "train/dissonance": beliefs.dissonance.mean(),
            "train/incorrect_belief": beliefs.incorrect.mean(),
            "train/correct_belief": beliefs.correct.mean(),
            "selection/uncertainty_chosen": task_uncertainty(beliefs.vacuity, beliefs.dissonance, lam).mean(),
        }
        if self.sampler.needs_scores(self.global_step) and not bool(chosen.all()):
            values["selection/uncertainty_rejected"] = scores[~chosen].mean()
        self.log(
            "train/acc", values.pop("train/acc"), on_step=True, on_epoch=True, prog_bar=True, batch_size=num_chosen
        )
        self.log_dict(values, on_step=True, on_epoch=True, batch_size=num_chosen)
        self.log_dict(
            {
                "labels/query_sets": float(self.ledger.query_sets),
                "labels/query_images": float(self.ledger.query_images),
                "labels/support_images": float(self.ledger.support_images),
            },
            on_step=True,
            on_epoch=False,
        )
        return queries

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["label_ledger"] = self.ledger.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "label_ledger" in checkpoint:
            self.ledger.load_state_dict(checkpoint["label_ledger"])
