"""``select`` with every acquisition sampler: it scores and chooses what people label as it chooses in training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_setup import tiny_model

from units_lightning.annotation import AnnotatedTasksDataModule, read_manifest, select_batch
from units_lightning.annotation.commands import select_main, select_parser
from units_lightning.annotation.selection import choose_query_sets
from units_lightning.samplers import (
    DiverseSampler,
    EntropySampler,
    MarginSampler,
    MultiQuerySampler,
    RandomSampler,
    StochasticSampler,
    TypicalitySampler,
    VacuitySampler,
)
from units_lightning.samplers.acquisition import diverse_order, margin_score

SAMPLERS = {
    "random": RandomSampler,
    "units": MultiQuerySampler,
    "vacuity": VacuitySampler,
    "entropy": EntropySampler,
    "margin": MarginSampler,
    "typicality": lambda: TypicalitySampler(neighbours=3),
    "stochastic": lambda: StochasticSampler(scorer=MarginSampler(), temperature=2.0, seed=1),
    "diverse": lambda: DiverseSampler(weight=0.5),
}


@pytest.fixture
def data(glyph_project):
    return AnnotatedTasksDataModule(
        root=str(glyph_project[0]), image_size=16, n_way=5, k_shot=1, sampler=MultiQuerySampler(tasks=2, query_sets=3)
    )


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_select_chooses_by_each_acquisition_within_the_label_budget(name, data):
    torch.manual_seed(0)
    model = tiny_model(sampler=data.sampler)
    sampler = SAMPLERS[name]()
    batch = select_batch(model, data, 4, step=50, lam=0.6, checkpoint="model.ckpt", sampler=sampler)
    assert len(batch.query_sets) == 4 and batch.sampler == repr(sampler)
    images = [p.image for s in batch.query_sets for p in s.images]
    assert len(set(images)) == len(images) == 20
    if name not in ("random", "stochastic"):
        scores = [s.score for s in batch.query_sets]
        assert scores == sorted(scores, reverse=True)  # by the sampler's own score, most informative first
    if name == "diverse":
        assert len({s.task for s in batch.query_sets[:3]}) == 3  # one per task before a second from any
    limited = select_batch(model, data, 4, step=50, lam=0.6, label_budget=2, sampler=sampler)
    assert len(limited.query_sets) == 2  # the project's label budget trims the batch


def test_select_scores_with_the_acquisitions_score(data, project):
    torch.manual_seed(0)
    model = tiny_model(sampler=data.sampler)
    batch = select_batch(model, data, 3, step=50, lam=0.6, sampler=MarginSampler())
    for chosen in batch.query_sets:
        probabilities = torch.tensor([[p.probabilities[c] for c in chosen.classes] for p in chosen.images])
        closest = probabilities.topk(2, dim=-1).values
        assert chosen.score == pytest.approx(float((1 - (closest[:, 0] - closest[:, 1])).mean()), abs=1e-5)
    assert margin_score(torch.zeros(1, 5, 5)).item() == 1.0


def test_stochastic_select_repeats_itself_for_a_seed_and_not_across_seeds(data):
    torch.manual_seed(0)
    model = tiny_model(sampler=data.sampler)

    def chosen(seed):
        sampler = StochasticSampler(temperature=5.0, seed=seed)
        return [(s.task, s.images[0].image) for s in select_batch(model, data, 4, step=50, sampler=sampler).query_sets]

    assert chosen(0) == chosen(0)
    assert any(chosen(seed) != chosen(0) for seed in range(1, 6))


def test_diversity_takes_one_set_per_task_before_a_second_from_any():
    scores = torch.tensor([[0.9, 0.8, 0.7], [0.1, 0.2, 0.3], [0.5, 0.4, 0.6]])
    priorities = diverse_order(scores, torch.eye(9).view(3, 3, 9), weight=0.0)
    chosen = choose_query_sets(DiverseSampler(weight=0.0), priorities, 4, 0, np.random.default_rng(0))
    assert chosen == [(0, 0), (2, 2), (1, 2), (0, 1)]  # each task's best, best first; then task 0's second


def test_select_command_takes_the_acquisition_by_class_path(glyph_project, project_options, tmp_path, capsys):
    root = glyph_project[0]
    options = project_options(root)
    parser = select_parser()
    model = parser.instantiate(parser.parse_args([*options, "--budget", "1"])).model
    checkpoint = tmp_path / "model.ckpt"
    torch.save({"state_dict": model.state_dict(), "global_step": 60, "epoch": 0}, checkpoint)
    acquisition = '{"class_path": "units_lightning.samplers.StochasticSampler", "init_args": {"seed": 7, "scorer": '
    acquisition += '{"class_path": "units_lightning.samplers.MarginSampler"}}}'
    select_main([*options, "--ckpt_path", str(checkpoint), "--budget", "3", "--acquisition", acquisition])
    batch = read_manifest(next((root / "batches").iterdir()))
    assert batch.sampler.startswith("StochasticSampler(") and "scorer=MarginSampler" in batch.sampler
    assert "seed=7" in batch.sampler
    assert len(batch.query_sets) == 3


def test_select_chooses_by_margin_unless_told_otherwise(glyph_project, project_options, tmp_path):
    root = glyph_project[0]
    options = project_options(root)
    parser = select_parser()
    built = parser.instantiate(parser.parse_args([*options, "--budget", "1"]))
    checkpoint = tmp_path / "model.ckpt"
    torch.save({"state_dict": built.model.state_dict(), "global_step": 60, "epoch": 0}, checkpoint)
    select_main([*options, "--ckpt_path", str(checkpoint), "--budget", "2"])
    batch = read_manifest(next((root / "batches").iterdir()))
    assert batch.sampler.startswith("MarginSampler(")  # the labeling-time winner (docs/RESULTS.md)
    assert f"tasks={built.data.sampler.tasks}" in batch.sampler
    assert f"query_sets={built.data.sampler.query_sets}" in batch.sampler


def test_select_reads_a_config_that_holds_every_top_level_option_of_fit(tmp_path):
    # A run's saved config.yaml holds all of fit's options: select ignores the ones it does not use.
    from tiny_setup import QUICKSTART, TINY_QUICKSTART

    from units_lightning.cli.parser import cli_main

    fit = cli_main(["--config", str(QUICKSTART), *TINY_QUICKSTART, f"--trainer.default_root_dir={tmp_path}"], run=False)
    fit_options = {key.split(".")[0] for key in fit.config.keys()} - {"config"}
    select_options = {action.dest.split(".")[0] for action in select_parser()._actions}
    assert {"compile_for_next_run", "progress", "dashboard_callbacks"} <= fit_options
    assert fit_options <= select_options, fit_options - select_options
