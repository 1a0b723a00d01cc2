"""What the load test sends: the mixed-length corpus or a user's file, cut into the inputs of each request
(serialized once, by the protocol's Target, before the load)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnserve.client.client import Input
from attnserve.config import LoadTestConfig
from attnserve.errors import InvalidInputError

from .corpus import mixed_length_corpus


@dataclass(frozen=True)
class Workload:
    batches: list[list[Input]]  # each request's inputs, sent in turn
    inputs_per_request: int
    description: str


def read_inputs(path: str) -> list[Input]:
    """Every input of a .txt, .jsonl or .parquet file, read as `attnserve encode` reads it; a bad row stops."""
    from attnserve.offline.readers import InputFile

    items: list[Input] = []
    for chunk in InputFile(path).chunks(8192):
        for record in chunk:
            if record.error:
                raise InvalidInputError(f"{path}: {record.where}: {record.error}")
            items.append(record.input)
    if not items:
        raise InvalidInputError(f"{path}: no inputs to send")
    return items


def build_workload(config: LoadTestConfig) -> Workload:
    if config.input is None:
        inputs: Sequence[Input] = mixed_length_corpus(config.corpus_size, config.seed)
        where = f"mixed-length corpus ({len(inputs)} texts, seed {config.seed})"
    else:
        inputs = read_inputs(config.input)
        where = f"{Path(config.input).name} ({len(inputs)} inputs)"
    n, size = len(inputs), config.batch_size
    # Consecutive inputs, wrapping at the end: every input is sent once per pass over the list.
    count = -(-n // size)
    batches = [[inputs[(i * size + j) % n] for j in range(size)] for i in range(count)]
    return Workload(batches, size, where)
