"""Docker for real: the compose fleet (images built with deploy/'s scripts as a machine without Docker Hub builds them,
two replicas and a load test, one replica stopped under load, everything removed after), deploy/k8s/'s container spec
run by Docker, and the preparation every image starts with. Cold, the builds take about 9 minutes on 2 cores. Traffic
goes only between the test's containers and to the Debian and Python package archives."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.compose import ComposeProject, require_tool, unavailable
from tests.deploy_files import env_of, k8s_manifests, port_named, server_container

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "attnserve-base:bookworm"
LOAD_SECONDS = 20
# A stopped replica's own clients may see these while it drains and leaves; anything else is a failure.
DRAIN_CODES = {"OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}


def docker(*args: str, timeout: float = 60, check: bool = True) -> str:
    """The command's stdout (and stderr, with check=False: `docker logs` writes the container's to both)."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert not check or done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done.stdout if check else done.stdout + done.stderr


@contextlib.contextmanager
def docker_engine():
    """Once `docker info` answers: the running engine, left as it was, or a dockerd started here (root only) and
    stopped at the end, its containerd with it."""
    require_tool("docker", "Debian: apt-get install docker.io")
    answers = lambda: subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    if answers():
        yield
        return
    dockerd = shutil.which("dockerd") or unavailable("no Docker engine answers and dockerd is not installed")
    if os.geteuid() != 0:
        unavailable("no Docker engine answers, and only root may start dockerd")
    with tempfile.TemporaryDirectory() as folder, open(Path(folder) / "dockerd.log", "w") as log:
        daemon = subprocess.Popen([dockerd], stdout=log, stderr=subprocess.STDOUT)
        try:
            end = time.monotonic() + 60
            while not answers():
                if daemon.poll() is not None or time.monotonic() > end:
                    pytest.fail(f"dockerd did not start:\n{Path(log.name).read_text()[-3000:]}", pytrace=False)
                time.sleep(0.5)
            yield
        finally:
            daemon.terminate()
            try:
                daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def run_script(*argv: str, timeout: float) -> None:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    print(f"{' '.join(argv)}: {time.monotonic() - started:.0f} s; {done.stdout.strip().splitlines()[-1]}")


@pytest.fixture(scope="module")
def images():
    """The serving image attnserve:cpu, built as a machine without Docker Hub builds it, with the machine's CA bundle
    (a proxy's CA in it, where there is one)."""
    with docker_engine():
        if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
            require_tool("debootstrap", "Debian: apt-get install debootstrap")
        ca = next((path for path in (os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile,
                                     "/etc/ssl/certs/ca-certificates.crt") if path and Path(path).is_file()), None)
        run_script("deploy/build-base-image.sh", "--if-missing", "--tag", BASE_IMAGE,
                   *(["--ca-bundle", ca] if ca else []), timeout=900)
        run_script("deploy/build-images.sh", "--base-image", BASE_IMAGE, timeout=1500)
        yield


def embed_ok(container: str) -> float:
    """The replica's count of OK Embed calls, read inside its container (the metrics port is not published)."""
    text = docker("exec", container, "python", "-c",
                  "import urllib.request; print(urllib.request.urlopen('http://localhost:9000/metrics').read().decode())")
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "attnserve_requests_total"
               and s.labels == {"code": "OK", "method": "Embed", "protocol": "grpc"})


def json_events(logs: str) -> list[str]:
    events = []
    for line in logs.splitlines():
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            events.append(json.loads(line).get("event"))
    return events


def wait_for(condition, seconds: float, what: str):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if value := condition():
            return value
        time.sleep(0.5)
    pytest.fail(f"not within {seconds:g} s: {what}")


def drained(container: str) -> str:
    """The logs of a server that `docker stop` (SIGTERM, SIGKILL only after the grace) stopped: it drained, exited 0."""
    state = json.loads(docker("inspect", "--format", "{{json .State}}", container))
    logs = docker("logs", container, check=False)
    assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, logs[-3000:])
    assert json_events(logs)[-1] == "stopped", logs[-3000:]
    return logs


