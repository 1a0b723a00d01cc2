"""What the offline tests share: a progress sink that records what the job driver reports."""

from __future__ import annotations


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
    (b'{"token_ids": []}', "empty token id list"),
    (b'{"id": true, "text": "x"}', "id must be an integer or a string"),
    (b'{"id": 9223372036854775808, "text": "x"}', "id 9223372036854775808 does not fit in a 64-bit integer"),
    (b'{"text": "x", "text": ""}', "empty text"),  # a repeated key: the last one counts
    (b'{"text": "\\u2003\\u3000\\n\\t"}', "empty text"),  # whitespace only, of several kinds
    (b'{"text": ["a", "b"]}', "'text' must be a string"),
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
