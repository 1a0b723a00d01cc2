"""The output's integrity: damaged, truncated or missing parts are encoded again; one run per output; never the
input as the output; Ctrl-C says how to resume; the progress bar moves per batch; memory for one long line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnserve.config import EngineConfig
from attnserve.engine.batching import plan_batches
from attnserve.engine.engine import Engine
from attnserve.errors import InvalidInputError
from attnserve.offline.encode import encode_file
from attnserve.offline.job import EncodeJob
from attnserve.offline.partial import PartialRun

from .conftest import assert_one_line_error, run_cli
from .offline_helpers import RecordedProgress, as_from_a_terminal, encode_command, interrupted_run, start_until_chunks
from .test_server_load import mixed_texts

CHUNK_ROWS = 20


@pytest.fixture(scope="module")
def texts_file(artifacts, tmp_path_factory):
    """The input of the module's runs, beside the output of its clean run (clean.parquet, clean.errors.jsonl)."""
    source = tmp_path_factory.mktemp("integrity") / "texts.txt"
    lines = mixed_texts(100, seed=21)
    lines[57] = "  "  # a bad row in chunk 2, for the runs that set it aside
    source.write_text("\n".join(lines) + "\n")
    clean = run_cli("encode", source, "-o", source.parent / "clean.parquet", "--artifacts", artifacts,
                    "--chunk-rows", CHUNK_ROWS, "--on-error", "skip", "--no-progress")
    assert clean.returncode == 0, clean.stderr
    return source


def assert_clean(output: Path, texts_file: Path) -> None:
    """The bytes of the module's clean run, its skipped rows' too."""
    assert output.read_bytes() == (texts_file.parent / "clean.parquet").read_bytes()
    skipped = output.with_name(output.stem + ".errors.jsonl")
    assert skipped.read_bytes() == (texts_file.parent / "clean.errors.jsonl").read_bytes()


def flip_one_float(path) -> None:
    """Still a readable Parquet file, with one embedding value off by 1e25."""
    table = pq.read_table(path)
    embeddings = table.column("embedding").combine_chunks()
    values = embeddings.values.to_numpy().copy()
    values[7] += 1e25
    damaged = pa.FixedSizeListArray.from_arrays(pa.array(values), embeddings.type.list_size)
    pq.write_table(table.set_column(1, table.schema.field("embedding"), damaged), path)


def truncate(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def rewrite_errors(path) -> None:
    path.write_text(path.read_text().replace("empty text", "empty text!"))


def flip_one_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, file, words", [
    (flip_one_float, "part-00001.parquet", "is damaged ("),  # rewritten by pyarrow: readable, another size
    (flip_one_byte, "part-00001.parquet", "is damaged (its sha256 does not match the progress record)"),
    (truncate, "part-00001.parquet", "is damaged ("),
    (lambda p: p.unlink(), "part-00001.parquet", "is missing"),
    (rewrite_errors, "errors-00002.jsonl", "is damaged ("),
], ids=["rewritten", "bit-flipped", "truncated", "missing", "skipped-rows"])
def test_a_bad_part_is_encoded_again_and_the_output_is_the_clean_runs(artifacts, engine, texts_file, tmp_path,
                                                                       monkeypatch, damage, file, words):
    flags = ["--artifacts", artifacts, "--chunk-rows", CHUNK_ROWS, "--on-error", "skip"]
    out = tmp_path / "out.parquet"
    interrupted_run(engine, EncodeJob(texts_file, out, chunk_rows=CHUNK_ROWS, on_error="skip", progress=False),
                    monkeypatch, after_chunks=4)
    damage(tmp_path / ".out.parquet.parts" / file)
    resumed = run_cli("encode", texts_file, "-o", out, *flags)
    assert resumed.returncode == 0, resumed.stderr
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
    assert_clean(job.output, texts_file)


