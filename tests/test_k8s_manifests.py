"""deploy/k8s/: every manifest against the Kubernetes schema (kubernetes-validate, strict), and against the rest of
attnserve: the CLI's flags and settings, the image's user and health check, the compose file's image, the
server's metrics. No cluster runs here; tests/test_docker_fleet.py runs the pod's container spec in Docker."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from attnserve.config import ServerConfig
from tests.cli_contract import cli_error, configuration_errors, known_environment
from tests.compose import compose_config
from tests.dockerfile import read_dockerfile
from tests.k8s import K8S, KUSTOMIZATION, env_of, manifest_files, manifests, port_named, server_container

REPO = Path(__file__).resolve().parents[1]
# The oldest Kubernetes with gRPC probes on by default and GA (1.27), and the newest the package knows.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict]:
    return manifests()


@pytest.fixture(scope="module")
def container(k8s) -> dict:
    return server_container(k8s)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", [p.name for p in manifest_files()])
def test_every_manifest_passes_the_kubernetes_schema(path, version):
    for doc in yaml.safe_load_all((K8S / path).read_text()):
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError, naming the field


def test_the_kinds_an_operator_needs_are_there(k8s):
    assert {"Deployment", "Service/attnserve-grpc", "Service/attnserve-http", "PodDisruptionBudget",
            "HorizontalPodAutoscaler"} <= set(k8s)


def test_kustomization_applies_every_manifest(k8s):
    kustomization = yaml.safe_load((K8S / KUSTOMIZATION).read_text())
    assert sorted(kustomization["resources"]) == sorted({m["_file"] for m in k8s.values()})
    image = kustomization["images"][0]["name"]
    assert image == k8s["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"].split(":")[0]


def test_the_container_runs_the_image_compose_runs_with_a_command_and_settings_the_cli_accepts(container):
    assert container["image"] == compose_config()["services"]["server"]["image"]
    assert not cli_error(container["args"]) and container["args"][0] == "serve"
    assert "command" not in container, "the image's ENTRYPOINT is attnserve"
    env = env_of(container)
    assert set(env) <= known_environment(), set(env) - known_environment()
    serve = read_dockerfile().stages["serve"]
    errors = configuration_errors({**serve.env(), **env})
    assert not errors, errors


def test_ports_probes_and_services_agree_with_the_servers_flags(k8s, container):
    env = env_of(container)
    grpc_port = int(env.get("ATTNSERVE_PORT", ServerConfig.port))
    metrics_port = int(env.get("ATTNSERVE_METRICS_PORT", ServerConfig.metrics_port))
    assert port_named(container, "grpc") == grpc_port and port_named(container, "metrics") == metrics_port
    # Every probe asks the gRPC health service on the server's port.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == grpc_port, probe
    annotations = k8s["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == metrics_port
    assert annotations["prometheus.io/path"] == "/metrics"
    # The Service: headless (DNS answers every ready pod, for client-side round_robin), on the port clients dial
    # in compose too, to a port the container names.
    service = k8s["Service/attnserve-grpc"]["spec"]
    assert service["clusterIP"] == "None" and not service.get("publishNotReadyAddresses")
    (port,) = service["ports"]
    assert port["port"] == grpc_port and port_named(container, port["targetPort"]) == grpc_port
    assert port["appProtocol"] == "grpc"
    compose_target = compose_config()["services"]["loadtest"]["command"]
    assert f":{port['port']}" in compose_target[compose_target.index("--target") + 1]
    # The HTTP door: a normal ClusterIP Service (HTTP/1.1 connections balance well) to the port serve listens on.
    http_port = int(env.get("ATTNSERVE_HTTP_PORT", ServerConfig.http_port))
    http = k8s["Service/attnserve-http"]["spec"]
    assert http.get("type", "ClusterIP") == "ClusterIP" and http.get("clusterIP") != "None"
    (port,) = http["ports"]
    assert port_named(container, "http") == http_port and port_named(container, port["targetPort"]) == http_port
    assert port["appProtocol"] == "http"


def test_every_selector_finds_the_deployments_pods(k8s):
    deployment = k8s["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selectors = {
        "Deployment": deployment["spec"]["selector"]["matchLabels"],
        "Service/attnserve-grpc": k8s["Service/attnserve-grpc"]["spec"]["selector"],
        "Service/attnserve-http": k8s["Service/attnserve-http"]["spec"]["selector"],
        "PodDisruptionBudget": k8s["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
    }
    for kind, selector in selectors.items():
        assert selector and selector.items() <= labels.items(), kind
    target = k8s["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


def test_resources_match_the_threads(container):
    threads = int(env_of(container)["ATTNSERVE_THREADS"])
    requests = container["resources"]["requests"]
    assert float(requests["cpu"]) == threads, "a thread per CPU requested"
    assert "memory" in requests and "memory" in container["resources"]["limits"]


def test_a_pod_drains_before_the_kubelet_kills_it_and_warms_up_before_it_is_ready(k8s, container):
    spec = k8s["Deployment"]["spec"]
    pod = spec["template"]["spec"]
    grace = float(env_of(container).get("ATTNSERVE_GRACE_SECONDS", ServerConfig.grace_seconds))
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + grace, "SIGKILL before the drain ends"
    # The start-up window covers warm-up as long as the image's HEALTHCHECK allows for it.
    health = next(v for v in read_dockerfile().stages["serve"].values("HEALTHCHECK"))
    start_period = int(re.search(r"--start-period=(\d+)s", health).group(1))
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= start_period
    # Rolling updates and disruptions never take the last ready pod.
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert k8s["PodDisruptionBudget"]["spec"]["maxUnavailable"] < spec["replicas"]
    assert k8s["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 2


def test_the_pod_runs_as_the_images_user_on_a_read_only_root(k8s, container):
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    user = read_dockerfile().stages["serve"].values("USER")[-1]
    assert f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}" == user
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # What the server writes (matplotlib's config, temporary files) goes to /tmp, a volume.
    serve_env = read_dockerfile().stages["serve"].env()
    assert serve_env["MPLCONFIGDIR"].startswith("/tmp/")
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_the_autoscaler_scales_on_cpu_and_its_queue_example_names_a_real_metric(k8s):
    hpa = k8s["HorizontalPodAutoscaler"]["spec"]
    assert [m["resource"]["name"] for m in hpa["metrics"] if m["type"] == "Resource"] == ["cpu"]
    text = (K8S / k8s["HorizontalPodAutoscaler"]["_file"]).read_text()
    commented = yaml.safe_load("\n".join(re.sub(r"^(\s*)# ?", r"\1", line) for line in text.splitlines()
                                         if re.match(r"^\s*# (- type|  )", line)))
    example = commented[0]["pods"]
    assert example["metric"]["name"] == "attnserve_queue_depth_seconds"
    assert '"attnserve_queue_depth_seconds"' in (REPO / "server" / "metrics.py").read_text()
