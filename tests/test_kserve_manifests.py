"""deploy/kserve/: the pods KServe makes of its ServingRuntime and InferenceServices against the Kubernetes schema
(kubernetes-validate, strict), against what KServe looks for, and against attnserve's CLI, ports, metrics and image;
then the runtime's command line run for real on a directory laid out as KServe's storage initializer leaves
/mnt/models. tests/test_kserve_sdk.py checks the KServe fields with KServe's own typed models. No cluster runs here."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request

import kubernetes_validate
import numpy as np
import pytest

from attnserve.cli import build_parser
from attnserve.config import EngineConfig, ServerConfig, from_args
from attnserve.engine.manifest import FORMAT_VERSION, MANIFEST
from tests.conftest import assert_one_line_error, link_but_data, run_cli
from tests.deploy_files import cli_error, configuration_errors, k8s_manifests, known_environment, read_dockerfile
from tests.deploy_files import server_container as k8s_server_container
from tests.kserve_files import manifest_files, of_kind, resources
from tests.serving import ServerProcess, serving

KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
# KServe's defaults (pkg/constants): the container it serves, the port it sends HTTP to when a container declares
# none, the port name Knative sends gRPC (HTTP/2 without TLS) to; where its storage initializer puts the model, and
# the placeholder its controller fills in a ServingRuntime's container with the InferenceService's name.
KSERVE_CONTAINER = "kserve-container"
KSERVE_HTTP_PORT = 8080
GRPC_PORT_NAME = "h2c"
MODEL_DIR = "/mnt/models"
NAME_PLACEHOLDER = "{{.Name}}"
# An InferenceService's model spec is a container's fields and these of KServe's own.
MODEL_SPEC_FIELDS = {"modelFormat", "runtime", "runtimeVersion", "protocolVersion", "storageUri", "storage"}
PORT_FLAGS = ("--port", "--http-port", "--metrics-port")


FOUND = resources()
(RUNTIME,) = of_kind(FOUND, "ServingRuntime")
(CONTAINER,) = RUNTIME["spec"]["containers"]
RUNTIME_ENV = {e["name"]: e["value"] for e in CONTAINER.get("env", [])}
SERVICES = of_kind(FOUND, "InferenceService")
STAGES = read_dockerfile().stages
# The image's ATTNSERVE_* settings, under which the runtime's own run.
IMAGE_ENV = {k: v for k, v in STAGES["serve"].env().items() if k.startswith("ATTNSERVE_")}


def rendered_args(name: str, model_dir: str = MODEL_DIR) -> list[str]:
    """The runtime container's args as KServe runs them for the InferenceService `name`, the model at model_dir."""
    return [arg.replace(NAME_PLACEHOLDER, name).replace(MODEL_DIR, model_dir) for arg in CONTAINER["args"]]


def model_spec(service: dict) -> dict:
    return service["spec"]["predictor"]["model"]


def example(protocol: str | None) -> dict:
    """The example of `protocol` serving an artifact directory on the runtime's own image; of None, the one serving a
    checkpoint, on an image that can export it."""
    (service,) = [s for s in SERVICES if ("image" in model_spec(s)) == (protocol is None)
                  and protocol in (None, model_spec(s)["protocolVersion"])]
    return service


def predictor_container(service: dict) -> dict:
    """The container KServe runs for the InferenceService: the runtime's, with the model spec's container fields
    over it (args appended, ports and env merged by key, as KServe's MergeRuntimeContainers does)."""
    own = {k: v for k, v in model_spec(service).items() if k not in MODEL_SPEC_FIELDS}
    merged = {**CONTAINER, **{k: v for k, v in own.items() if k not in ("args", "ports", "env")}}
    merged["args"] = CONTAINER.get("args", []) + own.get("args", [])
    for field, key in (("ports", "containerPort"), ("env", "name")):
        items = {item[key]: item for item in [*CONTAINER.get(field, []), *own.get(field, [])]}
        if items:
            merged[field] = list(items.values())
    return merged


def configs(name: str) -> tuple[EngineConfig, ServerConfig]:
    """The settings serve reads from the container's command line, in the image's environment and the runtime's."""
    args = build_parser().parse_args(rendered_args(name))
    with pytest.MonkeyPatch.context() as patch:
        for k in [k for k in os.environ if k.startswith("ATTNSERVE_")]:
            patch.delenv(k)
        for k, v in {**IMAGE_ENV, **RUNTIME_ENV}.items():
            patch.setenv(k, v)
        return from_args(EngineConfig, args), from_args(ServerConfig, args)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_pods_kserve_makes_pass_the_kubernetes_schema(version):
    # A mistyped container field of a model spec lands in the pod.
    spec = RUNTIME["spec"]
    for container in [CONTAINER, *map(predictor_container, SERVICES)]:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "predictor", "annotations": spec.get("annotations", {})},
               "spec": {"containers": [container], "volumes": spec.get("volumes", [])}}
        kubernetes_validate.validate(pod, version, strict=True)


