"""The dashboard callbacks in real training runs with CSVLogger and TensorBoardLogger, read back from disk."""

import math

import pytest
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.callbacks import (
    ScheduleMonitor,
    SelectionMonitor,
    TheoremOneMonitor,
    UncertaintyCurves,
    dashboard_callbacks,
)
from units_lightning.dashboard import CHARTS, build_report, read_log
from units_lightning.losses import CrossEntropyLoss, EvidentialLoss
from units_lightning.samplers import MultiQuerySampler, RandomSampler

QUERY_SETS = 3


def train(tmp_path, logger_class):
    sampler = MultiQuerySampler(tasks=2, query_sets=QUERY_SETS, warmup_steps=1)
    logger = logger_class(save_dir=tmp_path, name="run")
    trainer = tiny_trainer(
        tmp_path,
        max_steps=6,
        limit_train_batches=3,
        limit_val_batches=None,
        logger=logger,
        log_every_n_steps=1,
        callbacks=dashboard_callbacks(),
    )
    trainer.fit(tiny_model(sampler=sampler), tiny_data(sampler))
    return trainer


@pytest.mark.parametrize("logger_class", [CSVLogger, TensorBoardLogger], ids=["csv", "tensorboard"])
def test_callbacks_log_every_dashboard_key_with_any_logger(tmp_path, logger_class):
    train(tmp_path, logger_class)
    log = read_log(tmp_path)
    assert log.source == ("csv" if logger_class is CSVLogger else "tensorboard")
    for chart in CHARTS:
        if chart.kind in ("line", "threshold_curve"):
            assert chart.matching(log.keys), chart.title
            assert set(chart.y) <= log.keys, (chart.title, set(chart.y) - log.keys)
    rows = log.rows

    def values(key):
        return [row[key] for row in rows if key in row]

    # Two epochs of three steps, validation after each; Theorem 1 holds on every task.
    for stage in ("train", "val"):
        assert values(f"{stage}/theorem1_holds") == [1.0, 1.0]
        assert all(margin >= -1e-6 for margin in values(f"{stage}/theorem1_margin"))
    # Selection starts after one warm-up step; each task labels one of its QUERY_SETS sets.
    wins = [
        [row[f"selection/slot_win/{i}"] for i in range(QUERY_SETS)] for row in rows if "selection/slot_win/0" in row
    ]
    assert len(wins) == 2 and all(math.isclose(sum(w), 1.0, abs_tol=1e-6) for w in wins)
    for who in ("chosen", "rejected"):
        p10, p50, p90 = (values(f"selection/uncertainty_{who}_p{q}") for q in (10, 50, 90))
        assert all(a <= b <= c for a, b, c in zip(p10, p50, p90, strict=True)) and len(p50) == 2
    # The label-budget curve: labeled query sets at each validation, beside val/acc in the same row.
    budget = [(row["label_budget/query_sets"], row["val/acc"]) for row in rows if "label_budget/query_sets" in row]
    assert [spent for spent, _ in budget] == [3 * 2, 6 * 2]
    assert values("schedule/lambda") and values("schedule/eta")
    coverage = [
        row[key]
        for row in rows
        if "val_curve/coverage_vacuity_below_1p00" in row
        for key in sorted(k for k in row if k.startswith("val_curve/coverage"))
    ]
    assert coverage and all(0.0 <= c <= 1.0 for c in coverage)

    report = build_report(tmp_path, tmp_path / "report")
    assert len(report.images) == sum(chart.kind in ("line", "threshold_curve") for chart in CHARTS)
    page = report.html.read_text()
    assert page.count("data:image/png;base64,") == len(report.images) and 'src="http' not in page


def test_callbacks_reject_outputs_of_another_module():
    for callback in (ScheduleMonitor(), SelectionMonitor(), TheoremOneMonitor()):
        with pytest.raises(TypeError, match="UnitsMAML"):
            callback.on_train_batch_end(None, None, {"loss": 1.0}, None, 0)
    with pytest.raises(ValueError, match="quantiles"):
        SelectionMonitor(quantiles=(0.5, 1.0))
    assert type(UncertaintyCurves().thresholds) is tuple


@pytest.mark.parametrize(
    ("method", "logged"),
    [("maml", set()), ("units-nts", {"schedule/eta"}), ("units-ml", {"schedule/lambda", "schedule/eta"})],
)
def test_a_schedule_the_method_does_not_use_is_not_logged(tmp_path, method, logged):
    """lambda weighs the scores of a selecting sampler, eta the regulariser of the evidential loss: MAML uses
    neither, Units-NTS only eta. A comparison page would otherwise draw their unused schedules as if they mattered."""
    sampler = RandomSampler(tasks=2) if method in ("maml", "units-nts") else MultiQuerySampler(tasks=2, query_sets=2)
    loss = CrossEntropyLoss() if method == "maml" else EvidentialLoss()
    trainer = tiny_trainer(
        tmp_path,
        max_steps=2,
        logger=CSVLogger(tmp_path, name="run"),
        log_every_n_steps=1,
        callbacks=[ScheduleMonitor()],
    )
    trainer.fit(tiny_model(sampler=sampler, loss=loss), tiny_data(sampler))
    assert {key for key in read_log(tmp_path).keys if key.startswith("schedule/")} == logged
