"""``UnitsMAML``: MAML with evidential beliefs and uncertainty-aware task selection (Units-ML)."""

from __future__ import annotations

import copy
from functools import partial
from typing import Any, Literal

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from units_lightning import keys
from units_lightning.backbones import ConvNet
from units_lightning.belief import TaskBeliefs, query_beliefs, task_beliefs, task_uncertainty
from units_lightning.callbacks._shared import logging_step
from units_lightning.callbacks.csv_history import CSVHistory
from units_lightning.callbacks.label_budget import LabelBudget
from units_lightning.callbacks.non_finite import NonFiniteGuard
from units_lightning.callbacks.results_writer import ResultsWriter
from units_lightning.callbacks.sigterm import CheckpointOnSigterm
from units_lightning.callbacks.summary_writer import SummaryWriter
from units_lightning.collectives import log_equal_on_every_rank, weighted_means_over_ranks
from units_lightning.compile_cache import compiled_before, record_compiled, run_signature
from units_lightning.engines import EngineFactory, EngineName, InnerLRMode, build_engine
from units_lightning.engines.captured_step import COMPILE_MIN_STEPS, CapturedStep, MetaStep, auto_capture
from units_lightning.episode import TaskBatch
from units_lightning.evaluation.checkpoints import check_shapes
from units_lightning.evaluation.ensemble import CheckpointEnsemble
from units_lightning.evaluation.probes import ShiftProbes
from units_lightning.evaluation.shifts import QueryShift, default_shifts
from units_lightning.evaluation.steps import EpisodicEvaluation
from units_lightning.ledger import LabelLedger
from units_lightning.losses import EvidentialLoss, MetaLoss, ScheduledInnerLoss
from units_lightning.metrics import UncertaintyMetrics
from units_lightning.metrics.running_means import RunningMeans
from units_lightning.outputs import TrainStepOutput
from units_lightning.samplers import TaskSampler
from units_lightning.schedules import LinearAnneal, LinearWarmup, Schedule

# COMPILE_MIN_STEPS, auto_capture and MetaStep live in engines/captured_step.py; importable from here as before.
__all__ = ["COMPILE_MIN_STEPS", "MetaStep", "UnitsMAML", "auto_capture", "training_values"]

_NOT_COMPILED = frozenset({"lr", "lam", "eta", "schedule_steps_per_epoch", "label_budget", "capture", "non_finite"})
"""Hyperparameters that leave the compiled graphs as they are (the outer optimiser, schedules whose values reach the
step as tensors, the run's length and policies): ``compile_signature`` leaves them out."""


def training_values(
    loss: Tensor,
    correct: Tensor,
    queries: TaskBeliefs,
    scores: Tensor,
    chosen: Tensor,
    scored: bool,
    lam: float | Tensor,
) -> dict[str, Tensor]:
    """The means a training step logs, as 0-d tensors: loss, accuracy and beliefs of the labeled queries, and the
    task uncertainty of the chosen and (when scored) of the rejected query sets; ``correct``: (K, M) bool."""
    beliefs = TaskBeliefs(*(x.mean(dim=-1) for x in queries))
    num_chosen, num_sets = correct.shape[0], chosen.numel()
    values = {
        keys.stage_key(keys.TRAIN, keys.LOSS): loss.detach(),
        keys.stage_key(keys.TRAIN, keys.ACC): correct.float().mean(),
        **{keys.stage_key(keys.TRAIN, k): v.mean() for k, v in zip(keys.BELIEFS, beliefs, strict=True)},
        keys.selection_uncertainty("chosen"): task_uncertainty(beliefs.vacuity, beliefs.dissonance, lam).mean(),
    }
    if scored and num_chosen < num_sets:
        rejected = torch.where(chosen, torch.zeros_like(scores), scores).sum() / (num_sets - num_chosen)
        values[keys.selection_uncertainty("rejected")] = rejected
    return values


