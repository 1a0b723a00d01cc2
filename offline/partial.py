"""The output's integrity: one run per output, never over its input, resumable parts that are checked.

    OUTPUT                              written only when complete, by a rename
    .OUTPUT.lock                        held (flock) by the one run writing OUTPUT; holds its pid
    .OUTPUT.parts/progress.json         what this run is (its fingerprint) and, per finished chunk, its
                                        rows, the digest of its input rows, and the sha256 and size of
                                        its part and of its skipped rows
    .OUTPUT.parts/part-00000.parquet    chunk 0's rows      .OUTPUT.parts/errors-00000.jsonl  its skipped rows

Each part is written under a temporary name and renamed; progress.json is replaced
atomically after the part is in place. A run that starts over an unfinished one trusts
nothing it has not checked: every recorded part must exist with its recorded size and
sha256, and every chunk read again must have the input digest recorded for it. The first
chunk that fails is encoded again, with the chunks after it, with a line on stderr saying
so; the chunks before it are kept. The output is assembled from the parts, each checked
again as it is read, under a hidden name renamed into place, so a half-written or damaged
file never carries the final name. An uninterrupted run goes through the same parts, so a
resumed run ends with the same bytes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from attnserve.errors import InvalidInputError

from .readers import Record

PROGRESS = "progress.json"
FORMAT = 2  # of progress.json; a record of another format is not trusted
DIGEST_SLICE = 1 << 20  # characters of a text hashed at a time


def input_digest(records: list[Record]) -> str:
    """What a chunk's output is made from: every row's number, id, text, token ids or image bytes, and error."""
    digest = hashlib.sha256()
    for r in records:
        digest.update(repr((r.row, r.id, r.error, r.text is None)).encode())
        if r.text is not None:  # in slices: a long text is never copied whole to be hashed
            for start in range(0, len(r.text), DIGEST_SLICE):
                digest.update(r.text[start:start + DIGEST_SLICE].encode("utf-8", "surrogatepass"))
        elif r.token_ids is not None:  # any ints: a bad row may hold ids past int64
            digest.update(repr(r.token_ids).encode())
        elif r.image is not None:  # an image file edited since is encoded again
            digest.update(b"image\0" + len(r.image).to_bytes(8, "little"))
            digest.update(r.image)
        digest.update(b"\0")
    return digest.hexdigest()


def same_file(a: Path, b: Path) -> bool:
    """One file under two names: the same path once resolved, a symlink to it, or a hard link."""
    if a.resolve() == b.resolve():
        return True
    try:
        sa, sb = a.stat(), b.stat()
    except OSError:  # one of them does not exist (yet): they cannot be one file
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class OutputLock:
    """flock on .OUTPUT.lock: a second run on the same output refuses at once, naming the first by its pid.

    The lock goes when the process does (kill -9 included). The file is removed on release; a run that
    locked a file already removed starts over, so two runs can never each hold a different file.
    """

    def __init__(self, output: Path):
        self.path = output.with_name(f".{output.name}.lock")
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip()
                os.close(fd)
                raise InvalidInputError(
                    f"another attnserve encode{f' (pid {holder})' if holder else ''} is writing {output}; "
                    "wait for it to finish, or stop it and run this again (it resumes)") from None
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            locked = os.fstat(fd)
            if current is not None and (current.st_dev, current.st_ino) == (locked.st_dev, locked.st_ino):
                break
            os.close(fd)  # the run before us removed this file as we opened it: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)


class PartialRun:
    """The parts of one output, under its lock. Use as a context manager: the lock is held inside."""

    def __init__(self, output: Path, input_path: Path, errors_path: Path | None, fingerprint: dict,
                 overwrite: bool, notice: Callable[[str], None]):
        self.output, self.errors_path, self.fingerprint, self.notice = output, errors_path, fingerprint, notice
        self.directory = output.with_name(f".{output.name}.parts")
        self.chunks: list[dict] = []  # the finished chunks this run trusts, in order
        for path, what in ((output, "output"), (errors_path, "skipped-rows file")):
            if path is not None and same_file(path, input_path):
                raise InvalidInputError(f"the {what} {path} is the input file {input_path}; write it elsewhere")
        if output.is_dir():
            raise InvalidInputError(f"output {output} is a directory; give a .parquet file name")
        self._lock = None
        try:
            self._lock = OutputLock(output)
            if overwrite and self.directory.exists():
                shutil.rmtree(self.directory)
            self._resume()
            self.directory.mkdir(exist_ok=True)
            self._save()
        except OSError as e:
            self.close()
            raise InvalidInputError(f"cannot write output {output}: {e.strerror} ({e.filename})") from None
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> PartialRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def chunks_done(self) -> int:
        return len(self.chunks)

    @property
    def rows_done(self) -> int:
        return sum(c["rows"] for c in self.chunks)

    # --- starting over an unfinished run ----------------------------------------------------------------

    def _resume(self) -> None:
        path = self.directory / PROGRESS
        if not path.exists():
            return
        try:
            progress = json.loads(path.read_text())
            if progress.get("format") != FORMAT:
                raise ValueError("another format")
            before, chunks = progress["fingerprint"], list(progress["chunks"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.notice(f"the progress record of the unfinished run ({path}) is unreadable: encoding from the start")
            return
        if not chunks:
            return  # nothing finished, nothing to protect: start over, whatever the earlier arguments were
        if before != self.fingerprint:
            rows = sum(c.get("rows", 0) for c in chunks)
            raise InvalidInputError(
                f"{self.output} has an unfinished run ({len(chunks)} chunks, {rows} rows done) with other "
                f"settings: {'; '.join(describe_changes(before, self.fingerprint))}. Run it again as before to "
                "resume it, or add --overwrite to start again")
        self.chunks = chunks
        for index, chunk in enumerate(chunks):
            problem = self._check(index, chunk)
            if problem:
                self._restart_at(index, f"{problem}: it and the chunks after it are encoded again")
                return

    def _check(self, index: int, chunk: dict) -> str | None:
        """What is wrong with a finished chunk's files, or None."""
        for path, size, sha in ((self._part(index), chunk["part_bytes"], chunk["part_sha256"]),
                                (self._errors(index), chunk["errors_bytes"], chunk["errors_sha256"])):
            if sha is None:
                continue
            name = f"{path.name} of the unfinished run"
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return f"{name} is missing"
            except OSError as e:
                return f"{name} is unreadable ({e.strerror})"
            if len(data) != size:  # truncated, or written over
                return f"{name} is damaged ({len(data)} bytes, {size} written)"
            if _sha256(data) != sha:
                return f"{name} is damaged (its sha256 does not match the progress record)"
        return None

    def _restart_at(self, index: int, why: str) -> None:
        """Trust chunks before `index` only; the rest is encoded again."""
        rows_before = sum(c["rows"] for c in self.chunks[:index])
        self.notice(f"chunk {index} (from row {rows_before}): {why}")
        self.chunks = self.chunks[:index]
        self._save()

    def trusts(self, index: int, digest: str) -> bool:
        """Chunk `index`, read again, is finished and made from the same input rows as before.

        False for a chunk not finished; for one whose input changed, the run restarts there.
        """
        if index >= len(self.chunks):
            return False
        if self.chunks[index]["input_sha256"] == digest:
            return True
        self._restart_at(index, "the input rows changed since the unfinished run: they and the rows after "
                                "them are encoded again")
        return False

    def rows_recorded(self) -> int:
        """The rows of the finished chunks as the progress record has them: what a resumed run finds.

        Read back, since an interrupt can land between writing the record and noting it here."""
        try:
            return sum(c["rows"] for c in json.loads((self.directory / PROGRESS).read_text())["chunks"])
        except (OSError, ValueError, KeyError, TypeError):
            return self.rows_done

    def first_error(self, index: int) -> dict | None:
        """The first row a finished chunk set aside, from its skipped-rows part."""
        if not self.chunks[index]["set_aside"]:
            return None
        with open(self._errors(index)) as f:
            return json.loads(f.readline())

    # --- writing -----------------------------------------------------------------------------------------

    def _save(self, chunks: list[dict] | None = None) -> None:
        record = {"format": FORMAT, "fingerprint": self.fingerprint,
                  "chunks": self.chunks if chunks is None else chunks}
        _write_atomically(self.directory / PROGRESS, json.dumps(record, indent=1).encode())

    def _part(self, index: int) -> Path:
        return self.directory / f"part-{index:05d}.parquet"

    def _errors(self, index: int) -> Path:
        return self.directory / f"errors-{index:05d}.jsonl"

    def write_chunk(self, index: int, table: pa.Table, rows: int, errors: list[dict], digest: str) -> None:
        """Chunk `index` (the next one) is done: its rows, its skipped rows, then the progress record."""
        assert index == len(self.chunks), (index, len(self.chunks))
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        part = sink.getvalue().to_pybytes()
        skipped = "".join(json.dumps(e) + "\n" for e in errors).encode()
        try:
            _write_atomically(self._part(index), part)
            if errors:
                _write_atomically(self._errors(index), skipped)
            chunks = self.chunks + [{"rows": rows, "input_sha256": digest, "set_aside": len(errors),
                                     "part_bytes": len(part), "part_sha256": _sha256(part),
                                     "errors_bytes": len(skipped) if errors else None,
                                     "errors_sha256": _sha256(skipped) if errors else None}]
            self._save(chunks)
            self.chunks = chunks  # only once recorded: what this run reports done is what a resumed run finds
        except OSError as e:
            raise InvalidInputError(f"cannot write output {self.output}: {e.strerror}") from None

    def finish(self, schema: pa.Schema) -> None:
        """All chunks are done: assemble the output (and the skipped-rows file), then remove the parts.

        Every part is checked again as it is read: a part changed since it was written stops the run
        here, before anything takes the output's name, and the next run encodes it again.
        """
        partial = self.output.with_name(f".{self.output.name}.partial")
        errors_partial = None
        try:
            with pq.ParquetWriter(partial, schema) as writer:
                for index in range(len(self.chunks)):
                    # ParquetFile, not pq.read_table: that builds a dataset, whose module imports pandas (0.2-0.4 s).
                    writer.write_table(pq.ParquetFile(pa.BufferReader(self._checked(index, "part"))).read())
            if self.errors_path is not None:
                errors_partial = self.errors_path.with_name(f".{self.errors_path.name}.partial")
                with open(errors_partial, "wb") as out:
                    for index in range(len(self.chunks)):
                        if self.chunks[index]["errors_sha256"] is not None:
                            out.write(self._checked(index, "errors"))
                os.replace(errors_partial, self.errors_path)
            os.replace(partial, self.output)
            shutil.rmtree(self.directory)
        except OSError as e:
            raise InvalidInputError(f"cannot write output {self.output}: {e.strerror}") from None
        finally:
            for path in (partial, errors_partial):
                if path is not None and path.exists():
                    path.unlink()

    def _checked(self, index: int, kind: str) -> bytes:
        path = self._part(index) if kind == "part" else self._errors(index)
        chunk = self.chunks[index]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = None
        if data is None or _sha256(data) != chunk[f"{kind}_sha256"]:
            raise InvalidInputError(f"{path} changed while this run was writing it; run the same command again "
                                    "to encode that chunk again")
        return data


