"""``CompileForNextRun``: a fit that ``capture: auto`` steps with CUDA graphs only because it never compiled on this
machine starts a background fit that compiles it, so that the next run of the config compiles from the cache."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from jsonargparse import Namespace
from tiny_setup import QUICKSTART, TINY_QUICKSTART, tiny_model

from units_lightning.cli import compile_next
from units_lightning.cli.compile_next import (
    STALE_SECONDS,
    CompileForNextRun,
    Started,
    child_options,
    marker_is_stale,
    start,
)
from units_lightning.cli.parser import cli_main
from units_lightning.compile_cache import COMPILE_CACHE_VARIABLE, compiled_before, records_directory
from units_lightning.module import UnitsMAML
from units_lightning.samplers import RandomSampler

COMPILE_TESTS = os.environ.get("UNITS_LIGHTNING_COMPILE_TESTS") == "1"


def test_resolve_auto_says_when_a_run_steps_with_cuda_graphs_only_because_it_never_compiled_here():
    trainer = SimpleNamespace(estimated_stepping_batches=5_000, world_size=1)
    for compiled_here, cold in ((False, True), (True, False)):
        model = tiny_model(sampler=RandomSampler(tasks=2))
        assert model.captured_step.resolve_auto(trainer, torch.device("cuda"), lambda c=compiled_here: c) is cold
    for steps, world_size in ((50_000, 1), (500, 1), (5_000, 2)):  # compiles anyway; never would; data-parallel
        model = tiny_model(sampler=RandomSampler(tasks=2))
        trainer = SimpleNamespace(estimated_stepping_batches=steps, world_size=world_size)
        assert model.captured_step.resolve_auto(trainer, torch.device("cuda"), lambda: False) is False
    model = tiny_model(sampler=RandomSampler(tasks=2))
    assert model.captured_step.resolve_auto(trainer, torch.device("cpu"), lambda: False) is False


class FakeProcess:
    started: list[list[str]] = []

    def __init__(self, command, **kwargs):
        self.pid = os.getpid()  # a process that runs: the marker it leaves is not stale
        FakeProcess.started.append(command)
        assert kwargs["start_new_session"] and kwargs["stdin"] is not None


def test_start_runs_one_background_compile_per_signature_and_not_again_after_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setattr(compile_next.subprocess, "Popen", FakeProcess)
    FakeProcess.started = []
    said, process = start("abc", "model: {}\n", ["--model.capture=compile"])
    folder = records_directory()
    assert f"process {os.getpid()}" in said and str(folder / "abc.log") in said and process is not None
    assert (folder / "abc.compiling").read_text() == f"{os.getpid()} {socket.gethostname()}\n"
    assert (folder / "abc.yaml").read_text() == "model: {}\n"
    command = FakeProcess.started[0]
    assert command[1:] == ["-m", "units_lightning.cli.background_fit", "abc", str(folder / "abc.yaml"), *command[5:]]
    assert command[5:] == ["--model.capture=compile"]

    said, process = start("abc", "", [])  # a second run of the sweep: not twice
    assert "another process compiles" in said and process is None and len(FakeProcess.started) == 1
    (folder / "abc.compiling").write_text(f"{os.getpid()} another-host\n")  # a cache shared by hosts: by its age
    assert "another process compiles" in start("abc", "", []).said
    old = time.time() - STALE_SECONDS - 1
    os.utime(folder / "abc.compiling", (old, old))  # left by a killed machine
    assert f"process {os.getpid()}" in start("abc", "", []).said
    assert len(FakeProcess.started) == 2

    (folder / "abc.compiling").unlink()
    (folder / "abc.failed").write_text("see the log\n")
    said, process = start("abc", "", [])
    assert "failed" in said and "delete it to try again" in said and len(FakeProcess.started) == 2 and process is None


def test_a_marker_whose_process_is_gone_from_this_host_is_stale_at_once(tmp_path):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # its pid names no process now (the system does not reuse it this soon)
    marker = tmp_path / "abc.compiling"
    marker.write_text(f"{ended.pid} {socket.gethostname()}\n")  # a batch job's end killed it, say
    assert marker_is_stale(marker)
    marker.write_text(f"{os.getpid()} {socket.gethostname()}\n")
    assert not marker_is_stale(marker)
    assert not marker_is_stale(marker, now=time.time() + STALE_SECONDS + 1)  # its process runs: whatever its age
    marker.write_text("")  # being written: by its age
    assert not marker_is_stale(marker) and marker_is_stale(marker, now=time.time() + STALE_SECONDS + 1)
    assert marker_is_stale(tmp_path / "gone.compiling")


def test_the_background_fit_adds_its_options_after_the_config_and_keeps_the_run_that_started_it_apart():
    options = child_options(100, 3)
    assert "--model.capture=compile" in options and "--trainer.max_steps=104" in options
    assert "--trainer.devices=[3]" in options and "--trainer.logger=false" in options
    assert "--compile_for_next_run=false" in options  # it starts no background compile of its own
    assert "--ckpt_path=null" in options  # a resumed run's checkpoint is not continued
    assert not any(o.startswith("--trainer.devices") for o in child_options(0, None))


@pytest.mark.parametrize("cold", [True, False])
def test_the_callback_starts_it_once_at_the_first_step_of_a_cold_run_only(cold, monkeypatch, capsys):
    calls = []
    running = SimpleNamespace(pid=77, poll=lambda: None)  # the background fit, still running at the run's end
    monkeypatch.setattr(compile_next, "start", lambda *args: calls.append(args) or Started("started", running))
    parser = SimpleNamespace(dump=lambda config, skip_none: f"dumped {config.as_dict()}")
    config = Namespace(model=Namespace(lr=0.1), trainer=Namespace(callbacks=[Namespace(class_path="__main__.Timer")]))
    callback = CompileForNextRun(parser, config)
    module = SimpleNamespace(
        compiles_once_warm=cold, compile_signature=lambda: ("sig", {}), sampler=SimpleNamespace(warmup_steps=100),
        device=torch.device("cpu"),
    )  # fmt: skip
    trainer = SimpleNamespace(is_global_zero=True)
    for index in range(3):
        callback.on_train_batch_start(trainer, module, None, index)
    assert len(calls) == (1 if cold else 0)
    printed = capsys.readouterr().out  # printed: the quiet display hides Lightning's info messages
    assert ("capture auto: CUDA graphs for this run" in printed and "; started." in printed) == cold
    callback.on_fit_end(trainer, module)  # the run ends before the background fit: it says so
    assert ("(process 77) is still running" in capsys.readouterr().out) == cold
    running.poll = lambda: 0
    callback.on_fit_end(trainer, module)
    assert capsys.readouterr().out == ""
    if cold:
        signature, text, options = calls[0]
        assert signature == "sig" and "--trainer.max_steps=104" in options
        # without the run's callbacks: one defined in a script (a benchmark's timer) cannot be imported there
        assert text == "dumped {'model': {'lr': 0.1}, 'trainer': {'callbacks': None}}"
        assert len(config.trainer.callbacks) == 1  # the run's own config is left as it was


def cold_on_this_machine(self):
    """``UnitsMAML.on_train_start`` as on a GPU whose compile cache lacks the run's signature."""
    self._signature = self.compile_signature()
    self.compiles_once_warm = True


