"""Label Studio: the batch as a project with pre-annotations, its export read back, and one round against a real
Label Studio server (marked ``label_studio``: the server takes a minute or more to start; ``.ci/run`` runs it)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
import urllib.request

import pytest
import torch
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.annotation import IngestError, LabelStore, ingest, read_answers, read_manifest
from units_lightning.annotation.answers import CANT_TELL, read_label_studio_export
from units_lightning.annotation.commands import TOKEN_VARIABLE, ingest_main, select_main
from units_lightning.annotation.label_studio import (
    DOCUMENT_ROOT_VARIABLE,
    LABEL_CONFIG,
    LabelStudio,
    LabelStudioError,
    image_urls,
    label_studio_tasks,
    write_import_files,
)
from units_lightning.cli import cli_main
from units_lightning.samplers import MultiQuerySampler


def annotation(label: str, cancelled: bool = False, number: int = 1) -> dict:
    result = [{"from_name": "label", "to_name": "image", "type": "choices", "value": {"choices": [label]}}]
    return {"id": number, "result": result, "was_cancelled": cancelled}


def test_the_batch_becomes_one_task_per_image_with_its_tasks_classes_and_the_prediction(project, make_batch, tmp_path):
    batch = make_batch(project, [(t.name, list(t.unlabeled[:5])) for t in project.tasks[:2]])
    tasks = label_studio_tasks(batch, image_urls(project.root, project.root.parent), hint_vacuity=1.5)  # all sure
    assert len(tasks) == 10
    first, sixth = tasks[0], tasks[5]
    assert first["data"]["image_id"] == batch.query_sets[0].images[0].image
    assert first["data"]["image"] == f"/data/local-files/?d=project/{first['data']['image_id']}"
    assert [c["value"] for c in sixth["data"]["choices"]] == [*project.tasks[1].classes, CANT_TELL]
    prediction = first["predictions"][0]
    assert prediction["result"][0]["value"]["choices"] == [batch.query_sets[0].images[0].predicted]
    assert prediction["result"][0]["from_name"] == "label" and 'name="label"' in LABEL_CONFIG
    assert 'value="$choices"' in LABEL_CONFIG and 'value="$image"' in LABEL_CONFIG
    cold = dataclasses.replace(batch, checkpoint="")
    assert all(t["predictions"] == [] for t in label_studio_tasks(cold, image_urls(project.root)))
    config, imported = write_import_files(batch, tmp_path / "ls", image_urls(project.root))
    assert config.read_text() == LABEL_CONFIG and json.loads(imported.read_text())[3]["data"]["task"] == "task-000"
    with pytest.raises(ValueError, match="is not inside Label Studio's local files root"):
        image_urls(project.root, tmp_path / "elsewhere")


def test_an_export_gives_one_answer_per_submitted_annotation(project, make_batch, glyph_project, tmp_path):
    key = glyph_project[1]
    batch = make_batch(project, [(project.tasks[0].name, list(project.tasks[0].unlabeled[:5]))])
    tasks = label_studio_tasks(batch, image_urls(project.root))
    for number, task in enumerate(tasks, start=1):
        task["id"] = number
        task["annotations"] = [annotation(key[task["data"]["image_id"]], number=10 * number)]
    tasks[1]["annotations"].append(annotation("class-9999", cancelled=True, number=99))  # skipped: can't tell
    (tmp_path / "export.json").write_text(json.dumps(tasks))
    answers = read_answers(tmp_path / "export.json")
    skipped = answers.pop(2)
    assert (skipped.label, skipped.where) == (CANT_TELL, "export.json task 2 annotation 99 (skipped)")
    assert [a.image for a in answers] == [p.image for p in batch.query_sets[0].images]
    assert answers[2].where == "export.json task 3 annotation 30"
    ingest(batch, answers, "export.json")
    second = tasks[4]
    second["annotations"].append(
        annotation(next(c for c in batch.query_sets[0].classes if c != key[second["data"]["image_id"]]))
    )
    disagreeing = dataclasses.replace(batch, id="batch-two")
    # two images answered 1 to 1: disputed, their query set pending
    with pytest.raises(IngestError, match=r"(?s)no query set is complete yet \(1 pending\).*2 disputed"):
        ingest(disagreeing, read_label_studio_export(tasks, "export.json"), "export.json", tmp_path / "new.json")
    minimal = [
        {"image_id": t["data"]["image_id"], "label": key[t["data"]["image_id"]], "id": i} for i, t in enumerate(tasks)
    ]
    assert [a.label for a in read_label_studio_export(minimal, "min.json")] == [a.label for a in answers]
    with pytest.raises(ValueError, match="min.json task 7 has no 'image_id'"):
        read_label_studio_export([{"id": 7, "data": {"image": "x.png"}}], "min.json")


def test_an_unreachable_server_and_a_missing_token_are_named():
    with pytest.raises(ValueError, match="a Label Studio API token is needed"):
        LabelStudio("http://localhost:9", "")
    with pytest.raises(
        LabelStudioError, match=r"cannot reach Label Studio at http://127.0.0.1:9 \(POST /api/projects/\)"
    ):
        LabelStudio("http://127.0.0.1:9", "token", timeout=5).create_project("x")


# --- a real server --------------------------------------------------------------------------------------------


@pytest.mark.label_studio
def test_one_round_through_a_real_label_studio(
    label_studio_server, annotator_token, glyph_project, project_options, fit_options, tmp_path, monkeypatch
):
    url, legacy, files = label_studio_server
    root = files / "project"
    shutil.copytree(glyph_project[0], root)
    key = glyph_project[1]
    token = annotator_token
    monkeypatch.setenv(TOKEN_VARIABLE, token)

    sampler = MultiQuerySampler(tasks=2, query_sets=3)  # a model of the project's shape, as a first round's would be
    model = tiny_model(sampler=sampler)
    trainer = tiny_trainer(tmp_path, max_steps=2)
    trainer.fit(model, tiny_data(sampler))
    trainer.save_checkpoint(tmp_path / "model.ckpt")

    options = project_options(root)
    monkeypatch.setenv(DOCUMENT_ROOT_VARIABLE, str(files))  # exported for the server and select, as the docs say
    select_main([*options, "--ckpt_path", str(tmp_path / "model.ckpt"), "--budget", "2", "--label_studio_url", url])
    folder = next((root / "batches").iterdir())
    batch = read_manifest(folder)
    assert batch.label_studio["url"] == url
    client = LabelStudio(url, token)
    project = batch.label_studio["project"]
    tasks = client.request("GET", f"/api/projects/{project}/tasks/?page_size=100")
    assert len(tasks) == 10
    skipped = batch.query_sets[1].images[0].image  # the annotator cannot tell this one

    for task in tasks:  # an annotator at work: look at the image and the supports, answer or skip, submit
        image = task["data"]["image_id"]
        with urllib.request.urlopen(
            urllib.request.Request(url + task["data"]["image"], headers={"Authorization": f"Bearer {client._access}"})
        ) as served:
            assert served.read() == (root / image).read_bytes()
        assert task["data"]["hint"].startswith("The model's guess") and "vacuity" in task["data"]
        assert bool(task["predictions"]) == (task["data"]["vacuity"] < 0.5)  # pre-selected only when sure
        assert [c["value"] for c in task["data"]["choices"]][-1] == CANT_TELL
        result = [{"from_name": "label", "to_name": "image", "type": "choices", "value": {"choices": [key[image]]}}]
        body = {"result": [], "was_cancelled": True} if image == skipped else {"result": result, "was_cancelled": False}
        client.request("POST", f"/api/tasks/{task['id']}/annotations/", body)

    ingest_main(["--batch", str(folder)])  # the export fetched through the API
    store = LabelStore.load(root / "labels.json")
    assert dict(store.labels) == {p.image: key[p.image] for p in batch.query_sets[0].images}
    assert store.cant_tell == {skipped: batch.id} and store.removed[0].images == tuple(
        p.image for p in batch.query_sets[1].images
    )
    assert store.batches[0].source == f"{url} project {project}"
    assert (folder / "label_studio" / "export.json").is_file()

    run = tmp_path / "run"
    cli_main(["fit", *options, *fit_options(run, steps=2)])  # one round of training on the answers
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 2


@pytest.mark.label_studio
def test_label_studio_asks_the_ml_backend_for_predictions_and_annotations_reach_its_webhook(
    label_studio_server, annotator_token, glyph_project, project_options, tmp_path, monkeypatch
):
    url, _, files = label_studio_server
    root = files / "project-ml"
    shutil.copytree(glyph_project[0], root)
    token = annotator_token
    monkeypatch.setenv(TOKEN_VARIABLE, token)
    monkeypatch.setenv(DOCUMENT_ROOT_VARIABLE, str(files))
    sampler = MultiQuerySampler(tasks=2, query_sets=3)
    model = tiny_model(sampler=sampler)
    trainer = tiny_trainer(tmp_path, max_steps=2)
    trainer.fit(model, tiny_data(sampler))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    select_main(
        [
            *project_options(root),
            "--ckpt_path",
            str(tmp_path / "model.ckpt"),
            "--budget",
            "1",
            "--label_studio_url",
            url,
        ]
    )
    batch = read_manifest(next((root / "batches").iterdir()))
    project = batch.label_studio["project"]

    from units_lightning.annotation.layout import load_project
    from units_lightning.annotation.ml_backend import Debouncer, Predictor, make_server

    model.cpu()
    predictor = Predictor(model, load_project(root), lambda: LabelStore.load(root / "labels.json"), (1, 16, 16), 1.5)
    pokes = []
    backend = make_server(predictor, Debouncer(lambda: pokes.append(1), 0.5), port=0)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        client = LabelStudio(url, token)
        backend_url = f"http://127.0.0.1:{backend.server_address[1]}"
        client.request("POST", "/api/ml/", {"url": backend_url, "project": project, "title": "units-lightning"})
        client.request(
            "POST",
            f"/api/dm/actions/?id=retrieve_tasks_predictions&project={project}",
            {"selectedItems": {"all": True, "excluded": []}, "project": str(project)},
        )
        tasks = client.request("GET", f"/api/projects/{project}/tasks/?page_size=100")
        ours = [p for t in tasks for p in t["predictions"] if p["model_version"] == predictor.version]
        classes = batch.query_sets[0].classes
        assert len(ours) == 5 and all(p["result"][0]["value"]["choices"][0] in classes for p in ours)
        task = tasks[0]
        result = [
            {
                "from_name": "label",
                "to_name": "image",
                "type": "choices",
                "value": {"choices": [batch.query_sets[0].classes[0]]},
            }
        ]
        client.request("POST", f"/api/tasks/{task['id']}/annotations/", {"result": result, "was_cancelled": False})
        deadline = time.monotonic() + 60
        while not pokes and time.monotonic() < deadline:
            time.sleep(0.5)
        assert pokes, "the annotation webhook did not reach the ML backend"
    finally:
        backend.shutdown()
        backend.server_close()
