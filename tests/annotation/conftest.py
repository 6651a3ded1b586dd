"""Fixtures of the annotation tests: a small project of SyntheticGlyphs written to PNG, with its answer key; a fake
Label Studio for fast tests, and a real Label Studio server for the tests marked ``label_studio``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from units_lightning.annotation.batch import AnnotationBatch, ImagePrediction, SelectedQuerySet
from units_lightning.annotation.label_studio import LabelStudio
from units_lightning.annotation.layout import AnnotationProject, load_project
from units_lightning.annotation.simulation import write_simulated_project
from units_lightning.data.datasets.synthetic import SyntheticGlyphs

TASKS, N_WAY, UNLABELED_PER_CLASS, IMAGE_SIZE = 3, 5, 6, 16
ANNOTATION_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "annotation.yaml"


def _project_options(root: Path) -> list[str]:
    """configs/annotation.yaml shrunk to the tiny glyph project: what select and fit both take."""
    return [
        "--config",
        str(ANNOTATION_CONFIG),
        "--model.filters=4",
        "--model.inner_steps=1",
        f"--data.init_args.image_size={IMAGE_SIZE}",
        f"--data.init_args.root={root}",
        "--data.init_args.sampler.init_args.tasks=2",
        "--data.init_args.sampler.init_args.query_sets=3",
    ]


def _fit_options(run: Path, steps: int = 3) -> list[str]:
    """The trainer options of a fast CPU fit without logger, checkpoints in ``run/checkpoints``."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.logger=false",
        f"--trainer.limit_train_batches={steps}",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={run}",
        "--dashboard_callbacks=false",
    ]