def test_each_file_holds_what_kubectl_applies_and_the_runtime_what_kserve_looks_for():
    assert {doc["_file"] for doc in FOUND.values()} == {p.name for p in manifest_files()}
    for doc in FOUND.values():
        name = doc["metadata"]["name"]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name  # DNS-1035, as KServe's
        assert doc["apiVersion"] == {"ServingRuntime": "serving.kserve.io/v1alpha1",
                                     "InferenceService": "serving.kserve.io/v1beta1"}[doc["kind"]]
    assert CONTAINER["name"] == KSERVE_CONTAINER
    assert RUNTIME["spec"]["supportedModelFormats"] == [{"name": "attnserve", "version": str(FORMAT_VERSION),
                                              "autoSelect": True, "priority": 1}]
    assert RUNTIME["spec"]["protocolVersions"] == ["v2", "grpc-v2"]
    # Knative routes one port per container: the runtime declares none (KServe sends HTTP to 8080), and an
    # InferenceService for gRPC declares the one it wants.
    assert "ports" not in CONTAINER
    assert MODEL_DIR in " ".join(CONTAINER["args"]) and NAME_PLACEHOLDER in " ".join(CONTAINER["args"])


def test_the_runtime_runs_the_image_the_deployment_runs():
    assert CONTAINER["image"] == k8s_server_container(k8s_manifests())["image"]
    serve = STAGES["serve"]
    assert CONTAINER["command"] == json.loads(serve.values("ENTRYPOINT")[-1])
    user = serve.values("USER")[-1]
    assert re.fullmatch(r"\d+:\d+", user) and user.split(":")[0] != "0", "runAsNonRoot needs a numeric user"
    assert CONTAINER["securityContext"]["runAsNonRoot"] is True
    # What the server writes (the cache: calibration, a checkpoint's export) goes to /tmp, a volume.
    assert IMAGE_ENV["ATTNSERVE_CACHE"].startswith("/tmp/")
    (mount,) = CONTAINER["volumeMounts"]
    assert mount["mountPath"] == "/tmp" and mount["name"] in {v["name"] for v in RUNTIME["spec"]["volumes"]}
    threads = int(RUNTIME_ENV["ATTNSERVE_THREADS"])
    assert float(CONTAINER["resources"]["requests"]["cpu"]) == threads, "a thread per CPU requested"


def test_the_command_line_and_settings_are_what_serve_accepts():
    assert set(RUNTIME_ENV) <= known_environment(), set(RUNTIME_ENV) - known_environment()
    errors = configuration_errors({**IMAGE_ENV, **RUNTIME_ENV})
    assert not errors, errors
    for service in SERVICES:
        name = service["metadata"]["name"]
        args = rendered_args(name)
        assert args[0] == "serve" and not cli_error(args), cli_error(args)
        engine_config, server_config = configs(name)
        # The model at /mnt/models under the InferenceService's name, and not the image's own default model
        # (ATTNSERVE_ARTIFACTS) too: serve refuses --artifacts beside --model.
        assert server_config.model == (f"{name}={MODEL_DIR}",)
        assert engine_config.artifacts is None


def test_ports_probe_and_metrics_are_the_servers_and_the_services_name_them():
    _, config = configs("any")
    assert config.http_port == KSERVE_HTTP_PORT
    probe = CONTAINER["readinessProbe"]["httpGet"]
    assert probe["port"] == config.http_port and probe["path"] == "/v2/health/ready"
    spec = RUNTIME["spec"]
    annotations = spec["annotations"]
    assert annotations["serving.kserve.io/enable-prometheus-scraping"] == "true"
    assert annotations["serving.kserve.io/enable-metric-aggregation"] == "true"
    assert int(annotations["prometheus.kserve.io/port"]) == config.metrics_port
    assert annotations["prometheus.kserve.io/path"] == "/metrics"  # prometheus_client's, as ServerProcess reads
    assert len({config.port, config.http_port, config.metrics_port}) == 3
    for model in map(model_spec, SERVICES):
        assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
        assert model.get("runtime", RUNTIME["metadata"]["name"]) == RUNTIME["metadata"]["name"]
        assert model["protocolVersion"] in spec["protocolVersions"]
        assert re.match(r"[a-z0-9]+://", model["storageUri"])
        if model["protocolVersion"] == "v2":  # HTTP: KServe's default port, the server's --http-port
            assert "ports" not in model
    # gRPC: the one port Knative routes to, named h2c, the server's --port.
    assert model_spec(example("grpc-v2"))["ports"] == [
        {"name": GRPC_PORT_NAME, "containerPort": config.port, "protocol": "TCP"}]


