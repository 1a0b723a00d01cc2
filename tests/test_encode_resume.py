"""`attnserve encode` for long runs: resume after kill -9 with identical output, and strict handling of bad rows."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import assert_one_line_error, run_cli
from tests.offline_helpers import BAD_JSONL, encode_command, start_until_chunks
from tests.test_server_load import mixed_texts


def clean_run(source: Path, *flags) -> Path:
    """The bytes the command writes for source with nothing in its way (clean.parquet beside it), with the same
    flags: the same batches, so the same bytes (an in-process engine of other settings batches otherwise)."""
    clean = source.with_name("clean.parquet")
    result = run_cli("encode", source, "-o", clean, *flags)
    assert result.returncode == 0, result.stderr
    return clean


def test_kill_9_then_resume_gives_the_same_bytes_as_a_clean_run(artifacts, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(mixed_texts(480, seed=3)) + "\n")
    flags = ["--artifacts", artifacts, "--chunk-rows", "40"]

    out = tmp_path / "resumed.parquet"
    progress = tmp_path / ".resumed.parquet.parts" / "progress.json"
    process = start_until_chunks(encode_command(source, "-o", out, *flags), progress, 3, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done = len(json.loads(progress.read_text())["chunks"])
    assert 3 <= done < 12 and not out.exists()  # killed part-way; nothing under the final name

    resumed = run_cli("encode", source, "-o", out, *flags)
    assert resumed.returncode == 0, resumed.stderr
    assert f"(resumed after {done * 40} rows)" in resumed.stdout
    assert f"encoded {480 - done * 40} texts" in resumed.stdout  # the done chunks were not encoded again
    assert out.read_bytes() == clean_run(source, *flags).read_bytes()
    assert not progress.parent.exists()


def texts_with_a_bad_line(n: int, bad_line: int, seed: int) -> list[str]:
    lines = mixed_texts(n, seed=seed)
    lines[bad_line - 1] = "   "
    return lines


def test_other_arguments_over_an_unfinished_run_are_refused_in_words_and_overwrite_starts_again(artifacts, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts_with_a_bad_line(100, 90, seed=4)) + "\n")
    out = tmp_path / "out.parquet"
    failed = run_cli("encode", source, "-o", out, "--artifacts", artifacts, "--chunk-rows", "40")
    assert_one_line_error(failed, "texts.txt: line 90: empty text")  # after two finished chunks of 40
    refused = run_cli("encode", source, "-o", out, "--artifacts", artifacts, "--chunk-rows", "20", "--no-normalize")
    assert_one_line_error(refused, "has an unfinished run (2 chunks, 80 rows done) with other settings: "
                          "--chunk-rows was 40, now 20; --normalize was on, now off.", "--overwrite")
    assert not out.exists()
    fresh = run_cli("encode", source, "-o", out, "--artifacts", artifacts, "--chunk-rows", "20", "--overwrite",
                    "--on-error", "skip")
    assert fresh.returncode == 0, fresh.stderr
    assert pq.read_table(out).num_rows == 99 and "resumed" not in fresh.stdout


def test_a_failed_first_chunk_leaves_nothing_to_protect(artifacts, tmp_path):
    """New-user path: a bad row in the first chunk; any next step is taken, with no talk of the unfinished run."""
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts_with_a_bad_line(30, 7, seed=5)) + "\n")
    out = tmp_path / "out.parquet"
    assert_one_line_error(run_cli("encode", source, "-o", out, "--artifacts", artifacts), "line 7: empty text")
    other = run_cli("encode", source, "-o", out, "--artifacts", artifacts, "--chunk-rows", "10", "--on-error", "skip")
    assert other.returncode == 0 and "unfinished" not in other.stderr, other.stderr
    assert pq.read_table(out).num_rows == 29


def test_after_a_bad_row_stopped_the_run_skip_resumes_it(artifacts, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts_with_a_bad_line(100, 90, seed=6)) + "\n")
    flags = ["--artifacts", artifacts, "--chunk-rows", "40", "--on-error", "skip"]
    out = tmp_path / "out.parquet"
    assert_one_line_error(run_cli("encode", source, "-o", out, "--artifacts", artifacts, "--chunk-rows", "40"),
                          "line 90: empty text", "--on-error skip sets such rows aside")
    resumed = run_cli("encode", source, "-o", out, *flags)  # as the message suggests
    assert resumed.returncode == 0, resumed.stderr
    assert "(resumed after 80 rows)" in resumed.stdout and "skipped 1 bad rows" in resumed.stdout
    assert out.read_bytes() == clean_run(source, *flags).read_bytes()
    assert (tmp_path / "out.errors.jsonl").read_text() == (tmp_path / "clean.errors.jsonl").read_text()


@pytest.mark.parametrize("edits, resumed_after", [
    ({89: "the line, fixed"}, 80),  # the finished chunks' rows did not change
    ({50: "an edit inside the second finished chunk", 89: "the bad line, fixed"}, 40),
], ids=["the bad line fixed", "a finished chunk's row changed too"])
def test_after_a_bad_row_stopped_the_run_fixing_the_file_resumes_it(artifacts, tmp_path, edits,
                                                                     resumed_after):
    source = tmp_path / "texts.txt"
    lines = texts_with_a_bad_line(100, 90, seed=7)
    source.write_text("\n".join(lines) + "\n")
    out, flags = tmp_path / "out.parquet", ["--artifacts", artifacts, "--chunk-rows", "40"]
    assert_one_line_error(run_cli("encode", source, "-o", out, *flags), "line 90: empty text")
    for index, line in edits.items():
        lines[index] = line
    source.write_text("\n".join(lines) + "\n")
    resumed = run_cli("encode", source, "-o", out, *flags)
    assert resumed.returncode == 0, resumed.stderr
    assert f"(resumed after {resumed_after} rows)" in resumed.stdout
    changed = ("attnserve: chunk 1 (from row 40): the input rows changed since the unfinished run: they and the rows "
               "after them are encoded again")
    assert (changed in resumed.stderr) == (resumed_after == 40), resumed.stderr
    assert out.read_bytes() == clean_run(source, *flags).read_bytes()


def test_bad_rows_fail_the_run_by_default_naming_the_line(artifacts, tmp_path):
    source = tmp_path / "rows.jsonl"
    source.write_text(BAD_JSONL)
    result = run_cli("encode", source, "-o", tmp_path / "out.parquet", "--artifacts", artifacts)
    assert_one_line_error(result, "rows.jsonl: line 2: invalid JSON", "--on-error skip")
    assert not (tmp_path / "out.parquet").exists()


def test_skip_sets_bad_rows_aside_with_reason_and_line(artifacts, tmp_path):
    source = tmp_path / "rows.jsonl"
    source.write_text(BAD_JSONL)
    out = tmp_path / "out.parquet"
    result = run_cli("encode", source, "-o", out, "--artifacts", artifacts, "--on-error", "skip", "--chunk-rows", "3")
    assert result.returncode == 0, result.stderr
    assert "encoded 2 texts" in result.stdout
    assert f"skipped 5 bad rows -> {tmp_path / 'out.errors.jsonl'}" in result.stdout
    assert pq.read_table(out).column("id").to_pylist() == [10, 14]
    errors = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert [(e["line"], e["reason"].split(":")[0]) for e in errors] == [
        (2, "invalid JSON"), (3, "needs exactly one of 'text' or 'token_ids'"), (4, "empty text"),
        (5, "duplicate id 10"), (6, "token id 99999 is out of range [0, 30522)")]
    assert errors[0]["input"] == "{not json"


def test_parquet_bad_rows_are_named_too(artifacts, tmp_path):
    """A .txt file's: tests/test_cli_encode.py."""
    pq.write_table(pa.table({"text": ["ok", None, "ok too"], "id": ["a", "b", "a"]}), tmp_path / "in.parquet")
    result = run_cli("encode", tmp_path / "in.parquet", "-o", tmp_path / "b.parquet", "--artifacts", artifacts,
                     "--on-error", "skip")
    assert result.returncode == 0, result.stderr
    errors = [json.loads(line) for line in (tmp_path / "b.errors.jsonl").read_text().splitlines()]
    assert [(e["row"], e["reason"]) for e in errors] == [(1, "missing text (null)"), (2, "duplicate id 'a'")]
    assert pq.read_table(tmp_path / "b.parquet").column("id").to_pylist() == ["a"]
