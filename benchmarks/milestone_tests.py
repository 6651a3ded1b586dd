"""Testing the milestone checkpoints of one label-budget run: one ``units-lightning test`` process per checkpoint
(``grid.evaluation_command``, as the paper-tables sweep did) against all of them in one process
(``grid.milestone_tests_command``, ``benchmarks.tables.evaluate``), side by side on the same machine.

A tiny budget-like run is trained first (the quick start's synthetic glyphs, a narrow net, two query sets labeled
per step, a milestone checkpoint every ``--steps-between`` steps); then each round tests its ``--milestones``
checkpoints both ways, in turn, each into a fresh ``test/`` folder, and checks that both ways wrote the same
``results.json``. Printed: the wall time of each way (median, min-max over the rounds) and per checkpoint.

    python benchmarks/milestone_tests.py --milestones 4 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # `python benchmarks/milestone_tests.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from benchmarks.common import REPO, cpu_description, versions  # noqa: E402
from benchmarks.tables import grid  # noqa: E402


def tiny_budget_config(folder: Path, milestones: int, steps_between: int, test_tasks: int) -> Path:
    """The quick start shrunk to seconds, a label budget of two query sets per step and ``milestones`` milestone
    checkpoints ``steps_between`` steps apart (the last at the budget)."""
    config = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    steps = milestones * steps_between
    trainer = config["trainer"]
    trainer.update(max_epochs=1, limit_train_batches=steps, val_check_interval=steps, log_every_n_steps=1)
    trainer.update(enable_progress_bar=False, enable_model_summary=False)
    counts = [2 * steps_between * k for k in range(1, milestones + 1)]
    trainer["callbacks"].append(
        {"class_path": "units_lightning.callbacks.MilestoneCheckpoint", "init_args": {"milestones": counts}}
    )
    config["model"].update(filters=4, inner_steps=1, label_budget=counts[-1])
    data = config["data"]["init_args"]
    data.update(image_size=16, val_tasks=4, test_tasks=test_tasks, eval_batch_tasks=10, eval_query_shots=2)
    data.update(train_classes=40, eval_classes=10, images_per_class=12)
    data["sampler"]["init_args"].update(tasks=2, query_sets=2, warmup_steps=1)
    path = folder / "tiny_budget.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def timed(commands: list[list[str]], environment: dict[str, str]) -> float:
    """Seconds ``commands`` take, one after the other, each a fresh process from the repository.

    Raises:
        RuntimeError: a command that fails, with the end of its output.
    """
    started = time.perf_counter()
    for command in commands:
        done = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{command[:4]} exited with {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return time.perf_counter() - started


def results(run: grid.Run, targets: list[grid.Target]) -> list[dict]:
    return [json.loads((run.folder / "test" / t.name / "results.json").read_text()) for t in targets]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--milestones", type=int, default=4, help="milestone checkpoints to test (the configs: 4)")
    parser.add_argument("--steps-between", type=int, default=2, help="training steps between two milestones")
    parser.add_argument("--test-tasks", type=int, default=20, help="test tasks of each test")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both ways, interleaved")
    parser.add_argument("--keep", type=Path, help="train and test in this folder, kept (default: a temporary one)")
    args = parser.parse_args(argv)

    folder = args.keep or Path(tempfile.mkdtemp(prefix="milestone_tests-"))
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))  # as the sweep gives one run at a time
    environment = {**os.environ, "WANDB_MODE": "offline"}
    options = grid.Options(root=folder / "root", data_root=None)
    config = grid.read_config(tiny_budget_config(folder, args.milestones, args.steps_between, args.test_tasks))
    (run,) = grid.build_grid([config], ["Units-ML"], [0], options.root)
    targets = grid.targets_of(config)
    if not all(grid.milestone_checkpoint(run, t) for t in targets):
        print(f"training the tiny run in {run.folder} ...", flush=True)
        timed([grid.fit_command(run, options)], environment)

    separate = [grid.evaluation_command(run, target, options) for target in targets]
    together = [grid.milestone_tests_command(run, targets, options)]
    ways = {f"{len(targets)} processes (`units-lightning test` each)": separate, "1 process (`evaluate`)": together}
    times: dict[str, list[float]] = {way: [] for way in ways}
    written: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for way, commands in ways.items():
            shutil.rmtree(run.folder / "test", ignore_errors=True)
            times[way].append(timed(commands, environment))
            written[way] = results(run, targets)
    first, second = written.values()
    same = "the same results.json" if first == second else "DIFFERENT results.json"

    print(f"\n{len(targets)} milestone checkpoints of one tiny run, {args.test_tasks} test tasks each; {same}")
    print(f"{args.rounds} rounds; {cpu_description()}; {versions()}\n")
    print("| way | wall time (s), median (min-max) | per checkpoint (s) |\n|---|---|---|")
    for way, values in times.items():
        print(f"| {way} | {spread(values)} | {statistics.median(values) / len(targets):.1f} |")
    print(f"\nsame command again: python benchmarks/milestone_tests.py {' '.join(argv or sys.argv[1:])}".rstrip())
    if args.keep is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
