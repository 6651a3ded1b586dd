"""``compile_ahead``: compiled functions saved whole in the compile cache and loaded by later runs without tracing.

The float64 case compiles (about a minute on 2 CPU cores), so on the CPU it runs only with
``UNITS_LIGHTNING_COMPILE_TESTS=1``, as ``test_compiled_inner_loop.py``.
"""

import importlib.util
import logging
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from units_lightning.engines.ahead import (
    AheadCompiled,
    ahead_folder,
    aot_compile_enabled,
    load_artifact,
    savable_guards,
)
from units_lightning.engines.base import inner_loop_parameters
from units_lightning.engines.build import build_engine
from units_lightning.losses import EvidentialLoss, ScheduledInnerLoss

_here = Path(__file__)
_spec = importlib.util.spec_from_file_location("compiled_inner_loop", _here.with_name("test_compiled_inner_loop.py"))
compiled_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compiled_loop)
agree, meta_gradient, DEVICES = compiled_loop.agree, compiled_loop.meta_gradient, compiled_loop.DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_a_function_compiled_ahead_loads_without_tracing_and_gives_eagers_meta_gradient_in_float64(
    device, tmp_path, monkeypatch
):
    from torch._dynamo.utils import counters

    with aot_compile_enabled():  # as the engine compiles: Dynamo's switch on (off by default in older torch)
        can_compile_ahead = hasattr(torch.compile(lambda x: x), "aot_compile")
    if not can_compile_ahead:
        pytest.skip(f"torch {torch.__version__} has no torch.compile(...).aot_compile: compile_ahead compiles as usual")
    monkeypatch.setenv("UNITS_LIGHTNING_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr("units_lightning.compile_cache._in_use", None)  # this test's folder, not the process's
    eager = agree.make_engine("batched", "per_layer_per_step", True, capture="none").to(device)
    expected = meta_gradient(eager, device)

    def run():
        engine = agree.make_engine("batched", "per_layer_per_step", True, capture="compile", compile_ahead=True)
        engine = engine.to(device)
        torch._dynamo.reset()
        counters.clear()
        return engine, meta_gradient(engine, device)

    first, ours = run()  # compiles the inner loop and the query prediction ahead, and saves both
    agree.assert_close(ours, expected, f"compiled ahead on {device}")
    adapt, predict = first._compiled_adapt.compiled, first._compiled_predict.compiled
    assert (adapt.compiled, adapt.loaded, predict.compiled, predict.loaded) == (1, 0, 1, 0)
    folders = sorted(p.name.split("-")[0] for p in (tmp_path / "units-lightning-ahead").iterdir())
    assert folders == ["_adapt_all", "_predict_all"]

    second, ours = run()  # a later run (another engine): loads both, traces nothing
    agree.assert_close(ours, expected, f"loaded ahead-compiled functions on {device}")
    adapt, predict = second._compiled_adapt.compiled, second._compiled_predict.compiled
    assert (adapt.compiled, adapt.loaded, predict.compiled, predict.loaded) == (0, 1, 0, 1)
    assert not counters["stats"]["unique_graphs"]  # Dynamo traced no frame

    # Inputs the saved guards reject (fewer tasks): a second artifact, compiled and saved beside the first.
    support_x, support_y, _, _ = (t.to(device) for t in agree.episode())
    second.adapt(support_x[:1], support_y[:1], agree.LOSS, agree.STEPS, create_graph=True)
    assert (second._compiled_adapt.compiled.compiled, len(list(adapt.folder.glob("*.bin")))) == (1, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_an_artifact_saved_for_one_inner_loss_does_not_serve_a_later_run_with_another(device, tmp_path, monkeypatch):
    # the saved guards leave out objects' identities (savable_guards): what tells the losses apart must remain
    monkeypatch.setenv("UNITS_LIGHTNING_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr("units_lightning.compile_cache._in_use", None)
    support_x, support_y, _, _ = (t.to(device) for t in agree.episode())
    support_x = support_x.float()  # float32 as training runs, with the inner loss of UnitsMAML

    def adapt(loss, compile_ahead):
        torch._dynamo.reset()
        capture = "compile" if compile_ahead else "none"
        engine = agree.make_engine("batched", "per_layer_per_step", True, capture=capture, compile_ahead=compile_ahead)
        engine = engine.float().to(device).train()
        inner = ScheduledInnerLoss(loss).to(device)
        inner.set_eta(0.7)
        fast = engine._compiled_adapt(
            inner_loop_parameters(engine.model), support_x, support_y, inner, agree.STEPS, True
        )
        return fast, getattr(engine._compiled_adapt, "compiled", None)

    for number, loss in enumerate([EvidentialLoss(activation="softplus"), EvidentialLoss(activation="relu")]):
        ours, ahead = adapt(loss, True)
        if ahead.fallback is not None:
            pytest.skip(f"torch {torch.__version__} cannot compile this ahead: compile_ahead compiles as usual")
        assert (ahead.compiled, ahead.loaded) == (1, number)  # the softplus artifact was loaded, and refused
        expected, _ = adapt(loss, False)
        for name, weight in expected.items():
            torch.testing.assert_close(ours[name], weight, rtol=1e-5, atol=1e-5, msg=f"{name}, {loss.activation}")


class _Artifact:
    """What ``aot_compile`` returns, as the engine sees it: it accepts every input, answers ``result``, and saves a
    few bytes (noting in ``seen`` whether Dynamo's switch was on)."""

    def __init__(self, result, seen=None):
        self.result, self.seen = result, seen

    def guard_check(self, owner, *args):
        return True

    def __call__(self, owner, *args):
        return self.result

    def save_compiled_function(self, path):
        if self.seen is not None:
            self.seen.append(("save", torch._dynamo.config.enable_aot_compile))
        Path(path).write_bytes(b"artifact")


class _Compiled:
    """``torch.compile``'s result as a torch that cannot compile ahead gives it: it runs the function, and counts."""

    calls: list[str] = []

    def __init__(self, function):
        self.function = function

    def __call__(self, *args):
        self.calls.append(self.function.__name__)
        return self.function(*args)


class _Failing(_Compiled):
    def aot_compile(self, example):
        raise RuntimeError("aot_compile is not enabled")


@pytest.mark.parametrize(
    "compiled, reason",
    [
        (_Failing, "RuntimeError: aot_compile is not enabled"),
        (_Compiled, f"torch {torch.__version__} has no torch.compile(...).aot_compile"),
    ],
    ids=["aot_compile-fails", "no-aot_compile"],
)
def test_where_torch_cannot_compile_ahead_it_compiles_as_usual_and_says_so_once(
    compiled, reason, monkeypatch, tmp_path, caplog
):
    calls = []
    monkeypatch.setattr(_Compiled, "calls", calls)
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: compiled(function))
    counts = Counter()
    monkeypatch.setattr("units_lightning.engines.ahead.COUNTS", counts)
    engine = agree.make_engine("batched", "per_layer_per_step", True, capture="none")
    ahead = AheadCompiled(engine._adapt_all, None, tmp_path / "adapt")
    support_x, support_y, _, _ = agree.episode()
    slow = inner_loop_parameters(engine.model)
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            ahead(slow, support_x, support_y, agree.LOSS, agree.STEPS, True)
    said = [r.getMessage() for r in caplog.records if "cannot be compiled ahead" in r.getMessage()]
    assert len(said) == 1 and f"({reason});" in said[0]
    assert calls == ["_adapt_all", "_adapt_all"] and ahead.fallback is not None
    # A later run (a new AheadCompiled on the folder) compiles as usual at once: no second failed attempt.
    later = AheadCompiled(engine._adapt_all, None, tmp_path / "adapt")
    later(slow, support_x, support_y, agree.LOSS, agree.STEPS, True)
    assert calls == ["_adapt_all"] * 3
    assert len([r for r in caplog.records if "cannot be compiled" in r.getMessage()]) == 1
    assert (tmp_path / "adapt" / "cannot-compile-ahead.txt").read_text() == reason + "\n"
    assert counts == Counter({"as usual": 2})  # this run's function, and the later run's


def test_a_damaged_artifact_is_skipped_and_the_folder_is_keyed_by_function_and_options(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("UNITS_LIGHTNING_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr("units_lightning.compile_cache._in_use", None)
    engine = agree.make_engine("batched", "fixed", False)
    folder = ahead_folder(engine._adapt_all, None)
    assert folder.parent == tmp_path / "units-lightning-ahead" and folder.name.startswith("_adapt_all-")
    assert ahead_folder(engine._adapt_all, {"force_layout_optimization": True}) != folder
    assert ahead_folder(engine._predict_all, None) != folder
    folder.mkdir(parents=True)
    (folder / "torn.bin").write_bytes(b"not a compiled function")
    with caplog.at_level(logging.INFO):
        assert AheadCompiled(engine._adapt_all)._load() == []
    assert any(f"skipped {folder / 'torn.bin'}" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr("units_lightning.engines.ahead.MAX_ARTIFACTS", 1)
    (folder / "kept.bin").write_bytes(b"")
    with caplog.at_level(logging.INFO):
        AheadCompiled(engine._adapt_all, None, folder)._save(object())  # a full folder: nothing saved, and it says so
    assert sorted(p.name for p in folder.iterdir()) == ["kept.bin", "torn.bin"]
    assert any("holds 1 artifacts already" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="compile_ahead must be True or False, got 1"):
        agree.make_engine("batched", "fixed", False, compile_ahead=1)
    with pytest.raises(ValueError, match="compile_ahead applies to the batched engine"):
        build_engine(engine.model, "learn2learn", compile_ahead=True)


def test_dynamos_aot_compile_switch_is_on_while_it_compiles_saves_and_loads_and_restored_after(monkeypatch, tmp_path):
    # older torch (2.11) has torch._dynamo.config.enable_aot_compile off: its torch.compile then gives no aot_compile
    import torch._dynamo

    if not hasattr(torch._dynamo.config, "enable_aot_compile"):
        pytest.skip(f"torch {torch.__version__} has no torch._dynamo.config.enable_aot_compile")
    seen = []

    class Compiled(_Compiled):
        def __init__(self, function):
            super().__init__(function)
            seen.append(("compile", torch._dynamo.config.enable_aot_compile))

        def aot_compile(self, example):
            seen.append(("aot_compile", torch._dynamo.config.enable_aot_compile))
            return _Artifact("ran", seen)

    def load(file):
        seen.append(("load", torch._dynamo.config.enable_aot_compile))
        return _Artifact("ran")

    given = []
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: given.append(kwargs) or Compiled(function))
    monkeypatch.setattr(torch.compiler, "load_compiled_function", load)
    engine = agree.make_engine("batched", "fixed", False, capture="none")
    # the switch as older torch has it (not monkeypatch: its undo deletes the setting, which hides it from torch)
    with torch._dynamo.config.patch(enable_aot_compile=False):
        counts = Counter()
        monkeypatch.setattr("units_lightning.engines.ahead.COUNTS", counts)
        assert AheadCompiled(engine._adapt_all, None, tmp_path)("x") == "ran"  # compiles ahead and saves
        assert counts == Counter(compiled=1)
        assert AheadCompiled(engine._adapt_all, None, tmp_path)("x") == "ran"  # a later run loads it
        assert counts == Counter(compiled=1, loaded=1)
        # saving loads the artifact back once, as a later run will
        assert seen == [("compile", True), ("aot_compile", True), ("save", True), ("load", True), ("load", True)]
        assert torch._dynamo.config.enable_aot_compile is False
    # the guard filter goes with the compile that saves, in a copy of the options (torch.compile pops it)
    options = {"max_autotune": False}
    assert AheadCompiled(engine._predict_all, options, tmp_path / "p")("x") == "ran"
    assert given[-1]["options"] == {"max_autotune": False, "guard_filter_fn": savable_guards}
    assert options == {"max_autotune": False}


def test_an_artifact_keeps_only_the_guards_a_later_process_can_check():
    # torch 2.11 keeps every guard by default and then fails to save: "DICT_VERSION guard cannot be serialized"
    def entry(guard_type, is_global=False, derived=()):
        return SimpleNamespace(guard_type=guard_type, is_global=is_global, derived_guard_types=derived)

    entries = [
        entry("TENSOR_MATCH"),  # the inputs' dtype, device, shape: kept
        entry("TYPE_MATCH"),
        entry("DICT_VERSION"),  # a dict's version in this process
        entry("ID_MATCH"),  # an object's address in this process
        entry("CONSTANT_MATCH", is_global=True),  # a module's global: fixed by the package sources in the key
        entry("TYPE_MATCH", derived=("ID_MATCH",)),
        entry("EQUALS_MATCH", derived=None),
    ]
    assert savable_guards(entries) == [True, True, False, False, False, False, True]


def test_torch_2_11s_load_that_needs_a_trace_under_way_is_retried_inside_one(monkeypatch, tmp_path):
    # torch 2.11 rebuilds guard sources while it unpickles an artifact, and that installs guards
    from torch._guards import TracingContext

    path = tmp_path / "artifact.bin"
    path.write_bytes(b"artifact")
    tries = []

    def load(file):
        tries.append((file.read(), TracingContext.try_get() is not None))
        if len(tries) == 1:
            raise RuntimeError("TracingContext.get() must be called within an ongoing trace.")
        return "loaded"

    monkeypatch.setattr(torch.compiler, "load_compiled_function", load)
    assert load_artifact(path) == "loaded"
    assert tries == [(b"artifact", False), (b"artifact", True)]  # read again from the start, inside a trace
    assert TracingContext.try_get() is None

    def damaged(file):
        raise RuntimeError("invalid load key")

    monkeypatch.setattr(torch.compiler, "load_compiled_function", damaged)
    with pytest.raises(RuntimeError, match="invalid load key"):  # any other failure is the caller's to report
        load_artifact(path)


def test_an_artifact_that_saves_but_does_not_load_serves_this_run_and_later_runs_compile_as_usual(
    monkeypatch, tmp_path, caplog
):
    # what torch 2.11 did before load_artifact's retry: every run would compile ahead again and save one more
    calls = []
    monkeypatch.setattr(_Compiled, "calls", calls)

    class Compiled(_Compiled):
        def __call__(self, *args):
            self.calls.append(self.function.__name__)
            return "compiled as usual"

        def aot_compile(self, example):
            return _Artifact("compiled ahead")

    def load(file):
        raise RuntimeError("TracingContext.get() must be called within an ongoing trace.")

    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: Compiled(function))
    monkeypatch.setattr(torch.compiler, "load_compiled_function", load)
    engine = agree.make_engine("batched", "fixed", False, capture="none")
    folder = tmp_path / "predict"
    with caplog.at_level(logging.INFO):
        assert AheadCompiled(engine._predict_all, None, folder)("x") == "compiled ahead"
    error = "RuntimeError: TracingContext.get() must be called within an ongoing trace."
    reason = f"a saved artifact does not load ({error})"
    assert sorted(p.name for p in folder.iterdir()) == ["cannot-compile-ahead.txt"]  # the artifact is removed
    assert (folder / "cannot-compile-ahead.txt").read_text() == reason + "\n"
    assert any(f"cannot be compiled ahead here ({reason}); later runs" in r.getMessage() for r in caplog.records)
    later = AheadCompiled(engine._predict_all, None, folder)
    assert later("x") == "compiled as usual" and calls == ["_predict_all"]  # plain torch.compile, not one more attempt
