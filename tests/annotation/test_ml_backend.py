"""The ML backend for Label Studio: /health, /setup, /predict with score, vacuity and dissonance (no pre-selected
answer when the model is unsure), annotation webhooks debounced into one retraining that ingests through the API."""

from __future__ import annotations

import json
import shlex
import sys
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
import torch
from tiny_setup import tiny_data, tiny_model, tiny_trainer

from units_lightning.annotation import AnnotatedTasksDataModule, LabelStore, SimulatedAnnotator, ingest
from units_lightning.annotation.batch import write_batch
from units_lightning.annotation.commands import finished_epochs, retrain_once, train_command
from units_lightning.annotation.label_store import LabeledQuerySet, SelectedBatch
from units_lightning.annotation.label_studio import LabelStudio, image_urls, label_studio_tasks
from units_lightning.annotation.label_studio_project import send_batch
from units_lightning.annotation.ml_backend import Debouncer, Predictor, make_server
from units_lightning.annotation.selection import adapted_evidence
from units_lightning.evaluation.checkpoints import load_checkpoint
from units_lightning.samplers import MultiQuerySampler


def sent_out(store: LabelStore, batch, folder) -> LabelStore:
    sets = tuple(LabeledQuerySet(s.task, tuple(p.image for p in s.images)) for s in batch.query_sets)
    return store.with_selected(SelectedBatch(batch.id, str(folder), batch.created, sets))


