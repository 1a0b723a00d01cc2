"""The compose topology without Docker: what the `server` and `loadtest` services run, on loopback.

Two `attnserve serve` processes with the compose file's server settings listen
on the same port at 127.0.0.1 and 127.0.0.2, as two containers would. A DNS
server answers one name with both addresses, as Docker's embedded DNS answers
the service name. The compose file's `loadtest` command then runs with its
target pointed at that name (gRPC's dns resolver, asking our DNS server) and
round_robin, exactly the path compose uses. Each replica's own metrics must
show it took a fair share, and every request sent must be answered and
counted by one of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dnslib.server import DNSLogger, DNSServer
from dnslib.zoneresolver import ZoneResolver

from tests.compose import compose_config, environment
from tests.serving import ServerProcess, free_port

REPLICA_HOSTS = ("127.0.0.1", "127.0.0.2")
SERVICE_NAME = "replicas.attnserve.test"
REQUESTS = 240


@pytest.fixture(scope="module")
def compose() -> dict:
    return compose_config()["services"]


@pytest.fixture(scope="module")
def dns_server():
    """Answers SERVICE_NAME with every replica's address, as Docker's DNS does for a scaled service."""
    zone = "".join(f"{SERVICE_NAME}. 5 IN A {host}\n" for host in REPLICA_HOSTS)
    server = DNSServer(ZoneResolver(zone), address="127.0.0.1", port=0, logger=DNSLogger("-request,-reply,-truncated"))
    server.start_thread()
    yield server.server.server_address[1]
    server.stop()


@pytest.fixture(scope="module")
def fleet(artifacts, compose, tmp_path_factory):
    """The compose `server` service, twice: its settings, one port, two addresses."""
    service = compose["server"]
    assert service["deploy"]["replicas"] >= 2
    env = {k: v for k, v in environment(service).items() if k.startswith("ATTNSERVE_")}
    port, metrics_port, http_port = free_port(), free_port(), free_port()
    logs = tmp_path_factory.mktemp("fleet")
    replicas = [ServerProcess(artifacts, env=env, host=host, port=port, metrics_port=metrics_port,
                              http_port=http_port, log_path=logs / f"{host}.log") for host in REPLICA_HOSTS]
    try:
        for replica in replicas:
            replica.wait_serving()
        yield replicas
    finally:
        codes = [replica.terminate() for replica in replicas]
    assert codes == [0, 0], [replica.log_tail() for replica in replicas]


def embed_answers(replica: ServerProcess, code: str = "", method: str = "Embed") -> int:
    """Embed requests (or those of another method or HTTP route) the replica answered: with this status code,
    or whatever their status."""
    return int(sum(v for k, v in replica.metrics().items()
                   if k.startswith("attnserve_requests_total{") and f'method="{method}"' in k
                   and f'code="{code}' in k))


def run_loadtest_service(compose: dict, target: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The compose `loadtest` command and environment, with the target and report folder of this machine."""
    service = compose["loadtest"]
    command = list(service["command"])
    command[command.index("--target") + 1] = target
    for flag in ("--json", "--plot"):
        command[command.index(flag) + 1] = str(out / Path(command[command.index(flag) + 1]).name)
    env = {**os.environ, **environment(service)}
    return subprocess.run([sys.executable, "-m", "attnserve.cli", *command, *extra], capture_output=True,
                          text=True, env=env, timeout=300)


