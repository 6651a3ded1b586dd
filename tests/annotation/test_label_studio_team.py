"""Issue 33's acceptance scenario against a real Label Studio server (marked ``label_studio``; ``.ci/run`` runs it):
a team of two annotators works through three rounds in the annotation project's one Label Studio project, a tab per
batch, with the model as its ML backend (``units-lightning serve``, a process of its own): Label Studio asks it for
predictions, and annotations reach its webhook and start a debounced retraining, a real short ``fit``, after which
the reloaded model's version changes. Round 2 has two batches out at once; an image both annotators skip (can't
tell) takes its query set out; an image they disagree on stays disputed under ``unanimous`` until a third answer
resolves it by ``majority``; round 3 cancels a batch (its tasks and tab go, the project stays). At the end the label
store equals the answer key for every ingested image, the ledger counts match, and no batch's answers were lost."""

from __future__ import annotations

import http.cookiejar
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from units_lightning.annotation import LabelStore, read_manifest
from units_lightning.annotation.batch import AnnotationBatch
from units_lightning.annotation.commands import TOKEN_VARIABLE, ingest_main, select_main
from units_lightning.annotation.label_studio import DOCUMENT_ROOT_VARIABLE, LabelStudio
from units_lightning.annotation.label_studio_project import read_project_record
from units_lightning.cli import cli_main

DEBOUNCE = 8.0  # seconds of quiet after the last annotation before the backend retrains (a POST takes < 1 s)
PATIENCE = 600.0  # seconds to wait for a retraining (a fit in a process of its own, on two busy cores)


def sign_up(url: str, email: str, password: str = "a-password-for-tests-2") -> str:
    """A new member of the team: signs up on Label Studio's page (joining its organization) and reads their API
    token from their account, as a person would."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    browser.open(f"{url}/user/signup/").read()
    csrf = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    form = urllib.parse.urlencode({"csrfmiddlewaretoken": csrf, "email": email, "password": password}).encode()
    browser.open(urllib.request.Request(f"{url}/user/signup/", data=form, headers={"Referer": f"{url}/user/signup/"}))
    with browser.open(f"{url}/api/current-user/token") as answer:
        return json.loads(answer.read())["token"]


class Annotator:
    """A person at Label Studio's labeling page: opens a batch's tab, answers each task from what they see (the
    answer key), skips what they cannot tell, and now and then picks another class.

    Args:
        client: their API access (their own token).
        key: what they would answer, ``{image: class}``.
    """

    def __init__(self, client: LabelStudio, key: Mapping[str, str]):
        self.client, self.key = client, key

    def work_through(
        self, batch: AnnotationBatch, skip: tuple[str, ...] = (), wrong: tuple[str, ...] = ()
    ) -> list[int]:
        """Answer every task in the batch's tab; returns the annotation ids."""
        tasks = self.client.view_tasks(batch.label_studio["view"])  # the tab shows this batch's tasks, only those
        assert tasks == batch.label_studio["tasks"]
        return [self.answer(batch, image, skip=image in skip, wrong=image in wrong) for image in tasks]

    def answer(self, batch: AnnotationBatch, image: str, skip: bool = False, wrong: bool = False) -> int:
        """Submit an annotation of the image's task (Skip: can't tell); returns its id."""
        label = self.key[image]
        if wrong:
            classes = next(s.classes for s in batch.query_sets if image in {p.image for p in s.images})
            label = next(c for c in classes if c != label)
        result = [{"from_name": "label", "to_name": "image", "type": "choices", "value": {"choices": [label]}}]
        body = {"result": [], "was_cancelled": True} if skip else {"result": result, "was_cancelled": False}
        task = batch.label_studio["tasks"][image]
        return self.client.request("POST", f"/api/tasks/{task}/annotations/", body)["id"]


