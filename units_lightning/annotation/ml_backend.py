"""A model server for Label Studio's ML backend API: Label Studio asks it for predictions, and annotations trigger
retraining.

Label Studio (Settings > Model, the server's URL) calls ``GET /health``, ``POST /setup`` (the project's labeling
config; answered with the model version), ``POST /predict`` (``{"tasks": [...]}``; answered with one prediction
per task) and, for every annotation when "start training on annotation submission" is on, ``POST /webhook`` (the
annotation webhook; ``POST /train`` is the same route under its older name).

A prediction adapts the model to the image's task support set and predicts the image's whole query set, as
``select`` scored it (batch norm uses the set's statistics): the set's images are those ``select`` recorded in the
label store for the task's ``batch`` and ``query_set``. It carries the model's class as the result, the class's
expected probability as ``score``, and the image's ``vacuity`` and ``dissonance`` beside it. A prediction is made
only when the model is sure enough (vacuity below ``hint_vacuity``), as ``select`` pre-selects, so that Label
Studio never pre-selects a guess made without evidence.

Annotations are debounced: a burst of them starts one retraining, ``debounce`` seconds after the last one, never
two at once; what retraining does (fetch the answers through the API, ingest, fit, reload) is the ``retrain``
callable the server is given (``units-lightning serve`` passes one, see ``commands``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from units_lightning.annotation.answers import CHOICES_NAME, IMAGE_KEY
from units_lightning.annotation.label_store import LabelStore
from units_lightning.annotation.label_studio import HINT_VACUITY, IMAGE_NAME
from units_lightning.annotation.layout import AnnotationProject
from units_lightning.annotation.selection import adapted_evidence
from units_lightning.belief import belief, dissonance, expected_probability, vacuity
from units_lightning.module import UnitsMAML

__all__ = ["Debouncer", "Predictor", "make_server"]

TRAINING_EVENTS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_CREATED", "START_TRAINING")


class Debouncer:
    """Runs ``action`` once ``wait`` seconds have passed without another ``poke``; never two runs at once (a poke
    during a run starts one more run after it).

    Args:
        action: what to run (in a thread of its own).
        wait: seconds of quiet before it runs.
    """

    def __init__(self, action: Callable[[], None], wait: float):
        self.action, self.wait = action, wait
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._running = threading.Lock()
        self.runs = 0

    def poke(self) -> None:
        """An event: (re)start the quiet period."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.wait, self._run)
            self._timer.daemon = True
            self._timer.start()

    def _run(self) -> None:
        with self._running:
            self.runs += 1
            self.action()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()


