"""The labeling page and its images: choices with their support images and "can't tell", the model's guess as a
hint that is pre-selected only when the model is sure, the uncertainty in the task data, and images that load
(the files root follows Label Studio's document root; `select` fetches one image and fails with the fix)."""

from __future__ import annotations

import dataclasses

import pytest

from units_lightning.annotation import read_manifest
from units_lightning.annotation.answers import CANT_TELL
from units_lightning.annotation.commands import TOKEN_VARIABLE, select_main
from units_lightning.annotation.label_studio import (
    DOCUMENT_ROOT_VARIABLE,
    LABEL_CONFIG,
    LabelStudio,
    LabelStudioError,
    image_urls,
    label_studio_tasks,
)

LEGACY_TOKEN = "0123456789abcdef0123456789abcdef01234567"


def test_image_urls_follow_label_studios_document_root_from_the_environment(project, monkeypatch):
    monkeypatch.setenv(DOCUMENT_ROOT_VARIABLE, str(project.root.parent))
    assert image_urls(project.root)("tasks/t/unlabeled/a.png") == "/data/local-files/?d=project/tasks/t/unlabeled/a.png"
    assert image_urls(project.root, project.root)("tasks/a.png") == "/data/local-files/?d=tasks/a.png"  # explicit
    monkeypatch.delenv(DOCUMENT_ROOT_VARIABLE)
    assert image_urls(project.root)("tasks/a.png") == "/data/local-files/?d=tasks/a.png"  # else the project


def test_select_fetches_an_image_and_fails_with_the_fix_when_it_does_not_load(
    glyph_project, project_options, fake_label_studio, monkeypatch
):
    root = glyph_project[0]
    server = fake_label_studio(root.parent)  # Label Studio serves the folder that holds the project
    monkeypatch.setenv(TOKEN_VARIABLE, LEGACY_TOKEN)
    monkeypatch.delenv(DOCUMENT_ROOT_VARIABLE, raising=False)  # select's shell does not know the server's root
    options = [*project_options(root), "--budget", "1", "--label_studio_url", server.url]
    with pytest.raises(LabelStudioError) as refused:
        select_main(options)
    message = str(refused.value)
    assert "does not load" in message and "HTTP 404" in message
    assert f"{DOCUMENT_ROOT_VARIABLE} in its shell too, or pass --label_studio_files_root" in message
    assert "project 1 was deleted again; nothing was written" in message
    assert not server.projects and len(server.deleted) == 1  # no project of broken images left behind
    assert not (root / "batches").exists() and not (root / "labels.json").exists()

    monkeypatch.setenv(DOCUMENT_ROOT_VARIABLE, str(root.parent))  # as docs/ANNOTATION.md exports it for both
    select_main(options)
    batch = read_manifest(next((root / "batches").iterdir()))
    task = server.projects[batch.label_studio["project"]]["tasks"][0]
    image = LabelStudio(server.url, LEGACY_TOKEN).request("GET", task["data"]["image"], raw=True)
    assert image == (root / task["data"]["image_id"]).read_bytes()


def test_every_choice_shows_its_class_support_images_and_there_is_a_cant_tell_choice(project, make_batch):
    task = project.tasks[1]
    batch = make_batch(project, [(task.name, list(task.unlabeled[:5]))])
    url = image_urls(project.root)
    tasks = label_studio_tasks(batch, url, {t.name: t.support for t in project.tasks})
    choices = tasks[0]["data"]["choices"]
    assert [c["value"] for c in choices] == [*task.classes, CANT_TELL]
    for choice, support in zip(choices, task.support, strict=False):
        assert f"<b>{choice['value']}</b>" in choice["html"]
        assert all(f'src="{url(image)}"' in choice["html"] for image in support)
    assert 'value="$choices"' in LABEL_CONFIG and 'value="$hint"' in LABEL_CONFIG


def test_the_models_guess_is_preselected_only_when_it_is_sure_and_an_untrained_model_suggests_nothing(
    project, make_batch
):
    task = project.tasks[0]
    batch = make_batch(project, [(task.name, list(task.unlabeled[:5]))])
    sure, unsure = (dataclasses.replace(batch.query_sets[0].images[i], vacuity=v) for i, v in ((0, 0.2), (1, 0.9)))
    query_set = dataclasses.replace(batch.query_sets[0], images=(sure, unsure, *batch.query_sets[0].images[2:]))
    batch = dataclasses.replace(batch, query_sets=(query_set,))
    tasks = label_studio_tasks(batch, image_urls(project.root), hint_vacuity=0.5)
    first, second = tasks[0], tasks[1]
    assert first["predictions"][0]["result"][0]["value"]["choices"] == [sure.predicted]
    assert "pre-selected" in first["data"]["hint"] and sure.predicted in first["data"]["hint"]
    assert second["predictions"] == []  # the model is unsure: a hint, not a pre-selected answer
    assert second["data"]["hint"].endswith("unsure (vacuity 0.90): not pre-selected")
    for imported, p in zip(tasks[:2], (sure, unsure), strict=True):  # the uncertainty to sort and filter by
        data = imported["data"]
        assert (data["vacuity"], data["dissonance"], data["suggested"]) == (p.vacuity, p.dissonance, p.predicted)
        assert data["query_set_score"] == query_set.score and data["query_set"] == 0
    cold = label_studio_tasks(dataclasses.replace(batch, checkpoint=""), image_urls(project.root))
    assert all(t["predictions"] == [] and t["data"]["hint"] == "" for t in cold)
    assert not {"suggested", "vacuity", "dissonance", "confidence"} & set(cold[0]["data"])
