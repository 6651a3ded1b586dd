"""An annotation batch as Label Studio tasks: image classification with the task's classes as choices, each shown
with its support images, a "can't tell" choice, and the model's suggestion as a hint; sent through Label Studio's
REST API (``label_studio_project``: one Label Studio project per annotation project), or written as files to import.

One Label Studio task per image. Its data carry the image's name in the project (``image_id``), the batch, the
task, the query set, the model's uncertainty about the image (``vacuity``, ``dissonance``, ``confidence``) and the
query set's score (``query_set_score``: what ``select`` chose by), so that people can sort and filter by them, and
the task's classes, which the labeling config turns into the choices (``<Choices value="$choices">``: each image
offers only its own task's classes, each with its support images, then "can't tell"). Everything that differs
between tasks and batches travels in the task data, so the labeling config (``LABEL_CONFIG``) is one for every
batch. The model's suggestion is written as a hint (``hint``); it is also a pre-annotation, pre-selected, only when
the model is sure enough (its vacuity below ``hint_vacuity``), and an untrained model (a batch chosen without a
checkpoint) suggests nothing. Images are served by Label Studio's local file storage (``/data/local-files/?d=<path
under LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT>``) or from any web server that serves the project folder
(``image_url_prefix``); ``check_image_served`` fetches one through Label Studio to check that they load.

Nothing here imports Label Studio: the API is plain HTTP with a token (``Authorization: Token <token>``).
"""

from __future__ import annotations

import base64
import html
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from units_lightning.annotation.answers import CANT_TELL, CHOICES_NAME, IMAGE_KEY
from units_lightning.annotation.atomic import write_text_atomically
from units_lightning.annotation.batch import AnnotationBatch, ImagePrediction

__all__ = [
    "DOCUMENT_ROOT_VARIABLE",
    "HINT_VACUITY",
    "LABEL_CONFIG",
    "LabelStudio",
    "LabelStudioError",
    "check_image_served",
    "document_root",
    "hint",
    "image_urls",
    "label_studio_tasks",
    "write_import_files",
]

IMAGE_NAME = "image"
DOCUMENT_ROOT_VARIABLE = "LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT"
HINT_VACUITY = 0.5  # the model's class is pre-selected only below this vacuity (N / S: 1 when it has no evidence)
SUPPORT_SHOWN = 5  # support images shown beside a class choice
_PAGE = 100  # tasks per page of a listing, task ids per export call
LABEL_CONFIG = f"""<View>
  <Header value="Task $task: which class is this image? Compare it with each class's support images."/>
  <Image name="{IMAGE_NAME}" value="$image" maxWidth="320px"/>
  <Header value="$hint" size="6"/>
  <Choices name="{CHOICES_NAME}" toName="{IMAGE_NAME}" choice="single-radio" required="true" value="$choices"/>
</View>
"""


class LabelStudioError(OSError):
    """A Label Studio API call that failed (an I/O error, as a refused connection is); the message names the call,
    the status and what the server said.

    Attributes:
        status: the HTTP status the server answered with, or None (no answer).
    """

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def document_root(explicit: str | Path | None = None) -> Path | None:
    """The folder Label Studio serves local files from: ``explicit`` when given, else the
    ``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT`` variable (the one Label Studio itself reads, so a shell that
    exports it for the server gives the same folder to ``select``), else None."""
    if explicit is not None:
        return Path(explicit).expanduser().resolve()
    variable = os.environ.get(DOCUMENT_ROOT_VARIABLE, "").strip()
    return Path(variable).expanduser().resolve() if variable else None