class UnitsMAML(EpisodicEvaluation):
    """Model-agnostic meta-learning with evidential beliefs and uncertainty-aware task selection.

    Each training step follows the paper's Algorithm 1: adapt to every support set, score every
    candidate query set by its task uncertainty ``lambda * vacuity + (1 - lambda) * dissonance`` (no
    labels, no gradients), let the task sampler choose, reveal the labels of the chosen query sets
    only, and meta-update on their loss. Validation, test and predict adapt with gradients enabled whatever the
    trainer's inference mode (``EpisodicEvaluation``).

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
        fold_first_norm: the default backbone's first convolution and batch norm computed as one convolution with the
            batch's statistics folded into its weights, from the moments of the images' 3x3 patches (``ConvNet``,
            ``backbones.conv3x3_batch_norm``): the same outputs and meta-gradients to rounding (float64,
            tests/engines/test_engines_agree.py), the same parameters, less work over the first layer's activations.
        explicit_conv_grads: the default backbone's convolutions differentiated at every order through their own data
            and weight gradients (``conv_grads``): eagerly (CUDA graphs, the CPU) as autograd Functions, compiled as a
            pass over Inductor's graph. In a second-order step under ``vmap`` the weights' second-order term is then a
            weight gradient, not an image-sized convolution a task (tests/test_conv_grads.py). The same meta-gradients
            to rounding.
        engine: "batched" (every task at once with torch.func), "learn2learn" (one task at a time, the
            reference) or "auto" (batched), which compute the same meta-gradients (tests/engines); or an engine
            class (``class_path`` in a config) that takes the backbone, configured by its own arguments (the
            options ``inner_lr`` to ``compile_options`` here configure the named engines).
        chunk_size: tasks the batched engine vectorises at once (None: all); bounds evaluation memory.
        capture: speed-up of the batched engine's training steps: "auto" (on CUDA: "compile" for a run of at
            least ``COMPILE_MIN_STEPS`` steps on one GPU, or of ``WARM_COMPILE_MIN_STEPS`` where a fit of the
            same ``compile_signature`` compiled on this machine before; else "cuda_graph", data-parallel training
            among them),
            "none", "cuda_graph" (the whole step replayed as CUDA graphs: the same kernels as eager, without the
            host's launch work; ``CapturedStep``) or "compile" (as "cuda_graph", with the inner loop and predictions
            of training compiled by ``torch.compile`` inside the graphs, vectorised over tasks on every device;
            evaluation stays uncompiled, as CUDA graphs; it falls back to "cuda_graph", after one warning, where
            compiling fails); see ``BatchedEngine``, and docs/PERFORMANCE.md for what each saves.
        compile_scoring: compile the batched engine's scoring of candidate query sets (a forward pass
            without gradient) with ``torch.compile``: "auto" (on CUDA in a run that compiles, see ``capture``;
            falls back to eager with one warning where compiling fails), True or False. It pays on large query
            sets, not in a short run that is over before its compiling pays back.
        compile_inner: under "compile", one graph for the whole inner loop ("loop") or one inner step called
            ``inner_steps`` times ("step": the same meta-gradients, several times less compiling, no fusion across
            the steps); see ``BatchedEngine``.
        compile_channels_last: under "compile", inductor's channels-last layout forced for the compiled graphs;
            with ``trainer.benchmark: true`` 1.16-1.18x faster steps on ``omniglot_20w1s`` (an H200), slower without
            it; see ``BatchedEngine``.
        compile_ahead: under "compile", keep each compiled function whole (its graphs and guards too) in the compile
            cache, so that a later run loads it instead of tracing it again (``torch.compile(...).aot_compile``,
            experimental in torch); see ``BatchedEngine``.
        compile_options: under "compile", Inductor options for every compiled function (``torch._inductor.config``
            names), e.g. ``{combo_kernels: true}``; see ``BatchedEngine``.
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
        sampler: the task sampler that chooses which query sets to label; needed by ``fit``. It must be the
            data module's sampler, which draws the candidate tasks (``UnitsMAML(sampler=data.sampler)``; the
            ``units-lightning`` command links ``data.sampler`` into it).
        label_budget: stop training once this many query sets have been labeled (the paper: 10,000). Never
            exceeded: the last step labels only what is left, the most uncertain of its chosen sets first; under
            data-parallel training what is left is split evenly by rank (``LabelLedger``). A budget smaller than
            one meta-batch (the sampler's ``tasks`` x processes) is refused before the first step.
        non_finite: what a step whose meta-loss or gradients are not finite does: "skip" (default) drops its
            gradients, so that neither the weights nor Adam's state change, counts it (``train/skipped_steps``,
            the ledger, the fit summary; its labels stay counted, once) and warns the first time; "stop" raises
            ``FloatingPointError`` naming the step. Checked once per optimizer step after backward (under
            ``16-mixed`` precision the GradScaler's overflow steps, which it skips anyway, count as skipped too).
        metrics: the evaluation metrics of validation and test (default ``UncertaintyMetrics()``: vacuity
            thresholds 0.1 and 0.2, coverages 100/70/60/50%, 15 calibration bins).
        query_shifts: out-of-distribution probes run by ``test`` on every test task (default: rotations 0-180
            degrees and scales 0.5-1.5; ``[]`` for none); see ``units_lightning.evaluation``.
        ensemble: checkpoints whose adapted predictions are averaged in test, validate and predict instead of
            this model's own weights (the paper's top-k validation checkpoints), through an ``EnsembleEngine``.
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
        fold_first_norm: bool = False,
        explicit_conv_grads: bool = False,
        engine: EngineName | EngineFactory = "auto",
        chunk_size: int | None = None,
        capture: Literal["auto", "none", "cuda_graph", "compile"] = "auto",
        compile_scoring: bool | Literal["auto"] = "auto",
        compile_inner: Literal["loop", "step"] = "loop",
        compile_channels_last: bool = False,
        compile_ahead: bool = False,
        compile_options: dict[str, Any] | None = None,
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
        non_finite: Literal["skip", "stop"] = "skip",
        metrics: UncertaintyMetrics | None = None,
        query_shifts: list[QueryShift] | None = None,
        ensemble: CheckpointEnsemble | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone", "sampler", "metrics", "query_shifts", "ensemble"])
        if inner_steps < 0 or (eval_inner_steps is not None and eval_inner_steps < 0):
            raise ValueError("inner_steps and eval_inner_steps must be >= 0")
        if score_precision not in ("float32", "bfloat16"):
            raise ValueError(f"score_precision must be 'float32' or 'bfloat16', got {score_precision!r}")
        eval_steps = inner_steps if eval_inner_steps is None else eval_inner_steps
        convnet_only = {
            "per_step_bn": per_step_bn,
            "fold_first_norm": fold_first_norm,
            "explicit_conv_grads": explicit_conv_grads,
        }
        if backbone is None:
            bn_steps = max(inner_steps, eval_steps) + 1 if per_step_bn else 1
            backbone = ConvNet(
                tuple(image_shape),
                n_way,
                filters,
                bn_steps=bn_steps,
                fold_first_norm=fold_first_norm,
                explicit_conv_grads=explicit_conv_grads,
            )
        elif any(convnet_only.values()):
            options = [name for name, on in convnet_only.items() if on]
            names, flags = " and ".join(f"model.{o}" for o in options), " ".join(f"--model.{o} false" for o in options)
            verb, them = ("shapes", "it") if len(options) == 1 else ("shape", "them")
            raise ValueError(
                f"{names} {verb} the default ConvNet, not a backbone of your own: give {flags} (the Omniglot configs "
                f"set all three) and build what you want of {them} into your backbone"
            )
        self.engine = build_engine(
            backbone,
            engine,
            inner_lr,
            inner_lr_mode,
            inner_steps,
            chunk_size,
            capture,
            compile_scoring,
            compile_inner,
            compile_channels_last,
            compile_ahead,
            compile_options,
        )
        self.loss = loss if loss is not None else EvidentialLoss()
        self.inner_loss = ScheduledInnerLoss(self.loss)
        self.lam = lam if lam is not None else LinearAnneal(0.99, 0.5, 50)
        self.eta = eta if eta is not None else LinearWarmup(2.0, 10)
        self.sampler = sampler
        self.ledger = LabelLedger(label_budget)
        self.train_means = RunningMeans()  # the training values' epoch means, on the device until logged
        self.non_finite = NonFiniteGuard(non_finite).mode  # checked here, applied by the guard
        self.n_way, self.inner_steps, self.eval_inner_steps = n_way, inner_steps, eval_steps
        self.first_order, self.lr, self.score_precision = first_order, lr, score_precision
        self.schedule_steps_per_epoch = schedule_steps_per_epoch
        metrics = metrics if metrics is not None else UncertaintyMetrics()
        self.val_metrics, self.test_metrics = metrics, copy.deepcopy(metrics)
        self.probes = ShiftProbes(default_shifts() if query_shifts is None else query_shifts)
        self.ensemble = ensemble
        self.ensemble_engine = None  # loaded by setup outside fit (``load_ensemble``)
        self.ensemble_ranking: list[Any] = []
        self.test_results: dict[str, Any] | None = None
        self.captured_step = CapturedStep(self.engine, reads=(self.inner_loss,))  # on CUDA: replays training steps
        self._signature: tuple[str, dict[str, Any]] | None = None  # compile_signature, taken when training starts
        self.compiles_once_warm = False  # this fit steps with CUDA graphs only because it never compiled here before

    # --- wiring ---------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        data_sampler = getattr(datamodule, "sampler", None)
        if stage == "fit" and self.sampler is None:
            raise ValueError(
                "UnitsMAML needs the task sampler to train: UnitsMAML(sampler=data.sampler), where data is the "
                "EpisodicDataModule (the units-lightning command passes data.sampler itself)"
            )
        if data_sampler is not None and self.sampler is not None and self.sampler is not data_sampler:
            raise ValueError(
                "the model and the data module hold different task samplers: the sampler that draws the tasks "
                "must also choose among them, so give the model the data module's: UnitsMAML(sampler=data.sampler)"
            )
        data_way = getattr(datamodule, "n_way", self.n_way)
        if data_way != self.n_way:
            raise ValueError(f"model.n_way={self.n_way} but data.n_way={data_way}: set both to the same number")
        if self.ensemble is not None and stage != "fit" and self.ensemble_engine is None:
            self.load_ensemble()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Adam; fused on CUDA: one kernel per step, and ``NonFiniteGuard`` skips a step on the device (no read)."""
        return torch.optim.Adam(self.parameters(), lr=self.lr, fused=self.device.type == "cuda" or None)

    def configure_callbacks(self) -> list[Callback]:
        """The ``NonFiniteGuard`` of ``non_finite``, ``CheckpointOnSigterm``, ``LabelBudget`` and, unless the trainer
        has its own, a ``ResultsWriter`` (``test`` writes ``results.json``), a ``SummaryWriter`` (``fit`` writes
        ``summary.json``) and a ``CSVHistory`` (a resumed fit keeps its CSV metrics): the same from Python as from
        the command line. Lightning replaces a trainer's callback by the model's of the same type, so a user's own
        writer is kept by not returning one."""
        given = [] if self._trainer is None else self._trainer.callbacks
        defaults = [c() for c in (ResultsWriter, SummaryWriter, CSVHistory) if not any(isinstance(t, c) for t in given)]
        return [NonFiniteGuard(self.non_finite), CheckpointOnSigterm(), *defaults, LabelBudget()]

    # --- Algorithm 1 ----------------------------------------------------------------------------------

    def training_step(self, batch: TaskBatch, batch_idx: int) -> TrainStepOutput:
        """One meta-update, the paper's Algorithm 1 (``_forward_pass``: adapt, score, select, reveal, loss); returns
        what the dashboard callbacks read (``TrainStepOutput``).

        On a GPU (``capture`` other than "none", the batched engine, a sampler that declares ``chosen_count``) the
        forward pass and its backward pass replay as CUDA graphs (``CapturedStep``); the last step of a label budget,
        which may label fewer sets, runs eagerly.
        """
        lam, eta = self.lam(self.schedule_epoch), self.eta(self.schedule_epoch)
        self.inner_loss.set_eta(eta)
        scored = self.sampler.needs_scores(self.global_step)
        count = self.sampler.chosen_count(self.global_step)  # known: no device read to gather the chosen sets
        variant = (self.sampler.warming_up(self.global_step), self.inner_steps, self.first_order)
        result = self.captured_step(self._forward_pass, batch, self.ledger, lam, eta, scored, count, variant)
        if result is None:
            result = self._forward_pass(batch, lam, eta, scored, count)
        self._log_training(result.values, num_chosen=result.labels.shape[0])
        return TrainStepOutput(
            loss=result.loss,
            scores=result.scores,
            chosen=result.chosen,
            scored=scored,
            vacuity=result.queries.vacuity,
            dissonance=result.queries.dissonance,
            incorrect_belief=result.queries.incorrect,
            correct=result.correct,
            lam=lam,
            eta=eta,
        )

    def _forward_pass(
        self,
        batch: TaskBatch,
        lam: float | Tensor,
        eta: float | Tensor,
        scored: bool,
        count: int | None,
        reveal: Any = None,
    ) -> MetaStep:
        """Algorithm 1's forward pass: adapt, score, select, reveal the chosen sets' labels, loss.

        ``reveal(chosen)`` opens the labels; by default the ledger's, which trims the choice to the label budget and
        counts it (the captured step opens them with ``LabelLedger.open_chosen`` and counts outside the graph).
        """
        adapted = self.engine.adapt(
            batch.support_x, batch.support_y, self.inner_loss, self.inner_steps, create_graph=not self.first_order
        )
        scores = (
            self.score_query_sets(adapted, batch.query_x, lam)
            if scored
            else batch.query_x.new_zeros(batch.query_x.shape[:2])
        )
        chosen = self.sampler.select(scores, self.global_step)
        if reveal is None:
            chosen = self.ledger.within_budget(chosen, priority=scores, count=count)  # the last step: what is left
            reveal = partial(self.ledger.reveal, batch, count=count)
        labels, task_index, set_index = reveal(chosen)
        logits = self.engine.predict(adapted, batch.query_x[task_index, set_index], task_index)
        loss = self.loss(logits, labels, eta)  # not applied if it or its gradients are not finite (non_finite)
        detached = logits.detach()
        queries = query_beliefs(self.loss.evidence(detached), labels)
        correct = detached.argmax(-1) == labels
        values = training_values(loss, correct, queries, scores, chosen, scored, lam)
        return MetaStep(loss, scores.detach(), chosen, labels, queries, correct, values)

    @torch.no_grad()
    def score_query_sets(self, adapted: Any, query_x: Tensor, lam: float) -> Tensor:
        """The sampler's score of every candidate query set, (T, Q), without labels or gradients (``TaskSampler.score``:
        by default, and without a sampler, the paper's task uncertainty)."""
        low_precision = self.score_precision == "bfloat16" and query_x.is_cuda
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=low_precision):
            logits = self.engine.predict_sets(adapted, query_x)
        evidence = self.loss.evidence(logits.to(query_x.dtype))
        if self.sampler is None:
            beliefs = task_beliefs(evidence)
            return task_uncertainty(beliefs.vacuity, beliefs.dissonance, lam)
        return self.sampler.score(evidence, lam)

    def compile_signature(self) -> tuple[str, dict[str, Any]]:
        """This fit's signature in the compile cache's records (``compile_cache.run_signature``): the options that shape
        the compiled graphs (all hyperparameters but ``_NOT_COMPILED``), the parameters' shapes (a backbone of one's
        own included), the sampler, the episode shapes and the device; the same for another seed or data folder."""
        datamodule = getattr(self._trainer, "datamodule", None)
        device = str(self.device)
        if self.device.type == "cuda":
            device = f"{torch.cuda.get_device_name(self.device)} {torch.cuda.get_device_capability(self.device)}"
        return run_signature(
            {
                "hyperparameters": {k: v for k, v in self.hparams.items() if k not in _NOT_COMPILED | {"loss"}},
                "loss": self.loss,  # the one in use: a default of None in the hyperparameters is EvidentialLoss()
                "parameters": [(name, list(p.shape), str(p.dtype)) for name, p in self.named_parameters()],
                "sampler": self.sampler,
                "episodes": {name: getattr(datamodule, name, None) for name in ("spec", "eval_spec", "image_shape")},
                "device": device,
            }
        )

    def on_train_start(self) -> None:
        """``capture="auto"`` on CUDA: compile a long single-GPU run, or a shorter one whose signature compiled on this
        machine before (``CapturedStep.resolve_auto``, ``compile_signature``)."""
        capture = getattr(self.engine, "capture", None)
        compiles = capture == "compile" or (capture == "auto" and self.device.type == "cuda")  # auto compiles on CUDA
        self._signature = signature = self.compile_signature() if compiles else None  # on_train_end records this one
        self.compiles_once_warm = self.captured_step.resolve_auto(
            self.trainer, self.device, lambda: signature is not None and compiled_before(signature[0])
        )

    def on_train_end(self) -> None:
        """After a fit whose inner loop compiled: record its signature in the compile cache (rank 0), so that
        ``capture="auto"`` compiles the next, shorter run of the same signature here (``WARM_COMPILE_MIN_STEPS``)."""
        compiled = getattr(self.engine, "capture", None) == "compile"
        if compiled and self._signature is not None and self.trainer.is_global_zero and self.trainer.global_step > 0:
            try:
                record_compiled(*self._signature)
            except OSError as error:  # a read-only cache folder costs the next run its compile, not this run its end
                rank_zero_warn(f"could not record this compiled run in the compile cache ({error})")

    # --- logging and checkpoints ----------------------------------------------------------------------

    def _log_training(self, values: dict[str, Tensor], num_chosen: int) -> None:
        """Add the step's values to the epoch's means; log them at the logging steps (``LabelBudget`` logs the labels
        spent). Reads nothing from the device (the logging steps read what they log)."""
        self.train_means.update(values, weight=num_chosen)
        if logging_step(self._trainer):
            self.log_dict({keys.step_key(k): v for k, v in values.items()}, on_step=True, on_epoch=False)

    def on_train_epoch_start(self) -> None:
        self.train_means.reset()

    def on_train_epoch_end(self) -> None:
        """Log the epoch means of the training values (``train/acc_epoch``, ...): weighted by labeled query sets, over
        the steps of every process."""
        means = weighted_means_over_ranks(self.train_means.totals())
        if means:
            values = {keys.epoch_key(k): v for k, v in means.items()}
            log_equal_on_every_rank(self, values, on_step=False, on_epoch=True)
        self.train_means.reset()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The module's hooks, not LabelBudget's: they run at every save (weights-only too) and every load.
        checkpoint["label_ledger"] = self.ledger.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Before Lightning loads the weights: a checkpoint of another shape stops with the options to change.
        ckpt_path = getattr(self._trainer, "ckpt_path", None)
        source = f"checkpoint {ckpt_path}" if ckpt_path else "the checkpoint"
        check_shapes(self.state_dict(), checkpoint.get("state_dict", {}), source)
        if "label_ledger" in checkpoint:
            self.ledger.load_state_dict(checkpoint["label_ledger"])
