"""The compile cache's records of which runs compiled, and ``capture="auto"`` compiling a shorter run where one did."""

import json
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.compile_cache import COMPILE_CACHE_VARIABLE, compiled_before, record_compiled, run_signature
from units_lightning.engines.captured_step import COMPILE_MIN_STEPS, WARM_COMPILE_MIN_STEPS, auto_capture
from units_lightning.losses import EvidentialLoss
from units_lightning.samplers import MultiQuerySampler, RandomSampler


class StopAfterOneStep(pl.Callback):
    def on_train_batch_end(self, trainer, *args):
        trainer.should_stop = True


def signature_of_a_fit(tmp_path, data_options=None, sampler=None, **model_options):
    """The signature a one-step CPU fit takes when training starts (its trainer stays attached)."""
    data = tiny_data(sampler or RandomSampler(tasks=2), **(data_options or {}))
    model = tiny_model(sampler=data.sampler, **model_options)
    tiny_trainer(tmp_path, callbacks=[StopAfterOneStep()]).fit(model, data)
    return model.compile_signature()


def test_capture_auto_compiles_a_shorter_run_only_where_its_signature_compiled_on_this_machine_before():
    assert auto_capture(5_000, world_size=1) == "cuda_graph"  # a first label-budget run: compiling would not pay
    assert auto_capture(5_000, world_size=1, compiled_before=True) == "compile"  # its kernels come from the cache
    assert auto_capture(WARM_COMPILE_MIN_STEPS, world_size=1, compiled_before=True) == "compile"
    assert auto_capture(WARM_COMPILE_MIN_STEPS - 1, world_size=1, compiled_before=True) == "cuda_graph"
    assert auto_capture(5_000, world_size=2, compiled_before=True) == "cuda_graph"  # data-parallel: CUDA graphs
    assert auto_capture(COMPILE_MIN_STEPS, world_size=1, compiled_before=False) == "compile"


@pytest.mark.parametrize(
    ("steps", "recorded", "asked", "compiles"),
    [(5_000, True, True, True), (5_000, False, True, False), (50_000, False, False, True), (500, True, False, False)],
)
def test_resolve_auto_reads_the_records_only_for_a_run_whose_length_leaves_the_choice_to_them(
    steps, recorded, asked, compiles, capsys
):
    model = tiny_model(sampler=RandomSampler(tasks=2))  # capture "auto"
    questions = []

    def compiled_before_here():
        questions.append(True)
        return recorded

    trainer = SimpleNamespace(estimated_stepping_batches=steps, world_size=1)
    model.captured_step.resolve_auto(trainer, torch.device("cuda"), compiled_before_here)  # a device object only
    assert bool(questions) == asked
    assert model.engine.capture == ("compile" if compiles else "auto")
    printed = capsys.readouterr().out  # printed, not logged: the command line's quiet display hides Lightning's info
    assert ("compiled on this machine before" in printed) == (compiles and recorded)
    assert ("capture auto: compiling" in printed) == compiles


def test_records_round_trip_in_the_compile_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(tmp_path / "cache"))
    signature, description = run_signature({"episodes": {"spec": (5, 1, 1)}, "device": "NVIDIA H200 (9, 0)"})
    other, _ = run_signature({"episodes": {"spec": (20, 1, 1)}, "device": "NVIDIA H200 (9, 0)"})
    assert signature != other and not compiled_before(signature)
    path = record_compiled(signature, description)
    assert compiled_before(signature) and not compiled_before(other)
    assert path.parent == tmp_path / "cache" / "units-lightning-compiled"
    written = json.loads(path.read_text())
    assert written["torch"] == torch.__version__ and written["episodes"] == {"spec": [5, 1, 1]}
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it


def test_a_cache_folder_that_cannot_hold_records_reads_as_no_record_and_refuses_to_write_one(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(blocked))
    signature, description = run_signature({"device": "cpu"})
    assert not compiled_before(signature)
    with pytest.raises(OSError):  # UnitsMAML.on_train_end warns and lets the fit end as it would have
        record_compiled(signature, description)


def test_a_signature_is_the_same_for_another_seed_or_learning_rate_and_differs_for_other_shapes_or_losses(tmp_path):
    base, description = signature_of_a_fit(tmp_path / "base")
    spec = description["episodes"]["spec"]
    assert (spec["n_way"], spec["k_shot"], spec["query_shots"]) == (5, 1, 1) and description["device"] == "cpu"
    assert description["loss"]["type"] == "units_lightning.losses.EvidentialLoss"
    pl.seed_everything(7)
    same = signature_of_a_fit(tmp_path / "seed", {"seed": 7}, lr=0.01, capture="none", loss=EvidentialLoss())
    assert same[0] == base
    others = [
        signature_of_a_fit(tmp_path / "ways", {"n_way": 4}, n_way=4),
        signature_of_a_fit(tmp_path / "queries", {"query_shots": 2}),
        signature_of_a_fit(tmp_path / "sets", sampler=MultiQuerySampler(tasks=2, query_sets=3)),
        signature_of_a_fit(tmp_path / "loss", loss=EvidentialLoss(vacuity_weight=0.01)),
        signature_of_a_fit(tmp_path / "steps", inner_steps=2),
    ]
    assert len({base, *(signature for signature, _ in others)}) == 1 + len(others)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: capture 'auto' compiles on CUDA only")
def test_a_compiled_fit_records_its_signature_and_a_shorter_auto_fit_of_it_then_compiles(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(tmp_path / "cache"))
    data = tiny_data(RandomSampler(tasks=2))
    compiled = tiny_model(sampler=data.sampler, capture="compile")
    tiny_trainer(tmp_path / "first", accelerator="cuda", max_steps=2).fit(compiled, data)
    (record,) = (tmp_path / "cache" / "units-lightning-compiled").iterdir()  # taken on the GPU, at the fit's start
    assert json.loads(record.read_text())["device"].startswith(torch.cuda.get_device_name())
    again = tiny_model(sampler=data.sampler)  # capture "auto", too short a run to compile from scratch
    trainer = tiny_trainer(tmp_path / "again", accelerator="cuda", max_steps=WARM_COMPILE_MIN_STEPS)
    trainer.callbacks.append(StopAfterOneStep())
    capsys.readouterr()
    trainer.fit(again, data)
    assert again.engine.capture == "compile" and "compiled on this machine before" in capsys.readouterr().out
