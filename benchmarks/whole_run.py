"""A whole ``units-lightning fit`` of a config, timed phase by phase, and projected to the config's full length.

It runs the command a user types, in this process (``units_lightning.cli.main(["fit", ...])``: the config's logger,
checkpoints and callbacks), with one callback added (``--trainer.callbacks+=``) that synchronises the device only
every ``--block`` steps, around each validation and at the ends of training. It reports:

- start-up: from this script's first line (before torch and Lightning are imported) to the first training step,
  the sanity check among it; and the end, from the last step to the command's return;
- the steady seconds per step before and from the sampler's warm-up step (selection starts there): medians over
  blocks of ``--block`` steps, validations and the checkpoints after them taken out, the first block of each phase
  left out (capture and compiling happen there);
- each validation (their mean), in parts (to its first batch, its batches and the slowest of them, after its last
  batch), and what follows it until the next step (the checkpoints);
- Python's full (generation 2) garbage collections in training: how many, their seconds, those inside validations;
- the one-off costs (capturing graphs, compiling): the training time that the steady rates, the validations and
  the checkpoints do not explain, split by where it fell: the first block, the block of the warm-up step (where
  scoring starts), and the other blocks (their excess over the median: the host's noise);
- whether Python keeps the modules' bytecode: where ``PYTHONDONTWRITEBYTECODE`` is set (container images often set
  it), every start compiles torch's sources again, 5-6 s of the imports on an H200 host (docs/PERFORMANCE.md);
- what ``torch.compile`` spent in the process (Dynamo's ``compile_times``): in all, tracing the functions, and in
  its backends (AOTAutograd and Inductor, loads from their caches included); the rest of the one-off is capturing
  graphs, the device's first calls and loading kernels;
- under ``compile_ahead``, how many compiled functions were loaded from the cache, compiled here, or compiled as usual
  (where torch could not compile them ahead);
- how the steps ran (CUDA graphs, compiled, eager), and whether the run started compiling itself for the next run
  (``units_lightning.cli.compile_next``: a first budget run on a GPU);
- with ``--hooks N``, the host's time a training step in each of the N costliest Lightning hooks and actions that run
  at every step (Lightning's ``SimpleProfiler``, which adds a little host work of its own). On a GPU the kernels run
  behind the host, so these are what the host spends to launch a step: where their sum exceeds the step's GPU time
  (``benchmarks/step_profile.py``), the host bounds the step and these say where.

With ``--steps N`` shorter than the config's run, the full run is projected from those parts: the one-off costs,
the steady rate of each phase times its steps in the full run, and the full run's validations. On CUDA the run
keeps the capture of the full-length run (``capture: auto`` compiles a run of 20,000 steps or more; a shortened
run would not), as ``benchmarks/fit.py`` does. Options it does not know go to ``units-lightning fit``.

    python benchmarks/whole_run.py --config configs/budget_omniglot_5w1s.yaml --data.root <omniglot>
    python benchmarks/whole_run.py --config configs/omniglot_20w1s.yaml --data.root <omniglot> --steps 3000
"""

from __future__ import annotations

import time

START = time.perf_counter()  # before the imports below: they are part of a command's start-up

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import yaml  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

if not __package__:  # run as `python benchmarks/whole_run.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_name, versions  # noqa: E402
from benchmarks.engines import sync  # noqa: E402
from benchmarks.fit import full_run_capture  # noqa: E402
from units_lightning.cli import main as units_lightning  # noqa: E402
from units_lightning.cli.compile_next import CompileForNextRun  # noqa: E402

IMPORTED = time.perf_counter()


