"""Two processes (gloo, CPU) with different queries: every reduced metric equals the metric of all queries."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from lightning.fabric.plugins.environments.lightning import find_free_network_port

from units_lightning.metrics import UncertaintyMetrics

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from test_metrics_distributed import report, shard

    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    print("RESULT " + json.dumps(report([shard(rank)])), flush=True)
    dist.destroy_process_group()
""")


def shard(rank: int) -> dict:
    """Different queries per rank, and a different number of tasks (7 and 4), so a mean of means would be wrong."""
    generator = torch.Generator().manual_seed(rank)
    tasks = 7 if rank == 0 else 4
    probability = torch.softmax(2 * torch.randn(tasks, 5, 5, generator=generator), -1)
    labels = torch.randint(5, (tasks, 5), generator=generator)
    correct = probability.argmax(-1) == labels
    vacuity = torch.rand(tasks, 5, generator=generator) * (1.5 - correct.float())  # errors more vacuous
    beliefs = {
        name: torch.rand(tasks, 5, generator=generator) for name in ("dissonance", "incorrect_belief", "correct_belief")
    }
    return {"probability": probability, "labels": labels, "correct": correct, "vacuity": vacuity, **beliefs}


def report(shards: list) -> dict:
    metrics = UncertaintyMetrics(vacuity_thresholds=[0.3, 0.6], coverages=[1.0, 0.7, 0.5])
    for outputs in shards:
        metrics.update(outputs)
    return metrics.compute()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_rank_reduction_equals_one_process_on_all_queries(tmp_path):
    from tiny_setup import REPO

    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT.format(tests=str(REPO / "tests"), port=find_free_network_port()))
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=240) for p in processes]
    finally:  # a rank left waiting for the other must not outlive the test
        for process in processes:
            process.kill()
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err[-3000:]
    results = [json.loads(line[7:]) for out, _ in outputs for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 2 and results[0] == results[1]
    expected = report([shard(0), shard(1)])
    assert results[0]["tasks"] == 11 and results[0]["queries"] == 55
    assert _close(results[0], expected)


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7), (a, b)
        return True
    assert a == b, (a, b)
    return True
