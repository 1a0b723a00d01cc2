"""A resumable run: one Parquet part per input chunk and a progress record, beside the output.

    .OUTPUT.parts/progress.json       what this run is (its fingerprint) and how many chunks are done
    .OUTPUT.parts/part-00000.parquet  chunk 0's rows      .OUTPUT.parts/errors-00000.jsonl  its skipped rows

Each part is written under a temporary name and renamed; progress.json is
replaced atomically after the part is in place. A run killed at any point
(kill -9 included) therefore finds every chunk it recorded complete, and at
most one unrecorded part, which is written again. The output is assembled
from the parts only when all are done, under a hidden name renamed into
place, so a half-written file never carries the final name. An uninterrupted
run goes through the same parts, so a resumed run ends with the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from attnserve.errors import InvalidInputError

PROGRESS = "progress.json"


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class PartialRun:
    def __init__(self, output: Path, fingerprint: dict, overwrite: bool):
        self.output, self.fingerprint = output, fingerprint
        self.directory = output.with_name(f".{output.name}.parts")
        self.chunks_done, self.rows_done = 0, 0
        try:
            if overwrite and self.directory.exists():
                shutil.rmtree(self.directory)
            if (self.directory / PROGRESS).exists():
                self._resume()
            else:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._save()
        except OSError as e:
            raise InvalidInputError(f"cannot write output {output}: {e.strerror} ({e.filename})") from None

    def _resume(self) -> None:
        try:
            progress = json.loads((self.directory / PROGRESS).read_text())
        except (OSError, ValueError):
            raise InvalidInputError(
                f"{self.directory}: unreadable progress record of an earlier run; use --overwrite to start again"
            ) from None
        if progress.get("fingerprint") != self.fingerprint:
            before = progress.get("fingerprint", {})
            changed = [f"{k} {before.get(k)!r} -> {v!r}" for k, v in self.fingerprint.items() if before.get(k) != v]
            raise InvalidInputError(
                f"{self.output} has an unfinished run with other arguments or input ({'; '.join(changed)}); "
                "run again with the same arguments to resume it, or add --overwrite to start again")
        self.chunks_done, self.rows_done = progress["chunks_done"], progress["rows_done"]

    def _save(self) -> None:
        record = {"fingerprint": self.fingerprint, "chunks_done": self.chunks_done, "rows_done": self.rows_done}
        _write_atomically(self.directory / PROGRESS, json.dumps(record, indent=1).encode())

    def _part(self, index: int) -> Path:
        return self.directory / f"part-{index:05d}.parquet"

    def _errors(self, index: int) -> Path:
        return self.directory / f"errors-{index:05d}.jsonl"

    def write_chunk(self, index: int, table: pa.Table, rows: int, errors: list[dict]) -> None:
        """Chunk `index` (the next one) is done: its rows, its skipped rows, then the progress record."""
        assert index == self.chunks_done, (index, self.chunks_done)
        part = self._part(index)
        tmp = part.with_name(f".{part.name}.tmp")
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, part)
            if errors:
                _write_atomically(self._errors(index), "".join(json.dumps(e) + "\n" for e in errors).encode())
            self.chunks_done, self.rows_done = index + 1, self.rows_done + rows
            self._save()
        except OSError as e:
            raise InvalidInputError(f"cannot write output {self.output}: {e.strerror}") from None

    def finish(self, schema: pa.Schema, errors_path: Path | None) -> None:
        """All chunks are done: assemble the output (and the skipped-rows file), then remove the parts."""
        partial = self.output.with_name(f".{self.output.name}.partial")
        try:
            with pq.ParquetWriter(partial, schema) as writer:
                for index in range(self.chunks_done):
                    writer.write_table(pq.read_table(self._part(index), schema=schema))
            if errors_path is not None:
                with open(errors_path.with_name(f".{errors_path.name}.partial"), "wb") as out:
                    for index in range(self.chunks_done):
                        if self._errors(index).exists():
                            out.write(self._errors(index).read_bytes())
                os.replace(errors_path.with_name(f".{errors_path.name}.partial"), errors_path)
            os.replace(partial, self.output)
            shutil.rmtree(self.directory)
        except OSError as e:
            raise InvalidInputError(f"cannot write output {self.output}: {e.strerror}") from None
        finally:
            if partial.exists():
                partial.unlink()
