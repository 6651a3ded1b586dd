"""Select: candidates scored by the model's task uncertainty, chosen by the configured sampler's rule."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_setup import tiny_model

from units_lightning.annotation import AnnotatedTasksDataModule, LabelStore, SimulatedAnnotator, ingest, select_batch
from units_lightning.annotation.batch import CSV_COLUMNS, read_manifest, write_batch
from units_lightning.annotation.images import load_pixels, to_float
from units_lightning.annotation.layout import load_project
from units_lightning.annotation.selection import adapted_evidence, choose_query_sets, score_candidates, task_support
from units_lightning.belief import task_beliefs, task_uncertainty
from units_lightning.ledger import LabelLedger
from units_lightning.losses import EvidentialLoss
from units_lightning.samplers import MultiQuerySampler, RandomSampler, TaskSampler

SCORES = torch.tensor([[0.1, 0.9, 0.5], [0.8, 0.2, float("-inf")], [0.3, 0.7, 0.6]])


class LeastUncertainSampler(TaskSampler):
    """A user's sampler: the least uncertain query set of each task."""

    def choose(self, scores):
        mask = torch.zeros_like(scores, dtype=torch.bool)
        return mask.scatter_(1, scores.nan_to_num(posinf=2.0, neginf=2.0).argmin(dim=1, keepdim=True), True)


def test_the_multi_query_rule_takes_each_tasks_most_uncertain_set_first():
    chosen = choose_query_sets(MultiQuerySampler(tasks=3, query_sets=3), SCORES, 3, 0, np.random.default_rng(0))
    assert chosen == [(0, 1), (1, 0), (2, 1)]  # one per task, most uncertain first
    more = choose_query_sets(MultiQuerySampler(tasks=3, query_sets=3), SCORES, 5, 0, np.random.default_rng(0))
    assert more == [(0, 1), (1, 0), (2, 1), (2, 2), (0, 2)]  # asked again: each task's next most uncertain
    everything = choose_query_sets(MultiQuerySampler(), SCORES, 100, 0, np.random.default_rng(0))
    assert len(everything) == 8 and (1, 2) not in everything  # a missing candidate is never chosen


def test_a_custom_sampler_rule_chooses_in_select():
    chosen = choose_query_sets(LeastUncertainSampler(query_sets=3), SCORES, 3, 0, np.random.default_rng(0))
    assert sorted(chosen) == [(0, 0), (1, 1), (2, 0)]


def test_a_sampler_that_ignores_scores_chooses_at_random():
    picks = {tuple(choose_query_sets(RandomSampler(), SCORES, 3, 0, np.random.default_rng(s))) for s in range(8)}
    assert len(picks) > 1  # not the top scores, not a fixed order


def test_warmup_does_not_apply_at_selection():
    chosen = choose_query_sets(MultiQuerySampler(tasks=3, warmup_steps=100), SCORES, 3, 0, np.random.default_rng(0))
    assert chosen == [(0, 1), (1, 0), (2, 1)]  # the rule, not the warm-up's first query set


def test_the_label_budget_trims_to_what_is_left_most_uncertain_first():
    ledger = LabelLedger(budget=10)
    ledger.load_state_dict({"support_images": 0, "query_images": 40, "query_sets": 8})
    chosen = choose_query_sets(MultiQuerySampler(), SCORES, 5, 0, np.random.default_rng(0), ledger)
    assert chosen == [(0, 1), (1, 0)]


@pytest.fixture
def data(glyph_project):
    return AnnotatedTasksDataModule(
        root=str(glyph_project[0]), image_size=16, n_way=5, k_shot=1, sampler=MultiQuerySampler(tasks=2, query_sets=3)
    )


