"""`attnserve loadtest` against a real server: what it counts, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from attnserve.client.retry import BACKOFF_MAX_S, MAX_TOKENS, Backoff
from attnserve.loadtest.corpus import mixed_length_corpus
from tests.conftest import GUARD_KEY, assert_one_line_error, run_cli
from tests.serving import ServerProcess


def report_of(result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_closed_loop_counts_every_request_and_token(server, engine):
    texts = mixed_length_corpus(60, seed=3)
    report = report_of(run_cli("loadtest", "--target", server.target, "--corpus-size", 60, "--seed", 3,
                               "--batch-size", 4, "--requests", 15, "--concurrency", 4, "--json", "-"))
    # 15 requests of 4 consecutive texts: one pass over the corpus, every text once.
    assert report["mode"] == "closed" and report["concurrency"] == 4
    assert report["requests"] == {"sent": 15, "answered": 15, "ok": 15, "errors": 0, "retried": 0, "warmup": 0}
    assert report["codes"] == {"OK": 15}
    assert report["tokens"] == sum(len(x) for x in engine.tokenizer.encode_texts(texts, truncate=True))
    assert report["inputs_per_s"] == pytest.approx(4 * report["requests_per_s"], rel=0.01)
    lat = report["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]


@pytest.mark.parametrize("encoding_format", ["base64", "float"])
def test_over_http_the_same_load_counts_the_same_tokens(server, engine, encoding_format):
    """The OpenAI route: every request and token counted from the reply's usage, statuses as HTTP has them."""
    texts = mixed_length_corpus(60, seed=3)
    # host:port without a scheme is http://host:port.
    target = server.http_url if encoding_format == "base64" else server.http_url.removeprefix("http://")
    report = report_of(run_cli("loadtest", "--protocol", "http", "--encoding-format", encoding_format,
                               "--target", target, "--corpus-size", 60, "--seed", 3, "--batch-size", 4,
                               "--requests", 15, "--concurrency", 4, "--json", "-"))
    assert report["protocol"] == "http" and report["route"].startswith(f"http ({encoding_format}), round robin")
    assert report["requests"] == {"sent": 15, "answered": 15, "ok": 15, "errors": 0, "retried": 0, "warmup": 0}
    assert report["codes"] == {"200": 15}
    assert report["tokens"] == sum(len(x) for x in engine.tokenizer.encode_texts(texts, truncate=True))
    assert 0 < report["latency_ms"]["p50"] <= report["latency_ms"]["p99"]


@pytest.mark.parametrize("protocol", ["kserve", "kserve-http"])
@pytest.mark.parametrize("rate", [0, 40], ids=["closed", "open"])
def test_over_kserve_v2_the_same_load_counts_the_same_tokens(server, engine, protocol, rate):
    """KServe v2 as Triton's clients send it (ModelInfer's raw contents over gRPC, binary tensors over HTTP), closed
    and open loop: every request and token counted from the replies' num_tokens, the same report."""
    texts = mixed_length_corpus(60, seed=3)
    target = server.target if protocol == "kserve" else server.http_url.removeprefix("http://")
    load = ["--rate", rate, "--duration", 60] if rate else ["--concurrency", 4]
    report = report_of(run_cli("loadtest", "--protocol", protocol, "--target", target, "--corpus-size", 60,
                               "--seed", 3, "--batch-size", 4, "--requests", 15, *load, "--truncate", "--json", "-"))
    assert report["protocol"] == protocol and report["route"].startswith(
        "kserve v2 grpc" if protocol == "kserve" else "kserve v2 http (binary), round robin")
    assert report["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert report["mode"] == ("open" if rate else "closed")
    assert report["requests"] == {"sent": 15, "answered": 15, "ok": 15, "errors": 0, "retried": 0, "warmup": 0}
    assert report["codes"] == {"OK" if protocol == "kserve" else "200": 15}
    assert report["tokens"] == sum(len(x) for x in engine.tokenizer.encode_texts(texts, truncate=True))


def test_over_kserve_a_refusal_is_counted_under_its_code(server, tmp_path):
    """Token ids are no KServe v2 input: one line before any load; a deadline no request meets: each counted."""
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"token_ids": [101, 7592, 102]}\n')
    assert_one_line_error(run_cli("loadtest", "--protocol", "kserve", "--target", server.target, "--input", ids,
                                  "--requests", 2), "KServe v2 takes texts")
    result = run_cli("loadtest", "--protocol", "kserve", "--target", server.target, "--requests", 10,
                     "--concurrency", 5, "--timeout", "0.0005")
    assert_one_line_error(result, "no request succeeded", "'DEADLINE_EXCEEDED': 10")


