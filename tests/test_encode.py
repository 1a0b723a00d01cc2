"""`attnserve encode` on this machine: each input format against the engine, one-line refusals (most before the model
loads), bad and hostile rows (also through a server), resuming, the output's integrity, and memory for a long line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnserve.config import ClientConfig
from attnserve.errors import InvalidInputError
from attnserve.offline.encode import encode_file, read_embeddings
from attnserve.offline.job import EncodeJob
from attnserve.offline.partial import PartialRun
from attnserve.offline.remote import encode_file_remote

from . import offline_helpers as offline
from .conftest import VARIED_TEXTS, assert_one_line_error, run_cli
from .offline_helpers import BAD_JSONL, HOSTILE_ROWS, clean_run, encoded, errors_of, hostile_jsonl, text_file
from .serving import free_port
from .test_server_load import mixed_texts

CHUNK_ROWS = 20


def test_txt_rows_in_order_equal_the_engine_and_pandas_is_not_imported(artifacts, engine, tmp_path):
    """pyarrow imports pandas on its first pa.array() or pq.read_table(): 0.2-0.4 s of every run, for nothing."""
    out = tmp_path / "out.parquet"
    result = run_cli("encode", text_file(tmp_path / "texts.txt", VARIED_TEXTS), "-o", out, "--artifacts", artifacts,
                     "--no-progress", "--chunk-rows", "3",  # 3 parts: the assembly reads them back
                     env={"PYTHONPROFILEIMPORTTIME": "1"})  # every import on stderr
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import")}
    assert "pyarrow.parquet" in imported and "pandas" not in imported
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"encoded {len(VARIED_TEXTS)} texts, ") and "tokens/s, padding" in summary
    table = pq.read_table(out)
    assert table.column_names == ["id", "embedding", "num_tokens", "truncated"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert table.column("id").to_pylist() == list(range(len(VARIED_TEXTS)))
    expected = engine.encode(VARIED_TEXTS)
    assert np.abs(read_embeddings(out) - expected.embeddings).max() <= 1e-6
    assert table.column("num_tokens").to_pylist() == expected.num_tokens.tolist()
    assert table.column("truncated").to_pylist() == [False] * 6 + [True, True]
    assert not list(tmp_path.glob(".*partial"))


def test_jsonl_ids_token_ids_and_parquet_text_column_equal_the_engine(artifacts, engine, tmp_path):
    rows = [{"id": "a", "text": "first text"}, {"id": "b", "token_ids": [101, 7592, 2088, 102]},
            {"id": "c", "text": "third"}]
    jsonl = text_file(tmp_path / "rows.jsonl", map(json.dumps, rows))
    encoded(jsonl, tmp_path / "rows.parquet", "--artifacts", artifacts, "--no-normalize")
    assert pq.read_table(tmp_path / "rows.parquet").column("id").to_pylist() == ["a", "b", "c"]
    hello = engine.encode(["hello world"], normalize=False).embeddings[0]
    assert np.abs(read_embeddings(tmp_path / "rows.parquet")[1] - hello).max() <= 1e-5
    texts = [f"document number {i} " * (i % 7 + 1) for i in range(50)]
    pq.write_table(pa.table({"body": texts, "id": list(range(100, 150))}), tmp_path / "in.parquet")
    encoded(tmp_path / "in.parquet", tmp_path / "out.parquet", "--artifacts", artifacts, "--text-column", "body",
            "--chunk-rows", "16")  # several chunks: order must hold across them
    assert pq.read_table(tmp_path / "out.parquet").column("id").to_pylist() == list(range(100, 150))
    assert np.abs(read_embeddings(tmp_path / "out.parquet") - engine.encode(texts).embeddings).max() <= 1e-5


def test_int8_precision_is_close_to_fp32(artifacts, engine, tmp_path):
    encoded(text_file(tmp_path / "texts.txt", VARIED_TEXTS), tmp_path / "int8.parquet", "--artifacts", artifacts,
            "--precision", "int8", "--max-batch-tokens", "256")
    cosine = (engine.encode(VARIED_TEXTS).embeddings * read_embeddings(tmp_path / "int8.parquet")).sum(1)
    assert cosine.min() >= 0.97


@pytest.mark.parametrize("name", ["empty.txt", "empty.jsonl"])
def test_allow_empty_writes_an_empty_parquet_file(artifacts, tmp_path, name):
    (tmp_path / name).write_text("")
    result = encoded(tmp_path / name, tmp_path / "o.parquet", "--artifacts", artifacts, "--allow-empty")
    assert result.stdout.strip().splitlines()[-1].startswith("encoded 0 texts, 0 tokens")
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.num_rows == 0 and table.column_names == ["id", "embedding", "num_tokens", "truncated"]
    assert read_embeddings(tmp_path / "o.parquet").shape == (0, 384)  # the schema's width, no rows


IS_INPUT = "is the input file {t}/in.txt; write it elsewhere"
# case: (`encode`'s arguments, then the fragments of its one-line error); {t} is the test's folder (_refusal_files),
# {a} the default model's artifacts, {copy} a copy with tokenizer.json changed, {server} the shared server. The cases
# without a model or a server are refused before the model loads: the empty cache stays empty.
REFUSALS = {
    "missing input": ("{t}/nope.txt -o {t}/o.parquet", "nope.txt: no such file"),
    "a directory as input": ("{t}/folder.txt -o {t}/o.parquet", "a directory, not a regular file"),
    # any other folder is one of images (tests/test_offline_images.py): one with none is a mistake, said at once
    "a directory without a suffix": ("{t} -o {t}/o.parquet", "a folder with no image files in it"),
    "unknown input suffix": ("{t}/in.csv -o {t}/o.parquet", "unknown input format '.csv'"),
    "unreadable parquet": ("{t}/bad.parquet -o {t}/o.parquet", "not a readable Parquet file"),
    "empty input": ("{t}/empty.txt -o {t}/o.parquet", "empty input, nothing to encode", "--allow-empty"),
    "empty parquet input": ("{t}/empty.parquet -o {t}/o.parquet", "empty.parquet: empty input"),
    "missing output folder": ("{t}/in.txt -o {t}/no/such/o.parquet",
                              "cannot write output {t}/no/such/o.parquet: the folder {t}/no/such does not"),
    "output folder a file": ("{t}/in.txt -o {t}/a-file/o.parquet", "the folder {t}/a-file is not a folder"),
    "output not parquet": ("{t}/in.txt -o {t}/o.csv", "give a file name ending in .parquet"),
    "output a directory": ("{t}/in.txt -o {t}/out.parquet", "is a directory; give a .parquet file name"),
    # a folder no file can be made in, whoever runs the tests (root included): /proc takes no new files
    "output folder not writable": ("{t}/in.txt -o /proc/o.parquet", "no file can be made in the folder /proc"),
    "output the input": ("{t}/in.txt -o {t}/in.txt", "the output {t}/in.txt " + IS_INPUT),
    "output the input, relative": ("{t}/in.txt -o {t}/sub/../in.txt", "the output {t}/sub/../in.txt " + IS_INPUT),
    "output a symlink to the input": ("{t}/in.txt -o {t}/link.parquet", "the output {t}/link.parquet " + IS_INPUT),
    "output a hard link to the input": ("{t}/in.txt -o {t}/hard.parquet", "the output {t}/hard.parquet " + IS_INPUT),
    "missing artifacts": ("{t}/in.txt -o {t}/o.parquet --artifacts {t}/none", "--artifacts", "{t}/none",
                          "does not exist"),
    "unreachable server": ("{t}/in.txt -o {t}/o.parquet --server 127.0.0.1:{port}",
                           "no attnserve server at 127.0.0.1:{port} (start one with `attnserve serve`)",
                           "the same command resumes"),
    "bad environment value": ("{t}/in.txt -o {t}/o.parquet", "ATTNSERVE_MAX_BATCH_TOKENS: 'lots' is not a valid int"),
    "chunk tokens without the tokens chunker": ("{t}/in.txt -o {t}/o.parquet --late-chunking sentences "
                                                "--chunk-tokens 5", "--chunk-tokens goes with --late-chunking tokens"),
    "tampered artifacts": ("{t}/in.txt -o {t}/o.parquet --artifacts {copy}", "sha256 mismatch", "tokenizer.json"),
    "a blank line": ("{t}/blank.txt -o {t}/o.parquet --artifacts {a}", "blank.txt: line 2: empty text"),
    "a line of spaces": ("{t}/spaces.txt -o {t}/o.parquet --artifacts {a}", "spaces.txt: line 2: empty text"),
    "a blank line through a server": ("{t}/blank.txt -o {t}/o.parquet --server {server}",
                                      "blank.txt: line 2: empty text"),
    "a line not utf-8": ("{t}/latin1.txt -o {t}/o.parquet --artifacts {a}", "not UTF-8 text"),
    "bad rows": ("{t}/rows.jsonl -o {t}/o.parquet --artifacts {a}", "rows.jsonl: line 2: invalid JSON",
                 "--on-error skip"),
    "hostile rows": ("{t}/hostile.jsonl -o {t}/o.parquet --artifacts {a}",
                     f"hostile.jsonl: line 2: {HOSTILE_ROWS[0][1]}"),
    "an input type for a dense model": ("{t}/in.txt -o {t}/o.parquet --artifacts {a} --input-type query",
                                        "applies to multi-vector (ColBERT) models only"),
    "bge-m3 outputs of another model": ("{t}/in.txt -o {t}/o.parquet --artifacts {a} --outputs sparse_embedding",
                                        "--outputs chooses among a bge-m3 model's outputs"),
    "no chunk tokens": ("{t}/in.txt -o {t}/o.parquet --artifacts {a} --late-chunking tokens --chunk-tokens 0",
                        "--chunk-tokens must be positive, got 0"),
    "late chunks as int8": ("{t}/in.txt -o {t}/o.parquet --artifacts {a} --late-chunking tokens --precision-out int8",
                            "--precision-out does not apply to --late-chunking"),
}


def _refusal_files(t: Path) -> None:
    (t / "in.txt").write_text("one\ntwo\n")
    (t / "empty.txt").write_text("")
    (t / "folder.txt").mkdir()
    (t / "sub").mkdir()
    (t / "in.csv").write_text("a,b\n")
    (t / "out.parquet").mkdir()
    (t / "a-file").write_text("")
    (t / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), t / "empty.parquet")
    (t / "link.parquet").symlink_to(t / "in.txt")
    os.link(t / "in.txt", t / "hard.parquet")
    (t / "blank.txt").write_text("good\n\nafter a blank line\n")
    (t / "spaces.txt").write_text("ok\n   \n")
    (t / "latin1.txt").write_bytes(b"caf\xe9 latin-1\n")
    (t / "rows.jsonl").write_text(BAD_JSONL)
    hostile_jsonl(t / "hostile.jsonl")


@pytest.mark.parametrize("case", REFUSALS)
def test_a_mistake_is_one_line_and_writes_nothing(request, tmp_path, case):
    command, *fragments = REFUSALS[case]
    _refusal_files(tmp_path)
    places = {"t": tmp_path, "port": free_port(), "a": "", "copy": "", "server": ""}
    if "{a}" in command:
        places["a"] = request.getfixturevalue("artifacts")
    if "{copy}" in command:
        places["copy"] = copy = request.getfixturevalue("artifacts_copy")
        with open(copy / "tokenizer.json", "a") as f:
            f.write(" ")
    if "{server}" in command:
        places["server"] = request.getfixturevalue("server").target
    cache = tmp_path / "cache"
    env = {"ATTNSERVE_CACHE": str(cache), **({"ATTNSERVE_MAX_BATCH_TOKENS": "lots"} if "environment" in case else {})}
    result = run_cli("encode", *command.format(**places).split(), "--no-progress", env=env)
    assert_one_line_error(result, *(fragment.format(**places) for fragment in fragments))
    assert (tmp_path / "in.txt").read_text() == "one\ntwo\n"
    assert not (tmp_path / "o.parquet").exists() and not list(tmp_path.glob(".*partial"))
    assert not (tmp_path / "no").exists(), "the output's folder was created"
    if not any(place in command for place in ("{a}", "{copy}", "{server}")):
        assert not cache.exists() or not any(cache.iterdir()), "the model was loaded (exported) before the check"


def test_skip_sets_bad_rows_aside_with_reason_and_line(artifacts, tmp_path):
    (tmp_path / "rows.jsonl").write_text(BAD_JSONL)
    out = tmp_path / "out.parquet"
    result = encoded(tmp_path / "rows.jsonl", out, "--artifacts", artifacts, "--on-error", "skip", "--chunk-rows", "3")
    assert "encoded 2 texts" in result.stdout
    assert f"skipped 5 bad rows -> {tmp_path / 'out.errors.jsonl'}" in result.stdout
    assert pq.read_table(out).column("id").to_pylist() == [10, 14]
    errors = errors_of(tmp_path / "out.errors.jsonl")
    assert [(e["line"], e["reason"].split(":")[0]) for e in errors] == [
        (2, "invalid JSON"), (3, "needs exactly one of 'text' or 'token_ids'"), (4, "empty text"),
        (5, "duplicate id 10"), (6, "token id 99999 is out of range [0, 30522)")]
    assert errors[0]["input"] == "{not json"


def test_parquet_bad_rows_are_named_too(artifacts, tmp_path):
    pq.write_table(pa.table({"text": ["ok", None, "ok too"], "id": ["a", "b", "a"]}), tmp_path / "in.parquet")
    encoded(tmp_path / "in.parquet", tmp_path / "b.parquet", "--artifacts", artifacts, "--on-error", "skip")
    errors = errors_of(tmp_path / "b.errors.jsonl")
    assert [(e["row"], e["reason"]) for e in errors] == [(1, "missing text (null)"), (2, "duplicate id 'a'")]
    assert pq.read_table(tmp_path / "b.parquet").column("id").to_pylist() == ["a"]


@pytest.mark.parametrize("line, reason", HOSTILE_ROWS, ids=range(len(HOSTILE_ROWS)))
def test_a_hostile_row_stops_a_run_with_one_line_naming_it_locally_and_through_the_server(server, engine, tmp_path,
                                                                                          line, reason):
    src = tmp_path / "rows.jsonl"
    src.write_bytes(b'{"text": "a good row"}\n' + line + b"\n")
    with pytest.raises(InvalidInputError) as local:
        encode_file(engine, EncodeJob(src, tmp_path / "local.parquet", progress=False))
    message = str(local.value)
    assert message.startswith(f"{src}: line 2: ") and reason in message and "\n" not in message, message
    assert message.endswith("(--on-error skip sets such rows aside)")
    assert not (tmp_path / "local.parquet").exists()
    with pytest.raises(InvalidInputError) as remote:
        encode_file_remote(EncodeJob(src, tmp_path / "o.parquet", progress=False), ClientConfig(target=server.target))
    assert str(remote.value) == message


def test_the_command_sets_every_hostile_row_aside_and_encodes_the_rest(artifacts, tmp_path):
    """Through a server and on Ray: tests/test_encode_drivers.py."""
    bad = hostile_jsonl(tmp_path / "rows.jsonl")
    out = tmp_path / "local.parquet"
    result = encoded(tmp_path / "rows.jsonl", out, "--artifacts", artifacts, "--on-error", "skip", "--chunk-rows", "10")
    assert "Traceback" not in result.stderr and f"skipped {len(bad)} bad rows" in result.stdout
    errors = errors_of(tmp_path / "local.errors.jsonl")
    assert all(isinstance(e["input"], str) for e in errors)  # each as it was read, for the user to fix
    assert [e["line"] for e in errors] == [line for line, _ in bad]
    assert all(fragment in e["reason"] for (_, fragment), e in zip(bad, errors, strict=True))
    good = len(HOSTILE_ROWS) + 1
    assert pq.read_table(out).num_rows == good and read_embeddings(out).shape == (good, 384)


def test_a_txt_line_that_is_not_utf8_is_a_bad_row_of_its_own(engine, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"first\ncaf\xe9 latin-1\nthird\n")
    stats = encode_file(engine, EncodeJob(src, tmp_path / "o.parquet", progress=False, on_error="skip"))
    assert stats.skipped == 1 and pq.read_table(tmp_path / "o.parquet").column("id").to_pylist() == [0, 2]
    assert errors_of(tmp_path / "o.errors.jsonl") == [
        {"line": 2, "reason": "not UTF-8 text (invalid continuation byte at byte 3 of the line)",
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
    assert errors_of(tmp_path / "o.errors.jsonl") == [
        {"row": 1, "reason": "text is not valid UTF-8", "input": '{"text": "caf\\\\xe9", "id": "b"}'}]


def test_a_byte_order_mark_and_crlf_line_ends_are_not_part_of_the_texts(engine, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"\xef\xbb\xbfhello world\r\nsecond line\r\n")
    encode_file(engine, EncodeJob(src, tmp_path / "o.parquet", progress=False))
    expected = engine.encode(["hello world", "second line"])
    assert pq.read_table(tmp_path / "o.parquet").column("num_tokens").to_pylist() == expected.num_tokens.tolist()
    assert abs(read_embeddings(tmp_path / "o.parquet") - expected.embeddings).max() <= 1e-5


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["kill -9", "ctrl-c"])
def test_a_stopped_run_resumes_to_the_bytes_of_a_clean_run(artifacts, tmp_path, stop):
    source = text_file(tmp_path / "texts.txt", mixed_texts(480, seed=22))
    out, flags = tmp_path / "out.parquet", ["--artifacts", artifacts, "--chunk-rows", "20"]
    command = offline.encode_command(source, "-o", out, *flags)
    progress = tmp_path / ".out.parquet.parts" / "progress.json"
    # The signal must land mid-run. A run finishes in a few seconds; should this process stall that long before it
    # sees two chunks done (a loaded CI machine), the run ends first and proves nothing: it is run again.
    for _ in range(3):
        out.unlink(missing_ok=True)
        process = offline.start_until_chunks(command, progress, 2, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True, preexec_fn=offline.as_from_a_terminal)
        process.send_signal(stop)
        stdout, stderr = process.communicate(timeout=120)
        if not out.exists():
            break
    done = len(json.loads(progress.read_text())["chunks"]) * 20
    assert 40 <= done < 480 and not out.exists()  # stopped part-way; nothing under the final name
    assert process.returncode == (130 if stop == signal.SIGINT else -signal.SIGKILL), stderr
    if stop == signal.SIGINT:
        assert "Traceback" not in stderr, stderr
        assert stderr.splitlines()[-1] == (f"attnserve encode: interrupted after {done} of 480 rows; the same "
                                           "command resumes after them"), stderr
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"(resumed after {done} rows)" in resumed.stdout and f"encoded {480 - done} texts" in resumed.stdout
    assert out.read_bytes() == clean_run(source, *flags).read_bytes()
    assert not progress.parent.exists()


def texts_with_a_bad_line(n: int, bad_line: int, seed: int) -> list[str]:
    lines = mixed_texts(n, seed=seed)
    lines[bad_line - 1] = "   "
    return lines


def test_other_arguments_over_an_unfinished_run_are_refused_in_words_and_overwrite_starts_again(artifacts, tmp_path):
    source = text_file(tmp_path / "texts.txt", texts_with_a_bad_line(100, 90, seed=4))
    out = tmp_path / "out.parquet"
    failed = run_cli("encode", source, "-o", out, "--artifacts", artifacts, "--chunk-rows", "40")
    assert_one_line_error(failed, "texts.txt: line 90: empty text")  # after two finished chunks of 40
    refused = run_cli("encode", source, "-o", out, "--artifacts", artifacts, "--chunk-rows", "20", "--no-normalize")
    assert_one_line_error(refused, "has an unfinished run (2 chunks, 80 rows done) with other settings: "
                          "--chunk-rows was 40, now 20; --normalize was on, now off.", "--overwrite")
    assert not out.exists()
    fresh = encoded(source, out, "--artifacts", artifacts, "--chunk-rows", "20", "--overwrite", "--on-error", "skip")
    assert pq.read_table(out).num_rows == 99 and "resumed" not in fresh.stdout


def test_a_failed_first_chunk_leaves_nothing_to_protect(artifacts, tmp_path):
    """New-user path: a bad row in the first chunk; any next step is taken, with no talk of the unfinished run."""
    source = text_file(tmp_path / "texts.txt", texts_with_a_bad_line(30, 7, seed=5))
    out = tmp_path / "out.parquet"
    assert_one_line_error(run_cli("encode", source, "-o", out, "--artifacts", artifacts), "line 7: empty text")
    other = encoded(source, out, "--artifacts", artifacts, "--chunk-rows", "10", "--on-error", "skip")
    assert "unfinished" not in other.stderr and pq.read_table(out).num_rows == 29


@pytest.mark.parametrize("edits, skip, resumed_after", [
    ({}, True, 80),  # --on-error skip, as the message suggests
    ({89: "the line, fixed"}, False, 80),  # the finished chunks' rows did not change
    ({50: "an edit inside the second finished chunk", 89: "the bad line, fixed"}, False, 40),
], ids=["skip", "the bad line fixed", "a finished chunk's row changed too"])
def test_after_a_bad_row_stopped_the_run_it_resumes(artifacts, tmp_path, edits, skip, resumed_after):
    lines = texts_with_a_bad_line(100, 90, seed=7)
    source = text_file(tmp_path / "texts.txt", lines)
    out, flags = tmp_path / "out.parquet", ["--artifacts", artifacts, "--chunk-rows", "40"]
    assert_one_line_error(run_cli("encode", source, "-o", out, *flags), "line 90: empty text",
                          "--on-error skip sets such rows aside")
    text_file(source, [edits.get(index, line) for index, line in enumerate(lines)])
    flags += ["--on-error", "skip"] if skip else []
    resumed = encoded(source, out, *flags)
    assert f"(resumed after {resumed_after} rows)" in resumed.stdout
    assert ("skipped 1 bad rows" in resumed.stdout) == skip
    changed = ("attnserve: chunk 1 (from row 40): the input rows changed since the unfinished run: they and the rows "
               "after them are encoded again")
    assert (changed in resumed.stderr) == (resumed_after == 40), resumed.stderr
    assert out.read_bytes() == clean_run(source, *flags).read_bytes()
    if skip:
        assert (tmp_path / "out.errors.jsonl").read_text() == (tmp_path / "clean.errors.jsonl").read_text()


@pytest.fixture(scope="module")
def texts_file(artifacts, tmp_path_factory):
    """The input of the integrity runs, beside the output of its clean run (clean.parquet, clean.errors.jsonl)."""
    lines = mixed_texts(100, seed=21)
    lines[57] = "  "  # a bad row in chunk 2, for the runs that set it aside
    source = text_file(tmp_path_factory.mktemp("integrity") / "texts.txt", lines)
    clean_run(source, "--artifacts", artifacts, "--chunk-rows", CHUNK_ROWS, "--on-error", "skip")
    return source


def assert_clean(output: Path, texts_file: Path, clean: Path | None = None) -> None:
    """The bytes of the module's clean run (or of `clean`, another clean run's output), its skipped rows' too."""
    clean = clean or texts_file.parent / "clean.parquet"
    assert output.read_bytes() == clean.read_bytes()
    skipped = output.with_name(output.stem + ".errors.jsonl")
    assert skipped.read_bytes() == clean.with_name(clean.stem + ".errors.jsonl").read_bytes()


