"""benchmarks/compile_cache.py: the clock of a fit's first steps, the table of a cold and a warm fit, and its refusal
of a cache folder that is not empty (the real measurement compiles for minutes: docs/PERFORMANCE.md)."""

import json

import pytest
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from benchmarks import compile_cache
from units_lightning.samplers import RandomSampler


def test_the_step_clock_writes_when_the_first_steps_ended_and_the_cache_counters(tmp_path):
    data = tiny_data(RandomSampler(tasks=2))
    clock = compile_cache.StepClock(str(tmp_path / "clock.json"), steps=2)
    tiny_trainer(tmp_path, max_steps=3, callbacks=[clock]).fit(tiny_model(sampler=data.sampler), data)
    record = json.loads((tmp_path / "clock.json").read_text())
    assert len(record["step_ends"]) == 2 and record["step_ends"][0] <= record["step_ends"][1]
    assert set(record["counters"]) == {name for _, name in compile_cache.COUNTERS} and record["device"] == "cpu"


def test_the_table_puts_the_cold_and_the_warm_fit_side_by_side():
    counters = {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 4, "autograd_cache_hit": 0, "autograd_cache_miss": 2}
    warm = {"fxgraph_cache_hit": 4, "fxgraph_cache_miss": 0, "autograd_cache_hit": 2, "autograd_cache_miss": 0}
    results = {
        "cold": {"to_steps": [304.0, 305.15, 306.23], "counters": counters, "cache_mb": 9.4},
        "warm": {"to_steps": [21.4], "counters": warm, "cache_mb": 9.4},
    }
    lines = compile_cache.table(results).splitlines()
    assert lines[2] == "| cold | 304.0 | 305.1 | 306.2 | 0 / 4 | 0 / 2 | 9.4 |"
    assert lines[3] == "| warm | 21.4 | - | - | 4 / 0 | 2 / 0 | 9.4 |"


def test_a_cache_folder_that_is_not_empty_is_refused(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "entry").write_text("")
    with pytest.raises(SystemExit, match="is not empty; the first fit must compile from scratch"):
        compile_cache.main(["--cache", str(tmp_path / "cache"), "--config", "configs/quickstart.yaml"])
