"""The README stays true: its code blocks run as written, in order, from a fresh copy of the tree.

The run itself takes minutes (several quick starts), so it runs only when asked: ``UNITS_LIGHTNING_README=full``
runs the blocks as written (``.ci/run`` does, after the suite), ``UNITS_LIGHTNING_README=tiny`` shrinks the runs
for a quick check (see ``tests/readme_blocks.py``: what is inserted is printed with the block). The other tests
here are fast checks of the plan: which blocks run, which are saved as files, which are skipped and why.
"""

import json
import os
from pathlib import Path

import pytest
from readme_blocks import SKIPPED, blocks, fresh_copy, plan, run_blocks, shrink, timings
from tiny_setup import REPO, TINY_QUICKSTART

README = (REPO / "README.md").read_text()
MODE = os.environ.get("UNITS_LIGHTNING_README", "")


def test_every_skip_names_a_block_and_says_why():
    found = blocks(README)
    for first_line, reason in SKIPPED.items():
        matching = [b for b in found if b.first_line.startswith(first_line)]
        assert len(matching) == 1, f"SKIPPED entry matches {len(matching)} README blocks: {first_line!r}"
        assert reason


def test_the_walkthrough_runs_and_saves_the_blocks_a_reader_would():
    planned = [(plan(b), b) for b in blocks(README)]
    ran = [b.first_line for (action, _), b in planned if action == "run"]
    saved = [detail for (action, detail), _ in planned if action == "file"]
    assert saved == ["my_lab/samplers.py", "my_sampler.yaml"]
    steps = [
        "fit --config configs/quickstart.yaml",
        "test --config",
        "predict --config",
        "report runs/quickstart",
        "--ckpt_path last",
    ]
    position = 0
    for step in steps:  # in this order, each in a block that runs
        position = next(i for i, line in enumerate(ran[position:], position) if step in line) + 1
    assert any("--config my_sampler.yaml" in b.text for (action, _), b in planned if action == "run")


def test_tiny_mode_inserts_its_options_after_the_last_config():
    line = ".venv/bin/units-lightning fit --config configs/quickstart.yaml --config my_sampler.yaml --x 1\n"
    words = shrink(line, "bash").split()
    assert words[:6] == [
        ".venv/bin/units-lightning",
        "fit",
        "--config",
        "configs/quickstart.yaml",
        "--config",
        "my_sampler.yaml",
    ]
    assert words[6 : 6 + len(TINY_QUICKSTART)] == TINY_QUICKSTART and words[-2:] == ["--x", "1"]
    assert shrink("pl.Trainer(max_steps=300)", "python") == "pl.Trainer(max_steps=6)"


@pytest.mark.readme
@pytest.mark.skipif(MODE not in ("full", "tiny"), reason="set UNITS_LIGHTNING_README=full (or tiny) to run the README")
def test_readme_runs_as_written_from_a_fresh_copy(tmp_path):
    copy = fresh_copy(REPO, tmp_path / "clone")
    log = tmp_path / "readme.log"
    outcomes = run_blocks(copy, blocks(README), MODE, log)
    print(f"\nREADME blocks ({MODE}), log in {log}:\n{timings(outcomes)}")
    record = os.environ.get("UNITS_LIGHTNING_README_TIMES")
    if record:
        rows = [
            {
                "line": o.block.line,
                "action": o.action,
                "seconds": round(o.seconds, 1),
                "status": o.status,
                "first_line": o.block.first_line,
            }
            for o in outcomes
        ]
        Path(record).write_text(json.dumps(rows, indent=1) + "\n")
    failed = [o for o in outcomes if o.status != 0]
    assert not failed, f"README line {failed[0].block.line} failed:\n{failed[0].block.text}\n{failed[0].output}"
    assert len(outcomes) == len(blocks(README))