def test_the_compose_loadtest_spreads_over_both_replicas_and_loses_nothing(fleet, dns_server, compose, tmp_path):
    target = f"dns://127.0.0.1:{dns_server}/{SERVICE_NAME}:{fleet[0].port}"
    before = [(embed_answers(r), embed_answers(r, "OK")) for r in fleet]
    done = run_loadtest_service(compose, target, tmp_path, "--requests", str(REQUESTS))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "loadtest.json").read_text())
    served = [embed_answers(r) - b for r, (b, _) in zip(fleet, before, strict=True)]
    served_ok = [embed_answers(r, "OK") - b for r, (_, b) in zip(fleet, before, strict=True)]

    # Nothing lost: every request sent was answered, and the replicas counted exactly those.
    sent = report["requests"]["sent"]
    assert sent == REQUESTS and report["requests"]["answered"] == sent
    assert sum(report["codes"].values()) == sent
    assert sum(served) == sent + report["requests"]["warmup"], (served, report["requests"])
    # 64 streams overfill the compose fleet's 0.3 s queue bound: replicas shed, and may not fail otherwise.
    assert set(report["codes"]) <= {"OK", "RESOURCE_EXHAUSTED"}, report["codes"]
    # How many are shed depends on how fast this machine is; that each replica served some does not.
    assert report["codes"]["OK"] == sum(served_ok) and min(served_ok) >= 1, (report["codes"], served_ok)
    # round_robin: each replica was sent about half the requests (the picks alternate, whatever the answers).
    assert min(served) >= 0.35 * sum(served), served
    assert report["tokens_per_s"] > 0 and report["latency_ms"]["p99"] >= report["latency_ms"]["p50"] > 0

    # The printed table and the picture a user reads.
    assert f"{sent} sent, {sent} answered" in done.stdout
    assert (tmp_path / "loadtest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_replica_answers_the_compose_healthcheck(fleet, compose):
    """The healthcheck compose runs inside each container, aimed at each replica's address instead."""
    check = compose["server"]["healthcheck"]["test"]
    assert check[:3] == ["CMD", "attnserve", "health"]
    for replica in fleet:
        argv = list(check[2:])
        argv[argv.index("--target") + 1] = replica.target
        done = subprocess.run([sys.executable, "-m", "attnserve.cli", *argv], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == f"{replica.target}: SERVING", done


def test_an_open_loop_reports_every_request_by_code(fleet, dns_server, tmp_path):
    """Open loop over the same path: arrivals on a fixed schedule, each one answered and counted."""
    target = f"dns://127.0.0.1:{dns_server}/{SERVICE_NAME}:{fleet[0].port}"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "attnserve.cli", "loadtest", "--target", target, "--rate", "40", "--duration", "3",
         "--json", "-"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["mode"] == "open" and report["rate"] == 40
    # 120 on the schedule; should a replica shed one, its retry comes on top (a few at most: the throttle).
    requests = report["requests"]
    assert requests["sent"] - requests["retried"] == 120 and sum(report["codes"].values()) == requests["sent"]
    # Never ahead of the schedule (the last of the 120 is due at 2.975 s), and not fallen behind into a closed
    # loop. sent_per_s counts the retries too, over the time to the last send.
    assert 20 <= report["sent_per_s"] <= requests["sent"] / 2.975 + 0.01, report
    assert time.monotonic() - started < 60


def test_over_http_the_compose_loadtest_spreads_over_both_replicas(fleet, dns_server, compose, tmp_path):
    """The same service over the HTTP door: the name resolved to both addresses, requests to each in turn."""
    route = "/v1/embeddings"
    target = f"dns://127.0.0.1:{dns_server}/{SERVICE_NAME}:{fleet[0].http_port}"
    before = [embed_answers(r, method=route) for r in fleet]
    done = run_loadtest_service(compose, target, tmp_path, "--requests", "120", "--protocol", "http")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "loadtest.json").read_text())
    served = [embed_answers(r, method=route) - b for r, b in zip(fleet, before, strict=True)]
    r = report["requests"]
    assert r["sent"] == 120 and r["answered"] == sum(report["codes"].values()) == r["sent"]
    assert sum(served) == r["sent"] + r["warmup"], (served, r)
    assert set(report["codes"]) <= {"200", "429"}, report["codes"]
    assert report["route"] == f"http (base64), round robin over 2 address(es) of {SERVICE_NAME}"
    assert min(served) >= 0.4 * sum(served), served
