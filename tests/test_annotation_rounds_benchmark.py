"""benchmarks/annotation_rounds.py: arms named by acquisition, built as ``select`` builds its default, and the table's
labels saved against random; a tiny run through select_batch, ingest and resumed training on real Omniglot."""

import doctest
import json

import pytest
from image_fakes import shared

from benchmarks import annotation_rounds as rounds
from units_lightning.samplers import MarginSampler, MultiQuerySampler, RandomSampler, StochasticSampler


def test_docstring_examples():
    assert doctest.testmod(rounds).failed == 0


def test_default_arms_are_random_units_and_margin():
    arms = rounds.parse_arms(list(rounds.DEFAULT_ARMS))
    assert arms == {
        "random": "units_lightning.samplers.RandomSampler",
        "units": "units_lightning.samplers.MultiQuerySampler",
        "margin": "units_lightning.samplers.MarginSampler",
    }


def test_random_is_always_the_first_arm_and_any_sampler_can_be_named():
    arms = rounds.parse_arms(["margin", "mine=units_lightning.samplers.EntropySampler"])
    assert list(arms) == ["random", "margin", "mine"]
    assert arms["mine"] == "units_lightning.samplers.EntropySampler"


@pytest.mark.parametrize(
    "specs, message",
    [(["nonsense"], "unknown arm 'nonsense'"), (["margin", "margin"], "given twice"), (["mine="], "name=class_path")],
    ids=["unknown", "twice", "no-class-path"],
)
def test_bad_arms_are_refused_with_the_fix(specs, message):
    with pytest.raises(ValueError, match=message):
        rounds.parse_arms(specs)


def test_main_refuses_an_unknown_arm_before_loading_data(capsys):
    with pytest.raises(SystemExit):
        rounds.main(["--arms", "nonsense", "--root", "/nonexistent"])
    assert "unknown arm 'nonsense'" in capsys.readouterr().err


def test_arms_get_the_training_samplers_tasks_and_candidates():
    training = MultiQuerySampler(tasks=4, query_sets=6)
    margin = rounds.build_arm("units_lightning.samplers.MarginSampler", training, seed=3)
    assert type(margin) is MarginSampler and (margin.tasks, margin.query_sets) == (4, 6)  # as select's default
    units = rounds.build_arm("units_lightning.samplers.MultiQuerySampler", training, seed=3)
    assert type(units) is MultiQuerySampler and (units.tasks, units.query_sets) == (4, 6)
    random = rounds.build_arm("units_lightning.samplers.RandomSampler", training, seed=3)
    assert type(random) is RandomSampler and random.tasks == 4
    stochastic = rounds.build_arm("units_lightning.samplers.StochasticSampler", training, seed=3)
    assert type(stochastic) is StochasticSampler and stochastic.query_sets == 6


def _results(random, margin):
    return {
        "random": {"accuracy": random, "tasks_labeled": [2, 3, 4], "pre_annotation_accuracy": [0.5, 0.7]},
        "margin": {"accuracy": margin, "tasks_labeled": [2, 4, 5], "pre_annotation_accuracy": [0.4, 0.4]},
    }


def test_labels_saved_per_seed_and_never_where_random_is_not_reached():
    results = [_results([0.4, 0.5, 0.6], [0.4, 0.6, 0.7]), _results([0.4, 0.5, 0.6], [0.4, 0.45, 0.5])]
    saved = rounds.saved_against_random([8.0, 16.0, 24.0], results, "margin")
    assert saved[0] == pytest.approx(1 - 16 / 24) and saved[1] is None


def test_table_has_a_column_per_arm_and_the_labels_saved_row():
    settings = rounds.Settings(None, 5, 15, 8, 3, 25, 100, 32, 3, 4, "cpu", None)
    results = [_results([0.4, 0.5, 0.6], [0.4, 0.6, 0.7]), _results([0.4, 0.5, 0.6], [0.4, 0.55, 0.6])]
    table = rounds.markdown(settings, ["random", "margin"], [0, 1], results, 60.0)
    lines = table.splitlines()
    assert lines[0].startswith("| labeled query sets (images) | random | margin | margin - random |")
    widths = {line.count("|") for line in lines if line.startswith("|")}
    assert widths == {6}  # header, rule, 3 rounds, the labels-saved and pre-annotation rows: 5 cells each
    assert "| 16 (80) | 50.00% (50.0, 50.0) | 57.50% (60.0, 55.0) | +7.50 points | 3.0 / 4.0 of 5 |" in lines
    assert "| 0% | +17% (+33%, +0%) |" in lines[-4]  # 1 - 16/24, and seed 1 reaches 60% at 24 as random does
    assert lines[-3] == "| pre-annotations right, batches of rounds 2 on (mean) | 60.0% | 40.0% | | |"
    assert "select adapts to support sets only" in lines[-1]


@pytest.mark.slow
@pytest.mark.data
def test_a_tiny_run_through_select_and_ingest(tmp_path, capsys):
    out = tmp_path / "rounds.json"
    rounds.main(
        [
            *("--root", str(shared("omniglot")), "--tasks", "4", "--test-tasks", "5", "--rounds", "2"),
            *("--steps", "2", "--seeds", "0", "--budget", "2", "--filters", "8", "--inner-steps", "1"),
            *("--out", str(out)),
        ]
    )
    results = json.loads(out.read_text())["results"][0]
    assert list(results) == ["random", "units", "margin"]
    assert {len(arm["accuracy"]) for arm in results.values()} == {2}
    assert len({arm["accuracy"][0] for arm in results.values()}) == 1  # round 1 is shared
    assert results["margin"]["acquisition"].startswith("MarginSampler(tasks=4, query_sets=4")
    assert {len(arm["pre_annotation_accuracy"]) for arm in results.values()} == {1}  # round 2's batch
    assert "labels saved against random" in capsys.readouterr().out
