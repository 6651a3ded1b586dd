import numpy as np
import pytest
import torch

from units_lightning.data.datasets.images import FewShotImages
from units_lightning.data.episodic import EpisodeDataset
from units_lightning.episode import EpisodeSpec
from units_lightning.samplers import MultiQuerySampler, RandomSampler, SingleTaskSelectionSampler, TaskSampler


def labels_of(num_classes: int, per_class: int) -> np.ndarray:
    return np.repeat(np.arange(num_classes), per_class)


class ExplodingImages(FewShotImages):
    """A dataset whose images must never be loaded."""

    def __init__(self, labels):
        self.labels = torch.as_tensor(labels)
        self.class_names = [str(c) for c in range(int(self.labels.max()) + 1)]
        self.image_shape = (1, 4, 4)

    def gather(self, indices):
        raise AssertionError("a sampler loaded images")


SAMPLERS = [
    (RandomSampler(tasks=6), 6, 1),
    (SingleTaskSelectionSampler(tasks=3, candidates=7), 7, 1),
    (MultiQuerySampler(tasks=4, query_sets=5), 4, 5),
]


@pytest.mark.parametrize("sampler,num_tasks,num_sets", SAMPLERS, ids=["random", "units-st", "multi-query"])
def test_episode_shapes_class_balance_and_disjoint_images(sampler, num_tasks, num_sets):
    labels = labels_of(30, 20)
    spec = EpisodeSpec(n_way=5, k_shot=2, query_shots=3)
    sampler.bind(ExplodingImages(labels).labels, spec)
    episode = sampler.sample(np.random.default_rng(0), step=0)
    assert episode.classes.shape == (num_tasks, 5)
    assert episode.support.shape == episode.support_labels.shape == (num_tasks, 10)
    assert episode.query.shape == episode.query_labels.shape == (num_tasks, num_sets, 15)
    for t in range(num_tasks):
        assert len(set(episode.classes[t])) == 5
        # Labels are class positions; images carry the class they claim to.
        assert (episode.classes[t][episode.support_labels[t]] == labels[episode.support[t]]).all()
        assert (episode.classes[t][episode.query_labels[t]] == labels[episode.query[t]]).all()
        assert np.bincount(episode.support_labels[t], minlength=5).tolist() == [2] * 5
        for q in range(num_sets):
            assert np.bincount(episode.query_labels[t, q], minlength=5).tolist() == [3] * 5
        used = np.concatenate([episode.support[t], episode.query[t].ravel()])
        assert len(set(used)) == used.size, "support and query sets must not share images"


def test_streams_are_seeded_reproducible_and_step_dependent():
    sampler = MultiQuerySampler(tasks=3, query_sets=2)
    sampler.bind(labels_of(40, 20), EpisodeSpec(5, 1, 1))
    a = sampler.sample(np.random.default_rng([0, 0, 0, 7]), 7)
    b = sampler.sample(np.random.default_rng([0, 0, 0, 7]), 7)
    c = sampler.sample(np.random.default_rng([0, 0, 0, 8]), 8)
    assert (a.query == b.query).all() and (a.support == b.support).all()
    assert not (a.query == c.query).all()


def test_samplers_never_load_images():
    images = ExplodingImages(labels_of(10, 20))
    sampler = MultiQuerySampler(tasks=2, query_sets=3)
    sampler.bind(images.labels, EpisodeSpec(5, 1, 1))
    for step in range(20):
        sampler.sample(np.random.default_rng(step), step)
    with pytest.raises(AssertionError, match="loaded images"):
        EpisodeDataset(images, sampler, seed=0, stream="train")[0]  # the episode builder does load them


def test_more_ways_than_classes_names_both_numbers():
    sampler = RandomSampler(tasks=2)
    with pytest.raises(ValueError, match=r"n_way=20 but split 'val' has only 16 classes"):
        sampler.bind(labels_of(16, 600), EpisodeSpec(20, 1, 1), split="val")


def test_too_few_images_per_class_is_reported_before_sampling():
    sampler = MultiQuerySampler(tasks=2, query_sets=8)
    full = labels_of(10, 20)
    labels = np.concatenate([full[full != 3], np.full(4, 3)])  # class 3 has only 4 images
    with pytest.raises(ValueError, match=r"fewer than 13 images .*class 3 has 4"):
        sampler.bind(labels, EpisodeSpec(5, 5, 1), split="train")


def test_multi_query_selects_the_most_uncertain_set_of_each_task_after_warmup():
    sampler = MultiQuerySampler(tasks=3, query_sets=4, warmup_steps=10)
    scores = torch.tensor([[0.1, 0.9, 0.2, 0.3], [0.5, 0.4, 0.3, 0.2], [0.0, 0.1, 0.2, 0.7]])
    assert not sampler.needs_scores(9) and sampler.needs_scores(10)
    warm = sampler.select(scores, step=9)
    assert warm[:, 0].all() and warm.sum() == 3
    chosen = sampler.select(scores, step=10)
    assert chosen.sum(1).tolist() == [1, 1, 1]
    assert chosen.float().argmax(1).tolist() == [1, 0, 3]


def test_units_st_keeps_the_i_most_uncertain_of_j_tasks():
    sampler = SingleTaskSelectionSampler(tasks=2, candidates=5)
    scores = torch.tensor([[0.3], [0.8], [0.1], [0.9], [0.5]])
    assert sampler.select(scores, step=0)[:, 0].nonzero().flatten().tolist() == [1, 3]
    with pytest.raises(ValueError, match="candidates"):
        SingleTaskSelectionSampler(tasks=4, candidates=3)


def test_random_sampler_keeps_everything_and_needs_no_scores():
    sampler = RandomSampler(tasks=4)
    assert not sampler.uses_scores and not sampler.needs_scores(10**6)
    assert sampler.select(torch.zeros(4, 1), step=0).all()


def test_sample_before_bind_is_a_clear_error():
    with pytest.raises(RuntimeError, match="bind"):
        TaskSampler().sample(np.random.default_rng(0), 0)
