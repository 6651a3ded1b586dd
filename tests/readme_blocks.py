"""The README's code blocks, and how ``tests/test_readme.py`` runs them: in order, from a fresh copy of the tree.

A block is run as written (``bash``: by bash with ``-e -o pipefail``; ``python``: by the copy's ``.venv/bin/python``),
or saved as a file when its first line names one (``# my_lab/samplers.py``, ``# my_sampler.yaml``: the README
asks the reader to save it). Blocks in other languages (output, ``text``, ``bibtex``) and YAML snippets without a
file name are not run. ``SKIPPED`` lists the few blocks the test does not run, each with the reason.

In ``tiny`` mode (for a quick check; CI runs ``full``) the runs are shrunk, visibly: ``TINY_OPTIONS`` is inserted
after the last ``--config`` of every ``units-lightning`` command (so the README's own later options still win)
and ``TINY_REPLACEMENTS`` edits the Python blocks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tiny_setup import TINY_QUICKSTART

__all__ = ["SKIPPED", "Block", "blocks", "fresh_copy", "plan", "run_blocks", "shrink"]

RUN_LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
# First line of a block the test does not run -> why.
SKIPPED = {
    "scripts/setup.sh && .venv/bin/python -m pytest -q": "the test suite itself: CI runs it in the step before",
    ".venv/bin/units-lightning fit --config configs/omniglot_5w1s.yaml --data.root /path/to/omniglot": (
        "needs Omniglot and CIFAR-FS (a folder you point to, or a download)"
    ),
    "units-lightning fit --config configs/omniglot_20w1s.yaml --data.root /data/omniglot": (
        "needs Omniglot and several GPUs (or machines)"
    ),
    "pip install torch torchvision": "installs by hand what scripts/setup.sh installed at the first block",
    "# the next batch: the 8 query sets the model is least sure of, in the project's Label Studio project": (
        "needs an annotation project of your images and a Label Studio server (docs/ANNOTATION.md runs a small one)"
    ),
}
TINY_OPTIONS = [*TINY_QUICKSTART, "--trainer.limit_train_batches=3", "--data.test_tasks=4"]
TINY_REPLACEMENTS = {"max_steps=300": "max_steps=6"}
_COMMAND = re.compile(r"(\.venv/bin/)?units-lightning (fit|validate|test|predict)\b")


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README.

    Attributes:
        language: the fence's language (``bash``, ``python``, ``yaml``, ``""``).
        text: the code, without the fences.
        line: the line of the opening fence (1-based).
    """

    language: str
    text: str
    line: int

    @property
    def first_line(self) -> str:
        return self.text.strip().splitlines()[0].strip() if self.text.strip() else ""

    @property
    def file(self) -> str | None:
        """The file the README asks to save this block as (its first line ``# <path>``), or None."""
        match = re.fullmatch(r"#\s*([\w./-]+\.(?:py|ya?ml))", self.first_line)
        return match.group(1) if match else None


def blocks(readme: str) -> list[Block]:
    """Every fenced block of a Markdown text, in order."""
    found, lines = [], readme.splitlines()
    index = 0
    while index < len(lines):
        opening = re.match(r"^```(\w*)\s*$", lines[index])
        if opening:
            end = next(j for j in range(index + 1, len(lines)) if lines[j].startswith("```"))
            found.append(Block(opening.group(1), "\n".join(lines[index + 1 : end]) + "\n", index + 1))
            index = end
        index += 1
    return found


def plan(block: Block) -> tuple[str, str]:
    """What the test does with a block: ``("run", language)``, ``("file", path)`` or ``("skip", reason)``."""
    for first_line, reason in SKIPPED.items():
        if block.first_line.startswith(first_line):
            return "skip", reason
    if block.file is not None:
        return "file", block.file
    if block.language in RUN_LANGUAGES:
        return "run", RUN_LANGUAGES[block.language]
    return "skip", f"a {block.language or 'plain'} block: output or a snippet, not a command"


