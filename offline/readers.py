"""Input files for offline encoding, read as a stream of records in chunks.

.txt: one text per line. .jsonl: one object per line with "text" (or
"token_ids") and an optional "id". .parquet: a text column and an optional id
column. Rows are numbered from 0 in input order; a row's id is its "id" or,
without one, its row number. Line numbers in errors count from 1.

A row that cannot be used (bad JSON, no text, an empty text, a bad id) comes
out as a Record with `error` set, so the caller decides: fail the run, or set
the row aside. Problems of the whole file (unreadable, not UTF-8, not
Parquet) raise InvalidInputError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from attnserve.errors import InvalidInputError

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


@dataclass(frozen=True)
class Record:
    row: int  # 0-based position in the input
    where: str  # "line 12" or "row 11", for messages
    id: int | str
    text: str | None = None
    token_ids: list | None = None
    error: str | None = None  # why this row cannot be encoded
    raw: str | None = None  # the line as read, for a skipped-rows file


class RowError(InvalidInputError):
    """One row is unusable; the message names it."""


class InputFile:
    def __init__(self, path: str | Path, text_column: str = "text", id_column: str = "id"):
        self.path = Path(path)
        self.text_column, self.id_column = text_column, id_column
        self.format = FORMATS.get(self.path.suffix.lower())
        if self.format is None:
            raise InvalidInputError(
                f"{self.path}: unknown input format {self.path.suffix!r}; use .txt, .jsonl or .parquet")
        if not self.path.exists():
            raise InvalidInputError(f"{self.path}: no such file")
        if not self.path.is_file():
            raise InvalidInputError(f"{self.path}: not a regular file")
        try:
            with open(self.path, "rb") as f:
                f.read(1)
        except OSError as e:
            raise InvalidInputError(f"{self.path}: cannot read: {e.strerror}") from None
        self.id_type: type | None = None  # int or str, fixed by the first row that has an id
        if self.format == "parquet":
            self._parquet = self._open_parquet()

    def _open_parquet(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as e:
            raise InvalidInputError(f"{self.path}: not a readable Parquet file: {e}") from None
        names = pf.schema_arrow.names
        if self.text_column not in names:
            raise InvalidInputError(
                f"{self.path}: no column {self.text_column!r} (columns: {', '.join(names)}); choose one with --text-column")
        kind = pf.schema_arrow.field(self.text_column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise InvalidInputError(f"{self.path}: column {self.text_column!r} is {kind}, not text")
        if self.id_column in names:
            id_kind = pf.schema_arrow.field(self.id_column).type
            self.id_type = int if pa.types.is_integer(id_kind) else str if (
                pa.types.is_string(id_kind) or pa.types.is_large_string(id_kind)) else None
            if self.id_type is None:
                raise InvalidInputError(f"{self.path}: id column {self.id_column!r} is {id_kind}; use integers or text")
        return pf

    def count_rows(self) -> int:
        """Rows in the input, for the progress bar: Parquet metadata, or a fast newline count."""
        if self.format == "parquet":
            return self._parquet.metadata.num_rows
        count, last = 0, b"\n"
        with open(self.path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                count += block.count(b"\n")
                last = block[-1:]
        return count + (last != b"\n")

    def chunks(self, size: int) -> Iterator[list[Record]]:
        chunk: list[Record] = []
        for record in self._records():
            chunk.append(record)
            if len(chunk) == size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def _records(self) -> Iterator[Record]:
        if self.format == "parquet":
            yield from self._parquet_records()
            return
        try:
            with open(self.path, encoding="utf-8", newline="\n") as f:
                for row, line in enumerate(f):
                    line = line.rstrip("\n").removesuffix("\r")
                    where = f"line {row + 1}"
                    if self.format == "txt":
                        yield Record(row, where, row, text=line, error=None if line.strip() else "empty text",
                                     raw=line)
                    else:
                        try:
                            yield self._json_record(row, where, line)
                        except RowError as e:
                            yield Record(row, where, row, error=str(e), raw=line)
        except UnicodeDecodeError as e:
            raise InvalidInputError(f"{self.path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except OSError as e:
            raise InvalidInputError(f"{self.path}: read failed: {e.strerror}") from None

    def _json_record(self, row: int, where: str, line: str) -> Record:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RowError(f"invalid JSON: {e.msg}") from None
        if not isinstance(obj, dict):
            raise RowError("expected a JSON object")
        text, token_ids = obj.get(self.text_column), obj.get("token_ids")
        if (text is None) == (token_ids is None):
            raise RowError(f"needs exactly one of {self.text_column!r} or 'token_ids'")
        if text is not None and not isinstance(text, str):
            raise RowError(f"{self.text_column!r} must be a string")
        if text is not None and not text.strip():
            raise RowError("empty text")
        if token_ids is not None and not (isinstance(token_ids, list) and all(
                isinstance(i, int) and not isinstance(i, bool) for i in token_ids)):
            raise RowError("'token_ids' must be a list of integers")
        return Record(row, where, self._id(obj.get(self.id_column), row), text, token_ids, raw=line)

    def _id(self, value, row: int) -> int | str:
        kind = int if value is None else type(value)
        if kind not in (int, str):
            raise RowError("id must be an integer or a string")
        if kind is int and value is not None and not -(2**63) <= value < 2**63:
            raise RowError(f"id {value} does not fit in a 64-bit integer")
        if self.id_type is not None and kind is not self.id_type:
            raise RowError(f"id {value!r} is not of the same type as the ids before it")
        self.id_type = self.id_type or kind
        return row if value is None else value

    def _parquet_records(self) -> Iterator[Record]:
        import pyarrow as pa

        columns = [self.text_column] + ([self.id_column] if self.id_type else [])
        row = 0
        try:
            for batch in self._parquet.iter_batches(batch_size=8192, columns=columns):
                texts = batch.column(self.text_column).to_pylist()
                ids = batch.column(self.id_column).to_pylist() if self.id_type else [None] * len(texts)
                for text, id_ in zip(texts, ids):
                    where = f"row {row}"
                    error = ("missing text (null)" if text is None else "empty text" if not text.strip()
                             else "missing id (null)" if self.id_type and id_ is None else None)
                    yield Record(row, where, row if id_ is None else id_, text=text, error=error,
                                 raw=None if error is None else json.dumps({self.text_column: text, "id": id_}))
                    row += 1
        except (pa.ArrowException, OSError) as e:
            raise InvalidInputError(f"{self.path}: Parquet read failed at row {row}: {e}") from None