def call(url: str, path: str, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def backend(project, make_batch, glyph_project):
    root = glyph_project[0]
    batch = make_batch(project, [(t.name, list(t.unlabeled[:5])) for t in project.tasks[:2]], "batch-001")
    sent_out(LabelStore(), batch, root / "batches" / batch.id).save(root / "labels.json")
    torch.manual_seed(0)
    model = tiny_model(sampler=MultiQuerySampler(tasks=2, query_sets=3))
    predictor = Predictor(model, project, lambda: LabelStore.load(root / "labels.json"), (1, 16, 16), 1.5)
    pokes = []
    debouncer = Debouncer(lambda: pokes.append(time.monotonic()), 0.3)
    server = make_server(predictor, debouncer, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SimpleNamespace(
        url=f"http://127.0.0.1:{server.server_address[1]}", batch=batch, predictor=predictor, pokes=pokes
    )
    server.shutdown()
    server.server_close()


def test_health_setup_and_predictions_with_the_models_uncertainty(backend, project):
    assert call(backend.url, "/health") == (
        200,
        {"status": "UP", "model_class": "UnitsMAML", "model_version": "units-lightning step 0"},
    )
    assert call(backend.url, "/setup", {"project": "1.0", "schema": "<View/>"})[1]["model_version"]
    tasks = label_studio_tasks(backend.batch, image_urls(project.root))
    status, answer = call(backend.url, "/predict", {"tasks": tasks})
    assert status == 200 and len(answer["results"]) == 10
    second_set = backend.batch.query_sets[1]
    evidence = backend.predictor.evidence(second_set.task, [p.image for p in second_set.images])
    vacuity = (evidence.shape[1] / (evidence + 1).sum(dim=1)).tolist()  # N / S of each image of the set
    for result, expected in zip(answer["results"][5:], vacuity, strict=True):
        assert result["vacuity"] == pytest.approx(expected, abs=1e-5) and 0 <= result["dissonance"] <= 1
        assert result["result"][0]["value"]["choices"][0] in second_set.classes and 0 < result["score"] <= 1
    backend.predictor.hint_vacuity = 0.0  # the model is never sure enough: no answer to pre-select
    assert all(r["result"] == [] for r in call(backend.url, "/predict", {"tasks": tasks})[1]["results"])
    unknown = {"data": {**tasks[0]["data"], "batch": "batch-404"}}
    status, refused = call(backend.url, "/predict", {"tasks": [unknown]})
    assert status == 400 and "batch 'batch-404' query set 0 is not in the label store" in refused["error"]


def test_predictions_adapt_on_the_tasks_labels_where_told(project, make_batch, glyph_project):
    root, task = glyph_project[0], project.tasks[0]
    labeled = make_batch(project, [(task.name, list(task.unlabeled[:5]))], "batch-001")
    ingest(labeled, SimulatedAnnotator(glyph_project[1]).answer(labeled), "key")
    store = LabelStore.load(root / "labels.json")
    torch.manual_seed(0)
    model = tiny_model()
    images = list(task.unlabeled[5:10])
    plain = Predictor(model, project, lambda: store, (1, 16, 16)).evidence(task.name, images)
    adapted = Predictor(model, project, lambda: store, (1, 16, 16), adapt_on_labels=True).evidence(task.name, images)
    torch.testing.assert_close(adapted, adapted_evidence(model, project, task, [tuple(images)], (1, 16, 16), store)[0])
    assert not torch.allclose(plain, adapted)


def test_annotation_webhooks_are_debounced_into_one_retraining(backend):
    for _ in range(3):
        assert call(backend.url, "/webhook", {"action": "ANNOTATION_CREATED"})[0] == 201
    assert call(backend.url, "/webhook", {"action": "PROJECT_UPDATED"}) == (200, {"status": "ignored PROJECT_UPDATED"})
    time.sleep(1.0)
    assert len(backend.pokes) == 1
    assert call(backend.url, "/train", {})[0] == 201  # Label Studio's older route, and a manual start
    time.sleep(1.0)
    assert len(backend.pokes) == 2


def test_retraining_ingests_what_label_studio_has_then_trains_and_reloads(
    project, make_batch, glyph_project, fake_label_studio, tmp_path
):
    root, key = glyph_project
    server = fake_label_studio(root)
    batch = make_batch(project, [(t.name, list(t.unlabeled[:5])) for t in project.tasks[:2]], "batch-001")
    client = LabelStudio(server.url, "0123456789abcdef0123456789abcdef01234567")
    batch = send_batch(batch, client, image_urls(root, root), root / "tasks")
    folder = write_batch(batch, root / "batches" / batch.id).parent
    sent_out(LabelStore(), batch, folder).save(root / "labels.json")
    for task in server.projects[batch.label_studio["project"]]["tasks"][:5]:  # the first query set is answered
        label = key[task["data"]["image_id"]]
        task["annotations"] = [
            {
                "id": 1,
                "was_cancelled": False,
                "result": [
                    {"from_name": "label", "to_name": "image", "type": "choices", "value": {"choices": [label]}}
                ],
            }
        ]
    data = AnnotatedTasksDataModule(root=str(root), image_size=16, n_way=5, k_shot=1)
    marker = tmp_path / "trained"
    command = f"{shlex.quote(sys.executable)} -c \"open({str(marker)!r}, 'w').write('yes')\""
    config = SimpleNamespace(
        label_studio_url=None,
        label_studio_token=client.token,
        train_command=command,
        agreement="majority",
        annotators=1,
    )
    said = retrain_once(data, config, lambda: "reloaded")
    assert said == ["batch batch-001: 1 query sets taken in, 0 removed, 1 pending", "trained; reloaded"]
    assert marker.read_text() == "yes"
    assert set(LabelStore.load(root / "labels.json").labels) == {p.image for p in batch.query_sets[0].images}
    marker.unlink()
    assert retrain_once(data, config, lambda: "reloaded")[0].startswith("batch batch-001: not ingested: batch")
    assert not marker.exists()  # nothing new: no training


def test_retraining_ingests_by_the_servers_agreement_rule_and_writes_the_disputes(
    project, make_batch, glyph_project, fake_label_studio, tmp_path
):
    root, key = glyph_project
    server = fake_label_studio(root)
    batch = make_batch(project, [(t.name, list(t.unlabeled[:5])) for t in project.tasks[:2]], "batch-001")
    client = LabelStudio(server.url, "0123456789abcdef0123456789abcdef01234567")
    batch = send_batch(batch, client, image_urls(root, root), root / "tasks")
    folder = write_batch(batch, root / "batches" / batch.id).parent
    sent_out(LabelStore(), batch, folder).save(root / "labels.json")
    tasks = server.projects[batch.label_studio["project"]]["tasks"]
    disputed = tasks[7]["data"]["image_id"]  # in the second query set
    for task in tasks:  # two annotators, who disagree on one image
        image = task["data"]["image_id"]
        second = next(c for c in project.task(task["data"]["task"]).classes if c != key[image])
        for number, label in enumerate((key[image], second if image == disputed else key[image]), start=1):
            task["annotations"].append(
                {
                    "id": number,
                    "was_cancelled": False,
                    "result": [
                        {"from_name": "label", "to_name": "image", "type": "choices", "value": {"choices": [label]}}
                    ],
                }
            )
    data = AnnotatedTasksDataModule(root=str(root), image_size=16, n_way=5, k_shot=1)
    config = SimpleNamespace(
        label_studio_url=None, label_studio_token=client.token, train_command=None, agreement="unanimous", annotators=2
    )
    said = retrain_once(data, config, lambda: "reloaded")
    assert said == ["batch batch-001: 1 query sets taken in, 0 removed, 1 pending, 1 disputed image(s) in disputes.csv"]
    assert disputed in (folder / "disputes.csv").read_text()
    assert set(LabelStore.load(root / "labels.json").labels) == {p.image for p in batch.query_sets[0].images}


def test_the_train_command_trains_one_epoch_more_than_the_served_checkpoint(tmp_path):
    sampler = MultiQuerySampler(tasks=2, query_sets=3)
    trainer = tiny_trainer(tmp_path, max_steps=-1, max_epochs=2, limit_train_batches=1)
    trainer.fit(tiny_model(sampler=sampler), tiny_data(sampler))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    config = SimpleNamespace(
        train_command="fit --ckpt_path last --trainer.max_epochs {next_epoch}", ckpt_path=str(tmp_path / "last.ckpt")
    )
    assert train_command(config) == ["fit", "--ckpt_path", "last", "--trainer.max_epochs", "3"]
    assert finished_epochs(load_checkpoint(tmp_path / "last.ckpt")) == 2
    assert train_command(SimpleNamespace(train_command="fit --trainer.max_epochs 3", ckpt_path=None))[-1] == "3"