def test_over_http_failures_are_counted_under_their_http_status(server):
    """A deadline no request can meet, sent as X-Request-Timeout: the server's 504 for each, none lost."""
    result = run_cli("loadtest", "--protocol", "http", "--target", server.http_url, "--requests", 20,
                     "--concurrency", 5, "--timeout", "0.0005", env={"ATTNSERVE_LOADTEST_PROTOCOL": "grpc"})
    assert_one_line_error(result, "no request succeeded", "'504': 20")
    assert "20 sent, 20 answered: 0 ok, 20 errors" in result.stdout


def test_the_protocol_comes_from_the_environment_too(server):
    report = report_of(run_cli("loadtest", "--target", server.http_url, "--requests", 4, "--concurrency", 2,
                               "--json", "-", env={"ATTNSERVE_LOADTEST_PROTOCOL": "http"}))
    assert report["protocol"] == "http" and report["codes"] == {"200": 4}


def test_a_servers_wait_is_honoured_within_the_backoff_cap():
    backoff = Backoff()
    assert backoff.next(0.5) == 0.5  # the first backoff is 50 ms +-20%: the server asked for more
    assert backoff.next(30.0) == BACKOFF_MAX_S  # a long Retry-After is capped as the backoff is
    assert 0.16 <= backoff.next(None) <= 0.24  # no wait asked: the backoff alone (200 ms +-20%)


def test_a_users_file_is_sent_as_encode_reads_it(server, tmp_path):
    data = tmp_path / "inputs.jsonl"
    data.write_text('{"text": "a short text"}\n{"token_ids": [101, 7592, 102]}\n')
    result = run_cli("loadtest", "--target", server.target, "--input", data, "--requests", 4, "--concurrency", 1)
    assert result.returncode == 0, result.stderr
    assert "from the inputs.jsonl (2 inputs)" in result.stdout
    assert "4 sent, 4 answered: 4 ok, 0 errors" in result.stdout


def test_every_failure_is_counted_under_its_status_code(server):
    """A deadline no request can meet: all answered as DEADLINE_EXCEEDED, none lost, and the run says so."""
    result = run_cli("loadtest", "--target", server.target, "--requests", 20, "--concurrency", 5,
                     "--timeout", "0.0005")
    assert_one_line_error(result, "no request succeeded", "DEADLINE_EXCEEDED")
    assert "20 sent, 20 answered: 0 ok, 20 errors" in result.stdout
    assert "DEADLINE_EXCEEDED" in result.stdout


@pytest.mark.parametrize("args, fragments", [
    (["--rate", "10", "--concurrency", "4"], ["--concurrency", "--rate", "not both"]),
    (["--batch-size", "0"], ["batch_size"]),
    (["--rate", "abc"], ["--rate", "'abc'"]),
    (["--json", "/nonexistent/dir/report.json"], ["--json", "does not exist"]),
])
def test_bad_flags_are_one_line_errors_before_any_load(server, args, fragments):
    assert_one_line_error(run_cli("loadtest", "--target", server.target, "--requests", 1, *args), *fragments)


def test_a_bad_input_row_names_its_line(server, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "fine"}\n{"text": ""}\n')
    assert_one_line_error(run_cli("loadtest", "--target", server.target, "--input", data, "--requests", 1),
                          "bad.jsonl", "line 2", "empty text")


def test_an_unreachable_target_is_one_line():
    assert_one_line_error(run_cli("loadtest", "--target", "127.0.0.1:1", "--requests", 1, "--timeout", "2"),
                          "no attnserve server at 127.0.0.1:1 (start one with `attnserve serve`)")
    assert_one_line_error(run_cli("loadtest", "--protocol", "http", "--target", "http://127.0.0.1:1",
                                  "--requests", 1), "no attnserve server at 127.0.0.1:1")


@pytest.mark.parametrize("target", ["ftp://127.0.0.1:1", "127.0.0.1", "http://127.0.0.1:1/v1"])
def test_a_bad_http_target_is_one_line(target):
    assert_one_line_error(run_cli("loadtest", "--protocol", "http", "--target", target, "--requests", 1),
                          f"--target {target!r}", "http(s)://HOST:PORT")


def test_over_http_the_api_key_is_a_bearer_token_and_429s_are_retried(guarded_server):
    """A queue that holds a few requests' tokens: 16 streams overfill it, the server answers 429 with
    Retry-After, and the load backs off and retries, every send counted."""
    refused = run_cli("loadtest", "--protocol", "http", "--target", guarded_server.http_url, "--requests", 1)
    assert_one_line_error(refused, "no model info: HTTP 401: no API key")
    report = report_of(run_cli("loadtest", "--protocol", "http", "--target", guarded_server.http_url, "--api-key",
                               GUARD_KEY, "--batch-size", 2, "--requests", 120, "--concurrency", 16, "--json", "-"))
    r, codes = report["requests"], report["codes"]
    assert set(codes) == {"200", "429"} and r["sent"] == r["answered"] == sum(codes.values()), codes
    assert codes["429"] == r["errors"] > 0 and 0 < r["retried"] <= r["errors"], report
    assert r["ok"] == codes["200"] > 0


