"""`attnserve encode`: a file of texts -> a Parquet file of sentence embeddings, in input order.

The input is streamed in chunks; each chunk is batched by length inside the
engine and written as one Parquet part with a progress record (partial.py),
so a killed run started again with the same arguments resumes where it
stopped and ends with the same bytes. Bad rows are never dropped silently:
by default the first one fails the run, naming its line; with on_error
"skip" they go to a side file with the reason and the line, and are counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from attnserve import __version__
from attnserve.engine.engine import EncodeStats, Engine
from attnserve.errors import InvalidInputError

from .partial import PartialRun
from .readers import InputFile, Record
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
    on_error: str = "fail"  # "fail": the first bad row stops the run; "skip": bad rows go to errors_path
    overwrite: bool = False  # start again instead of resuming an unfinished run

    @property
    def errors_path(self) -> Path:
        return self.output.with_name(self.output.name.removesuffix(".parquet") + ".errors.jsonl")


@dataclass
class EncodeResult(EncodeStats):
    skipped: int = 0  # bad rows set aside (on_error "skip")
    resumed_rows: int = 0  # rows an earlier, interrupted run had already encoded
    padding_known: bool = True  # False through a server, which batches out of sight


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


def good_rows(source: InputFile, records: list[Record], bad: list[tuple[Record, str]], on_error: str
              ) -> list[Record]:
    """The chunk's rows to encode; on_error "fail": the first bad row stops the run, naming its line."""
    if not bad:
        return records
    if on_error == "fail":
        record, reason = bad[0]
        raise InvalidInputError(f"{source.path}: {record.where}: {reason} (--on-error skip sets such rows aside)")
    bad_rows = {r.row for r, _ in bad}
    return [r for r in records if r.row not in bad_rows]


def fingerprint(engine: Engine, job: EncodeJob, normalize: bool) -> dict:
    """What makes two runs the same run: a resumed run must match it exactly, or be refused."""
    stat = job.input.stat()
    return {"input": str(job.input.resolve()), "input_bytes": stat.st_size, "input_mtime_ns": stat.st_mtime_ns,
            "text_column": job.text_column, "id_column": job.id_column, "chunk_rows": job.chunk_rows,
            "on_error": job.on_error, "normalize": normalize, "model": engine.manifest.model,
            "precision": engine.precision, "graph_sha256": engine.embeddings_variant.sha256,
            "attnserve": __version__}


def encode_file(engine: Engine, job: EncodeJob) -> EncodeResult:
    """Encode job.input into job.output, resuming an unfinished run of the same job; returns the totals."""
    from tqdm import tqdm

    source = InputFile(job.input, job.text_column, job.id_column)
    if job.output.is_dir():
        raise InvalidInputError(f"output {job.output} is a directory; give a .parquet file name")
    normalize = engine.manifest.normalize if job.normalize is None else job.normalize
    run = PartialRun(job.output, fingerprint(engine, job, normalize), job.overwrite)
    metadata = {"model": engine.manifest.model, "precision": engine.precision, "pooling": engine.manifest.pooling,
                "normalize": normalize, "input": str(job.input)}
    track_ids = source.format == "jsonl" or (source.format == "parquet" and source.id_type is not None)
    checks, result, start = RowChecks(engine.manifest.vocab_size, track_ids), EncodeResult(), time.perf_counter()
    result.resumed_rows = run.rows_done
    # disable=None: a bar on a terminal only, never in logs or pipes.
    bar = tqdm(total=source.count_rows(), initial=run.rows_done, unit="text", disable=None if job.progress else True,
               dynamic_ncols=True, desc="encode")
    schema = None
    try:
        for index, records in enumerate(source.chunks(job.chunk_rows)):
            bad = checks.bad(records)
            schema = schema or output_schema(source.id_type or int, engine.manifest.hidden_size, metadata)
            if index < run.chunks_done:
                continue
            good = good_rows(source, records, bad, job.on_error)
            table, stats = encode_records(engine, str(source.path), good, normalize, schema)
            run.write_chunk(index, table, len(records), [error_line(r, reason) for r, reason in bad])
            result.add(stats)
            result.skipped += len(bad)
            bar.update(len(records))
            bar.set_postfix(tokens_per_s=f"{result.tokens / (time.perf_counter() - start):.0f}", refresh=False)
        # An empty input (an empty partition, say) gives an empty output with the same schema.
        schema = schema or output_schema(source.id_type or int, engine.manifest.hidden_size, metadata)
        run.finish(schema, job.errors_path if job.on_error == "skip" else None)
    finally:
        bar.close()
    result.seconds = time.perf_counter() - start
    return result


def error_line(record: Record, reason: str) -> dict:
    where = {"line": record.row + 1} if record.where.startswith("line") else {"row": record.row}
    return {**where, "reason": reason, "input": record.raw}


def summary_line(stats: EncodeStats, output: Path, errors_path: Path | None = None) -> str:
    rate = stats.tokens / stats.seconds if stats.seconds else 0.0
    padding = f"{stats.padding_fraction:.1%}" if getattr(stats, "padding_known", True) else "n/a"
    line = (f"encoded {stats.texts} texts, {stats.tokens} tokens in {stats.seconds:.2f}s: "
            f"{rate:.0f} tokens/s, padding {padding} -> {output}")
    if getattr(stats, "resumed_rows", 0):
        line += f" (resumed after {stats.resumed_rows} rows)"
    if errors_path is not None:
        line += f"; skipped {getattr(stats, 'skipped', 0)} bad rows -> {errors_path}"
    return line


def read_embeddings(path: Path) -> np.ndarray:
    """(N, H) float32 from an output file: a convenience for tests and notebooks."""
    table = pq.read_table(path, columns=["embedding"])
    column = table.column("embedding").combine_chunks()
    return column.values.to_numpy().reshape(len(table), -1)