@dataclass
class Record:
    """What ``PhaseTimer`` saw, in seconds since the script started."""

    warmup: int = 0  # the sampler's warm-up steps (0 without one): selection from this step on
    val_interval: int = 0  # steps between validations (0: none during training)
    epoch_steps: float = math.inf  # training batches of an epoch
    max_epochs: float = math.inf
    train_start: float = math.nan
    train_end: float = math.nan
    sanity: float = 0.0  # the sanity check's validation batches
    marks: list[tuple[int, float]] = field(default_factory=list)  # (global step, time) every block
    validations: list[tuple[int, float]] = field(default_factory=list)  # (after global step, seconds)
    after_validations: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds to the next step)
    steps: int = 0
    capture: str = ""  # how the steps ran (``steps_ran``)
    for_next_run: str = ""  # what CompileForNextRun said (empty where it did nothing)
    hooks: list[tuple[str, float]] = field(default_factory=list)  # (action, host ms a step), costliest first
    # Python's full (generation 2) garbage collections in training: (global step, seconds, during a validation)
    collections: list[tuple[int, float, bool]] = field(default_factory=list)
    # each validation in parts: (step, to its first batch, its batches, its slowest batch, after its last batch)
    validation_parts: list[tuple[int, float, float, float, float]] = field(default_factory=list)


RECORDS: list[Record] = []
BLOCK = 100  # ``--block``: steps between the marks of every ``PhaseTimer``