def fit_that_starts_the_background_compile(tmp_path, monkeypatch, then: list[str]) -> tuple[Path, str]:
    """A real ``units-lightning fit`` of the tiny quick start, cold as on a GPU; the background fit it starts runs
    with ``then`` after its own options. Returns the records folder, once that fit has ended, and the signature of
    the run that started it."""
    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setenv("UNITS_LIGHTNING_CACHE", str(tmp_path / "data-cache"))
    monkeypatch.setattr(UnitsMAML, "on_train_start", cold_on_this_machine)
    options = child_options
    monkeypatch.setattr(compile_next, "child_options", lambda *args: [*options(*args), *then])
    cli = cli_main(
        ["fit", "--config", str(QUICKSTART), *TINY_QUICKSTART, "--trainer.max_steps=2", "--trainer.logger=false",
         f"--trainer.default_root_dir={tmp_path / 'runs'}", "--trainer.limit_val_batches=0"]
    )  # fmt: skip
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, CompileForNextRun))
    assert "compiling it for the next run in the background" in callback.started
    folder, signature = records_directory(), cli.model._signature[0]
    deadline = time.monotonic() + 600
    while (folder / f"{signature}.compiling").exists():
        assert time.monotonic() < deadline, (folder / f"{signature}.log").read_text()[-3000:]
        time.sleep(0.5)
    return folder, signature


def test_a_background_fit_that_does_not_compile_leaves_a_failed_marker_and_cleans_up(tmp_path, monkeypatch):
    # On a CPU the background fit runs the dumped config for real, uncompiled: it records nothing.
    then = ["--model.capture=none", "--trainer.accelerator=cpu", "--trainer.max_steps=2"]
    folder, signature = fit_that_starts_the_background_compile(tmp_path, monkeypatch, then)
    assert [p.name for p in folder.glob("*.failed")] == [f"{signature}.failed"]
    log = (folder / f"{signature}.log").read_text()
    assert "compiling for the next run: units-lightning fit --config" in log
    assert "  steps 2 in " in log, log[-3000:]  # the fit's summary: it trained
    assert not compiled_before(signature) and (folder / f"{signature}.yaml").is_file()
    assert not list(Path(tempfile.gettempdir()).glob(f"units-lightning-compile-{signature}*"))  # its run folder


@pytest.mark.skipif(not COMPILE_TESTS, reason="compiles on the CPU (minutes): UNITS_LIGHTNING_COMPILE_TESTS=1")
def test_a_background_fit_that_compiles_records_the_signature_of_the_run_that_started_it(tmp_path, monkeypatch):
    folder, signature = fit_that_starts_the_background_compile(tmp_path, monkeypatch, ["--trainer.accelerator=cpu"])
    assert compiled_before(signature), (folder / f"{signature}.log").read_text()[-3000:]  # the same signature
    assert not list(folder.glob("*.failed")) and not (folder / f"{signature}.yaml").exists()
    assert "recorded in" in (folder / f"{signature}.log").read_text()
