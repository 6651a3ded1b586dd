"""One Label Studio project per annotation project: created by the first batch, recorded in label_studio.json and
reused by every later one, a tab (a view filtered on data.batch) per batch; ingest fetches only its batch's tasks,
a cancelled batch's tasks and tab are deleted (never the project), and a batch an older version sent to a project of
its own still ingests."""

from __future__ import annotations

import json
import threading
import time

import pytest

from units_lightning.annotation import LabelStore, ingest, read_manifest
from units_lightning.annotation.answers import Answer
from units_lightning.annotation.batch import write_batch
from units_lightning.annotation.commands import TOKEN_VARIABLE, ingest_main, select_main
from units_lightning.annotation.label_store import LabeledQuerySet, SelectedBatch, store_lock
from units_lightning.annotation.label_studio import (
    DOCUMENT_ROOT_VARIABLE,
    LABEL_CONFIG,
    LabelStudio,
    LabelStudioError,
    image_urls,
    label_studio_tasks,
)
from units_lightning.annotation.label_studio_project import (
    PROJECT_FILE,
    batch_export,
    batch_filter,
    read_project_record,
)

LEGACY_TOKEN = "0123456789abcdef0123456789abcdef01234567"


def answered(task: dict, label: str, number: int = 1, skipped: bool = False) -> None:
    """An annotator's submitted annotation of ``task`` (in the fake server's project)."""
    result = [{"from_name": "label", "to_name": "image", "type": "choices", "value": {"choices": [label]}}]
    task["annotations"].append({"id": number, "was_cancelled": skipped, "result": [] if skipped else result})


@pytest.fixture
def sent(glyph_project, project_options, fake_label_studio, monkeypatch):
    """``sent(*options)``: select a batch into a fake Label Studio serving the project folder; returns the batch.
    Also has ``server``, ``root`` and ``key``."""
    root, key = glyph_project
    server = fake_label_studio(root)
    monkeypatch.setenv(TOKEN_VARIABLE, LEGACY_TOKEN)
    monkeypatch.setenv(DOCUMENT_ROOT_VARIABLE, str(root))

    def select(*options: str):
        before = set((root / "batches").iterdir()) if (root / "batches").exists() else set()
        select_main([*project_options(root), "--label_studio_url", server.url, *options])
        (folder,) = set((root / "batches").iterdir()) - before
        return read_manifest(folder)

    select.server, select.root, select.key = server, root, key
    return select


def test_every_batch_goes_into_one_project_with_a_tab_of_its_own(sent):
    server, root = sent.server, sent.root
    first = sent("--budget", "2")
    second = sent("--budget", "1", "--alongside", "true")  # two batches out at once
    record = read_project_record(root)
    assert list(server.projects) == [record.project] and record.url == server.url
    assert json.loads((root / PROJECT_FILE).read_text())["project"] == record.project
    project = server.projects[record.project]
    assert project["label_config"] == LABEL_CONFIG and project["title"] == root.name  # one config for all batches
    assert server.view_titles(record.project) == [first.id, second.id]
    for batch in (first, second):
        where = batch.label_studio
        assert (where["url"], where["project"]) == (server.url, record.project)
        images = [p.image for s in batch.query_sets for p in s.images]
        assert list(where["tasks"]) == images  # {image: task id}, one task per image
        view = server.views[where["view"]]
        assert view["data"]["filters"] == batch_filter(batch.id)
        in_tab = LabelStudio(server.url, LEGACY_TOKEN).view_tasks(where["view"])
        assert in_tab == where["tasks"]
        assert all(t["data"]["batch"] == batch.id for t in project["tasks"] if t["id"] in in_tab.values())
    assert len(project["tasks"]) == 15 and not set(first.label_studio["tasks"]) & set(second.label_studio["tasks"])


def test_ingest_fetches_only_its_batchs_tasks(sent, tmp_path):
    server, root, key = sent.server, sent.root, sent.key
    first = sent("--budget", "1")
    second = sent("--budget", "1", "--alongside", "true")
    tasks = server.projects[first.label_studio["project"]]["tasks"]
    for task in tasks:  # both batches answered
        answered(task, key[task["data"]["image_id"]])
    ingest_main(["--batch", str(root / "batches" / second.id)])
    store = LabelStore.load(root / "labels.json")
    assert set(store.labels) == set(second.label_studio["tasks"])
    exported = json.loads((root / "batches" / second.id / "label_studio" / "export.json").read_text())
    assert [t["id"] for t in exported] == list(second.label_studio["tasks"].values())
    assert [p.id for p in store.pending()] == [first.id]


def test_cancelling_a_batch_deletes_its_tasks_and_tab_not_the_project(sent, capsys):
    server, key = sent.server, sent.key
    first = sent("--budget", "1")
    project = first.label_studio["project"]
    third = sent("--budget", "1", "--cancel", f"[{first.id}]")  # given up, and a new batch in its place
    said = capsys.readouterr().out
    assert f"{first.id}: its 5 task(s) and its tab were deleted from Label Studio project {project}" in said
    assert list(server.projects) == [project] and server.view_titles(project) == [third.id]
    assert {t["data"]["batch"] for t in server.projects[project]["tasks"]} == {third.id}

    # a batch of two query sets, one taken in: the other's tasks go, the tab stays with the tasks taken in
    partial = sent("--budget", "2", "--alongside", "true")
    kept = partial.query_sets[0].images
    ingest(partial, [Answer(p.image, key[p.image], "test") for p in kept], "test")
    sent("--budget", "1", "--alongside", "true", "--cancel", f"[{partial.id}]")
    assert "its 5 task(s) not taken in were deleted" in capsys.readouterr().out
    assert server.view_titles(project)[-2] == partial.id
    left = {t["data"]["image_id"] for t in server.projects[project]["tasks"] if t["data"]["batch"] == partial.id}
    assert left == {p.image for p in kept}