def flip_one_float(path) -> None:
    """Still a readable Parquet file, with one embedding value off by 1e25."""
    table = pq.read_table(path)
    embeddings = table.column("embedding").combine_chunks()
    values = embeddings.values.to_numpy().copy()
    values[7] += 1e25
    damaged = pa.FixedSizeListArray.from_arrays(pa.array(values), embeddings.type.list_size)
    pq.write_table(table.set_column(1, table.schema.field("embedding"), damaged), path)


def flip_one_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, file, words", [
    (flip_one_float, "part-00001.parquet", "is damaged ("),  # rewritten by pyarrow: readable, another size
    (flip_one_byte, "part-00001.parquet", "is damaged (its sha256 does not match the progress record)"),
    (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "part-00001.parquet", "is damaged ("),
    (lambda p: p.unlink(), "part-00001.parquet", "is missing"),
    (lambda p: p.write_text(p.read_text().replace("empty text", "empty text!")), "errors-00002.jsonl", "is damaged ("),
], ids=["rewritten", "bit-flipped", "truncated", "missing", "skipped-rows"])
def test_a_bad_part_is_encoded_again_and_the_output_is_the_clean_runs(artifacts, engine, texts_file, tmp_path,
                                                                       monkeypatch, damage, file, words):
    out = tmp_path / "out.parquet"
    job = EncodeJob(texts_file, out, chunk_rows=CHUNK_ROWS, on_error="skip", progress=False)
    offline.interrupted_run(engine, job, monkeypatch, after_chunks=4)
    damage(tmp_path / ".out.parquet.parts" / file)
    resumed = encoded(texts_file, out, "--artifacts", artifacts, "--chunk-rows", CHUNK_ROWS, "--on-error", "skip")
    chunk = int(file.split("-")[1].split(".")[0])
    assert (f"attnserve: chunk {chunk} (from row {chunk * CHUNK_ROWS}): {file} of the unfinished run {words}"
            in resumed.stderr and "it and the chunks after it are encoded again" in resumed.stderr), resumed.stderr
    assert f"(resumed after {chunk * CHUNK_ROWS} rows)" in resumed.stdout
    assert_clean(out, texts_file)


