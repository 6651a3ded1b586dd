"""How the fixed evaluation tasks are shared by processes: each task once, contiguous blocks, no padding."""

import pytest
import torch
from tiny_setup import tiny_data

from units_lightning.data.episodic import EpisodeDataset, ShardSampler, evaluation_shard
from units_lightning.samplers import RandomSampler, TaskSampler


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8], ids=lambda w: f"{w}proc")
def test_shards_hold_every_task_once_in_order(world_size):
    for num_tasks in range(world_size, 40):
        shards = [evaluation_shard(num_tasks, rank, world_size) for rank in range(world_size)]
        assert [t for shard in shards for t in shard] == list(range(num_tasks))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        assert min(map(len, shards)) >= 1


def test_fewer_tasks_than_processes_is_refused_naming_the_option():
    with pytest.raises(ValueError, match=r"data\.val_tasks=3 is fewer than the 4 processes.*at least 4"):
        evaluation_shard(3, 0, 4, option="data.val_tasks")
    with pytest.raises(ValueError, match="rank must lie in 0 .. 1"):
        evaluation_shard(5, 2, 2)


def test_shards_of_the_same_tasks_batched_unevenly_are_the_single_process_tasks():
    data = tiny_data(RandomSampler(tasks=2), val_tasks=7, eval_batch_tasks=3)
    data.setup("validate")
    everything = torch.cat([batch.classes for batch in data.val_dataloader()])
    assert everything.shape == (7, 5)

    evaluator = TaskSampler(tasks=1, query_sets=1)
    evaluator.bind(data.split("val").labels, data.eval_spec, split="val")
    per_rank = []
    for rank in range(2):
        shard = EpisodeDataset(
            data.split("val"), evaluator, data.seed, "val", num_tasks=7, tasks_per_item=3,
            tasks=evaluation_shard(7, rank, 2),
        )  # fmt: skip
        batches = [shard[i] for i in ShardSampler(len(shard))]
        per_rank.append([batch.num_tasks for batch in batches])
        assert torch.equal(torch.cat([b.classes for b in batches]), everything[shard.tasks.start : shard.tasks.stop])
    assert per_rank == [[3], [3, 1]]  # tasks 0-2 and 3-6: the last batch of a process holds what is left
    with pytest.raises(IndexError, match="out of range"):
        shard[2]


def test_single_process_loader_is_not_rewrapped():
    data = tiny_data(RandomSampler(tasks=2), val_tasks=5, eval_batch_tasks=2)
    data.setup("validate")
    loader = data.val_dataloader()
    assert isinstance(loader.sampler, ShardSampler) and len(loader) == 3
    assert [b.num_tasks for b in loader] == [2, 2, 1]
