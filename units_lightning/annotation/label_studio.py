"""An annotation batch as a Label Studio project: image classification with the task's classes as choices and the
model's predictions as pre-annotations; created through Label Studio's REST API, or written as files to import.

One Label Studio task per image. Its data carry the image's name in the project (``image_id``), the batch, the
task and the task's classes, which the labeling config turns into the choices (``<Choices value="$choices">``:
each image offers only its own task's classes). The model's predicted class is a prediction, shown to the
annotator as a pre-annotation. Images are served by Label Studio's local file storage
(``/data/local-files/?d=<path under LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT>``) or from any web server that serves
the project folder (``image_url_prefix``).

Nothing here imports Label Studio: the API is plain HTTP with a token (``Authorization: Token <token>``).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from units_lightning.annotation.answers import CHOICES_NAME, IMAGE_KEY
from units_lightning.annotation.atomic import write_text_atomically
from units_lightning.annotation.batch import AnnotationBatch

__all__ = [
    "LABEL_CONFIG",
    "LabelStudio",
    "LabelStudioError",
    "image_urls",
    "label_studio_tasks",
    "send_batch",
    "write_import_files",
]

IMAGE_NAME = "image"
LABEL_CONFIG = f"""<View>
  <Header value="Task $task: which class is this image?"/>
  <Image name="{IMAGE_NAME}" value="$image"/>
  <Choices name="{CHOICES_NAME}" toName="{IMAGE_NAME}" choice="single-radio" showInline="true" required="true"
           value="$choices"/>
