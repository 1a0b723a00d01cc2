"""`attnserve loadtest` against a real server: what it counts, and its errors."""

from __future__ import annotations

import json

import pytest

from attnserve.loadtest.corpus import mixed_length_corpus
from tests.conftest import assert_one_line_error, run_cli


def report_of(result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_closed_loop_counts_every_request_and_token(server, engine):
    texts = mixed_length_corpus(60, seed=3)
    report = report_of(run_cli("loadtest", "--target", server.target, "--corpus-size", 60, "--seed", 3,
                               "--batch-size", 4, "--requests", 15, "--concurrency", 4, "--json", "-"))
    # 15 requests of 4 consecutive texts: one pass over the corpus, every text once.
    assert report["mode"] == "closed" and report["concurrency"] == 4
    assert report["requests"] == {"sent": 15, "answered": 15, "ok": 15, "errors": 0, "warmup": 0}
    assert report["codes"] == {"OK": 15}
    assert report["tokens"] == sum(len(x) for x in engine.tokenizer.encode_texts(texts, truncate=True))
    assert report["inputs_per_s"] == pytest.approx(4 * report["requests_per_s"], rel=0.01)
    lat = report["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]


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
                          "127.0.0.1:1 is not serving", "UNAVAILABLE")
