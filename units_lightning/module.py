"""``UnitsMAML``: MAML with evidential beliefs and uncertainty-aware task selection (Units-ML)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from functools import partial
from typing import Any, Literal

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
from units_lightning.engines import BatchedEngine, InnerLRMode, Learn2LearnEngine
from units_lightning.evaluation.ensemble import CheckpointEnsemble, load_engines
from units_lightning.evaluation.shifts import QueryShift, default_shifts
from units_lightning.ledger import LabelLedger
from units_lightning.losses import EvidentialLoss, MetaLoss
from units_lightning.metrics import ShiftMetrics, UncertaintyMetrics
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
        inner_lr: inner-loop learning rate (the initial one when learned).
        inner_lr_mode: "fixed" (MAML), "per_layer_per_step" (learned per layer and step: MAML++, the
            paper's setup) or "per_parameter" (Meta-SGD, the paper's UA-MetaSGD).
        per_step_bn: one pair of batch-norm weights per inner step, meta-learned only (MAML++, the
            paper's setup); the default backbone only.
        engine: "batched" (every task at once with torch.func), "learn2learn" (one task at a time, the
            reference) or "auto" (batched). Both compute the same meta-gradients (tests/engines).
        chunk_size: tasks the batched engine vectorises at once (None: all); bounds evaluation memory.
        capture: speed-up of the batched engine's training steps: "auto" (CUDA graphs on a single GPU, else
            none), "none", "cuda_graph" (replay the inner loop as CUDA graphs: the same kernels, up to 5x
            faster on a GPU) or "compile" (experimental); see ``BatchedEngine`` and docs/PERFORMANCE.md.
        compile_scoring: compile the batched engine's scoring of candidate query sets (a forward pass
            without gradient) with ``torch.compile``: "auto" (on CUDA; falls back to eager with one warning
            where compiling fails), True or False. About twice as fast on large query sets.
        score_precision: "float32" or "bfloat16" (autocast on CUDA) for scoring candidate query sets: a
            cheaper selection pass when query sets are large; it may reorder near-tied candidates.
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
        metrics: the evaluation metrics of validation and test (default ``UncertaintyMetrics()``: vacuity
            thresholds 0.1 and 0.2, coverages 100/70/60/50%, 15 calibration bins).
        query_shifts: out-of-distribution probes run by ``test`` on every test task (default: rotations 0-180
            degrees and scales 0.5-1.5; ``[]`` for none); see ``units_lightning.evaluation``.
        ensemble: checkpoints whose adapted predictions are averaged in test, validate and predict instead of
            this model's own weights (the paper's top-k validation checkpoints).
    """

    def __init__(
        self,
        n_way: int = 5,
        image_shape: tuple[int, int, int] = (1, 28, 28),
        filters: int = 64,
        backbone: nn.Module | None = None,
        loss: MetaLoss | None = None,
        inner_lr: float = 0.1,
        inner_lr_mode: InnerLRMode = "fixed",
        per_step_bn: bool = False,
        engine: Literal["auto", "batched", "learn2learn"] = "auto",
        chunk_size: int | None = None,
        capture: Literal["auto", "none", "cuda_graph", "compile"] = "auto",
        compile_scoring: bool | Literal["auto"] = "auto",
        score_precision: Literal["float32", "bfloat16"] = "float32",
        inner_steps: int = 5,
        eval_inner_steps: int | None = None,
        first_order: bool = False,
        lr: float = 1e-3,
        lam: Schedule | None = None,
        eta: Schedule | None = None,
        schedule_steps_per_epoch: int | None = None,
        sampler: TaskSampler | None = None,
        label_budget: int | None = None,
        metrics: UncertaintyMetrics | None = None,
        query_shifts: list[QueryShift] | None = None,
        ensemble: CheckpointEnsemble | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone", "sampler", "metrics", "query_shifts", "ensemble"])
        if inner_steps < 0 or (eval_inner_steps is not None and eval_inner_steps < 0):
            raise ValueError("inner_steps and eval_inner_steps must be >= 0")
        eval_steps = inner_steps if eval_inner_steps is None else eval_inner_steps
        if backbone is None:
            bn_steps = max(inner_steps, eval_steps) + 1 if per_step_bn else 1
            backbone = ConvNet(tuple(image_shape), n_way, filters, bn_steps=bn_steps)
        elif per_step_bn:
            raise ValueError("per_step_bn builds the default ConvNet; give your own backbone per-step weights instead")
        if engine not in ("auto", "batched", "learn2learn"):
            raise ValueError(f"engine must be 'auto', 'batched' or 'learn2learn', got {engine!r}")
        if engine == "learn2learn":
            if capture not in ("auto", "none"):
                raise ValueError(f"capture={capture!r} applies to the batched engine: set model.engine=batched")
            self.engine = Learn2LearnEngine(backbone, inner_lr, inner_lr_mode, inner_steps)
        else:
            self.engine = BatchedEngine(
                backbone, inner_lr, inner_lr_mode, inner_steps, chunk_size, capture, compile_scoring=compile_scoring
            )
        self.loss = loss if loss is not None else EvidentialLoss()
        self.lam = lam if lam is not None else LinearAnneal(0.99, 0.5, 50)
        self.eta = eta if eta is not None else LinearWarmup(2.0, 10)
        self.sampler = sampler
        self.ledger = LabelLedger(label_budget)
        self.n_way = n_way
        self.inner_steps = inner_steps
        self.eval_inner_steps = eval_steps
        self.first_order = first_order
        self.lr = lr
        self.schedule_steps_per_epoch = schedule_steps_per_epoch
        if score_precision not in ("float32", "bfloat16"):
            raise ValueError(f"score_precision must be 'float32' or 'bfloat16', got {score_precision!r}")
        self.score_precision = score_precision
        # The inner loop reads eta from this buffer: one loss object and one storage for the whole run, so that
        # captured or compiled inner loops see each step's value without being rebuilt.
        self.register_buffer("inner_eta", torch.zeros(()), persistent=False)
        self._inner_loss = _InnerLoss(self)
        metrics = metrics if metrics is not None else UncertaintyMetrics()
        self.val_metrics, self.test_metrics = metrics, copy.deepcopy(metrics)
        self.query_shifts = default_shifts() if query_shifts is None else list(query_shifts)
        self.shift_metrics = nn.ModuleList(ShiftMetrics() for shift in self.query_shifts for _ in shift.levels)
        self.ensemble = ensemble
        self.ensemble_members: list[Any] = []  # plain list: members are not part of this model's state_dict
        self._ensemble_ranking: list[Any] = []
        self.test_results: dict[str, Any] | None = None

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
        if self.ensemble is not None and stage != "fit" and not self.ensemble_members:
            self.load_ensemble()
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
        self.inner_eta.fill_(eta)
        adapted = self.engine.adapt(
            batch.support_x,
            batch.support_y,
            self._inner_loss,
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
        low_precision = self.score_precision == "bfloat16" and query_x.is_cuda
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=low_precision):
            logits = self.engine.predict_sets(adapted, query_x)
        beliefs = task_beliefs(self.loss.evidence(logits.to(query_x.dtype)))
        return task_uncertainty(beliefs.vacuity, beliefs.dissonance, lam)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.ledger.exhausted:
            self.trainer.should_stop = True

    # --- evaluation -----------------------------------------------------------------------------------

    def validation_step(self, batch: TaskBatch, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluate(batch, "val")

    def test_step(self, batch: TaskBatch, batch_idx: int) -> dict[str, Any]:
        """Evaluate the test tasks and, from the same adapted models, every shifted query set.

        Returns:
            what ``_evaluate`` returns, plus ``shifted``: ``{level name: (T, M) vacuity}``.
        """
        clean = batch.query_x[:, 0]
        seed = int(getattr(getattr(self.trainer, "datamodule", None), "seed", 0))
        levels, queries = [], []
        for shift_index, shift in enumerate(self.query_shifts):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + batch_idx * 101 + shift_index)
            for level in shift.levels:
                levels.append((shift, level))
                queries.append(None if shift.is_identity(level) else shift.shift(clean, level, generator))
        outputs = self._evaluate(batch, "test", [q for q in queries if q is not None])
        shifted_logits = iter(outputs.pop("extra_logits", []))
        outputs["shifted"] = {}
        for (shift, level), query, metrics in zip(levels, queries, self.shift_metrics, strict=True):
            logits = outputs["logits"] if query is None else next(shifted_logits)
            evidence = self.loss.evidence(logits)
            vac = vacuity(evidence)
            correct = logits.argmax(-1) == outputs["labels"] if shift.keeps_labels else None
            metrics.update(outputs["vacuity"], vac, correct)
            outputs["shifted"][shift.name(level)] = vac
        return outputs

    def on_validation_epoch_end(self) -> None:
        if self.val_metrics.num_tasks() > 0:
            results = self.val_metrics.compute()
            self.log_dict({f"val/{k}": v for k, v in self.val_metrics.scalars(results).items()})
        self.val_metrics.reset()

    def on_test_epoch_end(self) -> None:
        """Compute the test report into ``test_results`` (for ``results.json``) and log its single numbers."""
        if self.test_metrics.num_tasks() == 0:
            return
        results = self.test_metrics.compute()
        scalars = {f"test/{k}": v for k, v in self.test_metrics.scalars(results).items()}
        shifts: dict[str, list[dict[str, Any]]] = {}
        metrics = iter(self.shift_metrics)
        for shift in self.query_shifts:
            for level in shift.levels:
                row = {"level": level, "name": shift.name(level), **next(metrics).compute()}
                shifts.setdefault(shift.kind, []).append(row)
                for key, value in (("acc", row["accuracy"]), ("vacuity", row["vacuity"])):
                    if value is not None and value["mean"] is not None:
                        scalars[f"test/ood/{row['name']}/{key}"] = value["mean"]
                if row["auroc"] is not None:
                    scalars[f"test/ood/{row['name']}/auroc"] = row["auroc"]
        results["ood"] = shifts
        if self.ensemble_members:
            results["ensemble"] = [
                {"path": str(m.path), "score": m.score, "step": m.step} for m in self._ensemble_ranking
            ]
        self.test_results = results
        self.log_dict(scalars)
        self.test_metrics.reset()
        for metric in self.shift_metrics:
            metric.reset()

    def load_ensemble(self) -> None:
        """Load the members of ``ensemble`` (each a copy of this model's engine with a checkpoint's weights)."""
        ranked = self.ensemble.rank()
        self._ensemble_ranking = [member for member, _ in ranked]
        self.ensemble_members = load_engines(self.engine, [checkpoint for _, checkpoint in ranked])

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
        return self.adapt_and_predict_sets(support_x, support_y, [query_x])[0]

    def adapt_and_predict_sets(
        self, support_x: Tensor, support_y: Tensor, query_sets: Sequence[Tensor]
    ) -> list[Tensor]:
        """Adapt once to each support set, then predict several query sets of each task, one pass per set.

        With an ensemble loaded, every member adapts on its own and the members' logits are averaged.

        Args:
            support_x: (T, S, C, H, W); support_y: (T, S); query_sets: tensors of shape (T, M_i, C, H, W).

        Returns:
            one (T, M_i, N) logits tensor per query set, detached.
        """
        engines = [member.to(self.device) for member in self.ensemble_members] or [self.engine]
        total: list[Tensor] = []
        with torch.inference_mode(False), torch.enable_grad():
            # Tensors made under inference mode cannot enter autograd: copy them out of it.
            support_x, support_y = support_x.clone(), support_y.clone()
            self.inner_eta.fill_(self.eta(self.schedule_epoch))
            # Sets of one shape go through the engine together (each set is still normalised on its own).
            stacked = torch.stack(list(query_sets), dim=1) if len({q.shape for q in query_sets}) == 1 else None
            for engine in engines:
                adapted = engine.adapt(
                    support_x, support_y, self._inner_loss, self.eval_inner_steps, create_graph=False
                )
                if stacked is not None:
                    logits = list(engine.predict_sets(adapted, stacked).detach().unbind(1))
                else:
                    logits = [engine.predict_sets(adapted, q.clone().unsqueeze(1))[:, 0].detach() for q in query_sets]
                total = logits if not total else [a + b for a, b in zip(total, logits, strict=True)]
        return [t / len(engines) for t in total]

    def _evaluate(self, batch: TaskBatch, stage: str, extra_queries: Sequence[Tensor] = ()) -> dict[str, Any]:
        """Adapt, predict the first query set of each task, log the means, update the stage's metrics.

        Args:
            batch: the evaluation tasks.
            stage: "val" or "test".
            extra_queries: more (T, M, C, H, W) query sets to predict from the same adapted models.

        Returns:
            dict for callbacks and metrics: ``loss``; (T, M, N) ``logits`` and ``probability`` (expected
            Dirichlet probabilities); (T, M) ``labels``, ``vacuity``, ``dissonance``, ``incorrect_belief``,
            ``correct_belief`` and ``correct`` (bool); with ``extra_queries``, ``extra_logits``: their logits.
        """
        logits, *extra_logits = self.adapt_and_predict_sets(
            batch.support_x, batch.support_y, [batch.query_x[:, 0], *extra_queries]
        )
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
        outputs = {
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
        (self.val_metrics if stage == "val" else self.test_metrics).update(outputs)
        if extra_queries:
            outputs["extra_logits"] = extra_logits
        return outputs

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


class _InnerLoss:
    """``loss(logits, labels)`` of the inner loop, with eta read from ``module.inner_eta``."""

    def __init__(self, module: UnitsMAML):
        self._module = [module]  # a list, so that the module does not register itself as its own child

    def __call__(self, logits: Tensor, labels: Tensor) -> Tensor:
        module = self._module[0]
        return module.loss(logits, labels, module.inner_eta.to(logits.dtype))
