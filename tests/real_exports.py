"""Real checkpoints exported at their own max_seq_length, cached outside the clone.

A full export of all-mpnet-base-v2 at 384 takes many minutes (most of it the int8 search and the verification of
every variant), so tests reuse one: it lives under the models cache (tests/real_models.py), in a folder named by a
key of everything that determines what export writes: the contents of the attnserve packages export runs
(model/, export/ with its sample texts, engine/), every file of the checkpoint, and the versions of the libraries
and of Python. The same code reuses the artifacts; any change to them exports afresh, and the older exports of that
checkpoint are removed. A reused directory is checked as serving checks any: load_manifest() verifies the sha256 of
every file it lists.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import attnserve
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint

from .real_models import _lock, models_cache

# The attnserve packages whose code decides what export writes (export/data/ holds the verified texts).
EXPORT_PACKAGES = ("model", "export", "engine")
LIBRARIES = ("torch", "onnx", "onnxruntime", "onnxscript", "tokenizers", "transformers", "safetensors", "numpy")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def export_key(checkpoint: Path) -> str:
    """sha256 over the export code, the checkpoint's files and the library versions."""
    digest = hashlib.sha256()
    for name in EXPORT_PACKAGES:
        package = Path(import_module(f"attnserve.{name}").__file__ or "").parent
        for path in _files(package):
            digest.update(f"code {name}/{path.relative_to(package)}\n".encode())
            digest.update(path.read_bytes())
    for path in _files(checkpoint):
        digest.update(f"checkpoint {path.relative_to(checkpoint)}\n".encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    for library in LIBRARIES:
        try:
            digest.update(f"{library} {version(library)}\n".encode())
        except PackageNotFoundError:
            digest.update(f"{library} absent\n".encode())
    digest.update(f"python {platform.python_version()} attnserve {attnserve.__version__}\n".encode())
    return digest.hexdigest()


def exported(name: str, checkpoint: Path, log=print, variants: list[str] | None = None) -> tuple[Path, bool]:
    """The artifact directory of the checkpoint at its own max_seq_length, exported (every variant verified, as
    `attnserve export --all` does, or those of `variants`) unless an export with the same key is cached. Returns
    (directory, whether it was reused). The caller checks it with load_manifest()."""
    root = models_cache() / "exports"
    key = export_key(checkpoint) if variants is None else hashlib.sha256(
        f"{export_key(checkpoint)} {' '.join(variants)}".encode()).hexdigest()
    target = root / f"{name}-{key[:20]}"
    if (target / "manifest.json").is_file():
        return target, True
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / f".{name}.lock"):  # concurrent test processes export once
        if (target / "manifest.json").is_file():
            return target, True
        # Exports of older code (1.7 GB each for MPNet), and what a killed export left half-built: under the lock
        # no other process builds this checkpoint.
        for old in [*root.glob(f"{name}-*"), *root.glob(f".{name}-*.building-*")]:
            shutil.rmtree(old, ignore_errors=True)
        # Renamed into place when verified.
        build_artifacts(read_checkpoint(checkpoint, name), target, log=log, variants=variants)
    return target, False
