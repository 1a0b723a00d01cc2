"""deploy/k8s/'s resources, read for the tests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
# kustomize's own file, not a Kubernetes resource.
KUSTOMIZATION = "kustomization.yaml"


def manifest_files() -> list[Path]:
    return [path for path in sorted(K8S.glob("*.yaml")) if path.name != KUSTOMIZATION]


def manifests() -> dict[str, dict]:
    """Every resource, with the file it is in under "_file": by kind where a kind has one resource
    ("Deployment"), by kind and name where it has several ("Service/attnserve-grpc")."""
    docs = [doc | {"_file": path.name} for path in manifest_files() for doc in yaml.safe_load_all(path.read_text())]
    kinds = Counter(doc["kind"] for doc in docs)
    out = {}
    for doc in docs:
        key = doc["kind"] if kinds[doc["kind"]] == 1 else f"{doc['kind']}/{doc['metadata']['name']}"
        assert key not in out, f"two {key}s"
        out[key] = doc
    return out


def server_container(resources: dict[str, dict]) -> dict:
    (only,) = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def port_named(container: dict, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port