# Fingerprint keys in words: what a user changed, as they would say it.
_SETTINGS = {
    "input": "the input file", "text_column": "--text-column", "id_column": "--id-column",
    "chunk_rows": "--chunk-rows", "normalize": "--normalize", "model": "the model", "precision": "--precision",
    "graph_sha256": "the model's graph (sha256)", "server": "--server", "attnserve": "attnserve's version",
    "dimensions": "--dimensions", "prompt_name": "--prompt-name", "prompt": "--prompt", "task": "--task",
    "image_column": "--image-column", "max_image_pixels": "--max-image-pixels",
}


def describe_changes(before: dict, now: dict) -> list[str]:
    """['--chunk-rows was 40, now 20', ...] for every setting that differs."""
    changes = []
    for key in sorted(set(before) | set(now), key=lambda k: list(_SETTINGS).index(k) if k in _SETTINGS else 99):
        if before.get(key) != now.get(key):
            changes.append(f"{_SETTINGS.get(key, key)} was {_shown(key, before.get(key))}, "
                           f"now {_shown(key, now.get(key))}")
    return changes


def _shown(key: str, value) -> str:
    if key == "normalize" and isinstance(value, bool):
        return "on" if value else "off"
    if key == "server" and value is None:
        return "not used (encoded in this process)"
    if key == "graph_sha256" and isinstance(value, str):  # a sha256, and what its session leaves out
        return value[:12] + value[64:]
    if value is None:
        return "not set"
    return str(value)
