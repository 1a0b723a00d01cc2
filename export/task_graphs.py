"""A checkpoint with per-task adapters (jina-embeddings-v3) exports one artifact directory per task, each with the
task's adapter merged into the weights, under tasks/<task>/ of the model's own directory (which has no adapter).

Merged graphs, not one graph with a task input: a merged graph is the base graph with other numbers in it, so
every variant (fused, int8, fp16, attention), its verification and the engine's calibration work unchanged, and it
runs as fast as the base graph; the task-input graph ran slower per token (bench/bench_jina_tasks.py measures it;
docs/families/jina_embeddings_v3.md has the numbers). What it costs is disk and memory: one copy of the weights per
task served.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from attnserve.engine.tasks import TASKS_FOLDER
from attnserve.model.checkpoint import Checkpoint


def checkpoint_tasks(ckpt: Checkpoint) -> tuple[str, ...]:
    """The adapters a checkpoint carries (none for every family but jina v3), unless one is already merged."""
    if getattr(ckpt.config, "task", None) is not None:
        return ()
    return tuple(getattr(ckpt.config, "tasks", ()))


def build_task_artifacts(ckpt: Checkpoint, work: Path, build: Callable[[Checkpoint, Path], object]) -> tuple[str, ...]:
    """build(checkpoint, out) each task's artifact directory under work/tasks/<task>; returns the tasks."""
    from attnserve.model.jina_v3 import with_task

    tasks = checkpoint_tasks(ckpt)
    for task in tasks:
        build(replace(ckpt, config=with_task(ckpt.config, task)), work / TASKS_FOLDER / task)  # type: ignore[arg-type]
    return tasks