def image_urls(
    project_root: str | Path, files_root: str | Path | None = None, prefix: str | None = None
) -> Callable[[str], str]:
    """How Label Studio finds an image: a function from an image's name in the project to its URL.

    Args:
        project_root: the project folder.
        files_root: the folder Label Studio serves local files from (its ``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT``;
            default: that variable of this environment, else the project folder); the project must lie inside it.
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
    files_root = Path(files_root) if files_root is not None else document_root() or project_root
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


def hint(prediction: ImagePrediction | None, hint_vacuity: float = HINT_VACUITY) -> tuple[str, bool]:
    """The model's suggestion for an image as the labeling page shows it, and whether it is pre-selected.

    No suggestion without a prediction (a batch chosen by no trained model); below ``hint_vacuity`` the class is
    pre-selected, above it the page only names it and says the model is unsure, so that nobody is anchored to a
    guess made without evidence.

    Example:
        >>> p = ImagePrediction("a.png", "/p/a.png", "wren", {"wren": 0.6, "tit": 0.4}, vacuity=0.8, dissonance=0.1)
        >>> hint(p)
        ("The model's guess: wren (p 0.60), unsure (vacuity 0.80): not pre-selected", False)
        >>> hint(None)
        ('', False)
    """
    if prediction is None:
        return "", False
    sure = prediction.vacuity < hint_vacuity
    guess = f"The model's guess: {prediction.predicted} (p {prediction.probabilities[prediction.predicted]:.2f})"
    if sure:
        return f"{guess}, vacuity {prediction.vacuity:.2f}: pre-selected, check it", True
    return f"{guess}, unsure (vacuity {prediction.vacuity:.2f}): not pre-selected", False


def _choice(name: str, images: Sequence[str], url: Callable[[str], str]) -> dict[str, str]:
    """A class choice showing its name and its support images (``html`` of a dynamic ``<Choice>``)."""
    pictures = "".join(
        f'<img src="{html.escape(url(i))}" alt="{html.escape(name)}" style="height:64px;margin:2px;'
        'border:1px solid #ccc"/>'
        for i in images[:SUPPORT_SHOWN]
    )
    return {"value": name, "html": f"<span><b>{html.escape(name)}</b> {pictures}</span>"}


def label_studio_tasks(
    batch: AnnotationBatch,
    url: Callable[[str], str],
    supports: Mapping[str, Sequence[Sequence[str]]] | None = None,
    hint_vacuity: float = HINT_VACUITY,
) -> list[dict[str, Any]]:
    """The batch as Label Studio tasks to import: one per image.

    Args:
        batch: the batch.
        url: the images' URLs (``image_urls``).
        supports: ``{task: the support images of each of its classes, in the order of its classes}``
            (``AnnotationTask.support``), shown beside each choice; None: the choices show class names only.
        hint_vacuity: the model's class is a pre-annotation (pre-selected) only for images whose vacuity is below
            this; every image of a batch chosen without a checkpoint gets no suggestion at all.
    """
    supports = supports or {}
    tasks = []
    for number, query_set in enumerate(batch.query_sets):
        shown = supports.get(query_set.task, [()] * len(query_set.classes))
        choices = [_choice(c, images, url) for c, images in zip(query_set.classes, shown, strict=True)]
        choices.append({"value": CANT_TELL, "html": f"<i>{CANT_TELL}</i>"})
        for p in query_set.images:
            text, preselect = hint(p if batch.checkpoint else None, hint_vacuity)
            result = {
                "from_name": CHOICES_NAME,
                "to_name": IMAGE_NAME,
                "type": "choices",
                "value": {"choices": [p.predicted]},
            }
            data = {
                IMAGE_NAME: url(p.image),
                IMAGE_KEY: p.image,
                "batch": batch.id,
                "task": query_set.task,
                "query_set": number,
                "query_set_score": query_set.score,
                "choices": choices,
                "hint": text,
            }
            if batch.checkpoint:
                data.update(
                    suggested=p.predicted,
                    confidence=p.probabilities[p.predicted],
                    vacuity=p.vacuity,
                    dissonance=p.dissonance,
                )
            prediction = {
                "model_version": f"step {batch.step}",
                "score": p.probabilities[p.predicted],
                "result": [result],
            }
            tasks.append({"data": data, "predictions": [prediction] if preselect else []})
    return tasks


def write_import_files(
    batch: AnnotationBatch,
    folder: str | Path,
    url: Callable[[str], str],
    supports: Mapping[str, Sequence[Sequence[str]]] | None = None,
    hint_vacuity: float = HINT_VACUITY,
) -> list[Path]:
    """Write ``label_config.xml`` (the project's labeling interface) and ``tasks.json`` (the tasks to import, see
    ``label_studio_tasks``) into ``folder``, for a Label Studio the command cannot reach; returns their paths."""
    folder = Path(folder)
    config, tasks = folder / "label_config.xml", folder / "tasks.json"
    write_text_atomically(config, LABEL_CONFIG)
    imported = label_studio_tasks(batch, url, supports, hint_vacuity)
    write_text_atomically(tasks, json.dumps(imported, indent=1) + "\n")
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

    def _send(self, method: str, path: str, body: Any, authorization: str | None, raw: bool = False) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if authorization is not None:
            request.add_header("Authorization", authorization)
        request.add_header("Accept", "*/*" if raw else "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            content = response.read()
        if raw:
            return content
        text = content.decode()
        return json.loads(text) if text.strip() else None

    def request(self, method: str, path: str, body: Any = None, raw: bool = False) -> Any:
        """One call; returns the decoded JSON answer (None when it is empty), or its bytes when ``raw``.

        Raises:
            LabelStudioError: the server answered with an error status or could not be reached.
        """
        try:
            try:
                return self._send(method, path, body, self._authorization(), raw)
            except urllib.error.HTTPError as error:
                if error.code != 401 or not _is_refresh_token(self.token):
                    raise
                return self._send(method, path, body, self._authorization(renew=True), raw)  # the access token expired
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:500]
            raise LabelStudioError(
                f"Label Studio {method} {path}: HTTP {error.code} {error.reason}: {detail}", error.code
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise LabelStudioError(f"cannot reach Label Studio at {self.url} ({method} {path}): {error}") from None

    def create_project(self, title: str, label_config: str = LABEL_CONFIG) -> int:
        return int(self.request("POST", "/api/projects/", {"title": title, "label_config": label_config})["id"])

    def project(self, project: int) -> dict[str, Any]:
        """The project's details (its title, its labeling config, ...).

        Raises:
            LabelStudioError: it does not exist (HTTP 404) or the call failed.
        """
        return self.request("GET", f"/api/projects/{project}/")

    def connect_local_files(self, project: int, path: str | Path, title: str) -> None:
        """Let ``project`` serve the images under ``path`` (a local file storage, never synced: the tasks are
        imported one per image, not one per file of the folder)."""
        body = {"project": project, "path": str(path), "title": title, "use_blob_urls": False}
        self.request("POST", "/api/storages/localfiles/", body)

    def import_tasks(self, project: int, tasks: list[dict[str, Any]]) -> list[int] | None:
        """Import ``tasks`` (with their predictions); returns the ids of the tasks created, in the order given, or
        None when the server does not say (an import it runs in the background: then ``view_tasks`` finds them).

        Raises:
            LabelStudioError: the call failed, or the server created another number of tasks.
        """
        answer = self.request("POST", f"/api/projects/{project}/import?return_task_ids=true", tasks) or {}
        ids = answer.get("task_ids")
        created = len(ids) if ids is not None else int(answer.get("task_count", len(tasks)))
        if created != len(tasks):
            raise LabelStudioError(f"Label Studio project {project} received {created} of {len(tasks)} tasks")
        return None if ids is None else [int(i) for i in ids]

    def create_view(self, project: int, title: str, filters: dict[str, Any]) -> int:
        """A Data Manager tab of ``project`` named ``title`` that shows the tasks ``filters`` selects; its id."""
        body = {"project": project, "data": {"title": title, "filters": filters}}
        return int(self.request("POST", "/api/dm/views/", body)["id"])

    def delete_view(self, view: int) -> None:
        self.request("DELETE", f"/api/dm/views/{view}/")

    def view_tasks(self, view: int) -> dict[str, int]:
        """``{image name: task id}`` of the tasks a Data Manager tab shows (every page of them)."""
        found: dict[str, int] = {}
        for page in range(1, 1_000_000):
            answer = self.request("GET", f"/api/tasks/?view={view}&page={page}&page_size={_PAGE}")
            tasks = answer.get("tasks", []) if isinstance(answer, dict) else answer
            found.update({t["data"][IMAGE_KEY]: int(t["id"]) for t in tasks})
            if len(tasks) < _PAGE:
                break
        return found

    def delete_tasks(self, project: int, tasks: Sequence[int]) -> None:
        """Delete the tasks ``tasks`` of ``project`` (with their annotations), these only."""
        if tasks:
            body = {"selectedItems": {"all": False, "included": [int(t) for t in tasks]}, "project": str(project)}
            self.request("POST", f"/api/dm/actions/?id=delete_tasks&project={project}", body)

    def delete_project(self, project: int) -> None:
        self.request("DELETE", f"/api/projects/{project}/")

    def export(self, project: int, tasks: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """The tasks of ``project`` with their annotations (Label Studio's JSON export): every task, or only those
        of the ids ``tasks`` (fetched in slices, so that no URL grows long)."""
        path = f"/api/projects/{project}/export?exportType=JSON&download_all_tasks=true"
        if tasks is None:
            return self.request("GET", path)
        ids = [int(t) for t in tasks]
        exported: list[dict[str, Any]] = []
        for start in range(0, len(ids), _PAGE):
            exported += self.request("GET", path + "".join(f"&ids[]={i}" for i in ids[start : start + _PAGE]))
        return exported


def check_image_served(client: LabelStudio, image_url: str, file: str | Path) -> None:
    """Fetch ``image_url`` as the labeling page will (through Label Studio, with the token, when it is a path of
    the server; as it is when it is a full URL) and check that it is the image ``file``.

    Raises:
        LabelStudioError: the image does not load, or another file comes back; the message says how to fix it.
    """
    fix = (
        f"the image {image_url} does not load ({{why}}), so annotators would see broken images. Label Studio serves "
        f"local files under its {DOCUMENT_ROOT_VARIABLE}: start it with LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true "
        f"and {DOCUMENT_ROOT_VARIABLE} set to a folder that holds the project, and give select the same folder "
        f"(export {DOCUMENT_ROOT_VARIABLE} in its shell too, or pass --label_studio_files_root); or serve the project "
        "folder from a web server and pass --image_url_prefix"
    )
    try:
        if image_url.startswith(("http://", "https://")):
            with urllib.request.urlopen(image_url, timeout=client.timeout) as response:
                served = response.read()
        else:
            served = client.request("GET", image_url, raw=True)
    except (LabelStudioError, OSError) as error:
        raise LabelStudioError(fix.format(why=error)) from None
    if served != Path(file).read_bytes():
        raise LabelStudioError(fix.format(why=f"the server sent another file than {file}"))
