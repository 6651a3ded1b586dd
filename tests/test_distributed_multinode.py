"""Beyond one machine: two "nodes" of one process each, started by torchrun's rendezvous on this machine (gloo), run
the multi-node command of docs/SCALING.md (and the README) on the quick start shrunk to seconds.

Each node has its own run folder, as two machines have their own disks. What tests/test_distributed.py checks of two
processes holds here too: the ranks end with the same weights, the label ledger counts both ranks' labels on each, and
only global rank 0 writes checkpoints and the run's files; no epoch value draws Lightning's ``sync_dist`` advice.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_setup import QUICKSTART, REPO, TINY_QUICKSTART, cli_environment

from units_lightning.evaluation.checkpoints import load_checkpoint

STEPS, TASKS, QUERY_IMAGES_PER_SET, SUPPORT_IMAGES_PER_TASK = 6, 4, 5, 5  # the quick start's 5-way 1-shot, 4 tasks


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun() -> list[str]:
    """The ``torchrun`` of this environment (the documented command), else its module."""
    beside = Path(sys.executable).with_name("torchrun")
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "torch.distributed.run"]


def node_command(node_rank: int, port: int, root: Path, records: Path) -> list[str]:
    """docs/SCALING.md's torchrun line, one process per node on the CPU instead of 4 GPUs per node."""
    return [
        *torchrun(),
        *("--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node_rank)),
        *("--master-addr", "127.0.0.1", "--master-port", str(port)),
        *("-m", "units_lightning", "fit", "--config", str(QUICKSTART)),
        *("--trainer.devices", "1", "--trainer.num_nodes", "2", "--trainer.strategy", "ddp"),
        *TINY_QUICKSTART,
        "--trainer.accelerator=cpu",
        "--trainer.limit_train_batches=3",
        "--data.init_args.sampler.init_args.warmup_steps=2",  # steps 3 to 6 select by uncertainty
        f"--trainer.default_root_dir={root}",
        "--trainer.logger=false",
        "--trainer.callbacks+=rank_record.RecordRank",
        f"--trainer.callbacks.folder={records}",
    ]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo unavailable")
    folder = tmp_path_factory.mktemp("multinode")
    environment = cli_environment(folder / "cache")
    port, records = free_port(), folder / "records"
    processes = []
    for node_rank in (0, 1):
        log = open(folder / f"node{node_rank}.log", "w")  # noqa: SIM115 - closed below, after the process ends
        command = node_command(node_rank, port, folder / f"node{node_rank}", records)
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=environment, start_new_session=True
        )
        processes.append((process, log))
    try:
        for process, _ in processes:
            process.wait(timeout=420)
    except subprocess.TimeoutExpired:
        for process, _ in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError("the two nodes ran past 420 s (killed):\n" + _tail(folder / "node0.log")) from None
    finally:
        for _, log in processes:
            log.close()
    for node_rank, (process, _) in enumerate(processes):
        assert process.returncode == 0, f"node {node_rank} exited with {process.returncode}:\n" + _tail(
            folder / f"node{node_rank}.log"
        )
    ranks = {r["global_rank"]: r for r in (json.loads(p.read_text()) for p in records.glob("rank_*.json"))}
    assert set(ranks) == {0, 1}
    return folder, ranks


def _tail(path: Path) -> str:
    return path.read_text()[-4000:] if path.is_file() else "(no log)"


def test_torchrun_places_one_rank_on_each_node(nodes):
    _, ranks = nodes
    for rank, record in ranks.items():
        assert record["environment"] == "TorchElasticEnvironment"  # Lightning read torchrun's variables
        assert (record["node_rank"], record["local_rank"], record["world_size"]) == (rank, 0, 2)
        assert record["torchrun"] == {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "GROUP_RANK": str(rank)}


def test_both_nodes_end_with_the_same_trained_weights(nodes):
    _, ranks = nodes
    assert ranks[0]["initial"] == ranks[1]["initial"]
    assert ranks[0]["weights"] == ranks[1]["weights"], "the nodes' weights differ after training"
    assert ranks[0]["weights"] != ranks[0]["initial"]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == STEPS
    assert ranks[0]["val_acc"] == ranks[1]["val_acc"]


def test_the_ledger_counts_both_nodes_labels_on_each(nodes):
    _, ranks = nodes
    labeled = STEPS * 2 * TASKS  # one query set of each task, on each of the two ranks, every step
    for record in ranks.values():
        ledger = record["ledger"]
        assert ledger["query_sets"] == labeled and ledger["query_images"] == labeled * QUERY_IMAGES_PER_SET
        assert ledger["support_images"] == STEPS * 2 * TASKS * SUPPORT_IMAGES_PER_TASK
        assert ledger["skipped_steps"] == 0
    assert ranks[0]["ledger"] == ranks[1]["ledger"]


def test_only_global_rank_zero_writes_checkpoints_and_run_files(nodes):
    folder, ranks = nodes
    first, second = folder / "node0", folder / "node1"
    checkpoints = sorted(p.name for p in first.rglob("*.ckpt"))
    assert "last.ckpt" in checkpoints and len(checkpoints) == 2, checkpoints  # last, and the best by val/acc
    assert list(second.rglob("*.ckpt")) == [] and list(second.rglob("summary.json")) == []
    last = load_checkpoint(next(first.rglob("last.ckpt")))
    assert last["global_step"] == STEPS and last["label_ledger"] == ranks[0]["ledger"]
    assert len(list(first.rglob("summary.json"))) == 1


def test_no_epoch_value_draws_lightnings_sync_dist_advice(nodes):
    folder, _ = nodes
    for node_rank in (0, 1):
        log = (folder / f"node{node_rank}.log").read_text()
        assert "sync_dist" not in log, f"node {node_rank}:\n" + "\n".join(
            line for line in log.splitlines() if "sync_dist" in line
        )


def test_the_documented_command_is_the_one_run():
    """The test runs docs/SCALING.md's and the README's torchrun line, with only the machine's values changed."""
    documented = {"--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port"}
    documented |= {"--trainer.devices", "--trainer.num_nodes", "--trainer.strategy"}
    for path in (REPO / "docs" / "SCALING.md", REPO / "README.md"):
        text = path.read_text()
        line = text[text.index("torchrun --nnodes") :].split("```")[0]
        flags = {word for word in line.split() if word.startswith("--") and "=" not in word}
        assert documented <= flags, (path.name, documented - flags)
        assert "-m units_lightning fit" in line
    ours = set(node_command(0, 1, Path("."), Path(".")))
    assert documented <= ours and shutil.which(torchrun()[0]) is not None
