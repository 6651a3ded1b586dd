"""benchmarks/training_time.py: labels saved at equal test accuracy from a label-budget table, paired by seed."""

import json

import pytest

from benchmarks import training_time


def _cells(curves):
    """Budget-table cells (as paper_tables.json writes them) of {seed: [acc at 2,000, 4,000, 8,000, 10,000]}."""
    seeds = sorted(curves)
    return {
        str(label): {"seeds": seeds, "values": [curves[s][i] for s in seeds]}
        for i, label in enumerate((2000, 4000, 8000, 10000))
    }


def test_labels_saved_are_paired_by_seed_against_the_reference():
    table = {
        "Units-NTS": _cells({0: [80.0, 85.0, 90.0, 92.0], 1: [70.0, 80.0, 88.0, 90.0]}),
        # seed 0 reaches 92 at 6,000 (half way from 90 at 4,000 to 94 at 8,000): 40% saved; seed 1 reaches 90 at 4,000.
        "Margin": _cells({0: [85.0, 90.0, 94.0, 95.0], 1: [80.0, 90.0, 91.0, 92.0]}),
        "Worse": _cells({0: [70.0, 75.0, 80.0, 85.0], 1: [60.0, 65.0, 70.0, 75.0]}),
        "Not run": {str(label): {"seeds": [], "values": []} for label in (2000, 4000, 8000, 10000)},
    }
    result = training_time.compare(table, "Units-NTS")
    margin = result["methods"]["Margin"]
    assert margin["labels_saved"]["values"] == pytest.approx([0.4, 0.6])
    assert margin["labels_saved"]["mean"] == pytest.approx(0.5) and margin["labels_saved"]["reached"] == "2/2"
    assert result["methods"]["Units-NTS"]["labels_saved"]["mean"] == 0.0
    assert result["methods"]["Worse"]["labels_saved"]["reached"] == "0/2"  # never reaches the reference's final
    assert result["methods"]["Worse"]["area_minus_reference"]["mean"] < 0 < margin["area_minus_reference"]["mean"]
    assert "Not run" not in result["methods"]  # a method of the grid without runs gets no row


def test_a_seed_missing_a_milestone_is_left_out_and_the_cli_prints_a_row_per_method(tmp_path, capsys):
    nts = _cells({0: [80.0, 85.0, 90.0, 92.0], 1: [70.0, 80.0, 88.0, 90.0]})
    ml = _cells({0: [85.0, 90.0, 94.0, 95.0], 1: [80.0, 90.0, 91.0, 92.0]})
    ml["10000"] = {"seeds": [0], "values": [95.0]}  # seed 1 not tested at 10,000 yet
    path = tmp_path / "paper_tables.json"
    path.write_text(json.dumps({"budget": {"budget_x": {"Units-NTS": nts, "Units-ML": ml}}}))
    results = training_time.main([str(path)])
    assert results["budget_x"]["methods"]["Units-ML"]["seeds"] == [0]
    assert "| Units-ML | +40.0 | 1/1 |" in capsys.readouterr().out


def test_tables_of_separate_calls_are_merged_method_by_method(tmp_path):
    """The reference in one call's table, an acquisition in another's: both are compared, and a method in both is
    taken from the last."""
    nts = _cells({0: [80.0, 85.0, 90.0, 92.0]})
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"budget": {"budget_x": {"Units-NTS": nts, "Margin": nts}}}))
    margin = _cells({0: [85.0, 90.0, 94.0, 95.0]})
    second.write_text(json.dumps({"budget": {"budget_x": {"Margin": margin, "Entropy": margin}}}))
    methods = training_time.main([str(first), str(second)])["budget_x"]["methods"]
    assert set(methods) == {"Units-NTS", "Margin", "Entropy"}
    assert methods["Margin"]["labels_saved"]["values"] == pytest.approx([0.4])


def test_the_seeds_of_a_method_are_gathered_from_several_tables_and_a_seed_in_both_is_the_later_one(tmp_path):
    """Seeds 0 and 1 of a method in one sweep's table, seed 2 (and seed 1 again) in a later one: three seeds, seed 1
    from the later table."""
    nts = _cells({seed: [80.0, 85.0, 90.0, 92.0] for seed in (0, 1, 2)})
    flat, low, high = [80.0, 80.0, 80.0, 80.0], [70.0, 75.0, 80.0, 85.0], [85.0, 90.0, 94.0, 95.0]
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"budget": {"budget_x": {"Units-NTS": nts, "Margin": _cells({0: flat, 1: low})}}}))
    second.write_text(json.dumps({"budget": {"budget_x": {"Margin": _cells({1: high, 2: high})}}}))
    margin = training_time.main([str(first), str(second)])["budget_x"]["methods"]["Margin"]
    assert margin["seeds"] == [0, 1, 2]
    assert margin["labels_saved"]["values"] == pytest.approx([None, 0.4, 0.4])  # seed 0 never reaches 92
    assert margin["final"]["mean"] == pytest.approx((80.0 + 95.0 + 95.0) / 3)


def test_a_later_table_without_runs_of_a_method_keeps_the_earlier_results(tmp_path):
    """A table built with a wider --methods than its call ran holds empty cells: they must not replace results."""
    nts = _cells({0: [80.0, 85.0, 90.0, 92.0]})
    empty = {label: {"seeds": [], "values": []} for label in nts}
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"budget": {"budget_x": {"Units-NTS": nts}}}))
    maml = _cells({0: [70.0, 80.0, 85.0, 88.0]})
    second.write_text(json.dumps({"budget": {"budget_x": {"Units-NTS": empty, "MAML": maml}}}))
    methods = training_time.main([str(first), str(second)])["budget_x"]["methods"]
    assert set(methods) == {"Units-NTS", "MAML"}
    assert methods["MAML"]["labels_saved"]["reached"] == "0/1"


def test_the_validation_choice_is_the_best_mean_validation_accuracy_and_never_reads_test_figures(tmp_path, capsys):
    """Margin is better on test, Units-ML on validation: the choice follows validation."""
    nts = _cells({0: [80.0, 85.0, 90.0, 92.0], 1: [70.0, 80.0, 88.0, 90.0]})
    margin = _cells({0: [85.0, 90.0, 94.0, 95.0], 1: [80.0, 90.0, 91.0, 92.0]})

    def run(method, seed, value):
        return {"config": "budget_x", "method": method, "seed": seed, "best_val": {"value": value, "step": 9}}

    runs = [run("Units-NTS", 0, 0.70), run("Margin", 0, 0.74), run("Margin", 1, 0.70), run("Units-ML", 0, 0.75)]
    runs += [run("Units-ML", 1, 0.76), run("Margin", 1, 0.71)]  # a later run of (Margin, seed 1) replaces the first
    path = tmp_path / "paper_tables.json"
    table = {"Units-NTS": nts, "Margin": margin, "Units-ML": nts}
    path.write_text(json.dumps({"budget": {"budget_x": table}, "runs": runs}))
    result = training_time.main([str(path)])["budget_x"]
    assert result["methods"]["Margin"]["best_val"]["mean"] == pytest.approx(72.5)
    assert result["methods"]["Units-ML"]["best_val"]["n"] == 2
    assert result["validation_choice"] == "Units-ML"
    out = capsys.readouterr().out
    assert "| 72.50 (2 seeds) |" in out and "validation choice: Units-ML (75.50%)" in out
