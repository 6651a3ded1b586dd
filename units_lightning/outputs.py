"""What ``UnitsMAML``'s steps return: the typed contract between the module and the callbacks.

The dictionaries are plain ``dict`` at run time (Lightning requires a tensor or a dict with ``loss`` from
``training_step``); these ``TypedDict`` classes name every key, its shape and its meaning, so that a callback
depends on this contract rather than on the module.
"""

from __future__ import annotations

from typing import TypedDict

from torch import Tensor

__all__ = ["EvalStepOutput", "PredictStepOutput", "TestStepOutput", "TrainStepOutput"]


class TrainStepOutput(TypedDict):
    """``training_step`` (what ``on_train_batch_end`` receives as ``outputs``).

    T tasks with Q candidate query sets each, K of them labeled, M queries per set.
    """

    loss: Tensor
    """The meta-loss of the labeled query sets (scalar)."""
    scores: Tensor
    """(T, Q) task uncertainty of every candidate query set; zeros when ``scored`` is False."""
    chosen: Tensor
    """(T, Q) bool: the query sets the sampler chose to label."""
    scored: bool
    """Whether the sampler used the scores at this step (False in warm-up and for random samplers)."""
    vacuity: Tensor
    """(K, M) vacuity of the labeled queries."""
    dissonance: Tensor
    """(K, M) dissonance of the labeled queries."""
    incorrect_belief: Tensor
    """(K, M) incorrect belief of the labeled queries."""
    correct: Tensor
    """(K, M) bool: whether each labeled query was classified correctly."""
    lam: float
    """The step's lambda (weight of vacuity in the task score)."""
    eta: float
    """The step's eta (weight of the incorrect-belief regulariser)."""


class EvalStepOutput(TypedDict):
    """``validation_step``: the first query set of each of T evaluation tasks, M queries of N classes."""

    loss: Tensor
    logits: Tensor
    """(T, M, N)."""
    probability: Tensor
    """(T, M, N) expected Dirichlet probabilities."""
    labels: Tensor
    """(T, M)."""
    vacuity: Tensor
    """(T, M); so are ``dissonance``, ``incorrect_belief``, ``correct_belief`` and ``correct`` (bool)."""
    dissonance: Tensor
    incorrect_belief: Tensor
    correct_belief: Tensor
    correct: Tensor


class TestStepOutput(EvalStepOutput):
    """``test_step``: the evaluation outputs plus the vacuity of every out-of-distribution probe."""

    shifted: dict[str, Tensor]
    """``{probe name (e.g. "rotation_90"): (T, M) vacuity}``."""


class PredictStepOutput(TypedDict):
    """``predict_step``: T tasks, M unlabeled queries of N classes."""

    prediction: Tensor
    """(T, M) class position."""
    probability: Tensor
    """(T, M, N) expected Dirichlet probabilities."""
    vacuity: Tensor
    """(T, M)."""
    dissonance: Tensor
    """(T, M)."""
    classes: Tensor
    """(T, N) dataset class ids of each task."""
