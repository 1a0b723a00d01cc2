"""deploy/k8s/ against the Kubernetes schema (kubernetes-validate, strict) and the rest of attnserve: the CLI's flags
and settings, the image's user and health check, the compose file's image, the server's metrics. No cluster runs
here; tests/test_docker_fleet.py runs the pod's container spec in Docker."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml

from attnserve.config import ServerConfig
from tests import deploy_files as deploy
from tests.compose import compose_config

# The oldest Kubernetes with gRPC probes on by default and GA (1.27), and the newest the package knows.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
RESOURCES = deploy.k8s_manifests()
CONTAINER = deploy.server_container(RESOURCES)
ENV = deploy.env_of(CONTAINER)
SERVE = deploy.read_dockerfile().stages["serve"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", [p.name for p in deploy.k8s_files()])
def test_every_manifest_passes_the_kubernetes_schema(path, version):
    for doc in yaml.safe_load_all((deploy.K8S / path).read_text()):
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError, naming the field


def test_kustomization_applies_the_kinds_an_operator_needs():
    assert {"Deployment", "Service/attnserve-grpc", "Service/attnserve-http", "PodDisruptionBudget",
            "HorizontalPodAutoscaler"} <= set(RESOURCES)
    kustomization = yaml.safe_load((deploy.K8S / deploy.KUSTOMIZATION).read_text())
    assert sorted(kustomization["resources"]) == sorted({m["_file"] for m in RESOURCES.values()})
    assert kustomization["images"][0]["name"] == CONTAINER["image"].split(":")[0]


def test_the_container_runs_the_image_compose_runs_with_a_command_and_settings_the_cli_accepts():
    assert CONTAINER["image"] == compose_config()["services"]["server"]["image"]
    assert not deploy.cli_error(CONTAINER["args"]) and CONTAINER["args"][0] == "serve"
    assert "command" not in CONTAINER, "the image's ENTRYPOINT is attnserve"
    assert set(ENV) <= deploy.known_environment(), set(ENV) - deploy.known_environment()
    errors = deploy.configuration_errors({**SERVE.env(), **ENV})
    assert not errors, errors


def test_ports_probes_and_services_agree_with_the_servers_flags():
    grpc_port, metrics_port, http_port = (int(ENV.get(f"ATTNSERVE_{name.upper()}", getattr(ServerConfig, name)))
                                          for name in ("port", "metrics_port", "http_port"))
    assert deploy.port_named(CONTAINER, "grpc") == grpc_port and deploy.port_named(CONTAINER, "metrics") == metrics_port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # the gRPC health service, on the server's port
        assert CONTAINER[probe]["grpc"]["port"] == grpc_port, probe
    annotations = RESOURCES["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == metrics_port
    assert annotations["prometheus.io/path"] == "/metrics"
    # gRPC's Service: headless (DNS answers every ready pod, for client-side round_robin), on the port clients dial
    # in compose too, to a port the container names.
    service = RESOURCES["Service/attnserve-grpc"]["spec"]
    assert service["clusterIP"] == "None" and not service.get("publishNotReadyAddresses")
    (port,) = service["ports"]
    assert port["port"] == grpc_port and deploy.port_named(CONTAINER, port["targetPort"]) == grpc_port
    assert port["appProtocol"] == "grpc"
    compose_target = compose_config()["services"]["loadtest"]["command"]
    assert f":{port['port']}" in compose_target[compose_target.index("--target") + 1]
    # HTTP's: a normal ClusterIP Service (HTTP/1.1 connections balance well) to the port serve listens on.
    http = RESOURCES["Service/attnserve-http"]["spec"]
    assert http.get("type", "ClusterIP") == "ClusterIP" and http.get("clusterIP") != "None"
    (port,) = http["ports"]
    assert deploy.port_named(CONTAINER, "http") == http_port
    assert deploy.port_named(CONTAINER, port["targetPort"]) == http_port
    assert port["appProtocol"] == "http"


def test_every_selector_finds_the_deployments_pods():
    deployment = RESOURCES["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selectors = {"Deployment": deployment["spec"]["selector"]["matchLabels"],
                 "Service/attnserve-grpc": RESOURCES["Service/attnserve-grpc"]["spec"]["selector"],
                 "Service/attnserve-http": RESOURCES["Service/attnserve-http"]["spec"]["selector"],
                 "PodDisruptionBudget": RESOURCES["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]}
    for kind, selector in selectors.items():
        assert selector and selector.items() <= labels.items(), kind
    target = RESOURCES["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


def test_a_pod_drains_before_the_kubelet_kills_it_and_warms_up_before_it_is_ready():
    spec = RESOURCES["Deployment"]["spec"]
    grace = float(ENV.get("ATTNSERVE_GRACE_SECONDS", ServerConfig.grace_seconds))
    pre_stop = CONTAINER["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] > float(pre_stop[1]) + grace, "SIGKILL mid-drain"
    # The start-up window covers warm-up as long as the image's HEALTHCHECK allows for it.
    health = SERVE.values("HEALTHCHECK")[0]
    start_period = int(re.search(r"--start-period=(\d+)s", health).group(1))
    assert CONTAINER["startupProbe"]["periodSeconds"] * CONTAINER["startupProbe"]["failureThreshold"] >= start_period
    # Rolling updates and disruptions never take the last ready pod.
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert RESOURCES["PodDisruptionBudget"]["spec"]["maxUnavailable"] < spec["replicas"]
    assert RESOURCES["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 2


def test_the_pod_runs_as_the_images_user_on_a_read_only_root_with_a_cpu_per_thread():
    pod = RESOURCES["Deployment"]["spec"]["template"]["spec"]
    assert f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}" == SERVE.values("USER")[-1]
    assert CONTAINER["securityContext"]["readOnlyRootFilesystem"] is True
    # What the server writes (matplotlib's config, temporary files) goes to /tmp, a volume.
    assert SERVE.env()["MPLCONFIGDIR"].startswith("/tmp/")
    assert any(m["mountPath"] == "/tmp" for m in CONTAINER["volumeMounts"])
    resources = CONTAINER["resources"]
    assert float(resources["requests"]["cpu"]) == int(ENV["ATTNSERVE_THREADS"]), "a thread per CPU"
    assert "memory" in resources["requests"] and "memory" in resources["limits"]


def test_the_autoscaler_scales_on_cpu_and_its_queue_example_names_a_real_metric():
    hpa = RESOURCES["HorizontalPodAutoscaler"]["spec"]
    assert [m["resource"]["name"] for m in hpa["metrics"] if m["type"] == "Resource"] == ["cpu"]
    text = (deploy.K8S / RESOURCES["HorizontalPodAutoscaler"]["_file"]).read_text()
    commented = yaml.safe_load("\n".join(re.sub(r"^(\s*)# ?", r"\1", line) for line in text.splitlines()
                                         if re.match(r"^\s*# (- type|  )", line)))
    assert commented[0]["pods"]["metric"]["name"] == "attnserve_queue_depth_seconds"
    assert '"attnserve_queue_depth_seconds"' in (deploy.REPO / "server" / "metrics.py").read_text()
