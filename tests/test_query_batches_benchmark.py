"""``benchmarks/query_batches.py``: the same queries predicted whole and in class-balanced batches, paired by task."""

import pytest
import torch
from tiny_setup import QUICKSTART, TINY_QUICKSTART

from benchmarks import query_batches


def test_balanced_batches_hold_c_of_each_class_and_every_query_once():
    generator = torch.Generator().manual_seed(0)
    classes = torch.arange(4).repeat_interleave(5)
    labels = torch.stack([classes[torch.randperm(20, generator=generator)] for _ in range(3)])
    batches = query_batches.balanced_batches(labels, n_way=4, per_class=2)
    assert [b.shape for b in batches] == [(3, 8), (3, 8), (3, 4)]  # 5 a class: 2 + 2 + the remainder 1
    for task in range(3):
        seen = torch.cat([b[task] for b in batches])
        assert sorted(seen.tolist()) == list(range(20))
        for b in batches:
            counts = torch.bincount(labels[task, b[task]], minlength=4)
            assert len(set(counts.tolist())) == 1  # as many of each class


def test_an_unbalanced_query_set_is_refused():
    with pytest.raises(ValueError, match="not a class-balanced set"):
        query_batches.balanced_batches(torch.zeros(2, 7, dtype=torch.long), n_way=5, per_class=1)


def test_batches_of_every_query_equal_the_whole_set_and_smaller_ones_are_paired(tmp_path, capsys):
    """A real ``validate`` of the tiny quick start: 5 queries of each class in one batch is the whole set permuted, so
    its predictions match query for query (a paired difference of exactly 0); 1 a class is a different protocol."""
    query_batches.main(
        ["--config", str(QUICKSTART), "--per-class", "5", "1", "--root", str(tmp_path), "--", *TINY_QUICKSTART]
    )
    rows = query_batches.QueryBatches.rows
    assert set(rows) == {"whole", "5 per class", "1 per class"}
    whole, same = torch.cat(rows["whole"]), torch.cat(rows["5 per class"])
    assert len(whole) == 4  # the tiny quick start's validation tasks
    assert torch.equal(whole, same)
    printed = capsys.readouterr().out
    assert "| 5 per class |" in printed and "+0.00 +- 0.00" in printed and "(4 tasks)" in printed
