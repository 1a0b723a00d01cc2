"""Docker for real: the compose fleet (the images built with deploy/'s scripts, two replicas and a load test
started by docker-compose, one replica stopped under load, everything removed after), deploy/k8s/'s container
spec run by Docker, and the preparation every image starts with.

The base image is built from Debian's archive (no Docker Hub needed) and kept between runs by its tag; the
serving image is rebuilt from this tree, from the layer cache when nothing changed. Cold, the builds take about
9 minutes on 2 cores (debootstrap 1, torch's install and the export most of the rest); warm, seconds. The
machine's CA bundle is trusted in the base image, so that pip reaches the package index through a proxy that
re-signs TLS. Traffic goes only between the test's containers and to the Debian and Python package archives.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.compose import ComposeProject, require_tool
from tests.docker_engine import docker_engine
from tests.k8s import env_of, manifests, port_named, server_container

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "attnserve-base:bookworm"
LOAD_SECONDS = 20
# A stopped replica's own clients may see these while it drains and leaves; anything else is a failure.
DRAIN_CODES = {"OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}


def docker(*args: str, timeout: float = 60) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done.stdout


def container_logs(container: str) -> str:
    """What the container wrote, stdout and stderr."""
    done = subprocess.run(["docker", "logs", container], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def machine_ca_bundle() -> str | None:
    """The bundle this machine's TLS clients trust (a proxy's CA in it, where there is one)."""
    for path in (os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile,
                 "/etc/ssl/certs/ca-certificates.crt"):
        if path and Path(path).is_file():
            return path
    return None


def run_script(*argv: str, timeout: float) -> None:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, \
        f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    print(f"{' '.join(argv)}: {time.monotonic() - started:.0f} s; {done.stdout.strip().splitlines()[-1]}")


@pytest.fixture(scope="module")
def images():
    """The serving image attnserve:cpu, built as a machine without Docker Hub builds it."""
    with docker_engine():
        if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
            require_tool("debootstrap", "Debian: apt-get install debootstrap")
        ca = machine_ca_bundle()
        run_script("deploy/build-base-image.sh", "--if-missing", "--tag", BASE_IMAGE,
                   *(["--ca-bundle", ca] if ca else []), timeout=900)
        run_script("deploy/build-images.sh", "--base-image", BASE_IMAGE, timeout=1500)
        yield


def replica_metrics(container: str) -> dict[str, float]:
    """A replica's /metrics, read inside its container (the metrics port is not published)."""
    text = docker("exec", container, "python", "-c",
                  "import urllib.request; print(urllib.request.urlopen('http://localhost:9000/metrics').read().decode())")
    return {f"{s.name}{{{','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))}}}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def embed_ok(container: str) -> float:
    return replica_metrics(container).get("attnserve_requests_total{code=OK,method=Embed,protocol=grpc}", 0.0)


def json_events(logs: str) -> list[str]:
    events = []
    for line in logs.splitlines():
        try:
            events.append(json.loads(line).get("event"))
        except (json.JSONDecodeError, AttributeError):
            pass
    return events


def wait_for(condition, seconds: float, what: str):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if value := condition():
            return value
        time.sleep(0.5)
    pytest.fail(f"not within {seconds:g} s: {what}")


def test_two_replicas_share_the_load_and_one_drains_under_it(images, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    project = ComposeProject(f"attnserve-fleet-test-{os.getpid()}", {
        "SERVER_REPLICAS": "2", "LOADTEST_DURATION": str(LOAD_SECONDS), "REPORTS_DIR": str(reports),
        "REPORT_UID": str(os.getuid()), "REPORT_GID": str(os.getgid())})
    try:
        started = time.monotonic()
        # Returns once both replicas are healthy (the load test depends on that) and the load test started.
        project.run("up", "-d", "--no-build", timeout=300)
        print(f"docker-compose up -d: {time.monotonic() - started:.0f} s")
        servers, (loadtest,) = project.containers("server"), project.containers("loadtest")
        assert len(servers) == 2, servers

        # round_robin: both replicas answer, before either is stopped.
        wait_for(lambda: all(embed_ok(c) > 0 for c in servers), LOAD_SECONDS / 2, "OK replies from both replicas")
        ok_before_stop = [embed_ok(c) for c in servers]

        # `docker stop`: SIGTERM, then SIGKILL only after stop_grace_period. The replica drains and exits 0,
        # while the load goes on against the other.
        stopping, staying = servers[1], servers[0]
        docker("stop", "--time", "30", stopping, timeout=60)
        assert json.loads(docker("inspect", "--format", "{{json .State.Running}}", loadtest)), \
            "the load test ended before the replica was stopped: not a stop under load"
        state = json.loads(docker("inspect", "--format", "{{json .State}}", stopping))
        logs = container_logs(stopping)
        assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, logs[-3000:])
        events = json_events(logs)
        assert "draining" in events and events[-1] == "stopped", events

        exit_code = int(docker("wait", loadtest, timeout=LOAD_SECONDS + 120).strip())
        report_text = container_logs(loadtest)
        assert exit_code == 0, report_text
        ok_after_stop = embed_ok(staying) - ok_before_stop[0]

        # A short load over the HTTP door too, to the replica still up. The flag, not `run -e`: docker-compose
        # 1.29 keeps the service's own ATTNSERVE_LOADTEST_PROTOCOL over one given to `run -e` (measured).
        http = project.run("run", "--rm", "--no-deps", "-T", "loadtest", "loadtest", "--protocol", "http",
                           "--target", "http://server:8080", "--wait-ready", "30", "--requests", "40",
                           "--concurrency", "4", "--json", "-", timeout=180)
        http_report = json.loads(http.stdout)
    finally:
        left_behind = []
        try:
            project.run("down", "--volumes", "--remove-orphans", "--timeout", "30", timeout=300)
            label = f"label=com.docker.compose.project={project.name}"
            for kind in ("ps -a", "network ls", "volume ls"):
                found = docker(*kind.split(), "--quiet", "--filter", label).split()
                left_behind += [f"{kind}: {x}" for x in found]
        finally:
            project.close()
    assert not left_behind, f"docker-compose down left: {left_behind}"

    # The reports, written by the load test's container into the host's folder, owned by this user.
    report = json.loads((reports / "loadtest.json").read_text())
    assert (reports / "loadtest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (reports / "loadtest.json").stat().st_uid == os.getuid()
    print(report_text)
    sent = report["requests"]["sent"]
    assert sent > 0 and report["requests"]["answered"] == sent == sum(report["codes"].values())
    # CANCELLED would be calls that reached the draining replica just as grpc's own stop began (grpc/grpc#41785):
    # a client that keeps picking a replica which said NOT_SERVING. A client that would not retry them.
    assert set(report["codes"]) <= DRAIN_CODES, report["codes"]
    assert report["codes"]["OK"] > 0 and report["mode"] == "closed" and report["target"] == "dns:///server:50051"
    assert all(n > 0 for n in ok_before_stop), ok_before_stop
    assert ok_after_stop > 0, "the remaining replica went on answering"
    r = http_report["requests"]
    assert http_report["protocol"] == "http" and r["sent"] == r["answered"] == 40, http_report
    assert set(http_report["codes"]) <= {"200", "429"} and http_report["codes"]["200"] > 0, http_report["codes"]


def docker_memory(quantity: str) -> str:
    """A Kubernetes memory quantity (2Gi, 512Mi) as docker run's --memory."""
    number, unit = re.fullmatch(r"(\d+)(Gi|Mi)", quantity).groups()
    return f"{number}{unit[0].lower()}"


def test_the_kubernetes_container_spec_serves_in_docker(images):
    """deploy/k8s/deployment.yaml's container as Docker can run it: its args, env, user, memory limit, a read-only
    root with /tmp a fresh volume, no capabilities, no privilege escalation. Then the readiness probe's question
    (the health service, SERVING) and a request, and the drain on SIGTERM. No cluster runs here."""
    resources = manifests()
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    container = server_container(resources)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["capabilities"]["drop"] == ["ALL"]
    assert not security["allowPrivilegeEscalation"]
    (tmp,) = [m["mountPath"] for m in container["volumeMounts"]]
    argv = ["run", "--detach", "--read-only", "--tmpfs", tmp, "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            "--user", f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}",
            "--memory", docker_memory(container["resources"]["limits"]["memory"])]
    for name, value in env_of(container).items():
        argv += ["--env", f"{name}={value}"]
    name = docker(*argv, container["image"], *container["args"]).strip()
    try:
        port = port_named(container, "grpc")
        wait_for(lambda: subprocess.run(["docker", "exec", name, "attnserve", "health", "--target",
                                         f"localhost:{port}"], capture_output=True).returncode == 0,
                 120, f"SERVING: {container_logs(name)[-2000:]}")
        reply = json.loads(docker("exec", name, "attnserve", "embed", "A pod with a read-only root.",
                                  "--target", f"localhost:{port}"))
        assert reply, reply
        docker("stop", "--time", str(pod["terminationGracePeriodSeconds"]), name, timeout=120)
        state = json.loads(docker("inspect", "--format", "{{json .State}}", name))
        logs = container_logs(name)
        assert state["ExitCode"] == 0 and not state["OOMKilled"], logs[-3000:]
        assert json_events(logs)[-1] == "stopped" and "Read-only file system" not in logs, logs[-3000:]
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=60)


def throwaway_ca_pem() -> str:
    """A self-signed CA certificate, as a proxy's would be."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "attnserve test proxy CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.mark.parametrize("ca", ["throwaway", "none"])
def test_prepare_trusts_the_ca_bundle_for_openssl_and_pip_and_makes_the_venv_and_user(images, tmp_path, ca):
    """deploy/image/prepare.sh, which every image's first stage runs, on the base image as it comes: with a
    CA_BUNDLE the system bundle and pip trust it; with the default file nothing changes."""
    pem = throwaway_ca_pem() if ca == "throwaway" else (REPO / "deploy/image/no-extra-ca.pem").read_text()
    (tmp_path / "ca.pem").write_text(pem)
    script = ("sh /in/prepare.sh /in/ca.pem > /dev/null && id attnserve && /opt/venv/bin/python -m pip config list"
              " && cat /etc/ssl/certs/ca-certificates.crt")
    out = docker("run", "--rm", "--network", "none", "-v", f"{REPO / 'deploy/image/prepare.sh'}:/in/prepare.sh:ro",
                 "-v", f"{tmp_path / 'ca.pem'}:/in/ca.pem:ro", BASE_IMAGE, "sh", "-c", script, timeout=120)
    assert "uid=10001(attnserve) gid=10001(attnserve)" in out
    body = "".join(pem.splitlines()[1:-1])
    if ca == "throwaway":
        assert body in out.replace("\n", ""), "the CA is not in the system bundle"
        assert "global.cert='/etc/ssl/certs/ca-certificates.crt'" in out
    else:
        assert "global.cert" not in out
