"""Every acquisition sampler trains (``fit``, from Python and from a config's ``class_path``) within a tiny label
budget, through the module's scoring."""

from __future__ import annotations

import json

import pytest
import torch
from jsonargparse import ArgumentParser
from tiny_setup import QUICKSTART, TINY_QUICKSTART, tiny_data, tiny_model, tiny_trainer

from units_lightning.cli import cli_main
from units_lightning.samplers import (
    DiverseSampler,
    EntropySampler,
    MarginSampler,
    StochasticSampler,
    TaskSampler,
    TypicalitySampler,
    VacuitySampler,
)

SAMPLERS = {
    "vacuity": lambda: VacuitySampler(tasks=2, query_sets=3, warmup_steps=1),
    "entropy": lambda: EntropySampler(tasks=2, query_sets=3, warmup_steps=1),
    "margin": lambda: MarginSampler(tasks=2, query_sets=3, warmup_steps=1),
    "typicality": lambda: TypicalitySampler(tasks=2, query_sets=3, warmup_steps=1, neighbours=3),
    "stochastic": lambda: StochasticSampler(tasks=2, query_sets=3, warmup_steps=1, scorer=EntropySampler(), seed=5),
    "diverse": lambda: DiverseSampler(tasks=2, query_sets=3, warmup_steps=1, scorer=MarginSampler()),
}


class Recorder:
    """Wraps a sampler's ``score`` and ``select`` to keep what the training steps asked and got."""

    def __init__(self, sampler):
        self.scores, self.chosen = [], []
        score, select = sampler.score, sampler.select

        def recorded_score(evidence, lam, available=None):
            assert evidence.shape[:2] == (2, 3) and (evidence >= 0).all()
            self.scores.append(score(evidence, lam, available))
            return self.scores[-1]

        def recorded_select(scores, step):
            self.chosen.append(select(scores, step))
            return self.chosen[-1]

        sampler.score, sampler.select = recorded_score, recorded_select


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_fit_chooses_by_the_samplers_score_within_the_label_budget(name, tmp_path):
    torch.manual_seed(0)
    data = tiny_data(SAMPLERS[name]())
    model = tiny_model(label_budget=5, sampler=data.sampler)
    recorder = Recorder(data.sampler)
    trainer = tiny_trainer(tmp_path, max_steps=10)
    trainer.fit(model, data)
    assert model.ledger.query_sets == 5 and trainer.global_step == 3  # 2 + 2 + the 1 left: spent, never exceeded
    assert len(recorder.scores) == 2  # the warm-up step is not scored
    for scores, chosen in zip(recorder.scores, recorder.chosen[1:], strict=True):
        assert chosen.sum(1).tolist() == [1, 1]  # one query set per task
        if name != "stochastic":
            assert torch.equal(chosen, data.sampler.choose(scores))  # the top of the sampler's own score


def test_fit_with_the_stochastic_sampler_repeats_itself_for_a_seed(tmp_path):
    def chosen_sets(seed):
        torch.manual_seed(0)
        data = tiny_data(StochasticSampler(tasks=2, query_sets=3, seed=seed, temperature=5.0))
        model = tiny_model(label_budget=12, sampler=data.sampler)
        recorder = Recorder(data.sampler)
        tiny_trainer(tmp_path, max_steps=6).fit(model, data)
        return torch.stack(recorder.chosen)

    first = chosen_sets(1)
    assert torch.equal(first, chosen_sets(1))
    assert not torch.equal(first, chosen_sets(2))


CLASS_PATHS = [
    "units_lightning.samplers.VacuitySampler",
    "units_lightning.samplers.EntropySampler",
    "units_lightning.samplers.MarginSampler",
    "units_lightning.samplers.TypicalitySampler",
    "units_lightning.samplers.StochasticSampler",
    "units_lightning.samplers.DiverseSampler",
]


@pytest.mark.parametrize("class_path", CLASS_PATHS, ids=lambda path: path.rsplit(".", 1)[1])
def test_each_sampler_is_named_by_class_path(class_path):
    parser = ArgumentParser()
    parser.add_subclass_arguments(TaskSampler, "sampler")
    config = parser.parse_args(["--sampler", json.dumps({"class_path": class_path, "init_args": {"tasks": 3}})])
    sampler = parser.instantiate(config).sampler
    assert type(sampler).__name__ == class_path.rsplit(".", 1)[1] and sampler.tasks == 3


def test_the_command_fits_with_a_nested_acquisition_from_its_config(tmp_path):
    sampler = {
        "class_path": "units_lightning.samplers.StochasticSampler",
        "init_args": {
            "tasks": 2,
            "query_sets": 3,
            "warmup_steps": 2,
            "temperature": 0.5,
            "scorer": {"class_path": "units_lightning.samplers.TypicalitySampler", "init_args": {"neighbours": 3}},
        },
    }
    options = [*TINY_QUICKSTART, "--trainer.limit_train_batches=3", "--trainer.logger=false"]
    options += [f"--trainer.default_root_dir={tmp_path}", f"--data.init_args.sampler={json.dumps(sampler)}"]
    cli = cli_main(["fit", "--config", str(QUICKSTART), *options])
    assert isinstance(cli.model.sampler, StochasticSampler) and isinstance(cli.model.sampler.scorer, TypicalitySampler)
    assert cli.trainer.global_step == 6 and cli.model.ledger.query_sets == 12  # one set per task per step
