"""``ValidationProgress``'s heartbeat between validations: at most one line every 30 s with step, steps/s, elapsed
and ETA, only when its stream is a terminal; quiet in CI logs and pipes."""

import io
from types import SimpleNamespace

from units_lightning.callbacks import ValidationProgress
from units_lightning.callbacks.progress import heartbeat_line


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_trainer(step: int = 0, total: int = 300):
    return SimpleNamespace(
        global_step=step,
        is_global_zero=True,
        estimated_stepping_batches=total,
        val_check_batch=100,
        enable_validation=True,
        sanity_checking=False,
    )


def run(terminal: bool, ticks: list[tuple[float, int]], start_step: int = 0) -> list[str]:
    """Train start at t=0 and step ``start_step``, then one batch end per (seconds, step) in ``ticks``."""
    stream, clock = io.StringIO(), Clock()
    progress = ValidationProgress(stream=stream, clock=clock, isatty=lambda: terminal)
    trainer = fake_trainer(start_step)
    progress.on_train_start(trainer, None)
    for seconds, step in ticks:
        clock.now = 1000.0 + seconds
        trainer.global_step = step
        progress.on_train_batch_end(trainer, None, None, None, step - 1)
    return stream.getvalue().splitlines()[1:]  # after the "training ..." line


def test_one_line_every_30_seconds_on_a_terminal():
    lines = run(True, [(10, 20), (29, 58), (30, 60), (45, 90), (59, 118), (61, 122)])
    assert lines == [
        heartbeat_line(60, 300, 2.0, 30.0),
        heartbeat_line(122, 300, 2.0, 61.0),
    ]
    assert lines[0] == "step 60/300  2.00 steps/s  30 s elapsed  ETA 2 min"


def test_quiet_when_the_stream_is_not_a_terminal():
    assert run(False, [(31, 62), (95, 190)]) == []


def test_a_validation_line_restarts_the_wait():
    stream, clock = io.StringIO(), Clock()
    progress = ValidationProgress(stream=stream, clock=clock, isatty=lambda: True)
    trainer = fake_trainer()
    progress.on_train_start(trainer, None)
    clock.now, trainer.global_step = 1025.0, 50
    progress.print("step 50/300  val acc 50.00%")  # a validation's line (as on_validation_end prints it)
    clock.now, trainer.global_step = 1040.0, 80  # 40 s since the start, 15 since the last line
    progress.on_train_batch_end(trainer, None, None, None, 79)
    assert stream.getvalue().splitlines()[-1] == "step 50/300  val acc 50.00%"


def test_a_resumed_run_counts_its_rate_from_the_step_it_resumed_at():
    (line,) = run(True, [(40, 180)], start_step=100)
    assert line == heartbeat_line(180, 300, 2.0, 40.0)


def test_the_line_without_a_known_length_has_no_eta():
    assert heartbeat_line(60, None, 2.0, 30.0) == "step 60  2.00 steps/s  30 s elapsed"
    assert heartbeat_line(60, 100000, 2.0, 30.0).endswith("ETA 13.9 h")
    assert heartbeat_line(0, 300, 0.0, 30.0) == "step 0/300  0.00 steps/s  30 s elapsed"
