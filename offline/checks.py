"""The bad-row rules that the reader cannot apply alone, and what becomes of a bad row.

The reader judges each row by itself (offline/readers.py). RowChecks adds what needs the
model or the rows before: token ids against the vocabulary, and ids seen before. A bad
row either stops the run with one line naming it (on_error "fail") or goes to the
skipped-rows file with its line and reason (on_error "skip"); never silently.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnserve.errors import InvalidInputError

from .readers import Record

SKIP_HINT = " (--on-error skip sets such rows aside)"


class RowChecks:
    """What the reader cannot know: token ids against the vocabulary, and ids seen before."""

    def __init__(self, vocab_size: int, track_ids: bool):
        """track_ids False: every id is its row number (.txt, Parquet without an id column): none can repeat."""
        self.vocab_size, self.track_ids = vocab_size, track_ids
        self.seen: set = set()

    def bad(self, records: list[Record]) -> list[tuple[Record, str]]:
        """Bad rows with their reasons. Run on every chunk, resumed ones too, so ids seen before are known."""
        return [(r, reason) for r in records if (reason := self.error(r))]

    def error(self, record: Record) -> str | None:
        if record.error:
            return record.error
        if record.token_ids is not None:
            if not record.token_ids:
                return "empty token id list"
            bad = [i for i in record.token_ids if not 0 <= i < self.vocab_size]
            if bad:
                return f"token id {bad[0]} is out of range [0, {self.vocab_size})"
        if self.track_ids:
            if record.id in self.seen:
                return f"duplicate id {record.id!r}"
            self.seen.add(record.id)
        return None


def bad_row_error(path: Path, where: str, reason: str) -> InvalidInputError:
    """on_error "fail": the one line that stops the run, naming the row ("line 12", "row 11")."""
    return InvalidInputError(f"{path}: {where}: {reason}{SKIP_HINT}")


def error_line(record: Record, reason: str) -> dict:
    """A row of the skipped-rows file: where, why, and the input as it was read (or as parsed)."""
    where = {"line": record.row + 1} if record.where.startswith("line") else {"row": record.row}
    return {**where, "reason": reason, "input": record.raw if record.raw is not None else _parsed(record)}


def _parsed(record: Record) -> str:
    """A good row that a later check set aside kept no copy of its line: its fields, as JSON."""
    content = {"text": record.text} if record.text is not None else {"token_ids": record.token_ids}
    return json.dumps({"id": record.id, **content})
