"""deploy/kserve/: the ServingRuntime and the InferenceServices against the Kubernetes schema (kubernetes-validate,
strict, on the pod KServe makes of them), against what KServe looks for, and against the rest of attnserve: the
CLI's flags and settings, the server's ports and metrics, the image; then the runtime's command line run for real
on a directory laid out as KServe's storage initializer leaves /mnt/models. KServe's own typed models check the
KServe fields in tests/test_kserve_sdk.py. No cluster runs here."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request
from pathlib import Path

import kubernetes_validate
import numpy as np
import pytest

from attnserve.cli import build_parser
from attnserve.config import EngineConfig, ServerConfig, from_args
from attnserve.engine.manifest import FORMAT_VERSION, MANIFEST
from tests.cli_contract import cli_error, configuration_errors, known_environment
from tests.conftest import assert_one_line_error, link_but_data, run_cli
from tests.dockerfile import read_dockerfile
from tests.k8s import manifests as k8s_manifests
from tests.k8s import server_container as k8s_server_container
from tests.kserve_files import (
    MODEL_DIR,
    NAME_PLACEHOLDER,
    manifest_files,
    of_kind,
    rendered_args,
    resources,
    runtime_container,
)
from tests.serving import ServerProcess, serving

KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
# KServe's defaults (pkg/constants): the container it serves, the port it sends HTTP to when a container declares
# none, the port name Knative sends gRPC (HTTP/2 without TLS) to.
KSERVE_CONTAINER = "kserve-container"
KSERVE_HTTP_PORT = 8080
GRPC_PORT_NAME = "h2c"
# An InferenceService's model spec is a container's fields and these of KServe's own.
MODEL_SPEC_FIELDS = {"modelFormat", "runtime", "runtimeVersion", "protocolVersion", "storageUri", "storage"}
PORT_FLAGS = ("--port", "--http-port", "--metrics-port")


@pytest.fixture(scope="module")
def found() -> dict[str, dict]:
    return resources()


@pytest.fixture(scope="module")
def runtime(found) -> dict:
    (only,) = of_kind(found, "ServingRuntime")
    return only


@pytest.fixture(scope="module")
def services(found) -> list[dict]:
    return of_kind(found, "InferenceService")


def model_spec(service: dict) -> dict:
    return service["spec"]["predictor"]["model"]


def of_artifacts(services: list[dict], protocol: str) -> dict:
    """The example of `protocol` serving an artifact directory on the runtime's own image."""
    (service,) = [s for s in services if model_spec(s)["protocolVersion"] == protocol and "image" not in model_spec(s)]
    return service


def of_checkpoint(services: list[dict]) -> dict:
    """The example serving a checkpoint, on an image that can export it."""
    (service,) = [s for s in services if "image" in model_spec(s)]
    return service


def predictor_container(runtime: dict, service: dict) -> dict:
    """The container KServe runs for the InferenceService: the runtime's, with the model spec's container fields
    over it (args appended, ports and env merged by key, as KServe's MergeRuntimeContainers does)."""
    container = runtime_container(runtime)
    own = {k: v for k, v in model_spec(service).items() if k not in MODEL_SPEC_FIELDS}
    merged = {**container, **{k: v for k, v in own.items() if k not in ("args", "ports", "env")}}
    merged["args"] = container.get("args", []) + own.get("args", [])
    for field, key in (("ports", "containerPort"), ("env", "name")):
        items = {item[key]: item for item in [*container.get(field, []), *own.get(field, [])]}
        if items:
            merged[field] = list(items.values())
    return merged


def as_pod(runtime: dict, container: dict) -> dict:
    spec = runtime["spec"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "predictor", "annotations": spec.get("annotations", {})},
            "spec": {"containers": [container], "volumes": spec.get("volumes", [])}}


def image_environment() -> dict[str, str]:
    """The serve image's ATTNSERVE_* settings, under which the runtime's own run."""
    return {k: v for k, v in read_dockerfile().stages["serve"].env().items() if k.startswith("ATTNSERVE_")}


