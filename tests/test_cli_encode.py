"""`attnserve encode` as a user runs it: real files in, real Parquet out, one-line errors for bad input."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnserve.offline.encode import read_embeddings

from .conftest import VARIED_TEXTS, assert_one_line_error, run_cli


def test_bad_flag_value_is_one_line(artifacts, tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.parquet", "--artifacts", artifacts,
                     env={"ATTNSERVE_MAX_BATCH_TOKENS": "lots"})
    assert_one_line_error(result, "ATTNSERVE_MAX_BATCH_TOKENS: 'lots' is not a valid int")


def _encode(artifacts, src, out, *extra):
    result = run_cli("encode", src, "-o", out, "--artifacts", artifacts, "--no-progress", *extra)
    assert result.returncode == 0, result.stderr
    return result


def test_txt_input_gives_rows_in_order_equal_to_the_engine(artifacts, engine, tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(VARIED_TEXTS) + "\n", encoding="utf-8")
    result = _encode(artifacts, src, tmp_path / "out.parquet")
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"encoded {len(VARIED_TEXTS)} texts, ") and "tokens/s, padding" in summary
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["id", "embedding", "num_tokens", "truncated"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert table.column("id").to_pylist() == list(range(len(VARIED_TEXTS)))
    expected = engine.encode(VARIED_TEXTS)
    assert np.abs(read_embeddings(tmp_path / "out.parquet") - expected.embeddings).max() <= 1e-6
    assert table.column("num_tokens").to_pylist() == expected.num_tokens.tolist()
    assert table.column("truncated").to_pylist() == [False] * 6 + [True, True]
    assert not list(tmp_path.glob(".*partial"))


def test_jsonl_with_ids_and_token_ids(artifacts, engine, tmp_path):
    rows = [{"id": "a", "text": "first text"}, {"id": "b", "token_ids": [101, 7592, 2088, 102]},
            {"id": "c", "text": "third"}]
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    _encode(artifacts, src, tmp_path / "out.parquet", "--no-normalize")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("id").to_pylist() == ["a", "b", "c"]
    got = read_embeddings(tmp_path / "out.parquet")
    assert np.abs(got[1] - engine.encode(["hello world"], normalize=False).embeddings[0]).max() <= 1e-5


def test_parquet_input_with_a_chosen_text_column(artifacts, engine, tmp_path):
    texts = [f"document number {i} " * (i % 7 + 1) for i in range(50)]
    pq.write_table(pa.table({"body": texts, "id": list(range(100, 150))}), tmp_path / "in.parquet")
    _encode(artifacts, tmp_path / "in.parquet", tmp_path / "out.parquet", "--text-column", "body",
            "--chunk-rows", "16")  # several chunks: order must hold across them
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("id").to_pylist() == list(range(100, 150))
    assert np.abs(read_embeddings(tmp_path / "out.parquet") - engine.encode(texts).embeddings).max() <= 1e-5


def test_int8_precision_is_close_to_fp32(artifacts, engine, tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(VARIED_TEXTS) + "\n")
    _encode(artifacts, src, tmp_path / "int8.parquet", "--precision", "int8", "--max-batch-tokens", "256")
    cosine = (engine.encode(VARIED_TEXTS).embeddings * read_embeddings(tmp_path / "int8.parquet")).sum(1)
    assert cosine.min() >= 0.97


@pytest.mark.parametrize("content, fragment", [
    ("good\n\nafter a blank line\n", "line 2: empty text"),
    ("ok\n   \n", "line 2: empty text"),
])
def test_empty_text_fails_with_its_line(artifacts, tmp_path, content, fragment):
    (tmp_path / "in.txt").write_text(content)
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.parquet", "--artifacts", artifacts)
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "o.parquet").exists() and not list(tmp_path.glob(".*partial"))


def test_missing_artifacts(tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.parquet", "--artifacts", tmp_path / "none")
    assert_one_line_error(result, "--artifacts", str(tmp_path / "none"), "does not exist")


def test_tampered_artifacts(artifacts_copy, tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    with open(artifacts_copy / "tokenizer.json", "a") as f:
        f.write(" ")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.parquet", "--artifacts", artifacts_copy)
    assert_one_line_error(result, "sha256 mismatch", "tokenizer.json")


def test_a_text_input_that_is_not_utf8_is_one_line(artifacts, tmp_path):
    """Read as the run goes; a missing, folder, unreadable or unknown input and an unwritable output are refused
    before the model loads (tests/test_encode_checks.py)."""
    (tmp_path / "in.txt").write_bytes(b"caf\xe9 latin-1\n")
    assert_one_line_error(run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.parquet", "--artifacts",
                                  artifacts), "not UTF-8 text")


def test_encode_does_not_import_pandas(artifacts, tmp_path):
    """pyarrow imports pandas on its first pa.array() or pq.read_table(): 0.2-0.4 s of every run, for nothing."""
    (tmp_path / "in.txt").write_text("".join(f"{t}\n" for t in VARIED_TEXTS[:5]))
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.parquet", "--artifacts", artifacts,
                     "--no-progress", "--chunk-rows", "2",  # 3 parts: the assembly reads them back
                     env={"PYTHONPROFILEIMPORTTIME": "1"})  # every import on stderr
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import")}
    assert "pyarrow.parquet" in imported and "pandas" not in imported
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.column("id").to_pylist() == [0, 1, 2, 3, 4] and table.column("truncated").to_pylist() == [False] * 5