</View>
"""


class LabelStudioError(OSError):
    """A Label Studio API call that failed (an I/O error, as a refused connection is); the message names the call,
    the status and what the server said."""


def image_urls(
    project_root: str | Path, files_root: str | Path | None = None, prefix: str | None = None
) -> Callable[[str], str]:
    """How Label Studio finds an image: a function from an image's name in the project to its URL.

    Args:
        project_root: the project folder.
        files_root: the folder Label Studio serves local files from (its ``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT``;
            default: the project folder); the project must lie inside it.
        prefix: a URL under which a web server serves the project folder; replaces local file serving.

    Raises:
        ValueError: the project is not inside ``files_root``.

    Example:
        >>> image_urls("/data/birds", "/data")("tasks/t1/unlabeled/a b.png")
        '/data/local-files/?d=birds/tasks/t1/unlabeled/a%20b.png'
        >>> image_urls("/data/birds", prefix="https://example.org/birds/")("tasks/t1/unlabeled/a.png")
        'https://example.org/birds/tasks/t1/unlabeled/a.png'
    """
    if prefix is not None:
        return lambda image: prefix.rstrip("/") + "/" + urllib.parse.quote(image)
    project_root = Path(project_root)
    files_root = Path(files_root) if files_root is not None else project_root
    try:
        inside = project_root.relative_to(files_root).as_posix()
    except ValueError:
        raise ValueError(
            f"the project {project_root} is not inside Label Studio's local files root {files_root}: start Label "
            "Studio with LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT set to a folder that holds the project, and pass it "
            "as --label_studio_files_root"
        ) from None
    base = "" if inside == "." else inside + "/"
    return lambda image: "/data/local-files/?d=" + urllib.parse.quote(base + image)


def label_studio_tasks(batch: AnnotationBatch, url: Callable[[str], str]) -> list[dict[str, Any]]:
    """The batch as Label Studio tasks to import: one per image, with the model's prediction as a pre-annotation
    (none for a batch chosen without a checkpoint: an untrained model's guess would only mislead)."""
    tasks = []
    for number, query_set in enumerate(batch.query_sets):
        for p in query_set.images:
            result = {
                "from_name": CHOICES_NAME,
                "to_name": IMAGE_NAME,
                "type": "choices",
                "value": {"choices": [p.predicted]},
            }
            tasks.append(
                {
                    "data": {
                        IMAGE_NAME: url(p.image),
                        IMAGE_KEY: p.image,
                        "batch": batch.id,
                        "task": query_set.task,
                        "query_set": number,
                        "choices": [{"value": c} for c in query_set.classes],
                    },
                    "predictions": [
                        {
                            "model_version": f"step {batch.step}",
                            "score": p.probabilities[p.predicted],
                            "result": [result],
                        }
                    ]
                    if batch.checkpoint
                    else [],
                }
            )
    return tasks


def write_import_files(batch: AnnotationBatch, folder: str | Path, url: Callable[[str], str]) -> list[Path]:
    """Write ``label_config.xml`` (the project's labeling interface) and ``tasks.json`` (the tasks to import) into
    ``folder``, for a Label Studio the command cannot reach; returns their paths."""
    folder = Path(folder)
    config, tasks = folder / "label_config.xml", folder / "tasks.json"
    write_text_atomically(config, LABEL_CONFIG)
    write_text_atomically(tasks, json.dumps(label_studio_tasks(batch, url), indent=1) + "\n")
    return [config, tasks]


def _is_refresh_token(token: str) -> bool:
    """Whether ``token`` is a Label Studio personal access token: a JWT whose payload says ``token_type: refresh``
    (legacy tokens are 40 hexadecimal characters). The payload is only read, not verified: the server does that."""
    parts = token.split(".")
    if len(parts) != 3:
        return False
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(payload, dict) and payload.get("token_type") == "refresh"


class LabelStudio:
    """The few Label Studio API calls an annotation round needs.

    Either kind of API token works: a personal access token (current Label Studio, Account & Settings > Personal
    Access Token) is exchanged for a short-lived access token (``/api/token/refresh/``, again when it expires), sent
    as ``Bearer``; a legacy token is sent as ``Token``.

    Args:
        url: the server, e.g. ``http://localhost:8080``.
        token: the API token (the ``LABEL_STUDIO_API_KEY`` variable, as Label Studio's own SDK reads it).
        timeout: seconds to wait for one call.
    """

    def __init__(self, url: str, token: str, timeout: float = 120.0):
        if not token:
            raise ValueError(
                "a Label Studio API token is needed: pass --label_studio_token or set LABEL_STUDIO_API_KEY "
                "(Label Studio: Account & Settings > Personal Access Token)"
            )
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout
        self._access: str | None = None

    def _authorization(self, renew: bool = False) -> str:
        if not _is_refresh_token(self.token):
            return f"Token {self.token}"
        if self._access is None or renew:
            answer = self._send("POST", "/api/token/refresh/", {"refresh": self.token}, None)
            self._access = answer["access"]
        return f"Bearer {self._access}"

    def _send(self, method: str, path: str, body: Any, authorization: str | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if authorization is not None:
            request.add_header("Authorization", authorization)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            text = response.read().decode()
        return json.loads(text) if text.strip() else None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One JSON call; returns the decoded answer (None when it is empty).

        Raises:
            LabelStudioError: the server answered with an error status or could not be reached.
        """
        try:
            try:
                return self._send(method, path, body, self._authorization())
            except urllib.error.HTTPError as error:
                if error.code != 401 or not _is_refresh_token(self.token):
                    raise
                return self._send(method, path, body, self._authorization(renew=True))  # the access token expired
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:500]
            raise LabelStudioError(
                f"Label Studio {method} {path}: HTTP {error.code} {error.reason}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise LabelStudioError(f"cannot reach Label Studio at {self.url} ({method} {path}): {error}") from None

    def create_project(self, title: str, label_config: str = LABEL_CONFIG) -> int:
        return int(self.request("POST", "/api/projects/", {"title": title, "label_config": label_config})["id"])

    def connect_local_files(self, project: int, path: str | Path, title: str) -> None:
        """Let ``project`` serve the images under ``path`` (a local file storage, never synced: the tasks are
        imported one per image, not one per file of the folder)."""
        body = {"project": project, "path": str(path), "title": title, "use_blob_urls": False}
        self.request("POST", "/api/storages/localfiles/", body)

    def import_tasks(self, project: int, tasks: list[dict[str, Any]]) -> int:
        """Import ``tasks`` (with their predictions); returns how many the server created."""
        answer = self.request("POST", f"/api/projects/{project}/import", tasks)
        return int((answer or {}).get("task_count", len(tasks)))

    def export(self, project: int) -> list[dict[str, Any]]:
        """The project's tasks with their annotations (Label Studio's JSON export)."""
        return self.request("GET", f"/api/projects/{project}/export?exportType=JSON&download_all_tasks=true")


def send_batch(
    batch: AnnotationBatch,
    client: LabelStudio,
    url: Callable[[str], str],
    files_root: str | Path | None = None,
) -> AnnotationBatch:
    """Create the batch's Label Studio project and import its tasks; returns the batch recording where it went.

    Args:
        batch: the batch to label.
        client: the Label Studio to create it in.
        url: the images' URLs (``image_urls``).
        files_root: when the images are served as local files, the folder to connect as the project's local file
            storage (the project's ``tasks`` folder); None when they are served from elsewhere.

    Raises:
        LabelStudioError: a call failed (the project may then exist without tasks: delete it in Label Studio).
    """
    title = f"{Path(batch.project).name} {batch.id}"[:50]
    project = client.create_project(title)
    if files_root is not None:
        client.connect_local_files(project, files_root, f"{batch.id} images")
    created = client.import_tasks(project, label_studio_tasks(batch, url))
    expected = sum(len(s.images) for s in batch.query_sets)
    if created != expected:
        raise LabelStudioError(f"Label Studio project {project} received {created} of the batch's {expected} images")
    return batch.sent_to({"url": client.url, "project": project})