def test_a_batch_an_older_version_sent_to_a_project_of_its_own_still_ingests(
    project, make_batch, glyph_project, project_options, fake_label_studio, monkeypatch, capsys
):
    root, key = glyph_project
    server = fake_label_studio(root)
    monkeypatch.setenv(TOKEN_VARIABLE, LEGACY_TOKEN)
    batch = make_batch(project, [(t.name, list(t.unlabeled[:5])) for t in project.tasks[:2]], "batch-old")
    client = LabelStudio(server.url, LEGACY_TOKEN)
    old = client.create_project("project batch-old")  # what select did before: a project per batch
    client.request("POST", f"/api/projects/{old}/import", label_studio_tasks(batch, image_urls(root, root)))
    batch = batch.sent_to({"url": server.url, "project": old})
    folder = write_batch(batch, root / "batches" / batch.id).parent
    sets = tuple(LabeledQuerySet(s.task, tuple(p.image for p in s.images)) for s in batch.query_sets)
    LabelStore().with_selected(SelectedBatch(batch.id, str(folder), batch.created, sets)).save(root / "labels.json")
    for task in server.projects[old]["tasks"][:5]:
        answered(task, key[task["data"]["image_id"]])
    ingest_main(["--batch", str(folder)])  # the whole project exported, as then
    assert set(LabelStore.load(root / "labels.json").labels) == set(sets[0].images)
    capsys.readouterr()
    select_main([*project_options(root), "--budget", "1", "--cancel", "[batch-old]"])  # the next batch: files only
    assert f"its Label Studio project {old} (one per batch, made by an older version) stays" in capsys.readouterr().out
    assert old in server.projects


def test_a_project_recorded_on_another_server_or_gone_is_named(sent, project_options, fake_label_studio):
    server, root = sent.server, sent.root
    first = sent("--budget", "1")
    other = fake_label_studio(root)
    elsewhere = [*project_options(root), "--budget", "1", "--alongside", "true", "--label_studio_url", other.url]
    with pytest.raises(ValueError, match=rf"go to Label Studio project 1 at {server.url} \(.*label_studio.json\), not"):
        select_main(elsewhere)
    assert not other.projects
    server.projects.clear()  # someone deleted it in Label Studio
    with pytest.raises(LabelStudioError, match=r"is gone \(HTTP 404\)\. Move label_studio\.json away"):
        sent("--budget", "1", "--alongside", "true")
    assert read_manifest(root / "batches" / first.id).label_studio["project"] == 1


def test_an_image_that_does_not_load_removes_only_the_new_batchs_tasks_and_tab(sent, monkeypatch):
    server, root = sent.server, sent.root
    first = sent("--budget", "1")
    project = first.label_studio["project"]
    monkeypatch.setenv(DOCUMENT_ROOT_VARIABLE, str(root.parent))  # select's root differs from the server's
    with pytest.raises(LabelStudioError, match="the batch's tasks and tab were removed from Label Studio project 1"):
        sent("--budget", "1", "--alongside", "true")
    assert list(server.projects) == [project] and server.view_titles(project) == [first.id]
    assert [t["id"] for t in server.projects[project]["tasks"]] == list(first.label_studio["tasks"].values())
    assert [b.id for b in LabelStore.load(root / "labels.json").selected] == [first.id]


def test_the_label_store_is_updated_by_one_command_at_a_time(project, make_batch, glyph_project):
    root, key = glyph_project
    batch = make_batch(project, [(project.tasks[0].name, list(project.tasks[0].unlabeled[:5]))])
    labels = root / "labels.json"
    done = threading.Event()
    answers = [Answer(i, key[i], "test") for i in project.tasks[0].unlabeled[:5]]
    worker = threading.Thread(target=lambda: (ingest(batch, answers, "test"), done.set()))
    with store_lock(labels):  # another command is reading, changing and writing the store
        worker.start()
        time.sleep(0.5)
        assert not done.is_set() and not labels.exists()  # the ingest waits for it
    worker.join(timeout=30)
    assert done.is_set() and len(LabelStore.load(labels).labels) == 5


def test_a_recorded_task_id_that_a_task_of_another_batch_took_since_is_left_out(sent):
    server = sent.server
    batch = sent("--budget", "1")
    tasks = server.projects[batch.label_studio["project"]]["tasks"]
    # Label Studio on SQLite gives a deleted task's id to the next task it creates: here to one of another batch
    tasks[0]["data"] = {**tasks[0]["data"], "batch": "batch-009-0000", "image_id": "tasks/task-001/unlabeled/0000.png"}
    exported = batch_export(batch, LabelStudio(server.url, LEGACY_TOKEN))
    assert [t["id"] for t in exported] == list(batch.label_studio["tasks"].values())[1:]