def test_a_part_changed_while_the_run_writes_never_reaches_the_output(engine, texts_file, tmp_path, monkeypatch):
    job = EncodeJob(texts_file, tmp_path / "out.parquet", chunk_rows=CHUNK_ROWS, on_error="skip", progress=False)
    finish = PartialRun.finish

    def damage_then_finish(run, schema):
        flip_one_float(run.directory / "part-00003.parquet")
        finish(run, schema)

    monkeypatch.setattr(PartialRun, "finish", damage_then_finish)
    with pytest.raises(InvalidInputError, match=r"part-00003.parquet changed while this run was writing it; run the "
                                                r"same command again to encode that chunk again$"):
        encode_file(engine, job)
    monkeypatch.undo()
    assert not job.output.exists()
    notices = []
    stats = encode_file(engine, job, notice=notices.append)
    assert stats.resumed_rows == 3 * CHUNK_ROWS and "part-00003.parquet of the unfinished run is damaged" in notices[0]
    # Against a clean run of this same engine: another process's engine may have timed another batch size
    # (engine/calibration.py), and other batches give other float bits.
    clean = EncodeJob(texts_file, tmp_path / "clean" / "out.parquet", chunk_rows=CHUNK_ROWS, on_error="skip",
                      progress=False)
    clean.output.parent.mkdir()
    encode_file(engine, clean)
    assert_clean(job.output, texts_file, clean.output)