class Predictor:
    """Predictions for Label Studio tasks of an annotation project's batches.

    Args:
        model: the trained model (on the device to predict on).
        project: the project; store: a callable returning its current label store (re-read at every request).
        image_shape: (C, H, W) the model takes.
        hint_vacuity: predictions are made only below this vacuity.
        step: the training step of the model's checkpoint, which names the model version (set it again, under
            ``lock``, when new weights are loaded).
        adapt_on_labels: adapt to each task's labeled images too (``AnnotatedTasksDataModule.adapt_on_labels``).
    """

    def __init__(
        self,
        model: UnitsMAML,
        project: AnnotationProject,
        store: Callable[[], LabelStore],
        image_shape: tuple[int, int, int],
        hint_vacuity: float = HINT_VACUITY,
        step: int = 0,
        adapt_on_labels: bool = False,
    ):
        self.model, self.project, self.store = model, project, store
        self.adapt_on_labels = adapt_on_labels
        self.image_shape, self.hint_vacuity, self.step = image_shape, hint_vacuity, step
        self.lock = threading.Lock()  # one prediction at a time; retraining swaps the weights under it

    @property
    def version(self) -> str:
        """The model version Label Studio shows and tags predictions with: ``units-lightning step <step>``."""
        return f"units-lightning step {self.step}"

    def _query_set(self, store: LabelStore, data: dict[str, Any]) -> tuple[str, ...]:
        out = store.selected_batch(str(data.get("batch")))
        number = int(data.get("query_set", -1))
        if out is None or not 0 <= number < len(out.query_sets):
            raise ValueError(
                f"task of image {data.get(IMAGE_KEY)!r}: batch {data.get('batch')!r} query set {number} is not in "
                "the label store: predictions are for the tasks `units-lightning select` sent"
            )
        return out.query_sets[number].images

    def evidence(self, task_name: str, images: Sequence[str], store: LabelStore | None = None) -> torch.Tensor:
        """(M, N) evidence of ``images`` (one query set of task ``task_name``) after adapting to its support set (and,
        with ``adapt_on_labels``, to the task's labeled images in ``store``, by default read now), as ``select``
        scores them (``adapted_evidence``)."""
        task = self.project.task(task_name)
        labels = (store if store is not None else self.store()) if self.adapt_on_labels else None
        return adapted_evidence(self.model, self.project, task, [tuple(images)], self.image_shape, labels)[0]

    def predict(self, tasks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """One prediction per task (an empty one where the model is unsure), in Label Studio's ML backend form."""
        store = self.store()
        answers: list[dict[str, Any]] = []
        cache: dict[tuple[str, tuple[str, ...]], torch.Tensor] = {}
        with self.lock:
            for task in tasks:
                data = task.get("data", {})
                images = self._query_set(store, data)
                key = (str(data["task"]), images)
                if key not in cache:
                    cache[key] = self.evidence(*key, store)
                evidence = cache[key][images.index(data[IMAGE_KEY])]
                probability = expected_probability(evidence[None])[0]
                vac, dis = float(vacuity(evidence[None])[0]), float(dissonance(belief(evidence[None]))[0])
                classes = self.project.task(key[0]).classes
                best = int(probability.argmax())
                sure = vac < self.hint_vacuity
                result = [
                    {
                        "from_name": CHOICES_NAME,
                        "to_name": IMAGE_NAME,
                        "type": "choices",
                        "value": {"choices": [classes[best]]},
                    }
                ]
                answers.append(
                    {
                        "model_version": self.version,
                        "score": round(float(probability[best]), 6),
                        "vacuity": round(vac, 6),
                        "dissonance": round(dis, 6),
                        "result": result if sure else [],
                    }
                )
        return answers


def make_server(predictor: Predictor, retrain: Debouncer, host: str = "127.0.0.1", port: int = 9090):
    """The HTTP server of the ML backend API (``serve_forever`` to run it; ``server_address`` has the port).

    Routes: ``GET /health``, ``POST /setup``, ``POST /predict``, ``POST /webhook`` and ``POST /train`` (annotation
    events poke ``retrain``; other events are acknowledged and ignored).
    """

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

        def _answer(self, status: int, body: Any) -> None:
            content = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/health", ""):
                health = {"status": "UP", "model_class": "UnitsMAML", "model_version": predictor.version}
                return self._answer(200, health)
            return self._answer(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            except json.JSONDecodeError as error:
                return self._answer(400, {"error": f"not JSON: {error}"})
            route = self.path.split("?")[0].rstrip("/")
            if route == "/setup":
                return self._answer(200, {"model_version": predictor.version})
            if route == "/predict":
                try:
                    results = predictor.predict(body.get("tasks", []))
                except (ValueError, KeyError) as error:
                    return self._answer(400, {"error": str(error)})
                return self._answer(200, {"results": results, "model_version": predictor.version})
            if route in ("/webhook", "/train"):
                action = body.get("action", "START_TRAINING")
                if action in TRAINING_EVENTS:
                    retrain.poke()
                    return self._answer(201, {"status": "training scheduled", "debounce_s": retrain.wait})
                return self._answer(200, {"status": f"ignored {action}"})
            return self._answer(404, {"error": f"no route {self.path}"})

    return ThreadingHTTPServer((host, port), Handler)
