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