def test_an_unreadable_progress_record_starts_the_run_again(engine, texts_file, tmp_path, monkeypatch):
    job = EncodeJob(texts_file, tmp_path / "out.parquet", chunk_rows=CHUNK_ROWS, progress=False, on_error="skip")
    offline.interrupted_run(engine, job, monkeypatch, after_chunks=2)
    progress = tmp_path / ".out.parquet.parts" / "progress.json"
    progress.write_text('{"format": 2, "fingerp')
    notices = []
    stats = encode_file(engine, job, notice=notices.append)
    assert notices == [f"the progress record of the unfinished run ({progress}) is unreadable: encoding from the start"]
    assert stats.resumed_rows == 0 and stats.texts == 99


def test_a_second_run_on_the_same_output_refuses_at_once_naming_the_first(artifacts, texts_file, tmp_path):
    out = tmp_path / "out.parquet"
    flags = ["--artifacts", artifacts, "--chunk-rows", CHUNK_ROWS, "--on-error", "skip"]
    first = subprocess.Popen(offline.encode_command(texts_file, "-o", out, *flags), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    lock = tmp_path / ".out.parquet.lock"
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and first.poll() is None:
            if lock.exists() and lock.read_text().strip() == str(first.pid):
                break
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)  # holds the lock for as long as the second run needs
        second = run_cli("encode", texts_file, "-o", out, *flags)
        assert_one_line_error(second, f"another attnserve encode (pid {first.pid}) is writing {out}")
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert_clean(out, texts_file)
    assert not lock.exists()  # removed by the run that held it