def pytest_collection_modifyitems(config, items):
    """Tests marked ``label_studio`` start a Label Studio server (about a minute): they run only when ``-m``
    asks for them (``.ci/run`` runs ``pytest -m label_studio`` after the main suite)."""
    if "label_studio" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="starts a Label Studio server: run with -m label_studio (.ci/run does)")
    for item in items:
        if "label_studio" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _written_project(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("glyph-project") / "project"
    per_class = 1 + UNLABELED_PER_CLASS
    glyphs = SyntheticGlyphs("val", num_classes=TASKS * N_WAY, images_per_class=per_class, image_size=IMAGE_SIZE)
    key = write_simulated_project(glyphs, root, TASKS, N_WAY, k_shot=1, unlabeled_per_class=UNLABELED_PER_CLASS)
    return root, key


@pytest.fixture
def glyph_project(_written_project, tmp_path) -> tuple[Path, dict[str, str]]:
    """A fresh copy of a 3-task, 5-way 1-shot project of 16x16 glyph PNGs (30 unlabeled images per task), and the
    answer key of its unlabeled images."""
    source, key = _written_project
    root = tmp_path / "project"
    shutil.copytree(source, root)
    return root, dict(key)


class RecordingKey(Mapping):
    """An answer key that records every image whose label is read."""

    def __init__(self, key: Mapping[str, str]):
        self._key, self.read = dict(key), []

    def __getitem__(self, image: str) -> str:
        self.read.append(image)
        return self._key[image]

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the annotator must look images up one by one, never walk the whole key")

    def __len__(self) -> int:
        return len(self._key)


def _make_batch(
    project: AnnotationProject, sets: list[tuple[str, list[str]]], batch_id: str = "batch-test"
) -> AnnotationBatch:
    """A batch of the given ``(task, images)`` query sets, without a model (uniform pre-annotations)."""
    query_sets = []
    for task_name, images in sets:
        task = project.task(task_name)
        uniform = {c: 1 / task.n_way for c in task.classes}
        predictions = tuple(
            ImagePrediction(image, str(project.path(image)), task.classes[0], uniform, 1.0, 0.0) for image in images
        )
        query_sets.append(SelectedQuerySet(task.name, task.classes, 0.5, 1.0, 0.0, predictions))
    return AnnotationBatch(
        id=batch_id,
        project=str(project.root),
        labels=str(project.root / "labels.json"),
        created="2026-01-01T00:00:00+00:00",
        checkpoint="model.ckpt",
        step=10,
        sampler="MultiQuerySampler(tasks=2, query_sets=3, warmup_steps=0)",
        lam=0.5,
        label_budget=None,
        query_sets=tuple(query_sets),
    )


@pytest.fixture
def project(glyph_project) -> AnnotationProject:
    return load_project(glyph_project[0])


@pytest.fixture
def make_batch():
    """``make_batch(project, [(task, [image, ...]), ...], batch_id)``: a batch chosen by hand, without a model."""
    return _make_batch


@pytest.fixture
def recording_key():
    """``recording_key(key)``: an answer key whose ``read`` lists every image looked up."""
    return RecordingKey


@pytest.fixture
def project_options():
    """``project_options(root)``: configs/annotation.yaml shrunk to the glyph project (select's and fit's options)."""
    return _project_options


@pytest.fixture
def fit_options():
    """``fit_options(run, steps=3)``: the trainer options of a short CPU fit writing ``run/checkpoints/last.ckpt``."""
    return _fit_options


class FakeLabelStudio:
    """The Label Studio API calls `select`, `ingest` and `serve` make, served by a local HTTP server, for fast tests.

    Like Label Studio, it serves ``/data/local-files/?d=<path>`` from its document root only (404 elsewhere), and
    refuses a local file storage outside that root; task ids are unique across projects, a view's tasks are those its
    ``data.batch`` filter selects, and an export may name its task ids (``ids[]``). ``projects[id]`` holds the
    imported tasks, to which a test adds annotations before ``ingest`` fetches the export; ``views[id]`` the views.
    """

    def __init__(self, document_root: Path):
        import http.server
        import threading
        import urllib.parse

        self.document_root, self.projects, self.deleted, self.views = Path(document_root), {}, [], {}
        self.next_task = 1000
        fake = self

        def view_tasks(number: int) -> list[dict]:
            view = fake.views[number]
            wanted = {item["value"] for item in view["data"]["filters"]["items"]}
            return [t for t in fake.projects[view["project"]]["tasks"] if t["data"].get("batch") in wanted]

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _answer(self, status: int, body=None, raw: bytes | None = None):
                content = raw if raw is not None else json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def _body(self):
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")

            def _parts(self):
                parsed = urllib.parse.urlparse(self.path)
                return parsed.path, urllib.parse.parse_qs(parsed.query)

            def do_POST(self):
                body, (path, query) = self._body(), self._parts()
                if path == "/api/projects/":
                    number = len(fake.projects) + len(fake.deleted) + 1
                    fake.projects[number] = {"title": body["title"], "label_config": body["label_config"], "tasks": []}
                    return self._answer(201, {"id": number})
                if path == "/api/storages/localfiles/":
                    inside = Path(body["path"]).resolve().is_relative_to(fake.document_root.resolve())
                    return self._answer(201 if inside else 400, {"id": 1} if inside else {"detail": "not in root"})
                if path.endswith("/import"):
                    tasks, ids = fake.projects[int(path.split("/")[3])]["tasks"], []
                    for task in body:
                        fake.next_task += 1
                        tasks.append({**task, "id": fake.next_task, "annotations": []})
                        ids.append(fake.next_task)
                    answer = {"task_count": len(body)}
                    if query.get("return_task_ids") == ["true"]:
                        answer["task_ids"] = ids
                    return self._answer(201, answer)
                if path == "/api/dm/views/":
                    number = len(fake.views) + 1
                    fake.views[number] = {"project": int(body["project"]), "data": body["data"]}
                    return self._answer(201, {"id": number, **fake.views[number]})
                if path == "/api/dm/actions/" and query["id"] == ["delete_tasks"]:
                    project, included = fake.projects[int(query["project"][0])], body["selectedItems"]["included"]
                    assert body["selectedItems"]["all"] is False  # never 'all the project's tasks'
                    project["tasks"] = [t for t in project["tasks"] if t["id"] not in included]
                    return self._answer(200, {"detail": f"Deleted {len(included)} tasks"})
                return self._answer(404, {"detail": path})

            def do_DELETE(self):
                path, _ = self._parts()
                number = int(path.split("/")[-2])
                if path.startswith("/api/dm/views/"):
                    fake.views.pop(number)
                else:
                    fake.deleted.append(fake.projects.pop(number))
                return self._answer(204)

            def do_GET(self):
                path, query = self._parts()
                if path == "/data/local-files/":
                    file = fake.document_root / query["d"][0]
                    if file.is_file():
                        return self._answer(200, raw=file.read_bytes())
                    return self._answer(404, {"detail": "not found"})
                if path.endswith("/export"):
                    tasks = fake.projects[int(path.split("/")[3])]["tasks"]
                    ids = {int(i) for i in query.get("ids[]", [])}
                    return self._answer(200, [t for t in tasks if not ids or t["id"] in ids])
                if path == "/api/tasks/":
                    tasks, page, size = (
                        view_tasks(int(query["view"][0])),
                        int(query["page"][0]),
                        int(query["page_size"][0]),
                    )
                    return self._answer(200, {"total": len(tasks), "tasks": tasks[(page - 1) * size : page * size]})
                if path.startswith("/api/projects/") and path.count("/") == 4:
                    number = int(path.split("/")[3])
                    if number in fake.projects:
                        return self._answer(200, {"id": number, "title": fake.projects[number]["title"]})
                    return self._answer(404, {"detail": "No Project matches the given query."})
                return self._answer(404, {"detail": self.path})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def view_titles(self, project: int) -> list[str]:
        """The titles of the views (tabs) of ``project``."""
        return [v["data"]["title"] for v in self.views.values() if v["project"] == project]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_label_studio(tmp_path):
    """``fake_label_studio(document_root)``: a fake Label Studio serving local files from ``document_root``."""
    servers = []

    def start(document_root: Path) -> FakeLabelStudio:
        servers.append(FakeLabelStudio(document_root))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


# --- a real Label Studio server (tests marked label_studio) ---------------------------------------------------

LEGACY_TOKEN = "0123456789abcdef0123456789abcdef01234567"


def label_studio_executable() -> str | None:
    """``$LABEL_STUDIO_BIN``, else ``label-studio`` beside this Python or on the PATH."""
    beside = Path(sys.executable).parent / "label-studio"
    return os.environ.get("LABEL_STUDIO_BIN") or (str(beside) if beside.exists() else shutil.which("label-studio"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def label_studio_server(tmp_path_factory):
    """A Label Studio server of its own for the tests marked ``label_studio`` (data in a temporary folder, local files
    served from ``files``, each test's project in a folder of its own there); yields its URL, the first user's legacy
    token (only to create that user's personal access token) and the files folder."""
    executable = label_studio_executable()
    if executable is None:
        pytest.skip(
            "label-studio is not installed: pip install 'units-lightning[annotation]' (or set LABEL_STUDIO_BIN)"
        )
    folder = tmp_path_factory.mktemp("label-studio")
    files, port = folder / "files", free_port()
    files.mkdir()
    env = {
        **os.environ,
        "LABEL_STUDIO_BASE_DATA_DIR": str(folder / "data"),
        "LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED": "true",
        "LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT": str(files),
        "LABEL_STUDIO_USERNAME": "annotator@example.org",
        "LABEL_STUDIO_PASSWORD": "a-password-for-tests",
        "LABEL_STUDIO_USER_TOKEN": LEGACY_TOKEN,
        "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",
        "ML_BLOCK_LOCAL_IP": "false",  # the ML backend of a test listens on 127.0.0.1,
        "SSRF_PROTECTION_ENABLED": "false",  # and so does its webhook
        "LATEST_VERSION_CHECK": "false",
        "COLLECT_ANALYTICS": "false",
    }
    log = open(folder / "server.log", "wb")  # noqa: SIM115 (closed at teardown)
    server = subprocess.Popen(
        [executable, "start", "--no-browser", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900  # a first start migrates a new database: minutes on two busy cores
        while True:
            if server.poll() is not None:
                output = (folder / "server.log").read_text()[-2000:]
                pytest.fail(f"label-studio exited with status {server.returncode}: {output}")
            try:
                with urllib.request.urlopen(f"{url}/api/version", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Label Studio did not answer within 15 minutes"
            time.sleep(2)
        yield url, LEGACY_TOKEN, files
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the workers it started, nothing else
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.fixture(scope="session")
def annotator_token(label_studio_server) -> str:
    """The annotator's personal access token (Label Studio makes one per user: created once for the session)."""
    url, legacy, _ = label_studio_server
    return LabelStudio(url, legacy).request("POST", "/api/token/")["token"]
