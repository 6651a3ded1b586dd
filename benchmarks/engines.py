"""Meta-training speed of the engines on the paper's six task shapes, measured side by side in one run.

For each shape (5 inner steps, second order, the paper's model: learned per-layer per-step inner rates and
per-step batch norm) and each engine, it times real ``UnitsMAML.training_step`` calls plus backward and
Adam step on random images:

- tasks/s of a Units-NTS step (random sampler, one query set per task);
- peak memory of that step (GPU only);
- the Units-ML step time (8 candidate query sets per task scored, the most uncertain labeled) over the
  Units-NTS step time: the cost of selection.

With ``--capture cuda_graph`` (or ``compile``) the batched engine also runs with its training inner loop
replayed as CUDA graphs (or under ``torch.compile``) and its scoring of candidate query sets compiled
(``compile_scoring: true``; by default a run compiles it where it compiles its inner loop, a long run on one GPU);
the "batched" column is all eager. The capture
and compile times are reported separately (first Units-NTS step, first Units-ML step) and the meta-gradient is
checked against eager with TF32 off (``--no-check`` skips that check: under ``compile`` it compiles twice more).

Usage:
    python benchmarks/engines.py                       # CPU, all shapes, prints the table
    python benchmarks/engines.py --device cuda --capture cuda_graph --check-only   # only the exactness check
    python benchmarks/engines.py --device cuda --capture cuda_graph --write docs/PERFORMANCE.md
    python benchmarks/engines.py --device cuda --capture cuda_graph compile --no-check --shapes omniglot-20w1s
    python benchmarks/engines.py --device cuda --engines batched --capture compile --no-check --shapes omniglot-20w1s \
        --inductor coordinate_descent_tuning=True      # an Inductor setting: compare with a run without it
    python benchmarks/engines.py --device cuda --engines batched --capture compile compile_step --no-check \
        --shapes omniglot-20w1s                        # the inner loop compiled whole, or one step at a time
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

if not __package__:  # run as `python benchmarks/engines.py`: `benchmarks` is imported from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_name, versions, write_section  # noqa: E402
from units_lightning.episode import SealedLabels, TaskBatch  # noqa: E402
from units_lightning.ledger import LabelLedger  # noqa: E402
from units_lightning.module import UnitsMAML  # noqa: E402
from units_lightning.samplers import MultiQuerySampler, RandomSampler  # noqa: E402

QUERY_SETS = 8  # candidate query sets per task in the Units-ML step


@dataclass(frozen=True)
class Shape:
    name: str
    n_way: int
    k_shot: int
    query_shots: int
    meta_batch: int
    image_shape: tuple[int, int, int]
    filters: int


# the suffix of an engine variant's name: the model option it turns on
VARIANTS = {"/folded": "fold_first_norm", "/explicit": "explicit_conv_grads"}

SHAPES = [
    Shape("omniglot-5w1s", 5, 1, 1, 8, (1, 28, 28), 64),
    Shape("omniglot-20w1s", 20, 1, 1, 16, (1, 28, 28), 64),
    Shape("omniglot-20w5s", 20, 5, 1, 16, (1, 28, 28), 64),
    Shape("cifarfs-5w5s-q2", 5, 5, 2, 4, (3, 32, 32), 64),
    Shape("miniimagenet-5w5s-q2", 5, 5, 2, 2, (3, 84, 84), 48),
    Shape("miniimagenet-5w1s-q15", 5, 1, 15, 4, (3, 84, 84), 48),
]


def random_batch(shape: Shape, query_sets: int, device: torch.device, seed: int = 0) -> TaskBatch:
    """Random images with balanced labels in the shapes a data module would deliver."""
    g = torch.Generator().manual_seed(seed)
    t, n = shape.meta_batch, shape.n_way
    support_y = torch.arange(n).repeat(shape.k_shot).expand(t, -1).contiguous()
    query_y = torch.arange(n).repeat(shape.query_shots).expand(t, query_sets, -1).contiguous()
    batch = TaskBatch(
        support_x=torch.randn(t, n * shape.k_shot, *shape.image_shape, generator=g),
        support_y=support_y,
        query_x=torch.randn(t, query_sets, n * shape.query_shots, *shape.image_shape, generator=g),
        query_y=SealedLabels(query_y),
        classes=torch.arange(n).expand(t, -1).contiguous(),
    )
    return TaskBatch(
        batch.support_x.to(device),
        batch.support_y.to(device),
        batch.query_x.to(device),
        batch.query_y.to(device),
        batch.classes.to(device),
    )


def build(
    shape: Shape,
    engine: str,
    device: torch.device,
    capture: str = "none",
    score_precision: str = "float32",
    fold_first_norm: bool = False,
    explicit_conv_grads: bool = False,
) -> UnitsMAML:
    torch.manual_seed(0)
    # "compile_step": compiled one inner step at a time (compile_inner="step") instead of the whole loop
    compile_inner = "step" if capture == "compile_step" else "loop"
    capture = "compile" if capture == "compile_step" else capture
    model = UnitsMAML(
        n_way=shape.n_way,
        image_shape=shape.image_shape,
        filters=shape.filters,
        inner_lr=0.1,
        inner_lr_mode="per_layer_per_step",
        per_step_bn=True,
        fold_first_norm=fold_first_norm,
        explicit_conv_grads=explicit_conv_grads,
        engine=engine,
        capture=capture,
        compile_scoring=capture != "none",
        compile_inner=compile_inner,
        score_precision=score_precision,
        inner_steps=5,
    ).to(device)
    model.sampler = RandomSampler(shape.meta_batch)
    return model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step(model: UnitsMAML, batch: TaskBatch, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad(set_to_none=True)
    model.ledger = LabelLedger(None)
    model.training_step(batch, 0)["loss"].backward()
    optimizer.step()


def time_steps(
    models: dict[str, UnitsMAML], batch: TaskBatch, device: torch.device, warmup: int, repeats: int
) -> dict[str, float]:
    """Median seconds per training step of each model after ``warmup`` untimed steps, the models taking turns
    step by step, so that a shared machine's drift falls on all of them alike."""
    optimizers = {name: model.configure_optimizers() for name, model in models.items()}  # as fit: fused on CUDA
    for _ in range(warmup):
        for name, model in models.items():
            step(model, batch, optimizers[name])
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            start = time.perf_counter()
            step(model, batch, optimizers[name])
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def first_step(model: UnitsMAML, batch: TaskBatch, device: torch.device) -> float:
    """Seconds of one step, capture and compilation included when it is the model's first of this kind."""
    start = time.perf_counter()
    step(model, batch, torch.optim.Adam(model.parameters(), lr=1e-3))
    sync(device)
    return time.perf_counter() - start


