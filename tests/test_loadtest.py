"""`attnserve loadtest` against real servers: what it counts over each protocol, how it backs off and retries, and
its errors."""

from __future__ import annotations

import json
import shlex
import subprocess
import time

import pytest

from attnserve.client.retry import BACKOFF_MAX_S, MAX_TOKENS, Backoff
from attnserve.loadtest.corpus import mixed_length_corpus
from attnserve.server_process import CLI
from tests.conftest import GUARD_KEY, assert_one_line_error, run_cli
from tests.serving import ServerProcess

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def report_of(*args, env: dict | None = None) -> dict:
    result = run_cli("loadtest", *args, "--json", "-", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def where(server: ServerProcess) -> dict[str, str]:
    """A server's addresses, to format a table's argv with; http_address: host:port, without a scheme (http)."""
    return dict(target=server.target, http_url=server.http_url, http_address=server.http_url.removeprefix("http://"))


LOADS = {  # argv (formatted by where()), its env, the protocol and route (its start) reported, an answer's status
    "grpc": ("--target {target} --concurrency 4", {}, "grpc", "", "OK"),
    "http-base64": ("--protocol http --encoding-format base64 --target {http_url} --concurrency 4", {}, "http",
                    "http (base64), round robin", "200"),
    "http-float": ("--protocol http --encoding-format float --target {http_address} --concurrency 4", {}, "http",
                   "http (float), round robin", "200"),
    "http-from-the-environment": ("--target {http_url} --concurrency 2", {"ATTNSERVE_LOADTEST_PROTOCOL": "http"},
                                  "http", "http (base64), round robin", "200"),
    # KServe v2 as Triton's clients send it: ModelInfer's raw contents over gRPC, binary tensors over HTTP.
    "kserve-closed": ("--protocol kserve --target {target} --truncate --concurrency 4", {}, "kserve",
                      "kserve v2 grpc", "OK"),
    "kserve-open": ("--protocol kserve --target {target} --truncate --rate 40 --duration 60", {}, "kserve",
                    "kserve v2 grpc", "OK"),
    "kserve-http-closed": ("--protocol kserve-http --target {http_address} --truncate --concurrency 4", {},
                           "kserve-http", "kserve v2 http (binary), round robin", "200"),
    "kserve-http-open": ("--protocol kserve-http --target {http_address} --truncate --rate 40 --duration 60", {},
                         "kserve-http", "kserve v2 http (binary), round robin", "200"),
}


@pytest.mark.parametrize("case", LOADS)
def test_a_load_counts_every_request_and_token(server, engine, case):
    """15 requests of 4 consecutive texts: one pass over the corpus, every text once, every token counted from the
    replies (HTTP's usage, KServe's num_tokens), the statuses as each protocol has them."""
    argv, env, protocol, route, ok = LOADS[case]
    report = report_of(*(a.format(**where(server)) for a in shlex.split(argv)), "--corpus-size", 60, "--seed", 3,
                       "--batch-size", 4, "--requests", 15, env=env)
    assert report["protocol"] == protocol and report["route"].startswith(route)
    assert report["model"] == MODEL if protocol.startswith("kserve") else report["model"].startswith(MODEL)
    closed = ("closed", int(argv.split()[-1])) if "--concurrency" in argv else ("open", None)
    assert (report["mode"], report["concurrency"]) == closed
    assert report["requests"] == {"sent": 15, "answered": 15, "ok": 15, "errors": 0, "retried": 0, "warmup": 0}
    assert report["codes"] == {ok: 15}
    texts = mixed_length_corpus(60, seed=3)
    assert report["tokens"] == sum(len(x) for x in engine.tokenizer.encode_texts(texts, truncate=True))
    assert report["inputs_per_s"] == pytest.approx(4 * report["requests_per_s"], rel=0.01)
    lat = report["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]


@pytest.mark.parametrize("argv, code", [
    ("--target {target}", "'DEADLINE_EXCEEDED': 20"),
    ("--protocol kserve --target {target}", "'DEADLINE_EXCEEDED': 20"),
    ("--protocol http --target {http_url}", "'504': 20"),  # the server's 504, for the X-Request-Timeout sent
])
def test_every_failure_is_counted_under_its_status_code(server, argv, code):
    """A deadline no request can meet: each answered under its code, none lost, and the run says so. The flag's
    protocol beats the environment's."""
    result = run_cli("loadtest", *(a.format(**where(server)) for a in shlex.split(argv)), "--requests", 20,
                     "--concurrency", 5, "--timeout", "0.0005", env={"ATTNSERVE_LOADTEST_PROTOCOL": "grpc"})
    assert_one_line_error(result, "no request succeeded", code)
    assert "20 sent, 20 answered: 0 ok, 20 errors" in result.stdout and code.split("'")[1] in result.stdout


# argv (formatted by where() and with the files the test writes) and what its one line says, before any load
ONE_LINE_ERRORS = [
    ("loadtest --protocol kserve --target {target} --input {ids} --requests 2", ["KServe v2 takes texts"]),
    ("loadtest --target {target} --requests 1 --rate 10 --concurrency 4", ["--concurrency", "--rate", "not both"]),
    ("loadtest --target {target} --requests 1 --batch-size 0", ["batch_size"]),
    ("loadtest --target {target} --requests 1 --rate abc", ["--rate", "'abc'"]),
    ("loadtest --target {target} --requests 1 --json /nonexistent/dir/report.json", ["--json", "does not exist"]),
    ("loadtest --target {target} --input {bad} --requests 1", ["bad.jsonl", "line 2", "empty text"]),
    ("loadtest --target 127.0.0.1:1 --requests 1 --timeout 2",
     ["no attnserve server at 127.0.0.1:1 (start one with `attnserve serve`)"]),
    ("loadtest --protocol http --target http://127.0.0.1:1 --requests 1", ["no attnserve server at 127.0.0.1:1"]),
    ("health --target 127.0.0.1:1 --timeout 2", ["no attnserve server at 127.0.0.1:1"]),
    *((f"loadtest --protocol http --target {target} --requests 1", [f"--target {target!r}", "http(s)://HOST:PORT"])
      for target in ["ftp://127.0.0.1:1", "127.0.0.1", "http://127.0.0.1:1/v1"]),
]


@pytest.mark.parametrize("argv, fragments", ONE_LINE_ERRORS)
def test_bad_flags_inputs_and_targets_are_one_line_errors(server, tmp_path, argv, fragments):
    (tmp_path / "ids.jsonl").write_text('{"token_ids": [101, 7592, 102]}\n')  # token ids are no KServe v2 input
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": ""}\n')
    files = dict(ids=tmp_path / "ids.jsonl", bad=tmp_path / "bad.jsonl")
    assert_one_line_error(run_cli(*(a.format(**where(server), **files) for a in shlex.split(argv))), *fragments)


def test_a_users_file_is_sent_as_encode_reads_it(server, tmp_path):
    data = tmp_path / "inputs.jsonl"
    data.write_text('{"text": "a short text"}\n{"token_ids": [101, 7592, 102]}\n')
    result = run_cli("loadtest", "--target", server.target, "--input", data, "--requests", 4, "--concurrency", 1)
    assert result.returncode == 0, result.stderr
    assert "from the inputs.jsonl (2 inputs)" in result.stdout
    assert "4 sent, 4 answered: 4 ok, 0 errors" in result.stdout


def test_a_servers_wait_is_honoured_within_the_backoff_cap():
    backoff = Backoff()
    assert backoff.next(0.5) == 0.5  # the first backoff is 50 ms +-20%: the server asked for more
    assert backoff.next(30.0) == BACKOFF_MAX_S  # a long Retry-After is capped as the backoff is
    assert 0.16 <= backoff.next(None) <= 0.24  # no wait asked: the backoff alone (200 ms +-20%)


def test_over_http_the_api_key_is_a_bearer_token_and_429s_are_retried(guarded_server):
    """A queue that holds a few requests' tokens: 16 streams overfill it, the server answers 429 with Retry-After,
    and the load backs off and retries, every send counted."""
    refused = run_cli("loadtest", "--protocol", "http", "--target", guarded_server.http_url, "--requests", 1)
    assert_one_line_error(refused, "no model info: HTTP 401: no API key")
    report = report_of("--protocol", "http", "--target", guarded_server.http_url, "--api-key", GUARD_KEY,
                       "--batch-size", 2, "--requests", 120, "--concurrency", 16)
    r, codes = report["requests"], report["codes"]
    assert set(codes) == {"200", "429"} and r["sent"] == r["answered"] == sum(codes.values()), codes
    assert codes["429"] == r["errors"] > 0 and 0 < r["retried"] <= r["errors"], report
    assert r["ok"] == codes["200"] > 0


@pytest.mark.parametrize("load, http", [("--concurrency 8", False), ("--rate 40", False), ("--concurrency 8", True)],
                         ids=["grpc-closed", "grpc-open", "http-closed"])
def test_a_load_backs_off_from_a_server_stopped_mid_run(artifacts, tmp_path, load, http):
    """`attnserve loadtest` for 5 s against a server stopped (SIGTERM: drain, exit) once it has answered 20 of its
    requests. Without a backoff the 8 streams of a closed loop would meet it with thousands of requests a second;
    an open loop keeps its schedule. HTTP has the same retry policy: 503 while draining, then refused connections."""
    server = ServerProcess(artifacts, log_path=tmp_path / "server.log")
    ok = 'attnserve_requests_total{code="200",method="/v1/embeddings",protocol="http"}' if http else \
        'attnserve_requests_total{code="OK",method="Embed",protocol="grpc"}'
    try:
        server.wait_serving()
        process = subprocess.Popen([*CLI, "loadtest", *(["--protocol", "http", "--target", server.http_url] if http
                                                        else ["--target", server.target]),
                                    "--duration", "5", "--json", str(tmp_path / "report.json"), *load.split()],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        end = time.monotonic() + 60
        while server.metrics().get(ok, 0) < 20 and process.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        assert server.terminate() == 0, server.log_tail()
    table, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    report = json.loads((tmp_path / "report.json").read_text())
    r, codes, timeline = report["requests"], report["codes"], report["timeline"]
    assert r["ok"] >= 20 and r["sent"] == r["answered"] == sum(codes.values()), r
    if http:
        assert set(codes) <= {"200", "503", "CONNECTION_FAILED", "CONNECTION_LOST"}, codes
        assert codes.get("CONNECTION_FAILED", 0) > 0, codes
    else:
        assert codes.get("UNAVAILABLE", 0) == r["errors"] > 0, codes
    if load.startswith("--rate"):
        # New requests: 40 a second for 5 s, refused or not. Retries on top: a few, until the throttle (MAX_TOKENS,
        # half of it spent) stops them.
        assert r["sent"] - r["retried"] == 200 and 0 < r["retried"] <= MAX_TOKENS, r
        assert max(row["sent"] for row in timeline) <= 40 + MAX_TOKENS, timeline
    else:
        # After a refusal a stream waits 50 ms, 100, 200, 400, 800, then 1 s each (+-20%): in its first second of
        # refusals at most 6 sends, at most 11 in 5 s. Every refusal is a send, so per stream and in all:
        assert max(row["errors"] for row in timeline) <= 8 * 6, timeline
        assert r["errors"] <= 8 * 11, r
        # The refused requests were sent again, until the retry throttle saw that refusals dominate.
        assert 0 < r["retried"] <= r["errors"]
    assert sum(row["retried"] for row in timeline) == r["retried"]
    assert f"retried      {r['retried']} of those sent" in table
