"""benchmarks/whole_run.py: a whole fit timed phase by phase, and the full run projected from its parts."""

import json
import math
import sys

import pytest
import torch
from tiny_setup import QUICKSTART, TINY_QUICKSTART

from benchmarks import whole_run

Record = whole_run.Record


def synthetic_run() -> Record:
    """600 steps in blocks of 100: 10 ms a step before the warm-up step 200, 20 ms from it; capturing costs 5 s in
    the first block and compiling the scoring 3 s in the first block from step 200; a validation of 0.5 s and 0.1 s
    of checkpoints after steps 300 and 600."""
    record = Record(warmup=200, val_interval=300, epoch_steps=300, max_epochs=4, train_start=10.0, steps=600)
    now, marks = 10.0, [(0, 10.0)]
    for first in range(0, 600, 100):
        now += 100 * (0.010 if first < 200 else 0.020) + {0: 5.0, 200: 3.0}.get(first, 0.0)
        if first + 100 in (300, 600):
            now += 0.5 + (0.1 if first + 100 == 300 else 0.0)  # the last validation's checkpoints fall after the end
        marks.append((first + 100, now))
    record.marks, record.train_end = marks, now
    record.validations = [(300, 0.5), (600, 0.5)]
    record.after_validations = [(300, 0.1)]
    return record


def test_steady_rates_leave_out_first_blocks_and_validations():
    steady = whole_run.steady_seconds(synthetic_run())
    assert steady["warmup"] == pytest.approx(0.010)  # block 100-200 only: 0-100 holds the capture
    assert steady["scoring"] == pytest.approx(0.020)  # blocks from 300 on; 200-300 holds the compiling


def test_the_full_run_is_projected_from_the_parts():
    record = synthetic_run()
    figures = whole_run.project(record, full_steps=1200, end=2.0)
    assert figures["one_off_s"] == pytest.approx(8.0)  # capture + compiling: what the steady rates do not explain
    assert figures["validation_s"] == pytest.approx(0.5) and figures["after_validation_s"] == pytest.approx(0.1)
    assert figures["full_validations"] == 4  # 4 epochs of 300 steps, one validation each
    # start-up 10 s + one-off 8 s + 200 x 10 ms + 1000 x 20 ms + 4 x 0.6 s + end 2 s
    assert figures["full_total_s"] == pytest.approx(10 + 8 + 2 + 20 + 2.4 + 2)
    assert figures["total_s"] == pytest.approx(record.train_end + 2.0)


def test_the_one_off_cost_is_split_by_the_block_it_fell_in():
    record = synthetic_run()
    record.train_start = 9.5  # half a second from the start of training to the first step: the first block's
    record.marks[3] = (record.marks[3][0], record.marks[3][1] + 0.25)  # block 200-300 ends 0.25 s later,
    record.marks[4:] = [(step, time + 0.25) for step, time in record.marks[4:]]  # and every mark after it
    record.marks[5] = (record.marks[5][0], record.marks[5][1] + 0.75)  # block 400-500 took 0.75 s too long,
    record.marks[6] = (record.marks[6][0], record.marks[6][1] + 0.75)  # and the last block is shifted with it
    record.train_end = record.marks[-1][1]
    figures = whole_run.project(record, full_steps=1200, end=0.0)
    assert figures["first_block_s"] == pytest.approx(5.5)
    assert figures["scoring_block_s"] == pytest.approx(3.25)
    assert figures["other_blocks_s"] == pytest.approx(0.75)
    parts = figures["first_block_s"] + figures["scoring_block_s"] + figures["other_blocks_s"]
    assert parts == pytest.approx(figures["one_off_s"])


def test_a_run_without_steady_scoring_steps_is_refused():
    record = synthetic_run()
    record.marks = [mark for mark in record.marks if mark[0] <= 300]
    record.steps = 300
    with pytest.raises(SystemExit, match="no steady block of steps from the warm-up step 200"):
        whole_run.project(record, full_steps=1200, end=0.0)


def test_full_garbage_collections_are_timed_and_those_in_validations_told_apart():
    import gc

    timer = whole_run.PhaseTimer(block=10)
    whole_run.RECORDS.remove(timer.record)
    timer._step = 7
    gc.callbacks.append(timer._collection)
    try:
        gc.collect(1)  # a younger generation's: not counted
        gc.collect()
        timer._validation_start = 1.0  # inside a validation
        gc.collect()
    finally:
        gc.callbacks.remove(timer._collection)
    assert [(step, validating) for step, _, validating in timer.record.collections] == [(7, False), (7, True)]
    assert all(seconds > 0 for _, seconds, _ in timer.record.collections)
    record = synthetic_run()
    record.collections = [(100, 0.25, False), (300, 0.5, True)]
    figures = whole_run.project(record, full_steps=1200, end=0.0)
    assert (figures["collections"], figures["collections_s"], figures["collections_in_validations_s"]) == (2, 0.75, 0.5)


