"""Rows that Python's JSON parser, the tokenizer, protobuf or Arrow reject: one line naming the file and line, or
set aside with --on-error skip; locally and through a server (tests/test_ray_encode.py runs them on Ray)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnserve.config import ClientConfig
from attnserve.errors import InvalidInputError
from attnserve.offline.encode import encode_file, read_embeddings
from attnserve.offline.job import EncodeJob
from attnserve.offline.remote import encode_file_remote

from .conftest import assert_one_line_error, run_cli
from .offline_helpers import HOSTILE_ROWS, hostile_jsonl


def one_hostile_row(tmp_path, line: bytes):
    src = tmp_path / "rows.jsonl"
    src.write_bytes(b'{"text": "a good row"}\n' + line + b"\n")
    return src


@pytest.mark.parametrize("line, reason", HOSTILE_ROWS, ids=range(len(HOSTILE_ROWS)))
def test_a_hostile_row_stops_a_run_with_one_line_naming_it_locally_and_through_the_server(server, engine, tmp_path,
                                                                                          line, reason):
    src = one_hostile_row(tmp_path, line)
    with pytest.raises(InvalidInputError) as local:
        encode_file(engine, EncodeJob(src, tmp_path / "local.parquet", progress=False))
    message = str(local.value)
    assert message.startswith(f"{src}: line 2: ") and reason in message and "\n" not in message, message
    assert message.endswith("(--on-error skip sets such rows aside)")
    assert not (tmp_path / "local.parquet").exists()
    with pytest.raises(InvalidInputError) as remote:
        encode_file_remote(EncodeJob(src, tmp_path / "o.parquet", progress=False), ClientConfig(target=server.target))
    assert str(remote.value) == message


def skipped(path) -> list[tuple[int, str]]:
    errors = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(isinstance(e["input"], str) for e in errors)  # each as it was read, for the user to fix
    return [(e["line"], e["reason"]) for e in errors]


def test_the_command_sets_every_hostile_row_aside_and_encodes_the_rest(artifacts, engine, server, tmp_path):
    src = tmp_path / "rows.jsonl"
    bad = hostile_jsonl(src)
    out = tmp_path / "local.parquet"
    result = run_cli("encode", src, "-o", out, "--artifacts", artifacts, "--no-progress", "--on-error", "skip",
                     "--chunk-rows", "10")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert f"skipped {len(bad)} bad rows" in result.stdout
    got = skipped(tmp_path / "local.errors.jsonl")
    assert [line for line, _ in got] == [line for line, _ in bad]
    assert all(fragment in reason for (_, fragment), (_, reason) in zip(bad, got, strict=True))
    good = len(HOSTILE_ROWS) + 1
    assert pq.read_table(out).num_rows == good and read_embeddings(out).shape == (good, 384)

    # Through a server: the same rows set aside with the same reasons, the same rows encoded.
    remote = tmp_path / "remote.parquet"
    encode_file_remote(EncodeJob(src, remote, progress=False, on_error="skip", chunk_rows=10),
                       ClientConfig(target=server.target))
    assert (tmp_path / "remote.errors.jsonl").read_bytes() == (tmp_path / "local.errors.jsonl").read_bytes()
    assert pq.read_table(remote).column("id").to_pylist() == pq.read_table(out).column("id").to_pylist()


def test_the_command_names_the_first_hostile_row(artifacts, tmp_path):
    src = tmp_path / "rows.jsonl"
    bad = hostile_jsonl(src)
    result = run_cli("encode", src, "-o", tmp_path / "o.parquet", "--artifacts", artifacts)
    assert_one_line_error(result, f"rows.jsonl: line {bad[0][0]}: {bad[0][1]}")


def test_a_txt_line_that_is_not_utf8_is_a_bad_row_of_its_own(engine, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"first\ncaf\xe9 latin-1\nthird\n")
    out = tmp_path / "o.parquet"
    stats = encode_file(engine, EncodeJob(src, out, progress=False, on_error="skip"))
    assert stats.skipped == 1 and pq.read_table(out).column("id").to_pylist() == [0, 2]
    errors = [json.loads(line) for line in (tmp_path / "o.errors.jsonl").read_text().splitlines()]
    assert errors == [{"line": 2, "reason": "not UTF-8 text (invalid continuation byte at byte 3 of the line)",
                       "input": "caf\\xe9 latin-1"}]


def test_parquet_strings_that_are_not_utf8_are_bad_rows(engine, tmp_path):
    # Arrow writes what it is given; a string column with other bytes reads back only as far as Python's decoder.
    data, offsets = pa.py_buffer(b"okcaf\xe9fine"), pa.array([0, 2, 6, 10], pa.int32()).buffers()[1]
    texts = pa.StringArray.from_buffers(3, offsets, data)
    pq.write_table(pa.table({"text": texts, "id": ["a", "b", "c"]}), tmp_path / "in.parquet")
    out = tmp_path / "o.parquet"
    with pytest.raises(InvalidInputError, match=r"in.parquet: row 1: text is not valid UTF-8 \(--on-error skip"):
        encode_file(engine, EncodeJob(tmp_path / "in.parquet", out, progress=False))
    stats = encode_file(engine, EncodeJob(tmp_path / "in.parquet", out, progress=False, on_error="skip"))
    assert stats.skipped == 1 and pq.read_table(out).column("id").to_pylist() == ["a", "c"]
    error = json.loads((tmp_path / "o.errors.jsonl").read_text())
    assert error == {"row": 1, "reason": "text is not valid UTF-8", "input": '{"text": "caf\\\\xe9", "id": "b"}'}


def test_a_byte_order_mark_and_crlf_line_ends_are_not_part_of_the_texts(engine, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"\xef\xbb\xbfhello world\r\nsecond line\r\n")
    out = tmp_path / "o.parquet"
    encode_file(engine, EncodeJob(src, out, progress=False))
    expected = engine.encode(["hello world", "second line"])
    assert pq.read_table(out).column("num_tokens").to_pylist() == expected.num_tokens.tolist()
    assert abs(read_embeddings(out) - expected.embeddings).max() <= 1e-5
