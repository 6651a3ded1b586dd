"""The AccumulateGrad stream mismatch of a data-parallel fit on a GPU (``units_lightning.strategies``), CUDA only.

Each strategy trains the tiny model for a few steps under DDP on one GPU in a fresh process and counts torch's
warning that "the AccumulateGrad node's stream does not match the stream of the node that produced the incoming
gradient". Lightning's own strategy is expected to draw it (it builds DDP on a side stream); ours must not.
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from tiny_setup import REPO

SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import lightning.pytorch as pl
    sys.path.insert(0, {tests!r})
    from tiny_setup import tiny_data, tiny_model
    from units_lightning.samplers import MultiQuerySampler
    from units_lightning.strategies import DDPStrategy

    MISMATCH = {mismatch!r}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pl.seed_everything(0, verbose=False)
        data = tiny_data(MultiQuerySampler(tasks=2, query_sets=2))
        model = tiny_model(sampler=data.sampler)
        strategy = DDPStrategy() if sys.argv[1] == "ours" else "ddp"
        trainer = pl.Trainer(accelerator=sys.argv[2], devices=1, strategy=strategy, max_steps=6, limit_val_batches=0,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, inference_mode=False)
        trainer.fit(model, data)
    mismatches = [str(w.message) for w in caught if MISMATCH in str(w.message)]
    print(json.dumps({{"steps": trainer.global_step, "mismatches": len(mismatches)}}))
""")


MISMATCH = "AccumulateGrad node's stream"


def mismatches(strategy: str, accelerator: str = "gpu") -> dict:
    """Steps trained, and the warnings counted as Python warnings and in what torch wrote to stderr itself."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=str(REPO / "tests"), mismatch=MISMATCH), strategy, accelerator],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["mismatches"] += done.stderr.count(MISMATCH)  # a warning torch printed itself, not through Python
    return result


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the stream mismatch needs a CUDA GPU")
def test_ddp_built_on_the_training_stream_draws_no_accumulate_grad_stream_mismatch():
    ours, lightnings = mismatches("ours"), mismatches("lightning")
    assert ours["steps"] == lightnings["steps"] == 6
    assert ours["mismatches"] == 0, f"{ours['mismatches']} stream-mismatch warnings with units_lightning's DDPStrategy"
    assert lightnings["mismatches"] > 0, (
        "Lightning's own DDPStrategy no longer draws the warning (Lightning-AI/pytorch-lightning#21746 released?): "
        "units_lightning.strategies.DDPStrategy can go"
    )