def test_candidates_are_scored_with_the_models_adaptation_and_task_uncertainty(data, project):
    torch.manual_seed(0)
    model = tiny_model(sampler=data.sampler)
    candidates = score_candidates(model, project, LabelStore(), (1, 16, 16), 5, 3, 0.7, np.random.default_rng(0))
    assert candidates.scores.shape == (3, 3) and torch.isfinite(candidates.scores).all()
    task, sets = candidates.tasks[1], candidates.sets[1]
    support = to_float(load_pixels(project, [i for images in task.support for i in images], (1, 16, 16)))
    queries = [to_float(load_pixels(project, list(s), (1, 16, 16)))[None] for s in sets]
    logits = model.adapt_and_predict_sets(support[None], torch.arange(5)[None], queries)
    beliefs = task_beliefs(model.loss.evidence(torch.cat(logits)))
    torch.testing.assert_close(candidates.scores[1], task_uncertainty(beliefs.vacuity, beliefs.dissonance, 0.7))
    assert all(len(set(s)) == 5 for s in sets) and len({i for s in sets for i in s}) == 15  # disjoint sets


def test_select_batch_writes_pre_annotations_and_skips_labeled_images(data, project, glyph_project, tmp_path):
    torch.manual_seed(0)
    model = tiny_model(sampler=data.sampler)
    first = select_batch(model, data, 4, step=50, lam=0.6, checkpoint="round0.ckpt")
    assert len(first.query_sets) == 4 and first.id.startswith("batch-001-")
    assert [s.score for s in first.query_sets] == sorted((s.score for s in first.query_sets), reverse=True)
    image = first.query_sets[0].images[0]
    assert set(image.probabilities) == set(first.query_sets[0].classes)
    assert abs(sum(image.probabilities.values()) - 1) < 1e-4 and 0 < image.vacuity <= 1
    assert image.predicted == max(image.probabilities, key=image.probabilities.get)
    folder = write_batch(first, tmp_path / first.id).parent
    assert read_manifest(folder) == first
    header, *rows = (folder / "batch.csv").read_text().splitlines()
    assert header.split(",") == list(CSV_COLUMNS) and len(rows) == 20
    assert json.loads(read_manifest(folder).to_json())["query_sets"][0]["images"][0]["image"] == image.image
    ingest(first, SimulatedAnnotator(glyph_project[1]).answer(first), "key")
    second = select_batch(model, data, 100, step=50, lam=0.6)
    labeled = {p.image for s in first.query_sets for p in s.images}
    assert second.id.startswith("batch-002-") and not labeled & {p.image for s in second.query_sets for p in s.images}
    assert len(second.query_sets) == 9  # 3 candidates per task, drawn again from the images still unlabeled


def test_nothing_left_and_a_spent_budget_are_named(data, glyph_project, make_batch, project):
    model = tiny_model(sampler=data.sampler)
    with pytest.raises(ValueError, match="budget must be at least 1"):
        select_batch(model, data, 0)
    batch = make_batch(project, [(project.tasks[0].name, list(project.tasks[0].unlabeled[:5]))], "batch-001")
    ingest(batch, SimulatedAnnotator(glyph_project[1]).answer(batch), "key")
    with pytest.raises(ValueError, match="the project's label budget of 1 query sets is spent"):
        select_batch(model, data, 2, label_budget=1)


def test_with_a_store_a_task_adapts_to_its_labeled_images_too(glyph_project, make_batch, project):
    task = project.tasks[0]
    batch = make_batch(project, [(task.name, list(task.unlabeled[:5]))], "batch-001")
    ingest(batch, SimulatedAnnotator(glyph_project[1]).answer(batch), "key")
    store = LabelStore.load(glyph_project[0] / "labels.json")
    names, classes = task_support(task, store)
    support = [image for images in task.support for image in images]
    assert task_support(task) == (support, [c for c, images in enumerate(task.support) for _ in images])
    assert names == support + list(task.unlabeled[:5])
    assert classes[len(support) :] == [task.classes.index(glyph_project[1][i]) for i in task.unlabeled[:5]]
    assert task_support(project.tasks[1], store) == task_support(project.tasks[1])  # nothing labeled there


def test_a_label_the_task_no_longer_has_is_named(glyph_project, make_batch, project):
    task = project.tasks[0]
    batch = make_batch(project, [(task.name, list(task.unlabeled[:5]))], "batch-001")
    ingest(batch, SimulatedAnnotator(glyph_project[1]).answer(batch), "key")
    store = LabelStore.load(glyph_project[0] / "labels.json")
    label = store.labels[task.unlabeled[0]]
    folder = glyph_project[0] / "tasks" / task.name / "support"
    (folder / label).rename(folder / "renamed")  # the class folder renamed after its images were labeled
    named = f"class '{label}', which task '{task.name}' does not have .* put the class folder back"
    with pytest.raises(ValueError, match=named):
        task_support(load_project(glyph_project[0]).task(task.name), store)
    data = AnnotatedTasksDataModule(
        root=str(glyph_project[0]), image_size=16, n_way=5, k_shot=1, sampler=RandomSampler()
    )
    with pytest.raises(ValueError, match=named):  # fit reads the labels the same way
        data.setup("fit")