def meta_gradient(model: UnitsMAML, batch: TaskBatch) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    model.ledger = LabelLedger(None)
    model.training_step(batch, 0)["loss"].backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def one_meta_gradient(shape: Shape, device: torch.device, capture: str, dtype: torch.dtype) -> torch.Tensor:
    """The meta-gradient of one batch in ``dtype``: eager for ``capture="none"``, else from the replay."""
    batch = random_batch(shape, 1, device, seed=1)
    batch = TaskBatch(batch.support_x.to(dtype), batch.support_y, batch.query_x.to(dtype), batch.query_y, batch.classes)
    model = build(shape, "batched", device, capture).to(dtype)
    for _ in range(1 if capture == "none" else 2):  # capture, then replay
        gradient = meta_gradient(model, batch)
    return gradient.double()


def capture_check(shape: Shape, device: torch.device, capture: str) -> tuple[float, float, float]:
    """Errors of the meta-gradient against eager float64, TF32 off: eager float32, replayed float32, replayed
    float64. The replay is right when its float32 error matches eager's and its float64 error is rounding."""
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        truth = one_meta_gradient(shape, device, "none", torch.float64)
        runs = [("none", torch.float32), (capture, torch.float32), (capture, torch.float64)]
        errors = [one_meta_gradient(shape, device, c, d) - truth for c, d in runs]
        return tuple(float(e.norm() / truth.norm()) for e in errors)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def release(device: torch.device) -> float:
    """Free cached memory; return what stays reserved (the baseline of the next measurement)."""
    gc.collect()
    if device.type != "cuda":
        return 0.0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_reserved(device)


