"""Images as input records, read in chunks: a folder of image files, or a Parquet column of image bytes or paths.

A folder: every file under it, in every subfolder, whose name ends in an image suffix (IMAGE_SUFFIXES, in any
case), in the order of their paths relative to it, as POSIX paths compared as strings, so that two runs (and a
resumed one) read the same rows in the same order on any machine; each row's id is that path. Links to files are
read; links to folders are not followed (a link back up would never end). A folder that cannot be listed stops the
run: a subfolder left out unsaid would be rows dropped silently.

A Parquet column (`--image-column`): binary (each row the file's bytes) or strings (each row a path, a relative one
taken from the Parquet file's folder), with an optional id column as a text column has (offline/readers.py).

Only the names (a folder's) are held for the whole run; a row's bytes are read as its chunk is read, so memory is
bounded by a chunk's files, not the folder's or the Parquet file's. The bytes are not decoded here: the engine
decodes each image as its batch runs (offline/image_encode.py), where a corrupt, truncated, vector, animated or
over-large image is refused in one line, as the tokenizer refuses a text. What this module finds wrong is a row's
error too: a file that cannot be read, a null, an empty path, a file name that is not UTF-8, or a file larger than
any image within the pixel limit can be (read whole only to be refused).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePath

from attnserve.errors import InvalidInputError
from attnserve.images import DEFAULT_MAX_PIXELS

from .readers import FORMATS, InputFile, Record, _blank, _Invalid, _shown, _strings

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")
# The largest file read as an image: an uncompressed TIFF of max_pixels pixels takes up to 16 bytes a pixel (4
# channels of 32-bit floats); anything larger cannot be an image within the limit, and is refused before it is read.
BYTES_PER_PIXEL = 16
MIN_FILE_LIMIT = 64 << 20
# Parquet rows of image bytes taken from the file at a time (a text column's are taken 8192 at a time).
PARQUET_BATCH_ROWS = 64


def file_limit(max_pixels: int) -> int:
    """The most bytes an image file may have (BYTES_PER_PIXEL)."""
    return max(MIN_FILE_LIMIT, BYTES_PER_PIXEL * max_pixels)


def read_image_file(path: Path, limit: int) -> bytes | str:
    """The file's bytes, or why they cannot be read (a row's error, in words)."""
    try:
        info = os.stat(path)  # before opening it: a FIFO named x.png would block the open
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        if info.st_size > limit:
            return f"the file is {info.st_size / 2**20:.1f} MiB, more than an image within the pixel limit " \
                   f"takes ({limit / 2**20:.0f} MiB)"
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        return f"cannot read the file: {e.strerror or type(e).__name__}"
    if len(data) > limit:  # it grew since
        return f"the file is more than an image within the pixel limit takes ({limit / 2**20:.0f} MiB)"
    return data


def _shown_name(name: str) -> str:
    """A file name as it can be printed: bytes that are not UTF-8 (surrogate-escaped by os) as backslash escapes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class ImageFolder:
    """A folder's image files as records: id and `where` their relative path."""

    format = "folder"
    id_type: type = str
    ids_can_repeat = False  # a path is named once

    def __init__(self, path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS):
        self.path = Path(path)
        self.limit = file_limit(max_pixels)
        self._names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        """Every image file's path relative to the folder, sorted (listed once, on first use)."""
        if self._names is None:
            def refuse(error: OSError) -> None:
                raise InvalidInputError(f"{self.path}: cannot list the folder {error.filename}: "
                                        f"{error.strerror or type(error).__name__}")

            names = []
            for folder, _, files in os.walk(self.path, onerror=refuse):
                for name in files:
                    if name.lower().endswith(IMAGE_SUFFIXES):
                        names.append(PurePath(os.path.relpath(os.path.join(folder, name), self.path)).as_posix())
            self._names = sorted(names)
        return self._names

    def is_empty(self) -> bool:
        return not self.names

    def count_rows(self) -> int:
        return len(self.names)

    def chunks(self, size: int) -> Iterator[list[Record]]:
        names = self.names
        for start in range(0, len(names), size):
            yield [self._record(row, names[row]) for row in range(start, min(start + size, len(names)))]

    def _record(self, row: int, name: str) -> Record:
        shown = _shown_name(name)
        if shown != name:  # an id Arrow cannot write, nor a user read
            return Record(row, shown, row, error="the file name is not valid UTF-8", raw=shown)
        data = read_image_file(self.path / name, self.limit)
        if isinstance(data, str):
            return Record(row, name, name, error=data, raw=name)
        return Record(row, name, name, image=data, raw=name)