class PhaseTimer(Callback):
    """Marks the device-synchronised time every ``block`` steps and around validations (see the module)."""

    def __init__(self, block: int | None = None):
        self.block = block or BLOCK
        self.record = Record()
        RECORDS.append(self.record)
        self._validation_start: float | None = None
        self._validation_end: tuple[int, float] | None = None
        self._step, self._collecting = 0, None
        # the current validation's batches, (start, end) each, marked on the device's timeline (``_mark``)
        self._batches: list[list[Any]] = []
        self._origin: Any = None  # the mark at the validation's start

    def _collection(self, phase: str, info: dict) -> None:  # a ``gc.callbacks`` entry: times the full collections
        if info["generation"] != 2:
            return
        if phase == "start":
            self._collecting = time.perf_counter()
        elif self._collecting is not None:
            seconds, self._collecting = time.perf_counter() - self._collecting, None
            self.record.collections.append((self._step, seconds, self._validation_start is not None))

    @staticmethod
    def _now(pl_module) -> float:
        sync(pl_module.device)
        return time.perf_counter() - START

    @staticmethod
    def _mark(pl_module) -> Any:
        """A point on the device's timeline without waiting for the device (a recorded CUDA event; elsewhere, the
        clock): marking every validation batch with ``_now`` would stop the host queueing the next one."""
        if pl_module.device.type != "cuda":
            return time.perf_counter() - START
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _at(self, mark: Any, start: float) -> float:
        """A mark's time, the validation's ``start`` being that of ``self._origin`` (call after a synchronisation)."""
        return mark if isinstance(mark, float) else start + self._origin.elapsed_time(mark) / 1000

    def on_train_start(self, trainer, pl_module) -> None:
        self.record.warmup = int(getattr(getattr(pl_module, "sampler", None), "warmup_steps", 0) or 0)
        every = getattr(trainer, "val_check_batch", None)
        self.record.val_interval = every if isinstance(every, int) and every < math.inf else 0
        self.record.epoch_steps = trainer.num_training_batches
        self.record.max_epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else math.inf
        self.record.train_start = self._now(pl_module)
        gc.callbacks.append(self._collection)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = self._step = trainer.global_step
        if self._validation_end is not None:
            at, ended = self._validation_end
            self.record.after_validations.append((at, self._now(pl_module) - ended))
            self._validation_end = None
        if step % self.block == 0:
            self.record.marks.append((step, self._now(pl_module)))

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validation_start = self._now(pl_module)
        self._origin, self._batches = self._mark(pl_module), []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._batches.append([self._mark(pl_module), None])

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batches[-1][1] = self._mark(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        now = self._now(pl_module)
        start, self._validation_start = self._validation_start, None
        if trainer.sanity_checking:
            self.record.sanity += now - start
            return
        self.record.validations.append((trainer.global_step, now - start))
        if self._batches:
            batches = [(self._at(first, start), self._at(last, start)) for first, last in self._batches]
            spans = [end - begin for begin, end in batches]
            parts = (batches[0][0] - start, sum(spans), max(spans), now - batches[-1][1])
            self.record.validation_parts.append((trainer.global_step, *parts))
        self._validation_end = (trainer.global_step, now)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._collection in gc.callbacks:
            gc.callbacks.remove(self._collection)
        self.record.steps = trainer.global_step
        self.record.capture = steps_ran(getattr(getattr(pl_module, "engine", None), "capture", None), pl_module.device)
        said = (c.started for c in trainer.callbacks if isinstance(c, CompileForNextRun) and c.started)
        self.record.for_next_run = next(said, "")
        self.record.hooks = per_step_actions(getattr(trainer, "profiler", None), trainer.global_step)
        self.record.train_end = self._now(pl_module)
        if not self.record.marks or self.record.marks[-1][0] != self.record.steps:
            self.record.marks.append((self.record.steps, self.record.train_end))


def per_step_actions(profiler: object, steps: int) -> list[tuple[str, float]]:
    """(action, host milliseconds per training step) of a ``SimpleProfiler``'s actions that ran at about every step
    (at least 90% as many times as there were steps, at most twice as many), costliest first; empty for any other
    profiler or before a step."""
    durations = getattr(profiler, "recorded_durations", None)
    if not isinstance(durations, dict) or steps <= 0:
        return []
    rows = [(name, 1000 * sum(d) / steps) for name, d in durations.items() if 0.9 * steps <= len(d) <= 2 * steps]
    return sorted(rows, key=lambda row: -row[1])


def _blocks(record: Record) -> Iterator[tuple[int, int, float]]:
    """``(first step, last step, seconds)`` of each block between two marks, less the validations and the checkpoints
    after them that fell inside it (time that belongs to no step)."""
    spent_after = {step: seconds for step, seconds in record.after_validations}
    breaks = [(step, seconds + spent_after.get(step, 0.0)) for step, seconds in record.validations]
    for (first, start), (last, end) in zip(record.marks, record.marks[1:], strict=False):
        if last > first:
            yield first, last, end - start - sum(seconds for step, seconds in breaks if first < step <= last)


def steady_seconds(record: Record) -> dict[str, float | None]:
    """Median seconds per step of the blocks wholly before and wholly from the warm-up step, validations and the
    time after them (checkpoints) taken out, the first block of each phase left out. None: no such block."""
    phases: dict[str, list[float]] = {"warmup": [], "scoring": []}
    for first, last, seconds in _blocks(record):
        per_step = seconds / (last - first)
        if last <= record.warmup and first > 0:
            phases["warmup"].append(per_step)
        elif first >= record.warmup and first != record.warmup:
            phases["scoring"].append(per_step)
    return {phase: statistics.median(values) if values else None for phase, values in phases.items()}


def one_off_parts(record: Record, warm_rate: float, scoring_rate: float) -> dict[str, float]:
    """The one-off cost split by where it fell: before and in the first block (the first capture, loading or
    compiling the inner loop), in the block that holds the warm-up step (the scoring pass's capture or compile), and
    in every other block (the slow blocks' excess over the steady rates, seconds a step before and from the warm-up
    step: the host's noise). The three add up to ``project``'s ``one_off_s``."""
    parts = {"first_block_s": 0.0, "scoring_block_s": 0.0, "other_blocks_s": 0.0}
    if record.marks:  # from the start of training to the first step: the loader's first batch
        parts["first_block_s"] += record.marks[0][1] - record.train_start
    for first, last, seconds in _blocks(record):
        warm_steps = max(0, min(last, record.warmup) - first)
        excess = seconds - warm_steps * warm_rate - (last - first - warm_steps) * scoring_rate
        if first == record.marks[0][0]:
            parts["first_block_s"] += excess
        elif first <= record.warmup < last:
            parts["scoring_block_s"] += excess
        else:
            parts["other_blocks_s"] += excess
    return parts


def validations_in(steps: float, val_interval: int, epoch_steps: float) -> int:
    """Validations of a run of ``steps`` steps that validates every ``val_interval`` steps of each epoch."""
    if not val_interval or math.isinf(steps):
        return 0
    if math.isinf(epoch_steps) or epoch_steps <= 0:
        return int(steps // val_interval)
    whole, rest = divmod(steps, epoch_steps)
    return int(whole * (epoch_steps // val_interval) + rest // val_interval)


def full_run_steps(record: Record, max_steps: int | None) -> float:
    """Steps of the full run: the config's ``max_steps`` (before ``--steps`` replaced it), at most its epochs."""
    by_epochs = record.max_epochs * record.epoch_steps
    return min(max_steps, by_epochs) if max_steps and max_steps > 0 else by_epochs


def project(record: Record, full_steps: float, end: float) -> dict[str, float | None]:
    """The measured run in parts, and the run of ``full_steps`` steps projected from them (see the module)."""
    steady = steady_seconds(record)
    warm, scoring = steady["warmup"], steady["scoring"]
    if scoring is None and max(record.steps, full_steps) > record.warmup:
        raise SystemExit(
            f"no steady block of steps from the warm-up step {record.warmup} on: give --steps at least "
            f"{record.warmup + 3 * BLOCK} (the first block after it is left out), or a smaller --block"
        )
    full_validations = validations_in(full_steps, record.val_interval, record.epoch_steps)
    if full_validations and not record.validations:
        raise SystemExit(
            f"no validation was measured, and the full run has {full_validations}: give --steps at least "
            f"{record.val_interval} (the steps between validations)"
        )
    # Means, not medians: validations can vary from one to the next (they took 0.22-0.45 s or 0.75-0.95 s in compiled
    # omniglot_20w1s runs on an H200 before a3873d1, the metrics' ranking on a busy CPU), and a median lands on either.
    validation = statistics.fmean(s for _, s in record.validations) if record.validations else 0.0
    after = statistics.fmean(s for _, s in record.after_validations) if record.after_validations else 0.0
    train = record.train_end - record.train_start
    warm_steps = min(record.warmup, record.steps)
    # A missing phase takes the other's rate (no scoring rate means no step from the warm-up step on: refused above).
    warm_rate, scoring_rate = warm or scoring or 0.0, scoring or warm or 0.0
    steady_time = warm_steps * warm_rate + (record.steps - warm_steps) * scoring_rate
    breaks = sum(s for _, s in record.validations) + sum(s for _, s in record.after_validations)
    one_off = train - steady_time - breaks
    full_warm = min(record.warmup, full_steps)
    full_train = (
        one_off
        + full_warm * warm_rate
        + (full_steps - full_warm) * scoring_rate
        + full_validations * (validation + after)
    )
    return {
        "start_up_s": record.train_start,
        "sanity_check_s": record.sanity,
        "steps": record.steps,
        "train_s": train,
        "warmup_step_ms": None if warm is None else 1000 * warm,
        "scoring_step_ms": None if scoring is None else 1000 * scoring,
        "validations": len(record.validations),
        "validation_s": validation,
        "after_validation_s": after,
        "one_off_s": one_off,
        **one_off_parts(record, warm_rate, scoring_rate),
        "end_s": end,
        "total_s": record.train_end + end,
        "full_steps": full_steps,
        "full_validations": full_validations,
        **validation_parts(record),
        "collections": len(record.collections),
        "collections_s": sum(s for _, s, _ in record.collections),
        "collections_in_validations_s": sum(s for _, s, validating in record.collections if validating),
        "full_total_s": record.train_start + full_train + end,
    }


def validation_parts(record: Record) -> dict[str, float | None]:
    """Means over the validations: seconds to the first batch (the loader's start), in the batches, in the slowest
    batch, and after the last batch (the epoch's metrics, logging, the callbacks before the checkpoints). None each
    without a validation."""
    names = ("validation_to_first_batch_s", "validation_batches_s", "validation_slowest_batch_s", "validation_after_s")
    if not record.validation_parts:
        return dict.fromkeys(names)
    return {name: statistics.fmean(row[i] for row in record.validation_parts) for i, name in enumerate(names, 1)}


def compiler_seconds() -> dict[str, float | None]:
    """Seconds ``torch.compile`` spent in this process so far, from Dynamo's ``compile_times``: in all (Dynamo's entry,
    its backends included), tracing bytecode, and in the backends (AOTAutograd and Inductor, loads from their caches
    included). None each where nothing compiled through Dynamo's entry (Dynamo not even imported; or every function
    compiled ahead, ``compile_ahead``, which Dynamo does not count there)."""
    none: dict[str, float | None] = {"compiler_s": None, "tracing_s": None, "backends_s": None}
    if "torch._dynamo" not in sys.modules:
        return none
    from torch._dynamo.utils import compile_times

    names, values = compile_times(repr="csv", aggregate=True)
    times = {name: float(value) for name, value in zip(names, values, strict=True)}
    if not times.get("_compile.compile_inner"):
        return none
    return {
        "compiler_s": times["_compile.compile_inner"],
        "tracing_s": times.get("bytecode_tracing"),
        "backends_s": times.get("OutputGraph.call_user_compiler"),
    }


def ahead_counts() -> dict[str, int | None]:
    """What ``compile_ahead`` did in this process (``units_lightning.engines.ahead.COUNTS``): artifacts loaded from
    the compile cache, artifacts compiled (and saved) here, and functions compiled as usual where torch could not
    compile them ahead. None each where nothing was compiled ahead."""
    counts = getattr(sys.modules.get("units_lightning.engines.ahead"), "COUNTS", None)
    if not counts or not sum(counts.values()):
        return {"ahead_loaded": None, "ahead_compiled": None, "ahead_as_usual": None}
    return {
        "ahead_loaded": counts["loaded"],
        "ahead_compiled": counts["compiled"],
        "ahead_as_usual": counts["as usual"],
    }


def main(argv: list[str] | None = None) -> dict[str, float | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the config to run, e.g. configs/omniglot_20w1s.yaml")
    parser.add_argument("--steps", type=int, help="stop after this many steps and project the full run")
    parser.add_argument("--block", type=int, default=100, help="steps between synchronised marks")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--hooks", type=int, default=0, metavar="N", help="list the N hooks that cost the host most a step (profiled)"
    )
    args, passed = parser.parse_known_args(argv)
    config = yaml.safe_load(Path(args.config).read_text())
    device = (
        "cuda" if torch.cuda.is_available() and _accelerator(config, passed) in (None, "auto", "gpu", "cuda") else "cpu"
    )
    global BLOCK
    BLOCK = args.block
    timer = f"{PhaseTimer.__module__}.PhaseTimer"  # this module, as a script (__main__) or imported
    command = ["fit", "--config", args.config, *passed, f"--trainer.callbacks+={timer}"]
    if args.hooks:
        command += ["--trainer.profiler", "simple"]
    if args.steps is not None:
        command += ["--trainer.max_steps", str(args.steps)]
        capture = full_run_capture(config, device, passed)
        if capture is not None:
            command += ["--model.capture", capture]
    del RECORDS[:]
    argv_before, sys.argv = sys.argv, sys.argv[:1]  # the command is given whole: LightningCLI reads no sys.argv
    try:
        units_lightning(command)
        _finish_wandb()
    finally:
        sys.argv = argv_before
    end = time.perf_counter() - START
    if len(RECORDS) != 1:
        raise SystemExit(f"expected one training run, saw {len(RECORDS)}")
    record = RECORDS[0]
    full_steps = full_run_steps(record, config["trainer"].get("max_steps"))
    figures = project(record, full_steps, end - record.train_end)
    figures = {
        "config": args.config,
        "device": f"{device_name(device)} | {versions()}",
        "imports_s": IMPORTED - START,
        "bytecode_kept": not sys.dont_write_bytecode,
        **figures,
        "capture": record.capture,
        "for_next_run": record.for_next_run,
        **compiler_seconds(),
        **ahead_counts(),
    }
    print(_table(figures))
    if args.hooks:
        print(_hooks_table(record.hooks[: args.hooks], record.steps))
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "record": asdict(record)}, indent=1))
    return figures


def _hooks_table(hooks: list[tuple[str, float]], steps: int) -> str:
    lines = ["", f"host ms a training step, per hook ({steps:,} steps, SimpleProfiler)", "", "| hook | ms a step |"]
    return "\n".join([*lines, "|---|---|", *(f"| {name} | {ms:.3f} |" for name, ms in hooks)])


def _accelerator(config: dict, passed: list[str]) -> str | None:
    """The trainer's accelerator: the last ``--trainer.accelerator`` given, else the config's."""
    found = config["trainer"].get("accelerator")
    for i, word in enumerate(passed):
        if word.startswith("--trainer.accelerator="):
            found = word.split("=", 1)[1]
        elif word == "--trainer.accelerator" and i + 1 < len(passed):
            found = passed[i + 1]
    return found


def _finish_wandb() -> None:
    """End a W&B run as the command's exit would (writing its files), so that the time it takes is counted."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


def steps_ran(capture: str | None, device: torch.device) -> str:
    """How a run's training steps ran, from its engine's capture at the end of training (``auto`` stays ``auto``
    where it did not compile).

    >>> steps_ran("auto", torch.device("cuda")), steps_ran("auto", torch.device("cpu")), steps_ran("compile", None)
    ('CUDA graphs (capture auto)', 'eager (capture auto on a CPU)', 'compiled')
    """
    if capture == "auto":
        return "CUDA graphs (capture auto)" if device.type == "cuda" else "eager (capture auto on a CPU)"
    return {"cuda_graph": "CUDA graphs", "compile": "compiled", "none": "eager"}.get(str(capture), str(capture or "-"))


_BYTECODE = {  # images that set PYTHONDONTWRITEBYTECODE compile every module's source again at every start
    True: "",
    False: " (Python keeps no bytecode here, PYTHONDONTWRITEBYTECODE: each start compiles the sources again)",
}


def _table(f: dict) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    def seconds(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rows = [
        ("imports (torch, Lightning, this package)", f"{f['imports_s']:.1f} s" + _BYTECODE[f["bytecode_kept"]]),
        ("start-up to the first step (imports and sanity check included)", f"{f['start_up_s']:.1f} s"),
        ("sanity check", f"{f['sanity_check_s']:.2f} s"),
        ("steps run / of the full run", f"{f['steps']:,} / {f['full_steps']:,.0f}"),
        ("steady ms a step: warm-up / scoring", f"{ms(f['warmup_step_ms'])} / {ms(f['scoring_step_ms'])}"),
        ("validations: count, s each, s after each (checkpoints)",
         f"{f['validations']}, {f['validation_s']:.3f}, {f['after_validation_s']:.3f}"),
        ("a validation in parts (means): to the first batch / the batches / the slowest batch / after the last",
         " / ".join(seconds(f[key], 3) for key in ("validation_to_first_batch_s", "validation_batches_s",
                                                  "validation_slowest_batch_s", "validation_after_s")) + " s"),
        ("full garbage collections (Python's generation 2) in training: count, s in all, s of them in validations",
         f"{f['collections']}, {f['collections_s']:.2f}, {f['collections_in_validations_s']:.2f}"),
        ("one-off (capture, compiling): the first block / the one of the warm-up step / the other blocks' excess",
         f"{f['one_off_s']:.1f} s: {f['first_block_s']:.1f} / {f['scoring_block_s']:.1f} / "
         f"{f['other_blocks_s']:.1f} s"),
        ("the steps ran; compiling for the next run (units_lightning.cli.compile_next)",
         f"{f['capture'] or '-'}; {f['for_next_run'] or '-'}"),
        ("torch.compile in the run (Dynamo's compile_times): in all / tracing / backends",
         f"{seconds(f['compiler_s'])} / {seconds(f['tracing_s'])} / {seconds(f['backends_s'])} s"),
        ("compile_ahead: artifacts loaded / compiled here / functions compiled as usual",
         " / ".join("-" if f[key] is None else str(f[key]) for key in ("ahead_loaded", "ahead_compiled",
                                                                       "ahead_as_usual"))),
        ("end (after the last step: the summary, W&B's run ending)", f"{f['end_s']:.1f} s"),
        ("**measured, start to end**", f"**{f['total_s']:.1f} s**"),
        (f"**full run projected ({f['full_validations']} validations)**",
         f"**{f['full_total_s']:.1f} s = {f['full_total_s'] / 60:.1f} min**"),
    ]  # fmt: skip
    lines = [f"# {f['config']} | {f['device']}", "", "| | |", "|---|---|"]
    return "\n".join(lines + [f"| {name} | {value} |" for name, value in rows])


if __name__ == "__main__":
    main()
