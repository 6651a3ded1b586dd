"""The package's layering, checked on its source: imports flow one way (docs/DESIGN.md, "Layers").

Each contract names modules that must not import others, directly or through function-local imports, the way
import-linter's "forbidden" contracts do; a last check finds import cycles. The checker reads the source with
``ast`` and imports nothing, and a test shows that it fails when a forbidden import is added.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "units_lightning"

# The bottom of the house: maths, engines, samplers, metrics and the episode types.
FOUNDATIONS = (
    "units_lightning.atomic",
    "units_lightning.backbones",
    "units_lightning.belief",
    "units_lightning.collectives",
    "units_lightning.compile_cache",
    "units_lightning.conv_grads",
    "units_lightning.csv_history",
    "units_lightning.engines",
    "units_lightning.episode",
    "units_lightning.keys",
    "units_lightning.lazy",
    "units_lightning.ledger",
    "units_lightning.losses",
    "units_lightning.metrics",
    "units_lightning.outputs",
    "units_lightning.resume",
    "units_lightning.runs",
    "units_lightning.samplers",
    "units_lightning.schedules",
    "units_lightning.sigterm",
    "units_lightning.strategies",
)
DATA_MODULES = ("units_lightning.data.episodic", "units_lightning.data.datamodules", "units_lightning.data.prediction")
ABOVE = ("units_lightning.module", "units_lightning.callbacks", "units_lightning.cli", "units_lightning.__main__")


@dataclass(frozen=True)
class Contract:
    name: str
    sources: tuple[str, ...]
    forbidden: tuple[str, ...]


CONTRACTS = (
    Contract(
        "maths, engines, samplers, metrics and episode import nothing above them",
        FOUNDATIONS,
        ("units_lightning.data", "units_lightning.evaluation", "units_lightning.dashboard", *ABOVE),
    ),
    Contract(
        "callbacks read the typed step outputs, not the module, the data modules or the CLI",
        ("units_lightning.callbacks",),
        ("units_lightning.module", "units_lightning.cli", "units_lightning.__main__", *DATA_MODULES),
    ),
    Contract(
        "evaluation (shifts, ensembles, results) does not know the module, the callbacks or the CLI",
        ("units_lightning.evaluation",),
        (*ABOVE, *DATA_MODULES, "units_lightning.dashboard"),
    ),
    Contract(
        "the dashboard reads logged keys and files, nothing that trains",
        ("units_lightning.dashboard",),
        (*ABOVE, "units_lightning.data", "units_lightning.engines", "units_lightning.evaluation"),
    ),
    Contract(
        "data knows images and samplers, not the model",
        ("units_lightning.data",),
        (*ABOVE, "units_lightning.engines", "units_lightning.evaluation", "units_lightning.dashboard"),
    ),
    Contract(
        "data: file and archive I/O below the datasets, datasets below the DataModules",
        ("units_lightning.data.io",),
        ("units_lightning.data.datasets", *DATA_MODULES),
    ),
    Contract("data: datasets below the DataModules", ("units_lightning.data.datasets",), DATA_MODULES),
    Contract(
        "the annotation loop (select, ingest) sits on the module and the data: nothing below it imports it",
        (
            *FOUNDATIONS,
            "units_lightning.data",
            "units_lightning.evaluation",
            "units_lightning.dashboard",
            "units_lightning.callbacks",
            "units_lightning.module",
        ),
        ("units_lightning.annotation",),
    ),
    Contract(
        "nothing below the CLI imports it",
        tuple(
            f"units_lightning.{p.name.removesuffix('.py')}"
            for p in PACKAGE.iterdir()
            if p.name not in ("cli", "__main__.py", "__init__.py", "__pycache__", "py.typed")
        ),
        ("units_lightning.cli", "units_lightning.__main__"),
    ),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(root: Path) -> dict[str, set[tuple[str, int]]]:
    """``{module: {(imported units_lightning module, line)}}`` for every module under ``root``, function-local
    imports included; ``from a import b`` counts as importing ``a.b`` when that is a module."""
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[tuple[str, int]]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            else:
                continue
            edges.update((t, node.lineno) for t in targets if t.split(".")[0] == root.name)
        graph[name] = edges
    return graph


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(root: Path) -> list[str]:
    """Every import that breaks a contract, as ``contract: module:line imports target``."""
    graph = imports(root)
    found = []
    for contract in CONTRACTS:
        for module, edges in sorted(graph.items()):
            if not _within(module, contract.sources):
                continue
            for target, line in sorted(edges):
                if _within(target, contract.forbidden) and not _within(target, (module,)):
                    found.append(f"{contract.name}: {module}:{line} imports {target}")
    return found


def cycles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), i.e. import cycles.

    A package's ``__init__`` is a module like any other: ``from units_lightning.callbacks import X`` imports
    ``callbacks/__init__``, which imports every callback. The package root, which re-exports the model, is left
    out (every import of a submodule runs it first, so it would close a cycle with anything it imports).
    """
    graph = {m: {t for t, _ in e if t != root.name} for m, e in imports(root).items() if m != root.name}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def imports_of_modules(root: Path) -> set[str]:
    return {module_name(p, root) for p in root.rglob("*.py")}


def test_every_import_contract_holds():
    assert violations(PACKAGE) == []


def test_no_import_cycles_even_through_function_local_imports():
    assert cycles(PACKAGE) == []


def test_contracts_name_only_modules_that_exist():
    modules = imports_of_modules(PACKAGE)
    for contract in CONTRACTS:
        for name in (*contract.sources, *contract.forbidden):
            assert any(_within(m, (name,)) for m in modules), f"{contract.name}: no module {name}"


@pytest.mark.parametrize(
    ("file", "line", "expected"),
    [
        ("callbacks/schedule_monitor.py", "from units_lightning.cli import UnitsCLI", "callbacks read the typed"),
        ("samplers/base.py", "from units_lightning.data.episodic import build_batch", "maths, engines"),
        ("metrics/functional.py", "    from units_lightning.module import UnitsMAML", "maths, engines"),
    ],
    ids=["callbacks-import-cli", "sampler-imports-data", "function-local-import"],
)
def test_a_forbidden_import_makes_the_check_fail(tmp_path, file, line, expected):
    copy = tmp_path / "units_lightning"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / file
    source = path.read_text()
    if line.startswith(" "):  # inside a function
        source += f"\n\ndef _sneaky():\n{line}\n"
    else:
        source += f"\n{line}\n"
    path.write_text(source)
    found = violations(copy)
    assert any(v.startswith(expected) and file.removesuffix(".py").replace("/", ".") in v for v in found), found


def test_a_cycle_through_a_function_local_import_is_found(tmp_path):
    copy = tmp_path / "units_lightning"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "belief.py", "a") as handle:
        handle.write("\n\ndef _late():\n    from units_lightning.losses import EvidentialLoss\n")
    assert ["units_lightning.belief", "units_lightning.losses"] in cycles(copy)