def shrink(text: str, language: str) -> str:
    """The tiny version of a block (see the module docstring)."""
    if language == "python":
        for before, after in TINY_REPLACEMENTS.items():
            text = text.replace(before, after)
        return text
    shrunk = []
    for line in text.splitlines():
        if _COMMAND.search(line) and "--config" in line:
            words = line.split(" ")
            last = max(i for i, w in enumerate(words) if w in ("--config", "-c") or w.startswith("--config="))
            last += 0 if "=" in words[last] else 1
            line = " ".join([*words[: last + 1], *TINY_OPTIONS, *words[last + 1 :]])
        shrunk.append(line)
    return "\n".join(shrunk) + "\n"


def fresh_copy(repo: Path, destination: Path) -> Path:
    """What a clone would hold (tracked files and new ones not ignored) copied to ``destination``, with a
    ``.venv`` of its own layered on the repository's (its packages visible through a ``.pth`` line), so that
    ``scripts/setup.sh`` runs as on a second setup and installs the copy, not the repository, as editable."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, (item.decode() for item in listed)):
        source = repo / name
        if source.is_file() and not source.is_symlink():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    python = repo / ".venv" / "bin" / "python"
    probe = "import sys, sysconfig; print(sys._base_executable); print(sysconfig.get_paths()['purelib'])"
    base, packages = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    subprocess.run([base, "-m", "venv", str(destination / ".venv")], check=True)
    own = subprocess.run(
        [destination / ".venv" / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(own, "_units_lightning_layered.pth").write_text(packages + "\n")
    return destination


@dataclass
class Outcome:
    """How a block went: what was done, its wall time, its exit status and the end of its output."""

    block: Block
    action: str
    seconds: float
    status: int
    output: str


def run_blocks(copy: Path, found: list[Block], mode: str, log: Path, timeout: float = 3600) -> list[Outcome]:
    """Run (or save) the README's blocks in order in ``copy``; stop at the first failure.

    Args:
        copy: the fresh copy (see ``fresh_copy``).
        found: the README's blocks.
        mode: ``full`` (as written) or ``tiny`` (shrunk, see ``shrink``).
        log: a file that receives every block's output, in order.
        timeout: seconds allowed to one block.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    outcomes: list[Outcome] = []
    with log.open("w") as out:
        for block in found:
            action, detail = plan(block)
            if action == "skip":
                outcomes.append(Outcome(block, f"skip: {detail}", 0.0, 0, ""))
                continue
            if action == "file":
                target = copy / detail
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.text)
                outcomes.append(Outcome(block, f"saved {detail}", 0.0, 0, ""))
                continue
            text = shrink(block.text, detail) if mode == "tiny" else block.text
            command = ["bash", "-e", "-o", "pipefail", "-c", text]
            if detail == "python":
                command = [str(copy / ".venv" / "bin" / "python"), "-c", text]
            out.write(f"\n===== README line {block.line} ({detail}) =====\n{text}\n")
            out.flush()
            started = time.perf_counter()
            done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
            seconds = time.perf_counter() - started
            out.write(done.stdout + done.stderr + f"\n[exit {done.returncode} after {seconds:.1f} s]\n")
            out.flush()
            outcomes.append(
                Outcome(block, f"ran {detail}", seconds, done.returncode, (done.stdout + done.stderr)[-4000:])
            )
            if done.returncode != 0:
                break
    return outcomes


def timings(outcomes: list[Outcome]) -> str:
    """A table of the blocks run, with their wall times."""
    rows = [f"{'line':>5}  {'seconds':>8}  first line"]
    for outcome in outcomes:
        if outcome.action.startswith("ran"):
            rows.append(f"{outcome.block.line:>5}  {outcome.seconds:>8.1f}  {outcome.block.first_line[:100]}")
    rows.append(f"total {sum(o.seconds for o in outcomes):.1f} s")
    return "\n".join(rows)


if __name__ == "__main__":  # print the plan: python tests/readme_blocks.py
    readme = Path(__file__).resolve().parents[1] / "README.md"
    print(json.dumps([(b.line, *plan(b), b.first_line[:80]) for b in blocks(readme.read_text())], indent=1))
    sys.exit(0)
