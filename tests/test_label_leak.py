"""The labels of query sets that were not chosen must have no influence at all."""

import lightning.pytorch as pl
import numpy as np
import torch
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.samplers import MultiQuerySampler


class TamperingSampler(MultiQuerySampler):
    """Records which query sets are chosen; optionally overwrites the labels of some query sets.

    ``tamper[step]`` is a (T, Q) bool mask of the query sets whose labels are replaced by random
    classes before the batch leaves the data loader. The images and every other draw stay the same.
    """

    def __init__(self, tamper=None, **kwargs):
        super().__init__(**kwargs)
        self.tamper = tamper or {}
        self.chosen = {}

    def sample(self, rng, step):
        episode = super().sample(rng, step)
        if step in self.tamper:
            noise = np.random.default_rng(10_000 + step)  # never touches the episode's own generator
            mask = self.tamper[step]
            episode.query_labels[mask] = noise.integers(0, self.spec.n_way, size=episode.query_labels[mask].shape)
        return episode

    def select(self, scores, step):
        mask = super().select(scores, step)
        self.chosen[step] = mask.cpu().numpy().copy()
        return mask


def train(tmp_path, tamper=None):
    pl.seed_everything(0, verbose=False)
    sampler = TamperingSampler(tamper=tamper, tasks=2, query_sets=4, warmup_steps=2)
    model = tiny_model(eta=None, sampler=sampler)
    tiny_trainer(tmp_path, max_steps=8).fit(model, tiny_data(sampler, seed=3))
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach(), sampler.chosen, model.ledger


def test_scrambling_every_unchosen_query_label_changes_nothing(tmp_path):
    reference, chosen, ledger = train(tmp_path)
    assert any((~mask).any() and not mask[:, 0].all() for step, mask in chosen.items() if step >= 2), (
        "selection must pick other sets than the first, or the test proves nothing"
    )
    unchosen = {step: ~mask for step, mask in chosen.items()}
    scrambled, chosen_again, _ = train(tmp_path, tamper=unchosen)
    assert all((chosen[s] == chosen_again[s]).all() for s in chosen)
    assert torch.equal(reference, scrambled)
    assert ledger.query_sets == 2 * 8 and ledger.query_images == 2 * 8 * 5


def test_the_same_attack_on_chosen_labels_does_change_training(tmp_path):
    reference, chosen, _ = train(tmp_path)
    tampered, _, _ = train(tmp_path, tamper=chosen)
    assert not torch.equal(reference, tampered)
