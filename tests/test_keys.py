"""The logged names: one threshold format, parsed back, and no dependency on the rest of the package."""

import ast
from pathlib import Path

import pytest

from units_lightning import keys


@pytest.mark.parametrize("threshold", [*keys.REPORTED_VACUITY_THRESHOLDS, *keys.CURVE_VACUITY_THRESHOLDS, 0.05])
def test_threshold_suffix_round_trips_without_a_dot(threshold):
    for name in (keys.acc_vacuity_below(threshold), keys.coverage_vacuity_below(threshold)):
        key = keys.stage_key(keys.VAL_CURVE, name)
        assert "." not in key
        assert keys.threshold_from_key(key) == threshold


def test_names_of_each_namespace():
    assert keys.stage_key(keys.TEST, keys.acc_vacuity_below(0.2)) == "test/acc_vacuity_below_0p20"
    assert keys.selective_acc(0.7) == "selective_acc_70"
    assert keys.theorem1_holds(keys.TRAIN) == "train/theorem1_holds"
    assert keys.ood_key("rotation_30", "auroc") == "test/ood/rotation_30/auroc"
    assert keys.epoch_key(keys.stage_key(keys.TRAIN, "vacuity")) == "train/vacuity_epoch"
    assert keys.step_key(keys.selection_uncertainty("rejected")) == "selection/uncertainty_rejected_step"
    assert keys.selection_quantile("chosen", 10) == "selection/uncertainty_chosen_p10"
    with pytest.raises(ValueError, match="no vacuity threshold"):
        keys.threshold_from_key("val/acc")


def test_keys_imports_nothing_from_the_package():
    tree = ast.parse(Path(keys.__file__).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name.startswith("units_lightning") for name in names), names
