"""deploy/kserve/'s resources, read with yaml alone: tests/test_kserve_sdk.py runs in a venv of KServe's SDK without
attnserve (.ci/run)."""

from __future__ import annotations

from pathlib import Path

import yaml

KSERVE = Path(__file__).resolve().parent.parent / "deploy" / "kserve"


def manifest_files() -> list[Path]:
    return sorted(KSERVE.glob("*.yaml"))


def resources() -> dict[str, dict]:
    """Every resource by "Kind/name", with the file it is in under "_file"."""
    out = {}
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            key = f"{doc['kind']}/{doc['metadata']['name']}"
            assert key not in out, f"two {key}s"
            out[key] = doc | {"_file": path.name}
    return out


def of_kind(found: dict[str, dict], kind: str) -> list[dict]:
    return [doc for key, doc in found.items() if key.startswith(kind + "/")]


def without_kserve(resource: dict) -> dict:
    """The resource as applied: without the "_file" the tests add."""
    return {k: v for k, v in resource.items() if k != "_file"}
