"""What the offline tests share: input files, the driver's progress recorded, bad and hostile rows, and the command
run, on a terminal or stopped part-way."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from .conftest import run_cli


def text_file(path: Path, lines) -> Path:
    """path, holding the lines."""
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def errors_of(path: Path) -> list[dict]:
    """The rows a run set aside, from its .errors.jsonl."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def encoded(source, out, *flags) -> subprocess.CompletedProcess:
    """`attnserve encode source -o out flags`, which must succeed."""
    result = run_cli("encode", source, "-o", out, "--no-progress", *flags)
    assert result.returncode == 0, result.stderr
    return result


def clean_run(source: Path, *flags) -> Path:
    """What the command writes for source with nothing in its way (clean.parquet beside it), with the same flags:
    the same batches, so the same bytes."""
    encoded(source, source.with_name("clean.parquet"), *flags)
    return source.with_name("clean.parquet")


def interrupted_run(engine, job, monkeypatch, after_chunks: int) -> None:
    """The job run locally and stopped (as by kill -9) once `after_chunks` chunks are written."""
    from attnserve.offline.encode import encode_file
    from attnserve.offline.partial import PartialRun

    write_chunk = PartialRun.write_chunk

    def stop(run, index, *args):
        if index == after_chunks:
            raise KeyboardInterrupt
        write_chunk(run, index, *args)

    monkeypatch.setattr(PartialRun, "write_chunk", stop)
    with pytest.raises(KeyboardInterrupt):
        encode_file(engine, job)
    monkeypatch.undo()


def encode_command(*args) -> list[str]:
    return [sys.executable, "-m", "attnserve.cli", "encode", *map(str, args), "--no-progress"]


def on_a_terminal(argv: list[str], *, stdout_too: bool = False, env: dict | None = None) -> tuple[int, bytes, str]:
    """argv run with its stderr on a terminal of 120 columns (tqdm draws its bar there), its stdout too if asked:
    (its exit status, what the terminal showed, its stdout where that was a pipe)."""
    main, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 0 columns: no bar at all
    try:
        process = subprocess.Popen(argv, stdout=secondary if stdout_too else subprocess.PIPE, stderr=secondary,
                                   text=True, env=env)
        os.close(secondary)
        terminal = b""
        while data := _read(main):
            terminal += data
        stdout, _ = process.communicate(timeout=120)
    finally:
        os.close(main)
    return process.returncode, terminal, stdout or ""


def _read(fd: int) -> bytes:
    ready, _, _ = select.select([fd], [], [], 120)
    try:
        return os.read(fd, 4096) if ready else b""
    except OSError:  # the process closed the terminal
        return b""


def start_until_chunks(command: list[str], progress: Path, chunks: int, **popen) -> subprocess.Popen:
    """The command started, returned once its progress record lists `chunks` written chunks (or it ended, or two
    minutes passed)."""
    process = subprocess.Popen(command, **popen)
    end = time.monotonic() + 120
    while time.monotonic() < end and process.poll() is None:
        if progress.exists() and len(json.loads(progress.read_text())["chunks"]) >= chunks:
            break
        time.sleep(0.02)
    return process


def as_from_a_terminal() -> None:
    """The child's SIGINT as a shell gives it: a child inherits an ignored SIGINT (something earlier in the suite
    may leave it so), and Python then installs no KeyboardInterrupt for it, so the Ctrl-C went unseen in CI."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class RecordedProgress:
    """The driver's progress calls, kept: total, then every step of rows (zero-row refreshes left out)."""

    def __init__(self):
        self.total: int | None = None
        self.steps: list[int] = []
        self.closed = False

    def start(self, total: int) -> None:
        self.total = total

    def advance(self, rows: int, tokens_per_s: float | None = None) -> None:
        if rows:
            self.steps.append(rows)

    def close(self) -> None:
        self.closed = True


