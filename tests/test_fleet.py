"""The compose topology without Docker: two `attnserve serve` processes with the compose file's server settings on
one port at 127.0.0.1 and 127.0.0.2, as two containers; a DNS server answers one name with both addresses, as
Docker's embedded DNS answers the service name; and the compose `loadtest` command, its target that name (gRPC's dns
resolver, round_robin: compose's path). Each replica must take a fair share, and every request be answered and
counted by one of them."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from dnslib.server import DNSLogger, DNSServer
from dnslib.zoneresolver import ZoneResolver

from attnserve.server_process import CLI
from tests.compose import compose_config, environment
from tests.serving import ServerProcess, free_port

REPLICA_HOSTS = ("127.0.0.1", "127.0.0.2")
SERVICE_NAME = "replicas.attnserve.test"


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


def answers(replica: ServerProcess, method: str, code: str = "") -> int:
    """The requests of a method (or HTTP route) the replica answered: with this status code, or any."""
    return int(sum(v for k, v in replica.metrics().items()
                   if k.startswith("attnserve_requests_total{") and f'method="{method}"' in k and f'code="{code}' in k))


@pytest.mark.parametrize("protocol, requests", [("grpc", 240), ("http", 120)])
def test_the_compose_loadtest_spreads_over_both_replicas_and_loses_nothing(fleet, dns_server, compose, tmp_path,
                                                                          protocol, requests):
    """The compose `loadtest` command and environment, with this machine's target and report folder."""
    method, port = ("Embed", fleet[0].port) if protocol == "grpc" else ("/v1/embeddings", fleet[0].http_port)
    command = list(compose["loadtest"]["command"])
    command[command.index("--target") + 1] = f"dns://127.0.0.1:{dns_server}/{SERVICE_NAME}:{port}"
    for flag in ("--json", "--plot"):
        command[command.index(flag) + 1] = str(tmp_path / Path(command[command.index(flag) + 1]).name)
    ok = "OK" if protocol == "grpc" else "200"
    before = [(answers(r, method), answers(r, method, ok)) for r in fleet]
    env = {**os.environ, **environment(compose["loadtest"]), "ATTNSERVE_LOADTEST_PROTOCOL": protocol}
    done = subprocess.run([*CLI, *command, "--requests", str(requests)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "loadtest.json").read_text())
    served = [answers(r, method) - b for r, (b, _) in zip(fleet, before, strict=True)]
    served_ok = [answers(r, method, ok) - b for r, (_, b) in zip(fleet, before, strict=True)]
    # Nothing lost: every request sent was answered, and the replicas counted exactly those.
    r = report["requests"]
    assert r["sent"] == requests and r["answered"] == sum(report["codes"].values()) == requests
    assert sum(served) == requests + r["warmup"], (served, r)
    # 64 streams overfill the compose fleet's 0.3 s queue bound: replicas shed, and may not fail otherwise.
    assert set(report["codes"]) <= {ok, "RESOURCE_EXHAUSTED" if protocol == "grpc" else "429"}, report["codes"]
    # round_robin: each replica was sent about half the requests (the picks alternate, whatever the answers). How
    # many are shed depends on how fast this machine is; that each replica served some does not.
    if protocol == "grpc":
        assert report["codes"]["OK"] == sum(served_ok) and min(served_ok) >= 1, (report["codes"], served_ok)
        assert min(served) >= 0.35 * sum(served), served
        assert report["tokens_per_s"] > 0 and report["latency_ms"]["p99"] >= report["latency_ms"]["p50"] > 0
    else:
        assert report["route"] == f"http (base64), round robin over 2 address(es) of {SERVICE_NAME}"
        assert min(served) >= 0.4 * sum(served), served
    # The printed table and the picture a user reads.
    assert f"{requests} sent, {requests} answered" in done.stdout
    assert (tmp_path / "loadtest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_replica_answers_the_compose_healthcheck(fleet, compose):
    """The healthcheck compose runs inside each container, aimed at each replica's address instead."""
    check = compose["server"]["healthcheck"]["test"]
    assert check[:3] == ["CMD", "attnserve", "health"]
    for replica in fleet:
        argv = list(check[2:])
        argv[argv.index("--target") + 1] = replica.target
        done = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == f"{replica.target}: SERVING", done


def test_an_open_loop_reports_every_request_by_code(fleet, dns_server):
    """Open loop over the same path: arrivals on a fixed schedule, each one answered and counted."""
    started = time.monotonic()
    target = f"dns://127.0.0.1:{dns_server}/{SERVICE_NAME}:{fleet[0].port}"
    done = subprocess.run([*CLI, "loadtest", "--target", target, "--rate", "40", "--duration", "3", "--json", "-"],
                          capture_output=True, text=True, timeout=120)
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
