"""How fast each data module delivers training episodes, against how fast a training step consumes them.

For every dataset in its paper setting (the shipped config's task shape, meta-batch and query sets), this
measures meta-batches per second from the training loader with ``num_workers`` 0 and 2 (after a warm-up
that also builds the decoded cache and starts the workers), and the rate of real ``UnitsMAML`` training
steps on the CPU (second order, 5 inner steps, the config's filters: forward, backward, Adam) on batches
from the same loader. Steps are timed during the sampler's warm-up, where no query set is scored: the
fastest a step gets, hence the strictest ratio. It prints a table and writes it as the "## Data loading"
section of docs/PERFORMANCE.md (other sections of that file are kept).

    python benchmarks/data.py --root ../shared/data
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

if not __package__:  # run as `python benchmarks/data.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, write_section  # noqa: E402
from units_lightning.data import (  # noqa: E402
    CIFARFSDataModule,
    EpisodicDataModule,
    MiniImageNetDataModule,
    OmniglotDataModule,
)
from units_lightning.module import UnitsMAML  # noqa: E402
from units_lightning.samplers import MultiQuerySampler  # noqa: E402

TITLE = "Data loading"
MODULES = {"omniglot": OmniglotDataModule, "cifarfs": CIFARFSDataModule, "miniimagenet": MiniImageNetDataModule}


@dataclass
class Result:
    config: str
    batch: str
    loader_rates: dict[int, float]
    step_rate: float

    @property
    def ratio(self) -> float:
        return min(self.loader_rates.values()) / self.step_rate


def build(config_name: str, root: Path, cache_dir: str | None, workers: int) -> tuple[EpisodicDataModule, dict]:
    """The config's data module (paper task shape and sampler) reading ``root``, and its model options."""
    config = yaml.safe_load((REPO / "configs" / f"{config_name}.yaml").read_text())
    data_args = dict(config["data"]["init_args"])
    sampler_args = data_args.pop("sampler")["init_args"]
    dataset = config["data"]["class_path"].rsplit(".", 1)[1].replace("DataModule", "").lower()
    module = MODULES[dataset]
    data_args.update(root=str(root / dataset), cache_dir=cache_dir, num_workers=workers, val_tasks=1)
    data_args.pop("download", None)
    data = module(sampler=MultiQuerySampler(**sampler_args), **data_args)
    data.setup("fit")
    return data, config["model"]


def loader_rate(data: EpisodicDataModule, warmup: int, batches: int) -> float:
    """Meta-batches per second from the training loader, after ``warmup`` batches."""
    loader = iter(data.train_dataloader())
    for _ in range(warmup):
        next(loader)
    start = time.perf_counter()
    for _ in range(batches):
        next(loader)
    rate = batches / (time.perf_counter() - start)
    del loader
    return rate


def step_rate(data: EpisodicDataModule, model_args: dict, steps: int) -> float:
    """Training steps per second of ``UnitsMAML`` (one warm-up step, then ``steps`` timed)."""
    model = UnitsMAML(
        n_way=data.n_way,
        image_shape=data.image_shape,
        filters=model_args["filters"],
        inner_lr=model_args["inner_lr"],
        inner_steps=model_args["inner_steps"],
    )
    model.sampler = data.sampler
    optimizer = torch.optim.Adam(model.parameters(), lr=model_args["lr"])
    loader = iter(data.train_dataloader())
    elapsed = 0.0
    for step in range(steps + 1):
        batch = next(loader)
        start = time.perf_counter()
        loss = model.training_step(batch, step)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step:
            elapsed += time.perf_counter() - start
    return steps / elapsed


def markdown(results: list[Result], machine: str) -> str:
    lines = [
        f"`python benchmarks/data.py` on {machine}. Meta-batches per second from each data module's training "
        "loader (the paper setting's task shape, meta-batch and 8 query sets; images decoded once and cached), "
        "with 0 and 2 loader workers, against the rate at which real `UnitsMAML` training steps consume them "
        "on the same CPU (second order, 5 inner steps, steps timed before selection starts, i.e. the fastest "
        "steps). Ratio = the slower loader rate / the step rate; at least 5 means loading is never the bottleneck.",
        "",
        "| config | meta-batch | loader, 0 workers (batches/s) | loader, 2 workers (batches/s) | training steps/s "
        "| ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r.config}` | {r.batch} | {r.loader_rates[0]:.1f} | {r.loader_rates[2]:.1f} | "
            f"{r.step_rate:.3f} | {r.ratio:.0f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root", type=Path, default=REPO.parent / "shared" / "data", help="holds omniglot/ cifarfs/ miniimagenet/"
    )
    parser.add_argument("--configs", nargs="+", default=["omniglot_20w1s", "cifarfs_5w5s", "miniimagenet_5w5s"])
    parser.add_argument("--cache-dir", default=None, help="decoded-image cache (default: $UNITS_LIGHTNING_CACHE)")
    parser.add_argument("--batches", type=int, default=50, help="timed loader batches per measurement")
    parser.add_argument("--steps", type=int, default=2, help="timed training steps (after one warm-up step)")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    results = []
    for config in args.configs:
        rates = {}
        for workers in (0, 2):
            data, model_args = build(config, args.root, args.cache_dir, workers)
            rates[workers] = loader_rate(data, warmup=5 if workers else 2, batches=args.batches)
        data, model_args = build(config, args.root, args.cache_dir, 0)
        batch = f"{data.sampler.tasks} x {data.n_way}w{data.spec.k_shot}s, {data.sampler.query_sets} query sets"
        result = Result(config, batch, rates, step_rate(data, model_args, args.steps))
        print(f"{config}: loader {rates[0]:.1f} / {rates[2]:.1f} batches/s (0 / 2 workers), "
              f"steps {result.step_rate:.3f}/s, ratio {result.ratio:.0f}x", flush=True)  # fmt: skip
        results.append(result)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    machine = (
        f"{os.cpu_count()} CPU cores ({platform.machine()}, load average {load:.1f} at the end), torch "
        f"{torch.__version__}, {time.strftime('%Y-%m-%d')}"
    )
    body = markdown(results, machine)
    print(f"## {TITLE}\n\n{body}")
    write_section(args.output, TITLE, body)


if __name__ == "__main__":
    main()
