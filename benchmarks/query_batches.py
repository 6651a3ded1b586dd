"""How the test protocol's query count moves accuracy: the same queries predicted all at once or in small batches.

The backbone's batch norm uses the statistics of the batch it is given, at test time too (transductive, as the
authors' code and MAML++), so a query's prediction depends on the other queries of its batch. The authors test
CIFAR-FS and mini-ImageNet with 2 queries per class, the common protocol (and our configs) with 15. This runs
``units-lightning validate`` (or ``test``) on a checkpoint or an ensemble and, from a callback, predicts every task's
query set once as a whole and once in class-balanced batches of ``c`` images per class for each ``--per-class c``
(the labels only group the queries, as a sampler that draws several query sets of ``c`` per class would; a class
with a remainder puts it into a last, smaller batch). It prints each protocol's accuracy and its paired difference
from the whole set (as the evaluation step itself predicted it), mean and 95% interval over tasks, on the same
queries and the same weights, adapted the same way.

    python benchmarks/query_batches.py --config configs/cifarfs_5w5s.yaml --per-class 1 2 7 -- \\
        --data.root <cifarfs> --data.init_args.eval_query_shots 14 --trainer.accelerator cpu \\
        '--model.ensemble={"class_path":"units_lightning.evaluation.CheckpointEnsemble",
                           "init_args":{"checkpoints":"<run>/checkpoints","top_k":3}}'

Other ``units-lightning`` arguments follow ``--``; ``--stage test`` uses the test tasks (report with them, never
choose with them).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

if not __package__:  # `python benchmarks/query_batches.py`: the callback is named by its importable path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def balanced_batches(labels: Tensor, n_way: int, per_class: int) -> list[Tensor]:
    """(T, M) labels of class-balanced query sets -> index tensors (T, m_j) of batches of ``per_class`` queries of
    each class, in the order the queries of a class appear (the last batch smaller when ``per_class`` does not divide
    the queries of a class)."""
    tasks, queries = labels.shape
    if queries % n_way:
        raise ValueError(f"{queries} queries are not {n_way} classes x the same count: not a class-balanced set")
    by_class = labels.argsort(dim=1, stable=True).view(tasks, n_way, queries // n_way)
    return [by_class[:, :, j : j + per_class].reshape(tasks, -1) for j in range(0, queries // n_way, per_class)]


class QueryBatches(Callback):
    """Per evaluation batch: per-task accuracy of the whole query set and of each batching in ``per_class``."""

    per_class: tuple[int, ...] = (2,)
    rows: dict[str, list[Tensor]] = defaultdict(list)

    def _measure(self, pl_module, outputs, batch) -> None:
        """The whole set is what the evaluation step itself predicted (``outputs``); the batches are predicted here."""
        labels, queries = outputs["labels"], batch.query_x[:, 0]
        self.rows["whole"].append(outputs["correct"].float().mean(1))
        plans = {c: balanced_batches(labels, pl_module.n_way, c) for c in self.per_class}
        sets = [queries[torch.arange(len(queries))[:, None], i] for c in self.per_class for i in plans[c]]
        logits = iter(pl_module.adapt_and_predict_sets(batch.support_x, batch.support_y, sets))
        for c, batches in plans.items():
            correct = torch.zeros_like(labels, dtype=torch.float)
            for index in batches:
                correct.scatter_(1, index, (next(logits).argmax(-1) == labels.gather(1, index)).float())
            self.rows[f"{c} per class"].append(correct.mean(1))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._measure(pl_module, outputs, batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._measure(pl_module, outputs, batch)


def report(rows: dict[str, list[Tensor]]) -> str:
    """Each protocol's accuracy and its paired difference from the whole set (mean, 1.96 x standard error)."""
    whole = torch.cat(rows["whole"])
    lines = ["| queries predicted | accuracy (%) | minus the whole set, paired by task (points) |", "|---|---|---|"]
    for name, values in rows.items():
        accuracy = torch.cat(values)
        difference = accuracy - whole
        interval = 1.96 * difference.std().item() / math.sqrt(len(difference)) if len(difference) > 1 else math.nan
        paired = "" if name == "whole" else f"{100 * difference.mean().item():+.2f} +- {100 * interval:.2f}"
        lines.append(f"| {name} | {100 * accuracy.mean().item():.2f} | {paired} |")
    lines.append(f"({len(whole)} tasks)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--per-class", type=int, nargs="+", default=[2], help="queries of each class in a batch")
    parser.add_argument("--stage", choices=("validate", "test"), default="validate")
    parser.add_argument("--root", default="/tmp/units-lightning-query-batches", help="run folder of the command")
    parser.add_argument("cli_args", nargs="*", help="after --: more `units-lightning` arguments")
    args = parser.parse_args(argv)
    if min(args.per_class) < 1:
        parser.error("--per-class: at least 1 query of each class in a batch")
    from benchmarks.query_batches import QueryBatches as collector  # the class the CLI instantiates, not __main__'s
    from units_lightning.cli import cli_main

    collector.per_class, collector.rows = tuple(args.per_class), defaultdict(list)

    sys.argv = sys.argv[:1]  # LightningCLI reads its arguments from args=, not from this script's
    cli_main(
        [
            args.stage,
            "--config",
            args.config,
            f"--trainer.default_root_dir={args.root}",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.callbacks+=benchmarks.query_batches.QueryBatches",
            *args.cli_args,
        ]
    )
    print(report(collector.rows))


if __name__ == "__main__":
    sys.exit(main())
