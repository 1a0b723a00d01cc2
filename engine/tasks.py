"""Which artifact directory serves a request's `task`: a model exported with per-task adapters (jina-embeddings-v3,
export/task_graphs.py) has one under tasks/<task>/ per adapter; the model's own directory has no adapter, and is
what a request without a task gets, as sentence-transformers encodes when no task is set."""

from __future__ import annotations

from pathlib import Path

from attnserve.errors import InvalidInputError

from .manifest import Manifest

TASKS_FOLDER = "tasks"


def check_task(manifest: Manifest, task: str | None) -> None:
    """InvalidInputError, in one line, for a task the model has no adapter for."""
    if task is None:
        return
    if not manifest.tasks:
        raise InvalidInputError(f"task {task!r}: the model {manifest.model} has no task adapters (only "
                                "jina-embeddings-v3 models have them); leave task unset", field="task")
    if task not in manifest.tasks:
        raise InvalidInputError(f"task {task!r} is not one of {manifest.model}'s tasks: {', '.join(manifest.tasks)}",
                                field="task")


def task_directory(manifest: Manifest, task: str | None) -> Path:
    """The artifact directory whose graphs have `task`'s adapter merged (None: the model's own, no adapter)."""
    check_task(manifest, task)
    return manifest.directory if task is None else manifest.directory / TASKS_FOLDER / task
