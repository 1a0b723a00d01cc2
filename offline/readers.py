"""Input files for offline encoding, read as a stream of records in chunks.

.txt: one text per line. .jsonl: one object per line with "text" (or
"token_ids") and an optional "id". .parquet: a text column and an optional id
column. Rows are numbered from 0 in input order; a row's id is its "id" or,
without one, its row number. Line numbers in errors count from 1.

A row that cannot be used (not UTF-8, bad JSON, JSON that Python's parser
gives up on, no text, an empty text, text or an id that is not valid Unicode,
a bad id) comes out as a Record with `error` set, so the caller decides: fail
the run, or set the row aside. Problems of the whole file (unreadable, not
Parquet) raise InvalidInputError.

Memory: a line is read into one buffer (_Lines), decoded once and parsed once;
the bytes are dropped before the line is parsed, and a good row keeps only its
parsed text (not the line as well), so a line of L bytes costs about 2-3 L at
its peak and L once its record is made.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attnserve.errors import InvalidInputError

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
BOM = b"\xef\xbb\xbf"
# A lone surrogate ("\ud800" in JSON) is a str in Python but not Unicode text: it cannot be
# encoded as UTF-8, so the tokenizer, protobuf and Arrow would each fail on it in their own way.
_SURROGATE = re.compile("[\ud800-\udfff]")

Input = str | list[int] | bytes  # a text, token ids with special tokens included, or an image file's bytes


@dataclass(frozen=True)
class Record:
    row: int  # 0-based position in the input
    where: str  # "line 12" or "row 11", for messages
    id: int | str
    text: str | None = None
    token_ids: list[int] | None = None
    error: str | None = None  # why this row cannot be encoded
    # The line as read, kept only where the row is set aside as it was read; an image row's source, always (its
    # path, or its column's value described: offline/image_readers.py).
    raw: str | None = None
    image: bytes | None = None  # an image file's bytes, not decoded (offline/image_readers.py)

    @property
    def input(self) -> Input:
        """What the model sees: the text, the token ids or the image, of which a good row (no error) has one."""
        if self.text is not None:
            return self.text
        if self.image is not None:
            return self.image
        assert self.token_ids is not None, f"{self.where} has no input: {self.error}"
        return self.token_ids


class RowError(InvalidInputError):
    """One row is unusable; the message names it."""


class InputFile:
    def __init__(self, path: str | Path, text_column: str = "text", id_column: str = "id"):
        self.path = Path(path)
        self.text_column, self.id_column = text_column, id_column
        self.format = FORMATS.get(self.path.suffix.lower())
        if self.path.is_dir():
            raise InvalidInputError(f"{self.path}: a directory, not a regular file; give one .txt, .jsonl or "
                                    ".parquet file")
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

    @property
    def ids_can_repeat(self) -> bool:
        """False where every id is its row number (.txt, Parquet without an id column)."""
        return self.format == "jsonl" or (self.format == "parquet" and self.id_type is not None)

    def _open_parquet(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as e:
            raise InvalidInputError(f"{self.path}: not a readable Parquet file: {e}") from None
        self._check_column(pf.schema_arrow)
        self._read_id_type(pf.schema_arrow)
        return pf

    def _check_column(self, schema) -> None:
        """The Parquet column of the inputs: there, and of text."""
        import pyarrow as pa

        if self.text_column not in schema.names:
            raise InvalidInputError(
                f"{self.path}: no column {self.text_column!r} (columns: {', '.join(schema.names)}); "
                "choose one with --text-column")
        kind = schema.field(self.text_column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise InvalidInputError(f"{self.path}: column {self.text_column!r} is {kind}, not text")

    def _read_id_type(self, schema) -> None:
        """A Parquet file's ids: int or str where it has the id column, of integers or text."""
        import pyarrow as pa

        if self.id_column in schema.names:
            id_kind = schema.field(self.id_column).type
            self.id_type = int if pa.types.is_integer(id_kind) else str if (
                pa.types.is_string(id_kind) or pa.types.is_large_string(id_kind)) else None
            if self.id_type is None:
                raise InvalidInputError(f"{self.path}: id column {self.id_column!r} is {id_kind}; use integers or text")

    def is_empty(self) -> bool:
        """No rows at all: a text file of no bytes, or a Parquet file of no rows (metadata only, so it is quick)."""
        if self.format == "parquet":
            return self._parquet.metadata.num_rows == 0
        return self.path.stat().st_size == 0

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
            with open(self.path, "rb") as f:
                lines = _Lines(f)
                row = 0
                while (data := lines.next()) is not None:
                    line = self._decode(row, data)
                    del data  # before the line is parsed: never the bytes, the line and its text at once
                    record = line if isinstance(line, Record) else self._line_record(row, line)
                    del line
                    yield record
                    row += 1
        except OSError as e:
            raise InvalidInputError(f"{self.path}: read failed: {e.strerror}") from None

    @staticmethod
    def _decode(row: int, data: bytes | bytearray) -> str | Record:
        """A line's text, without its end of line (or a byte-order mark); a Record if it is not UTF-8."""
        start = len(BOM) if row == 0 and data.startswith(BOM) else 0
        end = len(data) - data.endswith(b"\n")
        end -= end > start and data[end - 1 : end] == b"\r"
        try:
            return str(memoryview(data)[start:end], "utf-8")  # a view, not a slice: no copy before decoding
        except UnicodeDecodeError as e:
            shown = bytes(data[start:end]).decode("utf-8", "backslashreplace")
            return Record(row, f"line {row + 1}", row, raw=shown,
                          error=f"not UTF-8 text ({e.reason} at byte {e.start} of the line)")

    def _line_record(self, row: int, line: str) -> Record:
        """One line of a .txt or .jsonl file."""
        where = f"line {row + 1}"
        if self.format == "txt":
            # The text is the line: raw is the same object, no copy.
            return Record(row, where, row, text=line, error="empty text" if _blank(line) else None, raw=line)
        try:
            return self._json_record(row, where, line)
        except RowError as e:
            return Record(row, where, row, error=str(e), raw=line)

    def _json_record(self, row: int, where: str, line: str) -> Record:
        try:
            obj = json.loads(line, parse_constant=_not_json)
        except json.JSONDecodeError as e:
            raise RowError(f"invalid JSON: {e.msg}") from None
        except RecursionError:
            raise RowError("invalid JSON: nested too deeply for the parser") from None
        except ValueError as e:  # an integer of more digits than Python converts, NaN, Infinity
            raise RowError(f"invalid JSON: {str(e).split(';')[0]}") from None  # not Python's advice after ";"
        if not isinstance(obj, dict):
            raise RowError("expected a JSON object")
        text, token_ids = obj.get(self.text_column), obj.get("token_ids")
        if (text is None) == (token_ids is None):
            raise RowError(f"needs exactly one of {self.text_column!r} or 'token_ids'")
        if text is not None:
            if not isinstance(text, str):
                raise RowError(f"{self.text_column!r} must be a string")
            if _blank(text):
                raise RowError("empty text")
            _check_unicode(text, repr(self.text_column))
        if token_ids is not None and not (isinstance(token_ids, list) and all(
                isinstance(i, int) and not isinstance(i, bool) for i in token_ids)):
            raise RowError("'token_ids' must be a list of integers")
        return Record(row, where, self._id(obj.get(self.id_column), row), text, token_ids)

    def _id(self, value, row: int) -> int | str:
        kind = int if value is None else type(value)
        if kind not in (int, str):
            raise RowError("id must be an integer or a string")
        if kind is int and value is not None and not -(2**63) <= value < 2**63:
            raise RowError(f"id {value} does not fit in a 64-bit integer")
        if kind is str:
            _check_unicode(value, "id")
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
                texts = _strings(batch.column(self.text_column))
                ids = _strings(batch.column(self.id_column)) if self.id_type else [None] * len(texts)
                for text, id_ in zip(texts, ids, strict=True):
                    where = f"row {row}"
                    error = ("missing text (null)" if text is None else
                             "text is not valid UTF-8" if isinstance(text, _Invalid) else
                             "empty text" if _blank(text) else
                             "missing id (null)" if self.id_type and id_ is None else
                             "id is not valid UTF-8" if isinstance(id_, _Invalid) else None)
                    if error is None:
                        yield Record(row, where, row if id_ is None else id_, text=text)
                    else:
                        raw = json.dumps({self.text_column: _shown(text), self.id_column: _shown(id_)})
                        yield Record(row, where, row, error=error, raw=raw)
                    row += 1
        except (pa.ArrowException, OSError) as e:
            raise InvalidInputError(f"{self.path}: Parquet read failed at row {row}: {e}") from None


