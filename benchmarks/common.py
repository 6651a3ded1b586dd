"""What the benchmarks share: the repository's folder, the description of the machine a measurement ran on, and
writing a measured table into a Markdown section.

A benchmark run as a script (``python benchmarks/x.py``) has ``benchmarks/`` first on ``sys.path``, not the
repository: each puts the repository there before importing ``benchmarks.*`` (``if not __package__``), so that the
same file also runs as ``python -m benchmarks.x`` and imports as ``benchmarks.x``."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def processor() -> str:
    """The CPU's name as ``platform`` knows it (often empty on Linux), else its architecture."""
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: str = "cpu") -> str:
    """The device a measurement ran on: the CUDA device's name, or the CPU with torch's thread count."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return f"{processor()}, {torch.get_num_threads()} threads"


def versions(separator: str = " | ") -> str:
    """torch, Lightning and Python versions, the software half of a measurement's description."""
    import lightning
    import torch

    return separator.join(
        [f"torch {torch.__version__}", f"lightning {lightning.__version__}", f"Python {platform.python_version()}"]
    )


def cpu_description() -> str:
    """Cores, architecture and ``OMP_NUM_THREADS``, for a measurement that runs on (or waits for) the CPU."""
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    return f"{processor()}, {os.cpu_count()} cores, OMP_NUM_THREADS={threads}"


@cache
def gpu_name(gpu: str | None = None) -> str:
    """The name of GPU ``gpu`` (an index as ``CUDA_VISIBLE_DEVICES`` takes it), of the first GPU with their count
    when ``gpu`` is None, from ``nvidia-smi`` (no CUDA context in this process); the CPU's cores without one."""
    query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"] + (["-i", gpu] if gpu is not None else [])
    try:
        names = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        names = []
    names = [n.strip() for n in names if n.strip()]
    if names:
        return names[0] if gpu is not None or len(names) == 1 else f"{names[0]} (of {len(names)} GPUs)"
    return f"cpu ({os.cpu_count()} cores)"


def write_section(path: Path, title: str, body: str) -> None:
    """Replace the ``## title`` section of a Markdown file (up to the next ``## `` heading) with ``body``, or
    append it; every other section is kept as it is. A missing file starts as ``# Performance``.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "notes.md"
        >>> _ = path.write_text("# Notes\\n\\n## A\\n\\nold\\n\\n## B\\n\\nkept\\n")
        >>> write_section(path, "A", "new")
        >>> write_section(path, "C", "added")
        >>> print(path.read_text(), end="")
        # Notes
        <BLANKLINE>
        ## A
        <BLANKLINE>
        new
        <BLANKLINE>
        ## B
        <BLANKLINE>
        kept
        <BLANKLINE>
        ## C
        <BLANKLINE>
        added
    """
    text = path.read_text() if path.is_file() else "# Performance\n"
    section = f"## {title}\n\n{body.strip(chr(10))}\n"
    pattern = re.compile(rf"^## {re.escape(title)}[ \t]*\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
