"""deploy/kserve/'s resources, read for the tests. Only yaml: tests/test_kserve_sdk.py runs in a venv of KServe's
SDK without attnserve (.ci/run)."""

from __future__ import annotations

from pathlib import Path

import yaml

KSERVE = Path(__file__).resolve().parent.parent / "deploy" / "kserve"
# Where KServe's storage initializer puts the model, and the placeholder its controller fills in a ServingRuntime's
# container with the InferenceService's name.
MODEL_DIR = "/mnt/models"
NAME_PLACEHOLDER = "{{.Name}}"


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


def runtime_container(runtime: dict) -> dict:
    (container,) = runtime["spec"]["containers"]
    return container


def rendered_args(container: dict, name: str, model_dir: str = MODEL_DIR) -> list[str]:
    """The container's args as KServe runs them for the InferenceService `name` (its placeholder filled in), the
    model at model_dir rather than /mnt/models."""
    return [arg.replace(NAME_PLACEHOLDER, name).replace(MODEL_DIR, model_dir) for arg in container["args"]]


def without_kserve(resource: dict) -> dict:
    """The resource as applied: without the "_file" the tests add."""
    return {k: v for k, v in resource.items() if k != "_file"}