def test_an_unreadable_progress_record_starts_the_run_again(engine, texts_file, tmp_path, monkeypatch):
    job = EncodeJob(texts_file, tmp_path / "out.parquet", chunk_rows=CHUNK_ROWS, progress=False, on_error="skip")
    interrupted_run(engine, job, monkeypatch, after_chunks=2)
    (tmp_path / ".out.parquet.parts" / "progress.json").write_text('{"format": 2, "fingerp')
    notices = []
    stats = encode_file(engine, job, notice=notices.append)
    progress = tmp_path / ".out.parquet.parts" / "progress.json"
    assert notices == [f"the progress record of the unfinished run ({progress})"
                       " is unreadable: encoding from the start"]
    assert stats.resumed_rows == 0 and stats.texts == 99


def test_a_second_run_on_the_same_output_refuses_at_once_naming_the_first(artifacts, texts_file, tmp_path):
    out = tmp_path / "out.parquet"
    flags = ["--artifacts", artifacts, "--chunk-rows", CHUNK_ROWS, "--on-error", "skip"]
    first = subprocess.Popen(encode_command(texts_file, "-o", out, *flags), stdout=subprocess.PIPE,
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


@pytest.mark.parametrize("name", ["same path", "relative path", "symlink", "hard link"])
def test_the_input_is_never_the_output(artifacts, tmp_path, name, monkeypatch):
    source = tmp_path / "in.txt"
    source.write_text("one\ntwo\n")
    output = {"same path": source, "relative path": tmp_path / "sub" / ".." / "in.txt",
              "symlink": tmp_path / "link.parquet", "hard link": tmp_path / "hard.parquet"}[name]
    (tmp_path / "sub").mkdir()
    if name == "symlink":
        output.symlink_to(source)
    elif name == "hard link":
        os.link(source, output)
    result = run_cli("encode", source, "-o", output, "--artifacts", artifacts)
    assert_one_line_error(result, f"the output {output} is the input file {source}; write it elsewhere")
    assert source.read_text() == "one\ntwo\n"


def test_the_skipped_rows_file_is_never_the_input(engine, tmp_path):
    source = tmp_path / "rows.errors.jsonl"
    source.write_text('{"text": "one"}\n')
    with pytest.raises(InvalidInputError, match="the skipped-rows file .*rows.errors.jsonl is the input file"):
        encode_file(engine, EncodeJob(source, tmp_path / "rows.parquet", on_error="skip", progress=False))
    assert source.read_text() == '{"text": "one"}\n'


def test_ctrl_c_says_the_same_command_resumes(artifacts, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(mixed_texts(960, seed=22)) + "\n")
    out = tmp_path / "out.parquet"
    command = encode_command(source, "-o", out, "--artifacts", artifacts, "--chunk-rows", 40)
    progress = tmp_path / ".out.parquet.parts" / "progress.json"
    # The interrupt must land mid-run. A run finishes in a few seconds; should this process stall that long before
    # it sees two chunks done (a loaded CI machine), the run ends first and proves nothing: it is run again.
    for _ in range(3):
        out.unlink(missing_ok=True)
        process = start_until_chunks(command, progress, 2, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=as_from_a_terminal)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
        if not (process.returncode == 0 and stdout.startswith("encoded 960 texts")):
            break
    assert process.returncode == 130, stderr
    done = len(json.loads(progress.read_text())["chunks"]) * 40
    assert stderr.splitlines()[-1] == (f"attnserve encode: interrupted after {done} of 960 rows; the same command "
                                       "resumes after them"), stderr
    assert "Traceback" not in stderr
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and f"(resumed after {done} rows)" in resumed.stdout, resumed.stderr


def test_progress_moves_per_engine_batch(artifacts, tmp_path):
    texts = mixed_texts(60, seed=23)
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n")
    config = EngineConfig(max_batch_size=8)
    engine = Engine.from_directory(artifacts, config)
    progress = RecordedProgress()
    encode_file(engine, EncodeJob(source, tmp_path / "o.parquet", chunk_rows=30, progress=False), progress=progress)
    expected = [len(batch) for chunk in (texts[:30], texts[30:]) for batch in plan_batches(
        [len(t) for t in engine.tokenizer.encode_texts(chunk)], engine.batch_tokens, 8)]  # as calibrated here
    assert progress.total == 60 and progress.steps == expected and len(expected) >= 8 and progress.closed


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
        word = words[len(text) % len(words)]
        text.append(word)
        size += len(word) + 1
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
