"""`attnserve encode`: a file of texts -> a Parquet file of sentence embeddings, in input order.

The input is streamed in chunks; each chunk is batched by length inside the
engine and written as one row group. The output is written beside its final
name and renamed into place only when complete.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from attnserve.engine.engine import EncodeStats, Engine
from attnserve.errors import InvalidInputError

from .readers import InputFile
from .rows import encode_records, output_schema


@dataclass
class EncodeJob:
    input: Path
    output: Path
    normalize: bool | None = None  # None: as the checkpoint's pipeline does
    text_column: str = "text"
    id_column: str = "id"
    chunk_rows: int = 8192  # rows tokenized, encoded and written together; bounds memory
    progress: bool = True


def _open_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return pq.ParquetWriter(path, schema)
    except (OSError, pa.ArrowException) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise InvalidInputError(f"cannot write output {path.parent / path.name.lstrip('.')}: {reason}") from None


def encode_file(engine: Engine, job: EncodeJob) -> EncodeStats:
    """Encode job.input into job.output; returns the totals for the summary line."""
    from tqdm import tqdm

    source = InputFile(job.input, job.text_column, job.id_column)
    total = source.count_rows()
    if job.output.is_dir():
        raise InvalidInputError(f"output {job.output} is a directory; give a .parquet file name")
    partial = job.output.with_name(f".{job.output.name}.partial")
    normalize = engine.manifest.normalize if job.normalize is None else job.normalize
    metadata = {"model": engine.manifest.model, "precision": engine.precision, "pooling": engine.manifest.pooling,
                "normalize": normalize, "input": str(job.input)}
    stats, writer, start = EncodeStats(), None, time.perf_counter()
    # disable=None: a bar on a terminal only, never in logs or pipes.
    bar = tqdm(total=total, unit="text", disable=None if job.progress else True, dynamic_ncols=True, desc="encode")
    try:
        for records in source.chunks(job.chunk_rows):
            if writer is None:  # the id type is known once the first rows are read
                writer = _open_writer(partial, output_schema(source.id_type or int, engine.manifest.hidden_size,
                                                             metadata))
            table, chunk_stats = encode_records(engine, str(source.path), records, normalize, writer.schema)
            writer.write_table(table)
            stats.add(chunk_stats)
            bar.update(len(records))
            bar.set_postfix(tokens_per_s=f"{stats.tokens / (time.perf_counter() - start):.0f}", refresh=False)
        if writer is None:  # an empty input (an empty partition, say) gives an empty output with the same schema
            writer = _open_writer(partial, output_schema(source.id_type or int, engine.manifest.hidden_size, metadata))
        writer.close()
        writer = None
        os.replace(partial, job.output)
    except OSError as e:
        raise InvalidInputError(f"cannot write output {job.output}: {e.strerror}") from None
    finally:
        bar.close()
        if writer is not None:
            writer.close()
        if partial.exists():
            partial.unlink()
    stats.seconds = time.perf_counter() - start
    return stats


def summary_line(stats: EncodeStats, output: Path) -> str:
    rate = stats.tokens / stats.seconds if stats.seconds else 0.0
    return (f"encoded {stats.texts} texts, {stats.tokens} tokens in {stats.seconds:.2f}s: "
            f"{rate:.0f} tokens/s, padding {stats.padding_fraction:.1%} -> {output}")


def read_embeddings(path: Path) -> np.ndarray:
    """(N, H) float32 from an output file: a convenience for tests and notebooks."""
    table = pq.read_table(path, columns=["embedding"])
    column = table.column("embedding").combine_chunks()
    return column.values.to_numpy().reshape(len(table), -1)