def runtime_environment(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def configs(container: dict, name: str) -> tuple[EngineConfig, ServerConfig]:
    """The settings serve reads from the container's command line, in the image's environment and the runtime's."""
    args = build_parser().parse_args(rendered_args(container, name))
    env = {**image_environment(), **runtime_environment(container)}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
    with pytest.MonkeyPatch.context() as patch:
        for k in set(os.environ) - set(clean):
            patch.delenv(k)
        for k, v in env.items():
            patch.setenv(k, v)
        return from_args(EngineConfig, args), from_args(ServerConfig, args)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_pods_kserve_makes_pass_the_kubernetes_schema(runtime, services, version):
    kubernetes_validate.validate(as_pod(runtime, runtime_container(runtime)), version, strict=True)
    for service in services:  # a mistyped container field of the model spec lands in the pod
        kubernetes_validate.validate(as_pod(runtime, predictor_container(runtime, service)), version, strict=True)


def test_each_file_holds_what_kubectl_applies(found):
    assert {doc["_file"] for doc in found.values()} == {p.name for p in manifest_files()}
    for doc in found.values():
        name = doc["metadata"]["name"]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name  # DNS-1035, as KServe's
        assert doc["apiVersion"] == {"ServingRuntime": "serving.kserve.io/v1alpha1",
                                     "InferenceService": "serving.kserve.io/v1beta1"}[doc["kind"]]


def test_the_runtime_is_what_kserve_looks_for(runtime):
    spec = runtime["spec"]
    container = runtime_container(runtime)
    assert container["name"] == KSERVE_CONTAINER
    assert spec["supportedModelFormats"] == [{"name": "attnserve", "version": str(FORMAT_VERSION),
                                              "autoSelect": True, "priority": 1}]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    # Knative routes one port per container: the runtime declares none (KServe sends HTTP to 8080), and an
    # InferenceService for gRPC declares the one it wants.
    assert "ports" not in container
    assert MODEL_DIR in " ".join(container["args"]) and NAME_PLACEHOLDER in " ".join(container["args"])


def test_the_runtime_runs_the_image_the_deployment_runs(runtime):
    container = runtime_container(runtime)
    assert container["image"] == k8s_server_container(k8s_manifests())["image"]
    serve = read_dockerfile().stages["serve"]
    assert container["command"] == json.loads(serve.values("ENTRYPOINT")[-1])
    user = serve.values("USER")[-1]
    assert re.fullmatch(r"\d+:\d+", user) and user.split(":")[0] != "0", "runAsNonRoot needs a numeric user"
    assert container["securityContext"]["runAsNonRoot"] is True
    # What the server writes (the cache: calibration, a checkpoint's export) goes to /tmp, a volume.
    assert image_environment()["ATTNSERVE_CACHE"].startswith("/tmp/")
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/tmp" and mount["name"] in {v["name"] for v in runtime["spec"]["volumes"]}
    threads = int(runtime_environment(container)["ATTNSERVE_THREADS"])
    assert float(container["resources"]["requests"]["cpu"]) == threads, "a thread per CPU requested"


def test_the_command_line_and_settings_are_what_serve_accepts(runtime, services):
    container = runtime_container(runtime)
    env = runtime_environment(container)
    assert set(env) <= known_environment(), set(env) - known_environment()
    errors = configuration_errors({**image_environment(), **env})
    assert not errors, errors
    for service in services:
        name = service["metadata"]["name"]
        args = rendered_args(container, name)
        assert args[0] == "serve" and not cli_error(args), cli_error(args)
        engine_config, server_config = configs(container, name)
        # The model at /mnt/models under the InferenceService's name, and not the image's own default model
        # (ATTNSERVE_ARTIFACTS) too: serve refuses --artifacts beside --model.
        assert server_config.model == (f"{name}={MODEL_DIR}",)
        assert engine_config.artifacts is None


def test_ports_probe_and_metrics_are_the_servers(runtime):
    container = runtime_container(runtime)
    _, config = configs(container, "any")
    assert config.http_port == KSERVE_HTTP_PORT
    probe = container["readinessProbe"]["httpGet"]
    assert probe["port"] == config.http_port and probe["path"] == "/v2/health/ready"
    annotations = runtime["spec"]["annotations"]
    assert annotations["serving.kserve.io/enable-prometheus-scraping"] == "true"
    assert annotations["serving.kserve.io/enable-metric-aggregation"] == "true"
    assert int(annotations["prometheus.kserve.io/port"]) == config.metrics_port
    assert annotations["prometheus.kserve.io/path"] == "/metrics"  # prometheus_client's, as ServerProcess reads
    assert len({config.port, config.http_port, config.metrics_port}) == 3


def test_inference_services_name_the_runtime_and_its_ports(runtime, services):
    _, config = configs(runtime_container(runtime), "any")
    for service in services:
        model = model_spec(service)
        assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
        assert model.get("runtime", runtime["metadata"]["name"]) == runtime["metadata"]["name"]
        assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
        assert re.match(r"[a-z0-9]+://", model["storageUri"])
        if model["protocolVersion"] == "v2":  # HTTP: KServe's default port, the server's --http-port
            assert "ports" not in model
    # gRPC: the one port Knative routes to, named h2c, the server's --port.
    assert model_spec(of_artifacts(services, "grpc-v2"))["ports"] == [
        {"name": GRPC_PORT_NAME, "containerPort": config.port, "protocol": "TCP"}]


def test_the_checkpoint_example_runs_an_image_that_exports_as_the_images_user(runtime, services):
    model = model_spec(of_checkpoint(services))
    stages = read_dockerfile().stages
    # The Dockerfile's export stage: attnserve with the export extra (torch), and no USER of its own.
    assert any("[cpu,export]" in run for run in stages["export"].values("RUN"))
    assert model["image"].split(":")[-1] == "export" and not stages["export"].values("USER")
    uid, gid = stages["serve"].values("USER")[-1].split(":")
    assert (model["securityContext"]["runAsUser"], model["securityContext"]["runAsGroup"]) == (int(uid), int(gid))
    # Where it writes (the cache, and a home for the libraries export runs) is the runtime's /tmp volume.
    env = {e["name"]: e["value"] for e in model["env"]}
    assert env["ATTNSERVE_CACHE"].startswith("/tmp/") and env["HOME"] == "/tmp"
    assert "ATTNSERVE_CACHE" not in stages["export"].env()
    export_env = {k: v for k, v in stages["export"].env().items() if k.startswith("ATTNSERVE_")}
    errors = configuration_errors({**export_env, **runtime_environment(runtime_container(runtime)), **env})
    assert not errors, errors


def without_ports(args: list[str]) -> list[str]:
    """The args less the port flags, which ServerProcess gives free ports for."""
    return [a for a in args if a.split("=")[0] not in PORT_FLAGS]


def start_as_kserve(runtime: dict, name: str, model_dir: Path, cache: Path) -> ServerProcess:
    container = runtime_container(runtime)
    env = {**image_environment(), **runtime_environment(container), "ATTNSERVE_CACHE": str(cache)}
    command, *flags = without_ports(rendered_args(container, name, str(model_dir)))
    assert command == "serve"  # ServerProcess's own
    return ServerProcess(None, *flags, env=env)


def infer(server: ServerProcess, name: str, texts: list[str]) -> np.ndarray:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=60)
    try:
        assert client.is_server_ready() and client.is_model_ready(name)
        assert client.get_model_metadata(name)["name"] == name
        tensor = triton.InferInput("text", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
        return client.infer(name, [tensor]).as_numpy("embedding")
    finally:
        client.close()


def infer_grpc(server: ServerProcess, name: str, texts: list[str]) -> np.ndarray:
    import tritonclient.grpc as triton_grpc

    client = triton_grpc.InferenceServerClient(server.target)
    try:
        assert client.is_server_ready() and client.is_model_ready(name)
        tensor = triton_grpc.InferInput("text", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
        return client.infer(name, [tensor]).as_numpy("embedding")
    finally:
        client.close()


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return reply.status, reply.read().decode()


def test_the_runtime_serves_artifacts_where_kserve_puts_them(runtime, services, artifacts, engine, tmp_path):
    # /mnt/models as the storage initializer leaves it: the artifact directory's files (hard links: no copy).
    models = tmp_path / "mnt-models"
    shutil.copytree(artifacts, models, copy_function=link_but_data, ignore=shutil.ignore_patterns("calibration.json"))
    name = of_artifacts(services, "v2")["metadata"]["name"]
    texts = ["The cat sat on the mat.", "KServe mounts the model at /mnt/models."]
    with serving(start_as_kserve(runtime, name, models, tmp_path / "cache")) as server:
        assert get(server.http_url + "/v2/health/ready")[0] == 200
        np.testing.assert_allclose(infer(server, name, texts), engine.encode(texts).embeddings, atol=1e-5)
        # KServe v2 over gRPC on the gRPC port, the one the grpc-v2 InferenceService names h2c.
        np.testing.assert_allclose(infer_grpc(server, name, texts), engine.encode(texts).embeddings, atol=1e-5)
        # What Prometheus scrapes where the annotations say: the metrics of the model (the inputs of both calls),
        # under its served name.
        path = runtime["spec"]["annotations"]["prometheus.kserve.io/path"]
        status, text = get(f"http://{server.host}:{server.metrics_port}{path}")
        assert status == 200 and f'attnserve_queue_duration_seconds_count{{model="{name}"}} {2 * len(texts)}.0' in text


def test_the_runtime_exports_a_checkpoint_once(runtime, services, artifacts, tmp_path, monkeypatch):
    """/mnt/models holding a sentence-transformers checkpoint (the default model's, as its package ships it): the
    model serve loads (server/models.py, from the runtime's command line) is its export into the cache, served under
    the InferenceService's name (the export records the folder's, as any checkpoint's: one export whatever name serves
    it), and a second start reuses it. The export itself is `attnserve export`'s, tested with it:
    here it hands over the session's export of the same checkpoint."""
    import attnserve.engine.builds
    from attnserve.default_model import default_checkpoint_dir
    from attnserve.server.model_sources import model_sources

    models = tmp_path / "mnt-models"
    shutil.copytree(default_checkpoint_dir(), models, copy_function=os.link)
    exported = []

    def export_in_child(checkpoint, name, out, precision, provider, log):
        exported.append((checkpoint, name))
        shutil.copytree(artifacts, out, copy_function=link_but_data, ignore=shutil.ignore_patterns("calibration.json"))

    monkeypatch.setattr(attnserve.engine.builds, "export_in_child", export_in_child)
    monkeypatch.setenv("ATTNSERVE_CACHE", str(tmp_path / "cache"))
    name = of_checkpoint(services)["metadata"]["name"]
    args = build_parser().parse_args(rendered_args(runtime_container(runtime), name, str(models)))
    (source,) = model_sources(None, from_args(ServerConfig, args))
    assert exported == [(models, None)]
    assert source.name == name and source.directory.parent == tmp_path / "cache"
    assert (source.directory / MANIFEST).is_file()
    assert model_sources(None, from_args(ServerConfig, args)) == [source] and len(exported) == 1


def test_a_directory_neither_artifacts_nor_checkpoint_is_one_line(runtime, tmp_path):
    models = tmp_path / "mnt-models"
    (models / "nested").mkdir(parents=True)
    (models / "README.md").write_text("the artifacts are one folder down\n")
    args = rendered_args(runtime_container(runtime), "broken", str(models))
    result = run_cli(*args, "--port=0", "--http-port=0", "--metrics-port=0",
                     env={**image_environment(), **runtime_environment(runtime_container(runtime)),
                          "ATTNSERVE_CACHE": str(tmp_path / "cache")})
    assert_one_line_error(result, str(models), "not an artifact directory", "nor a checkpoint", "README.md, nested/")
