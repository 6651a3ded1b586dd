"""The background fit of ``units_lightning.cli.compile_next``: ``python -m units_lightning.cli.background_fit
<signature> <config.yaml> [fit options ...]`` runs ``units-lightning fit`` at a lower priority, then removes its
``.compiling`` marker and its run folder, and leaves ``<signature>.failed`` where the fit did not record the
signature in the compile cache (no compiler, an error: its log says).

A module of its own: it runs the command line (``cli.dispatch``), which imports ``compile_next``; its files are
``compile_next.files_of``'s.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from units_lightning.cli.compile_next import files_of
from units_lightning.compile_cache import compile_cache_directory, compiled_before

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """The background fit: ``<signature> <config> [options]``. Runs ``fit`` at a lower priority, then removes its
    ``.compiling`` marker and its files, and leaves ``.failed`` where the signature was not recorded."""
    if argv is None:
        argv = sys.argv[1:]
        del sys.argv[1:]  # the fit reads its arguments from the list below, not this command line
    signature, config, *options = argv
    files = files_of(signature)
    root = tempfile.mkdtemp(prefix=f"units-lightning-compile-{signature}-")  # the fit's files, removed after it
    options = [f"--trainer.default_root_dir={root}", *options]
    try:
        os.nice(10)
    except (AttributeError, OSError):  # no os.nice (Windows), or not allowed: at the usual priority
        pass
    print(f"compiling for the next run: units-lightning fit --config {config} {' '.join(options)}", flush=True)
    started = time.perf_counter()
    try:
        from units_lightning.cli.dispatch import cli_main  # here: a failing import, too, settles the markers below

        cli_main(["fit", "--config", config, *options])
    except BaseException:  # noqa: BLE001 - whatever ends it, the markers below are settled
        traceback.print_exc()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if compiled_before(signature):
            print(f"recorded in {compile_cache_directory()} after {time.perf_counter() - started:.1f} s", flush=True)
            Path(config).unlink(missing_ok=True)
        else:
            files.failed.write_text(
                "the background fit ended without recording this signature: see the .log beside this file\n"
            )
        files.compiling.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