def test_validations_in_parts_are_averaged_over_the_validations():
    record = synthetic_run()
    assert set(whole_run.validation_parts(record).values()) == {None}
    record.validation_parts = [(300, 0.1, 0.3, 0.2, 0.05), (600, 0.3, 0.5, 0.4, 0.15)]
    parts = whole_run.validation_parts(record)
    assert parts["validation_to_first_batch_s"] == pytest.approx(0.2)
    assert parts["validation_batches_s"] == pytest.approx(0.4)
    assert parts["validation_slowest_batch_s"] == pytest.approx(0.3)
    assert parts["validation_after_s"] == pytest.approx(0.1)


def test_a_validations_batches_on_cuda_are_placed_by_events_from_its_start():
    class Event:  # what PhaseTimer reads of a torch.cuda.Event: milliseconds from one to another
        def __init__(self, seconds):
            self.seconds = seconds

        def elapsed_time(self, other):
            return 1000 * (other.seconds - self.seconds)

    timer = whole_run.PhaseTimer(block=10)
    whole_run.RECORDS.remove(timer.record)
    timer._origin = Event(5.0)  # recorded when the validation started, at 100 s on the script's clock
    assert timer._at(Event(5.25), start=100.0) == pytest.approx(100.25)
    assert timer._at(3.5, start=100.0) == 3.5  # off CUDA a mark is the clock's time itself


def test_a_validations_time_is_its_mean_where_they_differ():
    record = synthetic_run()
    record.validations = [(300, 0.4), (600, 0.9)]  # two-valued, as on an H200
    figures = whole_run.project(record, full_steps=1200, end=0.0)
    assert figures["validation_s"] == pytest.approx(0.65)


@pytest.mark.parametrize(
    ("steps", "interval", "epoch", "expected"),
    [(50_000, 500, 500, 100), (50_000, 100, 500, 500), (1_000, 300, 500, 2), (5_000, 500, math.inf, 10), (9, 0, 3, 0)],
)
def test_validations_in_a_run(steps, interval, epoch, expected):
    assert whole_run.validations_in(steps, interval, epoch) == expected


def test_a_tiny_quick_start_is_timed_and_projected(tmp_path, capsys, monkeypatch):
    from collections import Counter

    monkeypatch.setattr("units_lightning.engines.ahead.COUNTS", Counter())  # this run's, as in its own process
    out = tmp_path / "figures.json"
    figures = whole_run.main(
        ["--config", str(QUICKSTART), "--steps", "12", "--block", "2", "--json", str(out), "--hooks", "3",
         *TINY_QUICKSTART, "--data.sampler.init_args.warmup_steps=4", "--trainer.limit_train_batches=6",
         "--trainer.max_epochs=4", f"--trainer.default_root_dir={tmp_path}"]
    )  # fmt: skip
    assert figures["steps"] == 12 and figures["full_steps"] == 24  # 4 epochs of 6 steps
    assert figures["warmup_step_ms"] > 0 and figures["scoring_step_ms"] > 0
    assert figures["validations"] == 2 and figures["full_validations"] == 4  # one validation an epoch
    assert figures["validation_s"] > 0 and figures["after_validation_s"] > 0
    parts = [figures[f"validation_{name}_s"] for name in ("to_first_batch", "batches", "after")]
    assert all(part >= 0 for part in parts) and figures["validation_batches_s"] > 0
    assert sum(parts) <= figures["validation_s"] + 1e-6  # the gaps between batches (the loader) are in none of them
    assert 0 < figures["validation_slowest_batch_s"] <= figures["validation_batches_s"]
    assert 0 < figures["start_up_s"] < figures["total_s"] < figures["full_total_s"]
    parts = figures["first_block_s"] + figures["scoring_block_s"] + figures["other_blocks_s"]
    assert parts == pytest.approx(figures["one_off_s"])
    saved = json.loads(out.read_text())
    assert saved["record"]["marks"][0][0] == 0 and saved["record"]["marks"][-1][0] == 12
    printed = capsys.readouterr().out
    assert "full run projected (4 validations)" in printed
    # --hooks: the host's time a step in the costliest per-step hooks, from Lightning's SimpleProfiler
    hooks = saved["record"]["hooks"]
    assert "[Strategy]SingleDeviceStrategy.training_step" in dict(hooks) and all(ms > 0 for _, ms in hooks)
    assert [ms for _, ms in hooks] == sorted((ms for _, ms in hooks), reverse=True)
    assert "host ms a training step, per hook (12 steps, SimpleProfiler)" in printed
    assert printed.count("\n| [") + printed.count("\n| run_") == 3, printed
    assert {"compiler_s", "tracing_s", "backends_s"} <= figures.keys()
    assert "| torch.compile in the run (Dynamo's compile_times): in all / tracing / backends |" in printed
    assert figures["ahead_loaded"] is None and "| compile_ahead: artifacts loaded / compiled here" in printed
    # how the steps ran, and that a CPU run starts no compile for the next run
    row = "| the steps ran; compiling for the next run (units_lightning.cli.compile_next) |"
    assert f"{row} eager (capture auto on a CPU); - |" in printed or f"{row} eager; - |" in printed, printed
    assert whole_run.steps_ran("auto", torch.device("cuda")) == "CUDA graphs (capture auto)"
    assert whole_run.steps_ran("compile", torch.device("cuda")) == "compiled"
    # where PYTHONDONTWRITEBYTECODE is set (the GPU image sets it), the imports row says so
    assert figures["bytecode_kept"] is (not sys.dont_write_bytecode)
    said = "(Python keeps no bytecode here, PYTHONDONTWRITEBYTECODE: each start compiles the sources again)"
    assert (said in printed) is sys.dont_write_bytecode
    for kept in (True, False):
        imports_row = whole_run._table({**figures, "bytecode_kept": kept}).splitlines()[4]
        assert (
            imports_row.startswith("| imports (torch, Lightning, this package) |") and (said in imports_row) is not kept
        )