def test_two_replicas_share_the_load_and_one_drains_under_it(images, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    project = ComposeProject(f"attnserve-fleet-test-{os.getpid()}", {
        "SERVER_REPLICAS": "2", "LOADTEST_DURATION": str(LOAD_SECONDS), "REPORTS_DIR": str(reports),
        "REPORT_UID": str(os.getuid()), "REPORT_GID": str(os.getgid())})
    try:
        # Returns once both replicas are healthy (the load test depends on that) and the load test started.
        project.run("up", "-d", "--no-build", timeout=300)
        servers, (loadtest,) = project.containers("server"), project.containers("loadtest")
        assert len(servers) == 2, servers
        # round_robin: both replicas answer, before either is stopped.
        wait_for(lambda: all(embed_ok(c) > 0 for c in servers), LOAD_SECONDS / 2, "OK replies from both replicas")
        ok_before_stop = [embed_ok(c) for c in servers]
        # One replica drains and exits 0 while the load goes on against the other.
        docker("stop", "--time", "30", servers[1], timeout=60)
        assert json.loads(docker("inspect", "--format", "{{json .State.Running}}", loadtest)), \
            "the load test ended before the replica was stopped: not a stop under load"
        assert "draining" in json_events(drained(servers[1]))
        exit_code = int(docker("wait", loadtest, timeout=LOAD_SECONDS + 120).strip())
        report_text = docker("logs", loadtest, check=False)
        assert exit_code == 0, report_text
        ok_after_stop = embed_ok(servers[0]) - ok_before_stop[0]
        # A short load over the HTTP door too, to the replica still up. The flag, not `run -e`: docker-compose 1.29
        # keeps the service's own ATTNSERVE_LOADTEST_PROTOCOL over one given to `run -e` (measured).
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
                left_behind += [f"{kind}: {x}" for x in docker(*kind.split(), "--quiet", "--filter", label).split()]
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


def test_the_kubernetes_container_spec_serves_in_docker(images):
    """deploy/k8s/deployment.yaml's container as Docker can run it: its args, env, user, memory limit, a read-only
    root with /tmp a fresh volume, no capabilities, no privilege escalation. Then the readiness probe's question
    (the health service, SERVING), a request, and the drain on SIGTERM. No cluster runs here."""
    resources = k8s_manifests()
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    container = server_container(resources)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["capabilities"]["drop"] == ["ALL"]
    assert not security["allowPrivilegeEscalation"]
    (tmp,) = [m["mountPath"] for m in container["volumeMounts"]]
    # A Kubernetes memory quantity (2Gi, 512Mi) as docker run's --memory.
    number, unit = re.fullmatch(r"(\d+)(Gi|Mi)", container["resources"]["limits"]["memory"]).groups()
    user = f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    argv = ["run", "--detach", "--read-only", "--tmpfs", tmp, "--cap-drop", "ALL", "--security-opt",
            "no-new-privileges", "--user", user,
            "--memory", f"{number}{unit[0].lower()}", *(f"--env={k}={v}" for k, v in env_of(container).items())]
    name = docker(*argv, container["image"], *container["args"]).strip()
    try:
        target = f"localhost:{port_named(container, 'grpc')}"
        health = ["docker", "exec", name, "attnserve", "health", "--target", target]
        wait_for(lambda: subprocess.run(health, capture_output=True).returncode == 0, 120,
                 f"SERVING: {docker('logs', name, check=False)[-2000:]}")
        assert json.loads(docker("exec", name, "attnserve", "embed", "A pod with a read-only root", "--target", target))
        docker("stop", "--time", str(pod["terminationGracePeriodSeconds"]), name, timeout=120)
        logs = drained(name)
        assert "Read-only file system" not in logs, logs[-3000:]
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=60)


def throwaway_ca_pem() -> str:
    """A self-signed CA certificate, as a proxy's would be."""
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
    """deploy/image/prepare.sh, which every image's first stage runs, on the base image as it comes: with a CA_BUNDLE
    the system bundle and pip trust it; with the default file nothing changes."""
    pem = throwaway_ca_pem() if ca == "throwaway" else (REPO / "deploy/image/no-extra-ca.pem").read_text()
    (tmp_path / "ca.pem").write_text(pem)
    script = ("sh /in/prepare.sh /in/ca.pem > /dev/null && id attnserve && /opt/venv/bin/python -m pip config list"
              " && cat /etc/ssl/certs/ca-certificates.crt")
    out = docker("run", "--rm", "--network", "none", "-v", f"{REPO / 'deploy/image/prepare.sh'}:/in/prepare.sh:ro",
                 "-v", f"{tmp_path / 'ca.pem'}:/in/ca.pem:ro", BASE_IMAGE, "sh", "-c", script, timeout=120)
    assert "uid=10001(attnserve) gid=10001(attnserve)" in out
    if ca == "throwaway":
        assert "".join(pem.splitlines()[1:-1]) in out.replace("\n", ""), "the CA is not in the system bundle"
        assert "global.cert='/etc/ssl/certs/ca-certificates.crt'" in out
    else:
        assert "global.cert" not in out
