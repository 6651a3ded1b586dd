"""Theorem 1 (ib_t >= cb_t / 2 on every task): the margin function and the property on generated tasks."""

import warnings
from types import SimpleNamespace
from unittest.mock import Mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from units_lightning.belief import query_beliefs, theorem_one_margin
from units_lightning.callbacks import TheoremOneMonitor


def test_margin_closed_forms():
    # Two equal beliefs with the label on one of them: dissonance 0.8, incorrect belief 0.4: the bound is tight.
    beliefs = query_beliefs(torch.tensor([[[4.0, 4.0, 0.0]]]), torch.tensor([[0]]))  # e=(4,4,0), S=11
    torch.testing.assert_close(
        theorem_one_margin(beliefs.incorrect, beliefs.dissonance), torch.zeros(1), atol=1e-7, rtol=0
    )
    # All evidence on the true class: no dissonance, no incorrect belief.
    beliefs = query_beliefs(torch.tensor([[[9.0, 0.0, 0.0]]]), torch.tensor([[0]]))
    assert theorem_one_margin(beliefs.incorrect, beliefs.dissonance).item() == 0.0
    # All evidence on a wrong class: incorrect belief 0.9 and no dissonance.
    beliefs = query_beliefs(torch.tensor([[[0.0, 27.0, 0.0]]]), torch.tensor([[0]]))
    torch.testing.assert_close(theorem_one_margin(beliefs.incorrect, beliefs.dissonance), torch.tensor([0.9]))


def test_margin_is_per_task_mean():
    incorrect = torch.tensor([[0.2, 0.4], [0.0, 0.0]])
    dissonance = torch.tensor([[0.2, 0.2], [0.0, 0.4]])
    torch.testing.assert_close(theorem_one_margin(incorrect, dissonance), torch.tensor([0.2, -0.1]))


def test_margin_needs_matching_task_by_query_tensors():
    with pytest.raises(ValueError, match="tasks, queries"):
        theorem_one_margin(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="atol"):
        TheoremOneMonitor(atol=-1.0)


@settings(max_examples=300, deadline=None)
@given(
    evidence=st.lists(
        st.lists(st.sampled_from([0.0, 1e-6, 0.5, 1.0, 1.0, 3.0, 50.0, 1e6]), min_size=5, max_size=5),
        min_size=1,
        max_size=6,
    ),
    labels=st.lists(st.integers(0, 4), min_size=6, max_size=6),
)
def test_theorem_holds_on_every_generated_task(evidence, labels):
    evidence = torch.tensor(evidence, dtype=torch.float64).unsqueeze(0)  # one task of M queries
    labels = torch.tensor(labels[: evidence.shape[1]]).unsqueeze(0)
    beliefs = query_beliefs(evidence, labels)
    assert theorem_one_margin(beliefs.incorrect, beliefs.dissonance).item() >= -1e-12


def test_theorem_holds_on_random_tasks_in_float32():
    generator = torch.Generator().manual_seed(0)
    evidence = torch.nn.functional.softplus(4 * torch.randn(2000, 10, 20, generator=generator))
    labels = torch.randint(0, 20, (2000, 10), generator=generator)
    beliefs = query_beliefs(evidence, labels)
    assert (theorem_one_margin(beliefs.incorrect, beliefs.dissonance) >= -1e-6).all()


def test_an_epoch_that_ran_no_batch_logs_nothing_and_warns_nothing():
    # A run resumed from the checkpoint of an epoch's last step ends that epoch before any batch: the monitor must
    # neither log a value nor let torchmetrics warn that compute ran before update.
    monitor = TheoremOneMonitor()
    module = SimpleNamespace(device=torch.device("cpu"), log=Mock())
    monitor.start(module, "train")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monitor.finish(module, "train")
    module.log.assert_not_called()


def test_held_training_steps_give_the_values_of_a_check_per_step(monkeypatch):
    """Training steps' beliefs go into the check in batches (``_HELD_STEPS``, and at the epoch's end, where a
    trimmed step's other shape is checked alone): the logged values are those of one update per step."""
    from units_lightning.callbacks import theorem_one
    from units_lightning.metrics import TheoremOneCheck

    monkeypatch.setattr(theorem_one, "_HELD_STEPS", 4)
    generator = torch.Generator().manual_seed(0)
    steps = []
    for tasks, queries in [(2, 5)] * 9 + [(1, 3)]:  # the last one trimmed by a label budget
        evidence = torch.rand(tasks, queries, 5, generator=generator) * 9
        beliefs = query_beliefs(evidence, torch.zeros(tasks, queries).long())
        broken = 2.0 * (len(steps) == 6)
        steps.append({"incorrect_belief": beliefs.incorrect, "dissonance": beliefs.dissonance + broken})
    expected = TheoremOneCheck()
    for step in steps:
        expected.update(step["incorrect_belief"], step["dissonance"])
    monitor = TheoremOneMonitor()
    module = SimpleNamespace(device=torch.device("cpu"), log_dict=Mock())
    monitor.start(module, "train")
    for step in steps:
        monitor.update("train", step)
    monitor.finish(module, "train")
    holds, margin = expected.compute()
    assert 0 < holds < 1  # step 6 broke the bound on purpose, so both values say something
    logged = module.log_dict.call_args.args[0]
    assert logged == {"train/theorem1_holds": float(holds), "train/theorem1_margin": float(margin)}