def test_per_step_actions_keep_what_ran_at_about_every_step():
    from types import SimpleNamespace

    profiler = SimpleNamespace(
        recorded_durations={"step": [0.002] * 10, "fetch": [0.001] * 9, "setup": [1.0], "twice": [0.0005] * 20}
    )
    rows = whole_run.per_step_actions(profiler, steps=10)
    assert [name for name, _ in rows] == ["step", "twice", "fetch"]
    assert rows[0][1] == pytest.approx(2.0) and rows[1][1] == pytest.approx(1.0) and rows[2][1] == pytest.approx(0.9)
    assert whole_run.per_step_actions(object(), steps=10) == [] and whole_run.per_step_actions(profiler, 0) == []


def test_the_compilers_time_comes_from_dynamos_compile_times(monkeypatch):
    before = whole_run.compiler_seconds()["compiler_s"] or 0.0
    compiled = torch.compile(lambda x: torch.sin(x) + 1, backend="eager")  # Dynamo's tracing, no Inductor
    compiled(torch.ones(3))
    after = whole_run.compiler_seconds()
    assert after["compiler_s"] > before
    assert 0 < after["tracing_s"] <= after["compiler_s"] and 0 < after["backends_s"] <= after["compiler_s"]
    monkeypatch.setattr("torch._dynamo.utils.compile_times", lambda **kwargs: ([], []))  # nothing compiled
    assert whole_run.compiler_seconds() == {"compiler_s": None, "tracing_s": None, "backends_s": None}


def test_what_compile_ahead_did_comes_from_the_engines_counts(monkeypatch):
    from collections import Counter

    from units_lightning.engines import ahead

    monkeypatch.setattr(ahead, "COUNTS", Counter(loaded=0))  # an empty folder: nothing was compiled ahead yet
    assert whole_run.ahead_counts() == {"ahead_loaded": None, "ahead_compiled": None, "ahead_as_usual": None}
    monkeypatch.setattr(ahead, "COUNTS", Counter({"loaded": 3}))  # a later run: every function from the cache
    assert whole_run.ahead_counts() == {"ahead_loaded": 3, "ahead_compiled": 0, "ahead_as_usual": 0}


def test_the_accelerator_given_on_the_command_line_wins_over_the_configs():
    config = {"trainer": {"accelerator": "auto"}}
    assert whole_run._accelerator(config, []) == "auto"
    assert whole_run._accelerator(config, ["--trainer.accelerator", "cpu"]) == "cpu"  # no compiled capture on a CPU run
    assert whole_run._accelerator(config, ["--trainer.accelerator=gpu", "--trainer.accelerator=cpu"]) == "cpu"


def test_a_run_without_a_validation_is_refused_where_the_full_run_validates():
    record = synthetic_run()
    record.validations, record.after_validations = [], []
    refused = "no validation was measured, and the full run has 4: give --steps at least 300"
    with pytest.raises(SystemExit, match=refused):
        whole_run.project(record, full_steps=1200, end=0.0)