def test_the_checkpoint_example_runs_an_image_that_exports_as_the_images_user():
    model, stages = model_spec(example(None)), STAGES
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
    errors = configuration_errors({**export_env, **RUNTIME_ENV, **env})
    assert not errors, errors


def infer(triton, client, name: str, texts: list[str]) -> np.ndarray:
    """KServe v2's infer of `texts` through tritonclient.http or tritonclient.grpc (`triton`) and its client."""
    try:
        assert client.is_server_ready() and client.is_model_ready(name)
        tensor = triton.InferInput("text", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
        return client.infer(name, [tensor]).as_numpy("embedding")
    finally:
        client.close()


def test_the_runtime_serves_artifacts_where_kserve_puts_them(artifacts, engine, tmp_path):
    import tritonclient.grpc
    import tritonclient.http

    # /mnt/models as the storage initializer leaves it: the artifact directory's files (hard links: no copy).
    models = tmp_path / "mnt-models"
    shutil.copytree(artifacts, models, copy_function=link_but_data, ignore=shutil.ignore_patterns("calibration.json"))
    name = example("v2")["metadata"]["name"]
    texts = ["The cat sat on the mat.", "KServe mounts the model at /mnt/models."]
    env = {**IMAGE_ENV, **RUNTIME_ENV, "ATTNSERVE_CACHE": str(tmp_path / "cache")}
    command, *flags = [a for a in rendered_args(name, str(models)) if a.split("=")[0] not in PORT_FLAGS]
    assert command == "serve"  # ServerProcess's own; it gives the port flags free ports
    with serving(ServerProcess(None, *flags, env=env)) as server:
        with urllib.request.urlopen(server.http_url + "/v2/health/ready", timeout=30) as reply:
            assert reply.status == 200
        http = tritonclient.http.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=60)
        assert http.get_model_metadata(name)["name"] == name
        expected = engine.encode(texts).embeddings
        np.testing.assert_allclose(infer(tritonclient.http, http, name, texts), expected, atol=1e-5)
        # KServe v2 over gRPC on the gRPC port, the one the grpc-v2 InferenceService names h2c.
        grpc = tritonclient.grpc.InferenceServerClient(server.target)
        np.testing.assert_allclose(infer(tritonclient.grpc, grpc, name, texts), expected, atol=1e-5)
        # What Prometheus scrapes where the annotations say: the model's metrics (the inputs of both calls), under
        # its served name.
        path = RUNTIME["spec"]["annotations"]["prometheus.kserve.io/path"]
        with urllib.request.urlopen(f"http://{server.host}:{server.metrics_port}{path}", timeout=30) as reply:
            assert reply.status == 200
            text = reply.read().decode()
        assert f'attnserve_queue_duration_seconds_count{{model="{name}"}} {2 * len(texts)}.0' in text


def test_the_runtime_exports_a_checkpoint_once(artifacts, tmp_path, monkeypatch):
    """/mnt/models holding a sentence-transformers checkpoint (the default model's): serve loads its export into the
    cache, under the InferenceService's name, and a second start reuses it. The export itself is tested with
    `attnserve export`; here it hands over the session's export of the same checkpoint."""
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
    name = example(None)["metadata"]["name"]
    args = build_parser().parse_args(rendered_args(name, str(models)))
    (source,) = model_sources(None, from_args(ServerConfig, args))
    # The export records the folder's name, as any checkpoint's: one export whatever name serves it.
    assert exported == [(models, None)]
    assert source.name == name and source.directory.parent == tmp_path / "cache"
    assert (source.directory / MANIFEST).is_file()
    assert model_sources(None, from_args(ServerConfig, args)) == [source] and len(exported) == 1


def test_a_directory_neither_artifacts_nor_checkpoint_is_one_line(tmp_path):
    models = tmp_path / "mnt-models"
    (models / "nested").mkdir(parents=True)
    (models / "README.md").write_text("the artifacts are one folder down\n")
    result = run_cli(*rendered_args("broken", str(models)), "--port=0", "--http-port=0", "--metrics-port=0",
                     env={**IMAGE_ENV, **RUNTIME_ENV, "ATTNSERVE_CACHE": str(tmp_path / "cache")})
    assert_one_line_error(result, str(models), "not an artifact directory", "nor a checkpoint", "README.md, nested/")