# Rows the run refuses, each of another kind, between good ones; an id repeated.
BAD_JSONL = "\n".join([
    json.dumps({"id": 10, "text": "a good row"}),
    "{not json",
    json.dumps({"id": 11}),
    json.dumps({"id": 12, "text": "   "}),
    json.dumps({"id": 10, "text": "the same id again"}),
    json.dumps({"id": 13, "token_ids": [101, 99999, 102]}),
    json.dumps({"id": 14, "text": "another good row"}),
]) + "\n"


# Rows that Python's JSON parser, the tokenizer, protobuf or Arrow reject or choke on, each with the reason
# the run gives for it (a fragment). Lines are bytes: one is not UTF-8 at all.
HOSTILE_ROWS = [
    (b"[" * 100_000 + b"]" * 100_000, "invalid JSON: nested too deeply for the parser"),
    (b'{"text": "x", "meta": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "invalid JSON: nested too deeply"),
    (b'{"id": ' + b"9" * 5000 + b', "text": "x"}',
     "invalid JSON: Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits"),
    (b'{"token_ids": [' + b"1" * 5000 + b"]}", "invalid JSON: Exceeds the limit (4300 digits)"),
    (b'{"id": NaN, "text": "x"}', "invalid JSON: NaN is not a JSON value"),
    (b'{"text": "x", "score": -Infinity}', "invalid JSON: -Infinity is not a JSON value"),
    (b'{"id": 1e400, "text": "x"}', "id must be an integer or a string"),
    (b'{"text": "\\ud800"}', "'text' is not valid Unicode: a lone surrogate \\ud800 at character 0"),
    (b'{"text": "fine until \\udfff"}', "'text' is not valid Unicode: a lone surrogate \\udfff at character 11"),
    (b'{"id": "\\udc80", "text": "x"}', "id is not valid Unicode: a lone surrogate \\udc80"),
    (b'{"text": "caf\xe9"}', "not UTF-8 text (invalid continuation byte at byte 13 of the line)"),
    (b'{"token_ids": [101, 1e3, 102]}', "'token_ids' must be a list of integers"),
    (b'{"token_ids": [101, true, 102]}', "'token_ids' must be a list of integers"),
    (b'{"token_ids": [101, 99999999999999999999999, 102]}', "token id 99999999999999999999999 is out of range"),
    (b'{"token_ids": [101, -1, 102]}', "token id -1 is out of range [0, 30522)"),
    (b'{"token_ids": [101, 30522, 102]}', "token id 30522 is out of range [0, 30522)"),
    (b'{"token_ids": []}', "empty token id list"),
    (b'{"id": true, "text": "x"}', "id must be an integer or a string"),
    (b'{"id": 9223372036854775808, "text": "x"}', "id 9223372036854775808 does not fit in a 64-bit integer"),
    (b'{"text": "x", "text": ""}', "empty text"),  # a repeated key: the last one counts
    (b'{"text": "\\u2003\\u3000\\n\\t"}', "empty text"),  # whitespace only, of several kinds
    (b'{"text": ["a", "b"]}', "'text' must be a string"),
    (b'{"text": 5}', "'text' must be a string"),
    (b'{"title": "no text"}', "needs exactly one of 'text' or 'token_ids'"),
    (b'{"text": "x"', "invalid JSON: Expecting ',' delimiter"),
    (b'"just a string"', "expected a JSON object"),
    (b'{"text": "x"} and more', "invalid JSON: Extra data"),
    (b"\x00", "invalid JSON: Expecting value"),
]


def hostile_jsonl(path) -> list[tuple[int, str]]:
    """A .jsonl file of good rows with every HOSTILE_ROWS line between them; returns (line, reason) of each bad one."""
    lines, bad = [b'{"text": "a good row to begin with"}'], []
    for i, (line, reason) in enumerate(HOSTILE_ROWS):
        lines.append(line)
        bad.append((len(lines), reason))
        lines.append(b'{"text": "good row %d"}' % i)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return bad
