"""``EpisodicEvaluation``: one evaluation path (adapt, then predict the query sets) for validate, test and predict,
the LightningModule that ``UnitsMAML`` extends with Algorithm 1's training step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from units_lightning import keys
from units_lightning.belief import belief, dissonance, expected_probability, query_beliefs, vacuity
from units_lightning.collectives import log_equal_on_every_rank
from units_lightning.engines import EnsembleEngine, adapt_and_predict_sets
from units_lightning.episode import TaskBatch
from units_lightning.evaluation.ensemble import CheckpointEnsemble, load_engines
from units_lightning.evaluation.probes import ShiftProbes
from units_lightning.ledger import LabelLedger
from units_lightning.losses import MetaLoss, ScheduledInnerLoss, class_balanced_copy
from units_lightning.metrics import UncertaintyMetrics
from units_lightning.outputs import EvalStepOutput, PredictStepOutput, TestStepOutput
from units_lightning.schedules import Schedule

__all__ = ["EpisodicEvaluation"]


class EpisodicEvaluation(pl.LightningModule):
    """Validation, test and predict of a meta-learner: adapt once to each support set with gradients on (whatever the
    trainer's inference mode), then predict one or more query sets of each task.

    The engine is the model's own, or an ``EnsembleEngine`` when ``ensemble`` is configured (its members adapt
    separately and their logits are averaged). Validation and test update the stage's ``UncertaintyMetrics`` and log
    their means at the epoch's end; test also predicts every out-of-distribution probe (``ShiftProbes``) from the same
    adapted models and puts the results into ``test_results`` (``ResultsWriter`` writes them).

    A subclass (``UnitsMAML``) sets the attributes declared below.
    """

    engine: nn.Module
    loss: MetaLoss
    inner_loss: ScheduledInnerLoss
    eta: Schedule
    eval_inner_steps: int
    val_metrics: UncertaintyMetrics
    test_metrics: UncertaintyMetrics
    probes: ShiftProbes
    ensemble: CheckpointEnsemble | None
    ensemble_engine: EnsembleEngine | None  # not a submodule: members are not this model's state
    ensemble_ranking: list[Any]
    test_results: dict[str, Any] | None
    schedule_steps_per_epoch: int | None

    @property
    def schedule_epoch(self) -> float:
        """The epoch count E the schedules see (from 0): the trainer's, or one every ``schedule_steps_per_epoch``."""
        if self.schedule_steps_per_epoch:
            return self.global_step / self.schedule_steps_per_epoch
        return float(self.current_epoch)

    def validation_step(self, batch: TaskBatch, batch_idx: int) -> EvalStepOutput:
        return self._evaluate(batch, "val")[0]

    def test_step(self, batch: TaskBatch, batch_idx: int) -> TestStepOutput:
        """Evaluate the test tasks and, from the same adapted models, every out-of-distribution probe."""
        seed = int(getattr(getattr(self.trainer, "datamodule", None), "seed", 0))
        outputs, shifted_logits = self._evaluate(
            batch, "test", self.probes.queries(batch.query_x[:, 0], seed, batch_idx)
        )
        shifted = self.probes.update(
            outputs["vacuity"], outputs["logits"], outputs["labels"], shifted_logits, self.loss.evidence
        )
        return TestStepOutput(**outputs, shifted=shifted)

    def predict_step(self, batch: TaskBatch, batch_idx: int) -> PredictStepOutput:
        """Adapt to each task's support set and describe every query of its first query set, without labels."""
        logits = self.adapt_and_predict(batch.support_x, batch.support_y, batch.query_x[:, 0])
        evidence = self.loss.evidence(logits)
        return PredictStepOutput(
            prediction=logits.argmax(-1),
            probability=expected_probability(evidence),
            vacuity=vacuity(evidence),
            dissonance=dissonance(belief(evidence)),
            classes=batch.classes,
        )

    def on_validation_epoch_end(self) -> None:
        if self.val_metrics.num_tasks() > 0:
            self._log_epoch(keys.VAL, self.val_metrics.scalars(self.val_metrics.compute()))
        self.val_metrics.reset()

    def on_test_epoch_end(self) -> None:
        """Compute the test results into ``test_results`` (``ResultsWriter`` writes them) and log their numbers."""
        if self.test_metrics.num_tasks() == 0:
            return
        results = self.test_metrics.compute()
        results["ood"] = self.probes.compute()
        if self.ensemble_engine is not None:
            results["ensemble"] = [
                {"path": str(m.path), "score": m.score, "step": m.step} for m in self.ensemble_ranking
            ]
        self.test_results = results
        self._log_epoch(keys.TEST, self.test_metrics.scalars(results))
        log_equal_on_every_rank(self, self.probes.scalars(results["ood"]))  # the probes' metrics are reduced
        self.test_metrics.reset()
        self.probes.reset()

    def load_ensemble(self) -> None:
        """Load the members of ``ensemble`` (copies of this model's engine with each checkpoint's weights)."""
        ranked = self.ensemble.rank()
        self.ensemble_ranking = [member for member, _ in ranked]
        checkpoints, sources = [checkpoint for _, checkpoint in ranked], [str(member.path) for member, _ in ranked]
        self.ensemble_engine = EnsembleEngine(load_engines(self.engine, checkpoints, sources=sources))

    def adapt_and_predict(self, support_x: Tensor, support_y: Tensor, query_x: Tensor) -> Tensor:
        """Adapt to each support set ((T, S, C, H, W), (T, S)) and return the (T, M, N) logits of its query set."""
        return self.adapt_and_predict_sets(support_x, support_y, [query_x])[0]

    def adapt_and_predict_sets(
        self, support_x: Tensor, support_y: Tensor, query_sets: Sequence[Tensor], class_balanced: bool = False
    ) -> list[Tensor]:
        """Adapt once to each support set, then predict several query sets of each task, gradients on in any mode.

        The ensemble's engine when one is loaded, else this model's (``engines.adapt_and_predict_sets``).

        Args:
            support_x: (T, S, C, H, W); support_y: (T, S); query_sets: tensors of shape (T, M_i, C, H, W).
            class_balanced: adapt with every class of a support set weighing the same (``class_balanced_copy`` of
                the loss; the model's loss is left as it is), for support sets with unequal classes.

        Returns:
            one (T, M_i, N) logits tensor per query set, detached.
        """
        engine = self.engine if self.ensemble_engine is None else self.ensemble_engine.to(self.device)
        with torch.inference_mode(False), torch.enable_grad():
            # Tensors made under inference mode cannot enter autograd: copy them out of it.
            support_x, support_y = support_x.clone(), support_y.clone()
            inner_loss = self._balanced_inner_loss() if class_balanced else self.inner_loss
            inner_loss.set_eta(self.eta(self.schedule_epoch))
            steps = self.eval_inner_steps
            return adapt_and_predict_sets(engine, support_x, support_y, query_sets, inner_loss, steps)

    def _balanced_inner_loss(self) -> ScheduledInnerLoss:
        """``inner_loss`` with every class weighing the same (``class_balanced_copy`` of ``loss``), made once per
        ``loss`` object: one object from call to call, so that evaluation's CUDA graphs, keyed by the inner loss and
        reading its eta buffer, are captured once. The copy is of the loss's options when first made: give the
        model a new loss object to change them. Call it outside inference mode (its buffer is written)."""
        made = self.__dict__.get("_balanced_inner")
        if made is None or made[0] is not self.loss:
            made = self.__dict__["_balanced_inner"] = (self.loss, ScheduledInnerLoss(class_balanced_copy(self.loss)))
        return made[1].to(self.device)

    def _evaluate(
        self, batch: TaskBatch, stage: str, extra_queries: Sequence[Tensor] = ()
    ) -> tuple[EvalStepOutput, list[Tensor]]:
        """Adapt, predict the first query set of each task (and ``extra_queries``), log, update the metrics.

        Returns:
            the step outputs of the first query sets, and the logits of ``extra_queries``.
        """
        logits, *extra_logits = self.adapt_and_predict_sets(
            batch.support_x, batch.support_y, [batch.query_x[:, 0], *extra_queries]
        )
        labels = LabelLedger.evaluation_labels(batch)[:, 0]
        loss = self.loss(logits, labels, self.eta(self.schedule_epoch))
        evidence = self.loss.evidence(logits)
        queries = query_beliefs(evidence, labels)
        correct = logits.argmax(-1) == labels
        outputs = EvalStepOutput(
            loss=loss,
            logits=logits,
            probability=expected_probability(evidence),
            labels=labels,
            vacuity=queries.vacuity,
            dissonance=queries.dissonance,
            incorrect_belief=queries.incorrect,
            correct_belief=queries.correct,
            correct=correct,
        )
        # Accuracy and beliefs reach the log from the epoch's metrics (``_log_epoch``): a ``self.log`` costs Lightning
        # host time per call. A float batch size: Lightning 2.6 averages an integer count over processes and floors
        # it, which inflates the mean when processes evaluate unequal numbers of tasks (#21859).
        self.log(
            keys.stage_key(stage, keys.LOSS), loss, batch_size=float(batch.num_tasks), on_epoch=True, sync_dist=True
        )
        (self.val_metrics if stage == "val" else self.test_metrics).update(outputs)
        return outputs, extra_logits

    def _log_epoch(self, stage: str, scalars: dict[str, float]) -> None:
        """Log an evaluation epoch's numbers (``UncertaintyMetrics.scalars``, means over every process's tasks, the same
        on each) under ``<stage>/``, the accuracy also on the progress bar."""
        named = {keys.stage_key(stage, k): v for k, v in scalars.items()}
        accuracy = keys.stage_key(stage, keys.ACC)
        log_equal_on_every_rank(self, {accuracy: named.pop(accuracy)}, prog_bar=True)
        log_equal_on_every_rank(self, named)