def engine_names(args: argparse.Namespace) -> list[str]:
    """The engines to time, learn2learn (the baseline) first, then eager batched, then its capture variants; with
    ``--fold-first-norm`` each batched one again with the first batch norm folded into its convolution ("/folded"),
    with ``--explicit-conv-grads`` each batched one with the convolutions' explicit gradients ("/explicit"); with both,
    also each with both ("/folded/explicit", as the Omniglot configs)."""
    names = [e for e in ["learn2learn", "batched"] if e in args.engines] + [f"batched+{c}" for c in args.capture]
    batched = [e for e in names if e != "learn2learn"]
    chosen = [suffix for suffix, option in VARIANTS.items() if getattr(args, option)]
    suffixes = chosen + (["".join(chosen)] if len(chosen) > 1 else [])
    return names + [f"{e}{suffix}" for suffix in suffixes for e in batched]


def variant(engine: str) -> tuple[str, str, dict[str, bool]]:
    """An engine name's kind, capture and model options: "batched+cuda_graph/folded" is ("batched", "cuda_graph",
    {"fold_first_norm": True}); "batched/folded/explicit" sets both options."""
    name, *suffixes = engine.split("/")
    kind, _, capture = name.partition("+")
    return kind, capture, {VARIANTS["/" + suffix]: True for suffix in suffixes}


def run(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    engines = engine_names(args)
    rows = []
    for shape in [s for s in SHAPES if not args.shapes or s.name in args.shapes]:
        row: dict = {"shape": shape, "tasks_per_s": {}, "memory": {}, "ml_over_nts": {}}
        for capture in args.capture:  # the errors of capture_check, or None for each where not checked
            errors = (None, None, None) if args.no_check else capture_check(shape, device, capture)
            row.setdefault("capture", {})[capture] = errors
        # On CPU the engines take turns step by step; on GPU they run one after the other, so that each one's
        # peak memory is its own.
        groups = [] if args.check_only else [engines] if device.type == "cpu" else [[e] for e in engines]
        for group in groups:
            baseline = release(device)
            # One model per engine (a captured one captures once); the sampler decides NTS or Units-ML.
            models = {}
            for engine in group:
                kind, capture, options = variant(engine)
                models[engine] = build(shape, kind, device, capture or "none", args.score_precision, **options)
            nts_batch, ml_batch = random_batch(shape, 1, device), random_batch(shape, QUERY_SETS, device)
            first_nts = {engine: first_step(model, nts_batch, device) for engine, model in models.items()}
            nts = time_steps(models, nts_batch, device, args.warmup, args.repeats)
            memory = None if device.type != "cuda" else (torch.cuda.max_memory_reserved(device) - baseline) / 2**20
            for model in models.values():
                model.sampler = MultiQuerySampler(tasks=shape.meta_batch, query_sets=QUERY_SETS)
            first_ml = {engine: first_step(model, ml_batch, device) for engine, model in models.items()}
            ml = time_steps(models, ml_batch, device, args.warmup, args.repeats)
            del models
            for engine in group:
                _, capture, options = variant(engine)
                if capture and not options:  # the capture check is of the plain model
                    row["capture"][capture] = (first_nts[engine], first_ml[engine], *row["capture"][capture])
                row["tasks_per_s"][engine] = shape.meta_batch / nts[engine]
                row["memory"][engine] = memory
                row["ml_over_nts"][engine] = ml[engine] / nts[engine]
                print(
                    f"{shape.name:24s} {engine:16s} {shape.meta_batch / nts[engine]:8.2f} tasks/s  "
                    f"Units-ML/NTS {ml[engine] / nts[engine]:5.2f}",
                    file=sys.stderr,
                    flush=True,
                )
        rows.append(row)
    return rows


def table(rows: list[dict], engines: list[str]) -> str:
    head = ["shape (meta-batch)"]
    head += [f"{e} tasks/s" for e in engines] + [f"{e} / l2l" for e in engines[1:]]
    head += [f"{e} peak MiB" for e in engines] + [f"{e} ML/NTS" for e in engines]
    timed = [row for row in rows if row["tasks_per_s"]]  # none with --check-only
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] if timed else []
    for row in timed:
        rate, memory, ratio = row["tasks_per_s"], row["memory"], row["ml_over_nts"]
        cells = [f"{row['shape'].name} ({row['shape'].meta_batch})"]
        cells += [f"{rate[e]:.2f}" for e in engines]
        base = rate.get("learn2learn")
        cells += [f"{rate[e] / base:.2f}x" if base else "n/a" for e in engines[1:]]
        cells += ["n/a" if memory[e] is None else f"{memory[e]:.0f}" for e in engines]
        cells += [f"{ratio[e]:.2f}" for e in engines]
        lines.append("| " + " | ".join(cells) + " |")
    if any("capture" in row for row in rows):
        lines += [
            "",
            "| shape | capture | first Units-NTS step (capture) s | first Units-ML step (scoring compile) s "
            "| error of eager float32 | error of replay float32 | error of replay float64 |",
        ]
        lines += ["|---|---|---|---|---|---|---|"]
        for r in rows:
            for c, check in r.get("capture", {}).items():
                firsts = [f"{t:.1f}" for t in check[:-3]] or ["not timed", "not timed"]
                errors = ["not checked" if e is None else f"{e:.1e}" for e in check[-3:]]
                lines.append("| " + " | ".join([r["shape"].name, c, *firsts, *errors]) + " |")
    return "\n".join(lines)