class _Lines:
    """A binary file's lines, end of line included, each held once however long it is.

    A file object's own readline gathers a long line in pieces and then joins them: two copies at once.
    Here a line within one block is sliced out of it, and a longer one grows a single buffer. next()
    keeps no reference to the line it returns, so the caller can free it before parsing it.
    """

    BLOCK = 1 << 20

    def __init__(self, f):
        self.f, self.block, self.start = f, b"", 0

    def next(self) -> bytes | bytearray | None:
        """The next line; None at the end of the file."""
        long: bytearray | None = None
        while True:
            end = self.block.find(b"\n", self.start)
            if end != -1:
                piece, self.start = self.block[self.start:end + 1], end + 1
                if long is None:
                    return piece
                long += piece
                return long
            if self.start < len(self.block):
                long = long if long is not None else bytearray()
                long += memoryview(self.block)[self.start:]
            self.block, self.start = self.f.read(self.BLOCK), 0
            if not self.block:
                return long


def _blank(text: str) -> bool:
    """Empty or whitespace only; unlike `not text.strip()`, never copies a long text."""
    return not text or text.isspace()


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON value")


def _check_unicode(value: str, what: str) -> None:
    match = _SURROGATE.search(value)
    if match:
        raise RowError(f"{what} is not valid Unicode: a lone surrogate \\u{ord(match.group()):04x} "
                       f"at character {match.start()}")


class _Invalid(str):
    """A Parquet string whose bytes are not UTF-8, shown with backslash escapes."""


def _strings(column) -> list:
    """A column's values as Python objects; a string value that is not UTF-8 becomes an _Invalid."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        import pyarrow as pa

        values = []
        for value in column.cast(pa.large_binary()).to_pylist():
            try:
                values.append(value.decode("utf-8") if isinstance(value, bytes) else value)
            except UnicodeDecodeError:
                values.append(_Invalid(value.decode("utf-8", "backslashreplace")))
        return values


def _shown(value):
    return str(value) if isinstance(value, _Invalid) else value