def test_adapting_on_labels_weighs_every_class_the_same_and_leaves_the_loss_as_it_was(
    glyph_project, make_batch, project
):
    torch.manual_seed(0)
    task = project.tasks[0]
    batch = make_batch(project, [(task.name, list(task.unlabeled[:5]))], "batch-001")
    ingest(batch, SimulatedAnnotator(glyph_project[1]).answer(batch), "key")
    store = LabelStore.load(glyph_project[0] / "labels.json")
    model = tiny_model()
    sets = [tuple(task.unlabeled[5:10]), tuple(task.unlabeled[10:15])]
    evidence = adapted_evidence(model, project, task, sets, (1, 16, 16), store)
    assert not model.loss.class_balanced  # restored
    names, classes = task_support(task, store)
    support = to_float(load_pixels(project, names, (1, 16, 16)))[None]
    queries = [to_float(load_pixels(project, list(s), (1, 16, 16)))[None] for s in sets]
    model.loss.class_balanced = True
    expected = model.loss.evidence(
        torch.cat(model.adapt_and_predict_sets(support, torch.tensor(classes)[None], queries))
    )
    torch.testing.assert_close(evidence, expected)
    assert not torch.allclose(evidence, adapted_evidence(model, project, task, sets, (1, 16, 16)))


def test_a_class_balanced_adaptation_runs_under_inference_mode_and_leaves_the_model_s_loss_as_it_was():
    torch.manual_seed(0)
    model = tiny_model()
    support_x, support_y = torch.randn(1, 7, 1, 16, 16), torch.tensor([[0, 0, 0, 1, 2, 3, 4]])  # unequal classes
    queries = [torch.randn(1, 5, 1, 16, 16)]
    with torch.inference_mode():  # as Lightning's test and predict loops call it
        inside = model.adapt_and_predict_sets(support_x, support_y, queries, class_balanced=True)
    outside = model.adapt_and_predict_sets(support_x, support_y, queries, class_balanced=True)
    plain = model.adapt_and_predict_sets(support_x, support_y, queries)
    torch.testing.assert_close(inside, outside)
    assert not torch.allclose(outside[0], plain[0])
    assert not model.loss.class_balanced and model.inner_loss.loss is model.loss
    balanced = model._balanced_inner_loss()
    assert balanced is model._balanced_inner_loss()  # one object: evaluation's CUDA graphs are keyed by it
    model.loss = EvidentialLoss(ib_reduction="mean")
    assert model._balanced_inner_loss() is not balanced and model._balanced_inner_loss().loss.ib_reduction == "mean"


def test_select_adapts_on_labels_where_the_data_module_says_so(data, glyph_project, project):
    torch.manual_seed(0)
    model = tiny_model(sampler=data.sampler)
    first = select_batch(model, data, 3, step=50, lam=0.6)
    ingest(first, SimulatedAnnotator(glyph_project[1]).answer(first), "key")
    plain = select_batch(model, data, 9, step=50, lam=0.6)
    data.adapt_on_labels = True
    adapted = select_batch(model, data, 9, step=50, lam=0.6)
    chosen = [{tuple(p.image for p in s.images) for s in b.query_sets} for b in (plain, adapted)]
    assert len(chosen[0]) == 9 and chosen[0] == chosen[1]  # every candidate of the same draw, scored otherwise
    labeled_tasks = {s.task for s in first.query_sets}
    by_task = {
        name: (
            [s.score for s in plain.query_sets if s.task == name],
            [s.score for s in adapted.query_sets if s.task == name],
        )
        for name in {s.task for s in plain.query_sets}
    }
    for name, (before, after) in by_task.items():
        assert (sorted(before) != sorted(after)) == (name in labeled_tasks)  # only tasks with labels adapt otherwise
