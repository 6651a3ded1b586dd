"""The project layout on disk and the training episodes made of it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from tiny_setup import tiny_model, tiny_trainer

from units_lightning.annotation import AnnotatedTasksDataModule, SimulatedAnnotator, ingest, load_project
from units_lightning.annotation.episodes import LabeledTask, check_tasks, draw_labeled_episode
from units_lightning.episode import EpisodeSpec
from units_lightning.samplers import MultiQuerySampler


def test_a_project_lists_tasks_classes_supports_and_unlabeled_images(project):
    assert [t.name for t in project.tasks] == ["task-000", "task-001", "task-002"]
    task = project.tasks[0]
    assert task.n_way == 5 and all(len(images) == 1 for images in task.support)
    assert task.support[0][0] == f"tasks/task-000/support/{task.classes[0]}/0.png"
    assert len(task.unlabeled) == 30 and task.unlabeled[0] == "tasks/task-000/unlabeled/0000.png"
    assert project.path(task.unlabeled[0]).is_file()


def _empty_one_class(root):
    for image in sorted((root / "tasks/task-002/support").iterdir())[0].iterdir():
        image.unlink()


def _keep_one_class(root):
    for folder in sorted((root / "tasks/task-000/support").iterdir())[1:]:
        shutil.rmtree(folder)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda root: shutil.rmtree(root / "tasks"), "is not an annotation project: it has no tasks/ folder"),
        (lambda root: shutil.rmtree(root / "tasks/task-001/support"), "task 'task-001' has no support folder"),
        (_empty_one_class, "task 'task-002': class folders without images in"),
        (_keep_one_class, "needs one folder of images per class (at least 2), found 1"),
    ],
    ids=["no-tasks-folder", "no-support-folder", "empty-class-folder", "one-class"],
)
def test_a_broken_layout_is_named(glyph_project, damage, message):
    root, _ = glyph_project
    damage(root)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_project(root)


def test_tasks_must_fit_the_episode_shape(project):
    with pytest.raises(ValueError, match=r"task 'task-000' has 5 classes \(.*\) but data.n_way=4"):
        check_tasks(project, EpisodeSpec(4, 1, 1))
    with pytest.raises(
        ValueError, match=r"class 'class-\d+' of task 'task-000' has 1 support image\(s\) but data.k_shot=2"
    ):
        check_tasks(project, EpisodeSpec(5, 2, 1))


def labeled_data(glyph_project, make_batch, sampler):
    """The glyph project with two query sets of task-001 and one of task-002 labeled."""
    root, key = glyph_project
    project = load_project(root)
    one, two = project.tasks[1].unlabeled, project.tasks[2].unlabeled
    batch = make_batch(
        project, [("task-001", list(one[:5])), ("task-001", list(one[5:10])), ("task-002", list(two[:5]))]
    )
    ingest(batch, SimulatedAnnotator(key).answer(batch), "key")
    return AnnotatedTasksDataModule(root=str(root), image_size=16, n_way=5, k_shot=1, sampler=sampler), batch


def test_training_batches_hold_the_supports_and_exactly_the_labeled_query_sets(glyph_project, make_batch):
    sampler = MultiQuerySampler(tasks=2, query_sets=3)
    data, batch = labeled_data(glyph_project, make_batch, sampler)
    data.setup("fit")
    episodes = data._episodes
    assert [t.name for t in episodes.tasks] == ["task-001", "task-002"]  # task-000 has no labels yet
    assert len(episodes.images) == 2 * 5 + 15  # the support images and the labeled images, nothing else
    key, project = glyph_project[1], load_project(glyph_project[0])
    for task in episodes.tasks:
        classes = project.task(task.name).classes
        labeled = [s for s in batch.query_sets if s.task == task.name]
        for images, positions, query_set in zip(task.query_sets, task.query_labels, labeled, strict=True):
            assert [classes[p] for p in positions] == [key[p.image] for p in query_set.images]
            assert torch.equal(episodes.images.labels[images] - task.classes[0], torch.as_tensor(positions))
    step = episodes[7]
    assert step.support_x.shape == (2, 5, 1, 16, 16) and step.query_x.shape == (2, 3, 5, 1, 16, 16)
    assert sorted(step.support_y[0].tolist()) == [0, 1, 2, 3, 4]
    assert torch.equal(episodes[7].query_x, step.query_x)  # a step's batch is a function of the step


def test_a_task_with_fewer_labeled_sets_than_candidates_repeats_them():
    task = LabeledTask("t", np.arange(2), (np.array([0]), np.array([1])), np.array([[2, 3]]), np.array([[1, 0]]))
    indices = draw_labeled_episode([task], np.random.default_rng(0), 3, 2, 1)
    assert indices.query.shape == (3, 2, 2) and (indices.query == [2, 3]).all()
    assert (indices.query_labels == [1, 0]).all()


def test_fit_trains_on_the_labeled_sets(glyph_project, make_batch, tmp_path):
    sampler = MultiQuerySampler(tasks=2, query_sets=3)
    data, _ = labeled_data(glyph_project, make_batch, sampler)
    model = tiny_model(sampler=sampler)
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    tiny_trainer(tmp_path, max_steps=3).fit(model, data)
    assert model.global_step == 3 and model.ledger.query_sets == 3 * 2  # one set of each of 2 tasks per step
    assert not torch.equal(before, torch.nn.utils.parameters_to_vector(model.parameters()))


def test_fit_without_labels_and_a_store_naming_a_removed_image_are_named(glyph_project, make_batch):
    root, _ = glyph_project
    sampler = MultiQuerySampler(tasks=2, query_sets=3)
    bare = AnnotatedTasksDataModule(root=str(root), image_size=16, n_way=5, k_shot=1, sampler=sampler)
    with pytest.raises(ValueError, match="no query set of .* is labeled yet: run `units-lightning select`"):
        bare.setup("fit")
    data, batch = labeled_data(glyph_project, make_batch, sampler)
    removed = batch.query_sets[2].images[1].image
    (root / removed).unlink()
    with pytest.raises(ValueError, match=f"the label store names image '{removed}' of task 'task-002', which is not"):
        data.setup("fit")
    with pytest.raises(ValueError, match="needs held-out query sets, but data.val_share is 0"):
        data.setup("test")


def test_every_fit_reads_the_labels_taken_in_since_the_last(glyph_project, make_batch):
    sampler = MultiQuerySampler(tasks=2, query_sets=3)
    data, _ = labeled_data(glyph_project, make_batch, sampler)
    data.setup("fit")
    assert [t.name for t in data._episodes.tasks] == ["task-001", "task-002"]
    project, key = load_project(glyph_project[0]), glyph_project[1]
    batch = make_batch(project, [("task-000", list(project.tasks[0].unlabeled[:5]))], "batch-002")
    ingest(batch, SimulatedAnnotator(key).answer(batch), "key")
    data.setup("fit")  # the next round's fit, with the same data module
    assert [t.name for t in data._episodes.tasks] == ["task-000", "task-001", "task-002"]
