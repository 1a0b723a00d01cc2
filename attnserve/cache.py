"""The cache: where what attnserve builds is kept (ATTNSERVE_CACHE), a checkpoint's fingerprint and the lock of a
directory being built. Below every layer: the model (tokenizers built for a checkpoint), export (the artifact
directory's lock, its source's fingerprint), the engine (calibration and speed records) and the server (--workers
auto's record) keep things here; attnserve/default_model.py names the artifact directories in it."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from attnserve.errors import ArtifactError


def cache_root() -> Path:
    if os.environ.get("ATTNSERVE_CACHE"):
        return Path(os.environ["ATTNSERVE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnserve"


def checkpoint_fingerprint(directory: Path) -> str:
    """Names what a checkpoint's export is cached under, and is recorded as its source (an artifact directory
    builds more graphs from it only while it matches): its path and every file's name, size and time, so that
    another checkpoint at the same path (a new /mnt/models) exports anew. Reads no weights."""
    digest = hashlib.sha256(str(directory.resolve()).encode())
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"\0{path.relative_to(directory)}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """The artifact directory's lock, held while it is built or a variant is added to it: processes started
    together on an empty cache (replicas, a test's servers) build it once; a variant is built by one of them."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        lock = open(directory.parent / f".{directory.name}.lock", "a")
    except OSError as e:
        raise ArtifactError(f"cannot lock {directory} to build it: {directory.parent} is not writable "
                            f"({e.strerror}); build it with `attnserve export --all` where it is") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield
