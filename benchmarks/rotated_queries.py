"""What rotated query sets are predicted as: why rotation probes can score below chance.

Runs ``units-lightning test`` (the probes of ``results.json`` included) on a checkpoint and, from a callback, for
every test task and every angle: the query set rotated (as ``Rotation`` does, the support set unchanged)
predicted from the same adapted model, and, for comparison, two model-free nearest-support classifiers on the same
rotated queries, one on raw pixels (the support image with the smallest L2 distance) and one on elongation only
(the spin-2 second moment of the ink, ``((mu20 - mu02), 2 mu11) / (mu20 + mu02)``, which turns by twice the angle:
a wide glyph rotated by 90 degrees is as tall as it was wide). It also predicts, as a control, the rotated query
set after adapting to the support set rotated by the same angle. It prints, per angle: the model's accuracy, the
fraction of queries whose own class gets the model's lowest logit (1/N by chance), how often the model agrees with
each nearest-support classifier, their accuracies, the mean vacuity, and the control's accuracy.

    .venv/bin/python benchmarks/rotated_queries.py --ckpt_path runs/quickstart/.../checkpoints/<best>.ckpt

Other ``units-lightning test`` arguments follow ``--`` (default config: configs/quickstart.yaml).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from units_lightning.belief import vacuity
from units_lightning.evaluation import Rotation
from units_lightning.ledger import LabelLedger

REPO = Path(__file__).resolve().parents[1]
ANGLES = (0, 30, 60, 90, 120, 150, 180)


def elongation(images: Tensor) -> Tensor:
    """(..., 2) spin-2 second moment of each image's ink: turns by 2 theta when the image turns by theta."""
    height, width = images.shape[-2:]
    ink = images.mean(dim=-3).clamp(min=0)  # (..., H, W)
    ys = torch.arange(height, dtype=ink.dtype)[:, None]
    xs = torch.arange(width, dtype=ink.dtype)[None, :]
    mass = ink.sum((-2, -1)).clamp(min=1e-8)
    cx, cy = (ink * xs).sum((-2, -1)) / mass, (ink * ys).sum((-2, -1)) / mass
    dx, dy = xs - cx[..., None, None], ys - cy[..., None, None]
    mu20, mu02 = (ink * dx**2).sum((-2, -1)) / mass, (ink * dy**2).sum((-2, -1)) / mass
    mu11 = (ink * dx * dy).sum((-2, -1)) / mass
    return torch.stack([mu20 - mu02, 2 * mu11], dim=-1) / (mu20 + mu02).clamp(min=1e-8)[..., None]


def nearest_support(query: Tensor, support: Tensor, support_y: Tensor) -> Tensor:
    """(T, M) label of each query's nearest support item (features flattened, L2)."""
    distance = torch.cdist(query.flatten(2), support.flatten(2))  # (T, M, S)
    return support_y.gather(1, distance.argmin(-1))


class RotatedQueryAnalysis(Callback):
    """Per test batch: rotated query sets through the model and through the nearest-support classifiers."""

    angles = ANGLES
    rows: dict[float, dict[str, list[Tensor]]] = defaultdict(lambda: defaultdict(list))

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        rotation = Rotation(self.angles)
        clean = batch.query_x[:, 0]
        labels = LabelLedger.evaluation_labels(batch)[:, 0]
        rotated = [rotation.shift(clean, angle, torch.Generator()) for angle in self.angles]
        logits = pl_module.adapt_and_predict_sets(batch.support_x, batch.support_y, rotated)
        support_elongation = elongation(batch.support_x)
        for angle, queries, level_logits in zip(self.angles, rotated, logits, strict=True):
            row = RotatedQueryAnalysis.rows[angle]
            prediction = level_logits.argmax(-1)
            row["correct"].append(prediction == labels)
            row["own_class_last"].append(level_logits.argmin(-1) == labels)
            row["vacuity"].append(vacuity(pl_module.loss.evidence(level_logits)))
            pixels = nearest_support(queries, batch.support_x, batch.support_y)
            shape = nearest_support(elongation(queries), support_elongation, batch.support_y)
            row["pixel_nn_correct"].append(pixels == labels)
            row["elongation_nn_correct"].append(shape == labels)
            row["agree_pixel_nn"].append(prediction == pixels)
            row["agree_elongation_nn"].append(prediction == shape)
            if angle in (90, 180):  # the control: support set rotated by the same angle
                support = rotation.shift(batch.support_x, angle, torch.Generator())
                both = pl_module.adapt_and_predict(support, batch.support_y, queries)
                row["both_rotated_correct"].append(both.argmax(-1) == labels)


def report(rows: dict[float, dict[str, list[Tensor]]], n_way: int) -> str:
    columns = [
        ("model acc", "correct"),
        ("own class last", "own_class_last"),
        ("agrees pixel-NN", "agree_pixel_nn"),
        ("agrees elong.-NN", "agree_elongation_nn"),
        ("pixel-NN acc", "pixel_nn_correct"),
        ("elong.-NN acc", "elongation_nn_correct"),
        ("vacuity", "vacuity"),
        ("support rotated too", "both_rotated_correct"),
    ]
    lines = ["| angle | " + " | ".join(name for name, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for angle, row in sorted(rows.items()):
        cells = []
        for _, key in columns:
            if key not in row:
                cells.append("")
                continue
            value = float(torch.cat(row[key]).float().mean())
            cells.append(f"{value:.3f}" if key == "vacuity" else f"{100 * value:.1f}%")
        lines.append(f"| {angle:g} | " + " | ".join(cells) + " |")
    tasks = sum(len(t) for t in rows[min(rows)]["correct"])
    lines.append(f"({tasks} test tasks; chance {100 / n_way:.0f}%; own class last by chance {100 / n_way:.0f}%)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt_path", required=True)
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    parser.add_argument("--root", default="/tmp/units-lightning-rotated-queries", help="run folder of the test")
    parser.add_argument("test_args", nargs="*", help="after --: more `units-lightning test` arguments")
    args = parser.parse_args(argv)

    from units_lightning.cli import cli_main

    sys.argv = sys.argv[:1]  # LightningCLI reads its arguments from args=, not from this script's

    cli = cli_main(
        [
            "test",
            "--config",
            args.config,
            f"--ckpt_path={args.ckpt_path}",
            f"--trainer.default_root_dir={args.root}",
            f"--trainer.logger.init_args.save_dir={args.root}",
            "--trainer.enable_progress_bar=false",
            "--trainer.callbacks+=__main__.RotatedQueryAnalysis",
            *args.test_args,
        ]
    )
    print(report(RotatedQueryAnalysis.rows, cli.model.n_way))


if __name__ == "__main__":
    sys.exit(main())