def test_the_skipped_rows_file_is_never_the_input(engine, tmp_path):
    source = tmp_path / "rows.errors.jsonl"
    source.write_text('{"text": "one"}\n')
    with pytest.raises(InvalidInputError, match="the skipped-rows file .*rows.errors.jsonl is the input file"):
        encode_file(engine, EncodeJob(source, tmp_path / "rows.parquet", on_error="skip", progress=False))
    assert source.read_text() == '{"text": "one"}\n'


# Runs `argv` as a child and prints its peak RSS in KiB: a fresh process, so that no other run's peak counts.
PEAK_RSS = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "sys.stderr.write(r.stderr); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.exit(r.returncode)")
LONG_LINE_BYTES = 20_000_000
# What one line of L bytes may add to the command's own peak: the line read into one buffer, decoded (a str
# of up to 2 bytes a character where a character is not Latin-1), parsed into its text, and the text held
# until its chunk is written; the tokenizer cuts the text before it tokenizes (engine/tokenizer.py).
LINE_COST = 6


def peak_rss_mib(*argv) -> float:
    result = subprocess.run([sys.executable, "-c", PEAK_RSS, *map(str, argv)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1]) / 1024


def test_one_long_line_costs_memory_in_proportion_to_the_line_alone(artifacts, tmp_path):
    words = " ".join(mixed_texts(200, seed=24)).split()
    text, size = [], 0
    while size < LONG_LINE_BYTES:
        text.append(words[len(text) % len(words)])
        size += len(text[-1]) + 1
    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    short.write_text('{"text": "a short one"}\n{"text": "after it"}\n')
    long.write_text('{"text": "a short one"}\n' + json.dumps({"text": " ".join(text)}) + '\n{"text": "after it"}\n')
    command = ["-m", "attnserve.cli", "encode", "--artifacts", artifacts, "--no-progress"]
    base = peak_rss_mib(sys.executable, *command, short, "-o", tmp_path / "short.parquet")
    peak = peak_rss_mib(sys.executable, *command, long, "-o", tmp_path / "long.parquet")
    print(f"peak RSS: {base:.0f} MiB for two short lines, {peak:.0f} MiB with a line of "
          f"{LONG_LINE_BYTES / 1e6:.0f} MB between them")
    assert peak - base <= LINE_COST * LONG_LINE_BYTES / 2**20 and peak <= 1024
    assert pq.read_table(tmp_path / "long.parquet").column("truncated").to_pylist() == [False, True, False]