class Backend:
    """``units-lightning serve`` in a process of its own (on a port the system chooses), its output in a log file."""

    def __init__(self, command: list[str], log: Path):
        self.log, self.url = log, None
        self._file = open(log, "wb")  # noqa: SIM115 (closed by stop)
        self.process = subprocess.Popen(
            [*command, "--port", "0"], stdout=self._file, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.wait(lambda: re.search(r"at (http://127\.0\.0\.1:\d+) \(", self.said()), "serve did not start")
        self.url = re.search(r"at (http://127\.0\.0\.1:\d+) \(", self.said())[1]

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def version(self) -> str:
        with urllib.request.urlopen(f"{self.url}/health", timeout=30) as answer:
            return json.loads(answer.read())["model_version"]

    def wait(self, condition: Callable[[], bool], what: str, patience: float = PATIENCE) -> None:
        deadline = time.monotonic() + patience
        while not condition():
            assert self.process.poll() is None, f"serve exited ({self.process.returncode}):\n{self.said()[-3000:]}"
            assert time.monotonic() < deadline, f"{what} within {patience:.0f} s; serve said:\n{self.said()[-3000:]}"
            time.sleep(1)

    def wait_for_version(self, version: str) -> None:
        def reloaded() -> bool:
            try:
                return self.version() == version
            except OSError:
                return False

        self.wait(reloaded, f"the backend did not serve {version!r}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._file.close()


def select(root: Path, options: list[str], *more: str) -> AnnotationBatch:
    before = set((root / "batches").iterdir()) if (root / "batches").exists() else set()
    select_main([*options, *more])
    (folder,) = set((root / "batches").iterdir()) - before
    return read_manifest(folder)


def predictions(client: LabelStudio, batch: AnnotationBatch) -> dict[str, list[str]]:
    """``{image: the model versions of its task's predictions}`` of every task in the batch's tab."""
    tab = client.request("GET", f"/api/tasks/?view={batch.label_studio['view']}&fields=all&page_size=100")
    found = {t["data"]["image_id"]: [p["model_version"] for p in t["predictions"]] for t in tab["tasks"]}
    assert set(found) == set(batch.label_studio["tasks"])
    return found


@pytest.mark.label_studio
def test_a_team_of_two_works_through_three_rounds_with_the_model_as_ml_backend(
    label_studio_server, annotator_token, glyph_project, project_options, fit_options, tmp_path, monkeypatch
):
    url, _, files = label_studio_server
    root = files / "team"
    shutil.copytree(glyph_project[0], root)
    key = glyph_project[1]
    monkeypatch.setenv(TOKEN_VARIABLE, annotator_token)  # the commands talk to Label Studio as the project's owner
    monkeypatch.setenv(DOCUMENT_ROOT_VARIABLE, str(files))
    owner = LabelStudio(url, annotator_token)
    team = [Annotator(owner, key), Annotator(LabelStudio(url, sign_up(url, "second@example.org")), key)]
    reviewer = Annotator(LabelStudio(url, sign_up(url, "reviewer@example.org")), key)
    options = [*project_options(root), "--label_studio_url", url]
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "last.ckpt"
    made = {}  # annotation ids given, by batch

    # Round 1: no model yet, a random batch; both annotators answer it, ingest takes what they agree on, fit.
    first = select(root, options, "--budget", "2")
    made[first.id] = [a for person in team for a in person.work_through(first)]
    ingest_main(["--batch", str(root / "batches" / first.id), "--annotators", "2", "--agreement", "unanimous"])
    cli_main(["fit", *project_options(root), *fit_options(run, steps=2)])
    record = read_project_record(root)
    project = record.project

    # The model becomes the project's ML backend; retraining is a real short fit, one epoch more each time.
    train = [sys.executable, "-m", "units_lightning", "fit", *project_options(root), *fit_options(run, steps=2)]
    train += ["--ckpt_path", "last", "--trainer.max_epochs", "{next_epoch}"]
    backend = Backend(
        [sys.executable, "-m", "units_lightning", "serve", *project_options(root), "--ckpt_path", str(checkpoint),
         "--label_studio_url", url, "--debounce", str(DEBOUNCE), "--hint_vacuity", "1.5", "--annotators", "2",
         "--agreement", "unanimous", "--train_command", shlex.join(train)],
        tmp_path / "serve.log",
    )  # fmt: skip
    try:
        assert backend.version() == "units-lightning step 2"
        assert f"in Label Studio project {project} at {url}" in backend.said()
        owner.request("POST", "/api/ml/", {"url": backend.url, "project": project, "title": "units-lightning"})

        # Round 2: two batches out at once, chosen by the model, in one project with a tab each.
        second = select(root, options, "--ckpt_path", str(checkpoint), "--budget", "2")
        third = select(root, options, "--ckpt_path", str(checkpoint), "--budget", "2", "--alongside", "true")
        assert not set(second.label_studio["tasks"]) & set(third.label_studio["tasks"])
        assert second.label_studio["project"] == third.label_studio["project"] == project
        ask_for_predictions(owner, project)
        for batch in (second, third):  # beside select's pre-annotations ("step 2"), the backend's
            assert all("units-lightning step 2" in v for v in predictions(owner, batch).values())
        cant_tell = second.query_sets[1].images[0].image  # nobody can tell this one
        disputed = third.query_sets[0].images[2].image  # the second annotator picks another class
        made[second.id] = [a for person in team for a in person.work_through(second, skip=(cant_tell,))]
        made[third.id] = team[0].work_through(third) + team[1].work_through(third, wrong=(disputed,))
        backend.wait_for_version("units-lightning step 4")  # webhooks -> ingest -> fit -> reload
        assert backend.said().count("units-lightning serve: trained;") == 1  # one retraining for 40 annotations
        store = LabelStore.load(root / "labels.json")
        assert cant_tell in store.cant_tell and disputed not in store.labels
        assert disputed in (root / "batches" / third.id / "disputes.csv").read_text()  # to review

        # The dispute: a third person answers, and the team settles it by majority.
        made[third.id].append(reviewer.answer(third, disputed))
        ingest_main(["--batch", str(root / "batches" / third.id), "--annotators", "2", "--agreement", "majority"])
        assert LabelStore.load(root / "labels.json").labels[disputed] == key[disputed]
        assert not (root / "batches" / third.id / "disputes.csv").exists()

        # Round 3: a batch given up (its tasks and tab go, not the project), another labeled; the model retrains.
        fourth = select(root, options, "--ckpt_path", str(checkpoint), "--budget", "2")
        fifth = select(root, options, "--ckpt_path", str(checkpoint), "--budget", "2", "--cancel", f"[{fourth.id}]")
        views = owner.request("GET", f"/api/dm/views/?project={project}")
        assert [v["data"]["title"] for v in views] == [first.id, second.id, third.id, fifth.id]
        assert {t["data"]["batch"] for t in owner.export(project)} == {first.id, second.id, third.id, fifth.id}
        ask_for_predictions(owner, project)
        assert all("units-lightning step 4" in v for v in predictions(owner, fifth).values())
        made[fifth.id] = [a for person in team for a in person.work_through(fifth)]
        backend.wait_for_version("units-lightning step 6")
        assert backend.said().count("units-lightning serve: trained;") == 2
    finally:
        backend.stop()

    # One Label Studio project for the annotation project, all its answers there and in the label store.
    projects = owner.request("GET", "/api/projects/?page_size=100")
    assert [p["id"] for p in projects.get("results", projects) if p["title"] == root.name] == [project]
    store = LabelStore.load(root / "labels.json")
    batches = [first, second, third, fifth]
    labeled = [s for b in store.batches for s in b.query_sets]
    assert dict(store.labels) == {i: key[i] for s in labeled for i in s.images}  # exactly the answer key
    assert len(labeled) == 7 and {i for s in labeled for i in s.images} == set(store.labels)
    assert (store.ledger["query_sets"], store.ledger["query_images"]) == (7, 35)
    (removed,) = store.removed
    assert removed.cant_tell == (cant_tell,) and removed.answers == {
        i: key[i] for i in removed.images if i != cant_tell
    }
    assert not store.pending() and store.selected_batch(fourth.id).cancelled
    for batch in batches:  # every query set of every batch taken in or removed, every answer still in Label Studio
        assert store.taken(batch.id) == {tuple(p.image for p in s.images) for s in batch.query_sets}
        exported = owner.export(project, list(batch.label_studio["tasks"].values()))
        assert sorted(a["id"] for t in exported for a in t["annotations"]) == sorted(made[batch.id])


def ask_for_predictions(client: LabelStudio, project: int) -> None:
    """Label Studio asks the project's ML backend for predictions of every task (the Data Manager's action)."""
    body = {"selectedItems": {"all": True, "excluded": []}, "project": str(project)}
    client.request("POST", f"/api/dm/actions/?id=retrieve_tasks_predictions&project={project}", body)