class ImageColumn(InputFile):
    """A Parquet file's column of images: binary (their bytes) or strings (their paths)."""

    def __init__(self, path: str | Path, image_column: str, id_column: str = "id",
                 max_pixels: int = DEFAULT_MAX_PIXELS):
        path = Path(path)
        if path.is_dir() or path.suffix.lower() != ".parquet":
            raise InvalidInputError(f"{path}: --image-column names a column of a .parquet file; a folder's images "
                                    "are its files (give the folder without --image-column)")
        self.image_column, self.limit = image_column, file_limit(max_pixels)
        self.paths = False  # the column holds paths (strings), not bytes: set as the file is opened
        super().__init__(path, image_column, id_column)

    def _check_column(self, schema) -> None:
        import pyarrow as pa

        if self.image_column not in schema.names:
            raise InvalidInputError(f"{self.path}: no column {self.image_column!r} (columns: "
                                    f"{', '.join(schema.names)}); choose one with --image-column")
        kind = schema.field(self.image_column).type
        self.paths = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        if not (self.paths or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
            raise InvalidInputError(f"{self.path}: column {self.image_column!r} is {kind}: give image files' bytes "
                                    "(binary) or their paths (strings)")

    def _parquet_records(self) -> Iterator[Record]:
        import pyarrow as pa

        columns = [self.image_column] + ([self.id_column] if self.id_type else [])
        row = 0
        try:
            for batch in self._parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
                values = batch.column(self.image_column)
                values = _strings(values) if self.paths else values.to_pylist()
                ids = _strings(batch.column(self.id_column)) if self.id_type else [None] * len(values)
                for value, id_ in zip(values, ids, strict=True):
                    yield self._record(row, value, id_)
                    row += 1
        except (pa.ArrowException, OSError) as e:
            raise InvalidInputError(f"{self.path}: Parquet read failed at row {row}: {e}") from None

    def _record(self, row: int, value: str | bytes | None, id_) -> Record:
        where = f"row {row}"
        shown = _shown(value) if self.paths else None if value is None else f"{len(value)} bytes"
        raw = json.dumps({self.image_column: shown, self.id_column: _shown(id_)})
        error = ("missing image (null)" if value is None else
                 "the path is not valid UTF-8" if isinstance(value, _Invalid) else
                 "empty path" if isinstance(value, str) and _blank(value) else
                 "missing id (null)" if self.id_type and id_ is None else
                 "id is not valid UTF-8" if isinstance(id_, _Invalid) else None)
        data = value
        if error is None and isinstance(value, str):  # a path, from the Parquet file's folder
            data = read_image_file(self.path.parent / value, self.limit)
            error = f"{value}: {data}" if isinstance(data, str) else None
        if error is not None:
            return Record(row, where, row, error=error, raw=raw)
        assert isinstance(data, bytes), (where, type(data))  # binary, or a path's file read
        return Record(row, where, row if id_ is None else id_, image=data, raw=raw)


def is_image_folder(path: str | Path) -> bool:
    """A folder, read as one of images, unless its name ends as a file of texts does: a folder named x.parquet is
    more likely a Spark-style Parquet dataset, or a mistake, and is refused as a folder (offline/readers.py)."""
    path = Path(path)
    return path.is_dir() and path.suffix.lower() not in FORMATS


def open_input(path: str | Path, text_column: str = "text", id_column: str = "id", image_column: str | None = None,
               max_pixels: int = DEFAULT_MAX_PIXELS) -> InputFile | ImageFolder:
    """Every input `encode` reads, by its kind: a column of images (image_column), a folder of images, or a file of
    texts (offline/readers.py)."""
    if image_column is not None:
        return ImageColumn(path, image_column, id_column, max_pixels)
    if is_image_folder(path):
        return ImageFolder(path, max_pixels)
    return InputFile(path, text_column, id_column)
