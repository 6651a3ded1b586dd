"""``import units_lightning`` is light: it loads neither torch nor Lightning, W&B, matplotlib, scipy, torchvision nor
the annotation stack (its HTTP clients and server), which come with the first name that needs them; and every
public name still imports from where it did (docs/PERFORMANCE.md, "Start-up").

What is loaded is checked in a fresh interpreter: in this one, other tests have imported everything already."""

import importlib
import subprocess
import sys

import pytest
from tiny_setup import REPO

# What `import units_lightning` must not load, and why a command would want each.
HEAVY = (
    "torch",  # any model or tensor
    "lightning",  # the Lightning commands
    "jsonargparse",  # their command line
    "wandb",  # the W&B logger
    "matplotlib",  # report's charts
    "scipy",
    "torchvision",
    "units_lightning.annotation",  # select / ingest / serve
    "units_lightning.dashboard",
    "urllib.request",  # the annotation stack's Label Studio client
    "http.server",  # its ML backend
    "requests",
    "label_studio_sdk",
)
# Every name of each package's `__all__` as of the change that made them lazy: none may go missing.
PUBLIC = {
    "units_lightning": ["LabelLedger", "UnitsMAML", "__version__"],
    "units_lightning.cli": [
        "COMMANDS",
        "LIGHTNING_COMMANDS",
        "UnitsArgumentParser",
        "UnitsCLI",
        "cli_main",
        "fit_summary",
        "main",
        "overview",
    ],
}
DEFINED_IN = {
    "LabelLedger": "units_lightning.ledger",
    "UnitsMAML": "units_lightning.module",
    "UnitsCLI": "units_lightning.cli.parser",
    "cli_main": "units_lightning.cli.parser",
    "UnitsArgumentParser": "units_lightning.cli.arguments",
    "fit_summary": "units_lightning.callbacks.summary_writer",
    "main": "units_lightning.cli.dispatch",
}


def run_python(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("statement", ["import units_lightning", "from units_lightning.cli import main"])
def test_importing_the_package_loads_nothing_heavy(statement):
    done = run_python(f"import sys\n{statement}\nprint(sorted(n for n in {HEAVY!r} if n in sys.modules))")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"{statement} loaded {done.stdout.strip()}"


def test_the_check_sees_a_heavy_import():
    """The same check after a module that loads one of them: it is seen, so the test above can fail."""
    done = run_python(f"import sys, units_lightning.dashboard\nprint([n for n in {HEAVY!r} if n in sys.modules])")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "units_lightning.dashboard" in done.stdout


@pytest.mark.parametrize("package_name", sorted(PUBLIC))
def test_every_public_name_still_imports(package_name):
    package = importlib.import_module(package_name)
    assert sorted(package.__all__) == sorted(PUBLIC[package_name])
    for name in PUBLIC[package_name]:
        value = getattr(package, name)
        assert name in dir(package)
        assert value is getattr(importlib.import_module(DEFINED_IN.get(name, package_name)), name)
    namespace: dict = {}
    exec(f"from {package_name} import *", namespace)  # reads __all__, the lazy names included
    assert set(PUBLIC[package_name]) <= set(namespace)


def test_an_unknown_name_is_an_attribute_error():
    import units_lightning
    import units_lightning.cli

    for package in (units_lightning, units_lightning.cli):
        with pytest.raises(AttributeError, match="has no attribute 'UnitsMaml'"):
            package.UnitsMaml  # noqa: B018