def test_health_of_an_unreachable_target_is_one_line():
    assert_one_line_error(run_cli("health", "--target", "127.0.0.1:1", "--timeout", "2"),
                          "no attnserve server at 127.0.0.1:1")


def answered_ok(server: ServerProcess, http: bool = False) -> int:
    key = ('attnserve_requests_total{code="200",method="/v1/embeddings",protocol="http"}' if http
           else 'attnserve_requests_total{code="OK",method="Embed",protocol="grpc"}')
    return int(server.metrics().get(key, 0))


def load_until_the_server_stops(artifacts, tmp_path, *load: str, http: bool = False) -> tuple[dict, str]:
    """`attnserve loadtest` for 5 s against a server that is stopped (SIGTERM: drain, exit) once it has
    answered 20 requests of it; the report and the printed table."""
    server = ServerProcess(artifacts, log_path=tmp_path / "server.log")
    target = ["--protocol", "http", "--target", server.http_url] if http else ["--target", server.target]
    try:
        server.wait_serving()
        process = subprocess.Popen(
            [sys.executable, "-m", "attnserve.cli", "loadtest", *target, "--duration", "5",
             "--json", str(tmp_path / "report.json"), *load], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        end = time.monotonic() + 60
        while answered_ok(server, http) < 20 and process.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        assert server.terminate() == 0, server.log_tail()
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    return json.loads((tmp_path / "report.json").read_text()), stdout


def refusals_per_second(report: dict) -> list[int]:
    return [row["errors"] for row in report["timeline"]]


def test_a_closed_loop_backs_off_from_a_server_stopped_mid_run(artifacts, tmp_path):
    """Without a backoff the 8 streams would meet the stopped server with thousands of requests a second."""
    report, table = load_until_the_server_stops(artifacts, tmp_path, "--concurrency", "8")
    r, codes = report["requests"], report["codes"]
    assert r["ok"] >= 20 and r["sent"] == r["answered"] == sum(codes.values())
    assert codes.get("UNAVAILABLE", 0) == r["errors"] > 0, codes
    # After a refusal a stream waits 50 ms, 100, 200, 400, 800, then 1 s each (+-20%): in its first second
    # of refusals at most 6 sends, at most 11 in 5 s. Every refusal is a send, so per stream and in all:
    assert max(refusals_per_second(report)) <= 8 * 6, report["timeline"]
    assert r["errors"] <= 8 * 11, r
    # The refused requests were sent again, until the retry throttle saw that refusals dominate.
    assert 0 < r["retried"] <= r["errors"]
    assert sum(row["retried"] for row in report["timeline"]) == r["retried"]
    assert f"retried      {r['retried']} of those sent" in table


def test_an_open_loop_keeps_its_schedule_when_the_server_stops_and_retries_little(artifacts, tmp_path):
    report, table = load_until_the_server_stops(artifacts, tmp_path, "--rate", "40")
    r, codes = report["requests"], report["codes"]
    assert r["ok"] >= 20 and codes.get("UNAVAILABLE", 0) == r["errors"] > 0, codes
    # New requests: 40 a second for 5 s, refused or not. Retries on top: a few, until the throttle (MAX_TOKENS,
    # half of it spent) stops them.
    assert r["sent"] - r["retried"] == 200
    assert 0 < r["retried"] <= MAX_TOKENS, r
    assert max(row["sent"] for row in report["timeline"]) <= 40 + MAX_TOKENS, report["timeline"]
    assert f"retried      {r['retried']} of those sent" in table


def test_over_http_a_closed_loop_backs_off_from_a_server_stopped_mid_run(artifacts, tmp_path):
    """The same retry policy as over gRPC: 503 while draining and refused connections once it is gone."""
    report, table = load_until_the_server_stops(artifacts, tmp_path, "--concurrency", "8", http=True)
    r, codes = report["requests"], report["codes"]
    assert r["ok"] >= 20 and r["sent"] == r["answered"] == sum(codes.values())
    assert set(codes) <= {"200", "503", "CONNECTION_FAILED", "CONNECTION_LOST"}, codes
    assert codes.get("CONNECTION_FAILED", 0) > 0, codes
    assert max(refusals_per_second(report)) <= 8 * 6, report["timeline"]
    assert r["errors"] <= 8 * 11, r
    assert 0 < r["retried"] <= r["errors"]
