"""The annotation project on disk: tasks, each with a labeled support set and a pool of unlabeled images.

A project is a folder a person can make by hand::

    <root>/tasks/<task>/support/<class>/<image>    labeled support images, one folder per class
    <root>/tasks/<task>/unlabeled/<image>          candidate query images, known to show the task's classes

An image is named by its path relative to the root, with forward slashes (``tasks/birds-1/unlabeled/0042.jpg``):
the name the label store, the annotation batches and Label Studio use for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from units_lightning.data.io.files import is_image_name, is_visible

__all__ = ["AnnotationProject", "AnnotationTask", "load_project"]

TASKS_FOLDER = "tasks"
SUPPORT_FOLDER = "support"
UNLABELED_FOLDER = "unlabeled"


@dataclass(frozen=True)
class AnnotationTask:
    """One task of a project.

    Attributes:
        name: the task's folder name.
        classes: the class folder names of its support set, sorted; a class's position is its label.
        support: the image names of each class's support images, in the order of ``classes``.
        unlabeled: the names of its candidate query images, sorted.
    """

    name: str
    classes: tuple[str, ...]
    support: tuple[tuple[str, ...], ...]
    unlabeled: tuple[str, ...]

    @property
    def n_way(self) -> int:
        return len(self.classes)

    def label_of(self, image: str, label: str) -> int:
        """The position in ``classes`` of class ``label``, which the label store gives ``image`` of this task.

        Raises:
            ValueError: the task has no such class (its folder was renamed or removed after the image was labeled).
        """
        if label not in self.classes:
            raise ValueError(
                f"the label store gives image {image!r} class {label!r}, which task {self.name!r} does not have "
                f"(its classes: {', '.join(self.classes)}): put the class folder back under "
                f"tasks/{self.name}/support/, or remove the image's batch from the label store"
            )
        return self.classes.index(label)


@dataclass(frozen=True)
class AnnotationProject:
    """The tasks of a project folder (see the module docstring for the layout).

    Attributes:
        root: the project folder.
        tasks: its tasks, sorted by name.
    """

    root: Path
    tasks: tuple[AnnotationTask, ...]

    def path(self, image: str) -> Path:
        """The file of image ``image`` (a name relative to the root)."""
        return self.root.joinpath(*image.split("/"))

    def task(self, name: str) -> AnnotationTask:
        """The task called ``name``.

        Raises:
            KeyError: no such task; the message lists the project's tasks.
        """
        for task in self.tasks:
            if task.name == name:
                return task
        raise KeyError(
            f"no task {name!r} in {self.root / TASKS_FOLDER} (its tasks: {_listed(t.name for t in self.tasks)})"
        )

    def unlabeled_owner(self) -> dict[str, AnnotationTask]:
        """``{image name: task}`` for every unlabeled image of the project."""
        return {image: task for task in self.tasks for image in task.unlabeled}


def _listed(names, shown: int = 8) -> str:
    names = list(names)
    more = f", ... ({len(names)} in all)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _images(folder: Path, root: Path) -> tuple[str, ...]:
    """The image names directly inside ``folder``, sorted."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and is_image_name(p.name))
    return tuple(p.relative_to(root).as_posix() for p in files)


def _subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and is_visible(p.name))


def _load_task(folder: Path, root: Path) -> AnnotationTask:
    support_root = folder / SUPPORT_FOLDER
    if not support_root.is_dir():
        raise ValueError(f"task {folder.name!r} has no support folder: make {support_root}/<class>/<image>")
    class_folders = _subfolders(support_root)
    if len(class_folders) < 2:
        raise ValueError(
            f"task {folder.name!r}: {support_root} needs one folder of images per class (at least 2), "
            f"found {len(class_folders)}"
        )
    support = tuple(_images(c, root) for c in class_folders)
    empty = [c.name for c, images in zip(class_folders, support, strict=True) if not images]
    if empty:
        raise ValueError(f"task {folder.name!r}: class folders without images in {support_root}: {_listed(empty)}")
    unlabeled_root = folder / UNLABELED_FOLDER
    unlabeled = _images(unlabeled_root, root) if unlabeled_root.is_dir() else ()
    return AnnotationTask(folder.name, tuple(c.name for c in class_folders), support, unlabeled)


def load_project(root: str | Path) -> AnnotationProject:
    """Read a project folder's tasks (file names only; no image is opened).

    Args:
        root: the project folder, holding ``tasks/<task>/support/<class>/`` and ``tasks/<task>/unlabeled/``.

    Returns:
        The project, its tasks sorted by name.

    Raises:
        ValueError: the folder or its ``tasks`` folder is missing or empty, or a task has no support folder,
            fewer than two class folders, or a class folder without images; the message names the folder.
    """
    root = Path(root).expanduser().resolve()
    tasks_root = root / TASKS_FOLDER
    if not tasks_root.is_dir():
        raise ValueError(
            f"{root} is not an annotation project: it has no {TASKS_FOLDER}/ folder. Lay it out as "
            f"{TASKS_FOLDER}/<task>/{SUPPORT_FOLDER}/<class>/<image> and "
            f"{TASKS_FOLDER}/<task>/{UNLABELED_FOLDER}/<image> (docs/ANNOTATION.md)"
        )
    tasks = tuple(_load_task(folder, root) for folder in _subfolders(tasks_root))
    if not tasks:
        raise ValueError(f"no tasks in {tasks_root}: add {TASKS_FOLDER}/<task>/{SUPPORT_FOLDER}/<class>/<image>")
    return AnnotationProject(root, tasks)