def environment(device: torch.device) -> str:
    return f"device: {device_name(str(device))}; {versions(', ')}; cuDNN benchmark {torch.backends.cudnn.benchmark}"


def inductor_settings(pairs: list[str]) -> dict[str, bool | int | float | str]:
    """``--inductor KEY=VALUE`` pairs as ``torch._inductor.config`` settings (``triton.max_tiles=3``: a nested one),
    each value read as a Python literal (``True``, ``4``) or else kept as text. A key the installed torch does not
    have is refused, so that a typo does not time the default under another name."""
    import ast

    import torch._inductor.config as inductor

    settings: dict[str, bool | int | float | str] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--inductor {pair!r}: give KEY=VALUE, e.g. coordinate_descent_tuning=True")
        owner: object = inductor
        *path, leaf = key.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, leaf):
            raise ValueError(f"--inductor {pair!r}: torch {torch.__version__} has no torch._inductor.config.{key}")
        try:
            settings[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            settings[key] = text
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", nargs="*", help="subset of: " + " ".join(s.name for s in SHAPES))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--capture",
        nargs="*",
        default=[],
        choices=["cuda_graph", "compile", "compile_step"],
        help="also time these batched variants (compile_step: compile_inner=step, one inner step a compiled graph)",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["learn2learn", "batched"],
        choices=["learn2learn", "batched"],
        help="eager engines to time (one per process keeps a large CPU run within memory: freed memory is not "
        "always returned to the system)",
    )
    parser.add_argument(
        "--check-only", action="store_true", help="only check the --capture variants against eager, no timing"
    )
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="time the --capture variants without checking them against eager first (under compile the check "
        "compiles twice more, minutes each)",
    )
    parser.add_argument("--cudnn-benchmark", action="store_true")
    parser.add_argument(
        "--fold-first-norm",
        action="store_true",
        help="also time every batched variant with model.fold_first_norm (the first batch norm's statistics folded "
        "into its convolution), side by side with the plain one; learn2learn stays the plain model",
    )
    parser.add_argument(
        "--explicit-conv-grads",
        action="store_true",
        help="also time every batched variant with model.explicit_conv_grads (each convolution's "
        "derivatives as its own data and weight gradients), side by side with the plain one",
    )
    parser.add_argument("--score-precision", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--write", type=Path, help="write the table into this Markdown file")
    parser.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a torch._inductor.config setting for the compiled variant (repeatable), e.g. "
        "coordinate_descent_tuning=True; to compare settings run one process per setting and compare each one's "
        "batched+compile against its own eager batched column",
    )
    args = parser.parse_args()
    if args.check_only and args.no_check:
        parser.error("--check-only and --no-check exclude each other")
    try:
        settings = inductor_settings(args.inductor)
    except ValueError as error:
        parser.error(str(error))
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    device = torch.device(args.device)
    if settings:
        import torch._inductor.config as inductor

        with inductor.patch(settings):
            rows = run(args)
    else:
        rows = run(args)
    engines = engine_names(args)
    command = "python benchmarks/engines.py " + " ".join(sys.argv[1:])
    inductor = f"; Inductor settings {settings}" if settings else ""
    body = (
        f"{environment(device)}{inductor}\n\nCommand: `{command}` ({time.strftime('%Y-%m-%d')})\n\n"
        f"{table(rows, engines)}"
    )
    print(body)
    if args.write:
        title = f"Engines on {'GPU' if device.type == 'cuda' else 'CPU'}"
        write_section(args.write, title, body)
        print(f"written to {args.write} ({title})", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    import warnings

    warnings.filterwarnings("ignore")
    main()
