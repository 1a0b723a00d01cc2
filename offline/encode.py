"""`attnserve encode`: the local chunk encoder (the Engine in this process) and its entry point."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from attnserve.engine.engine import Engine

from .job import Chunk, EncodedChunk, EncodeJob, EncodeResult, ModelFacts, Session, run_job
from .rows import encode_inputs, inputs_of


def engine_facts(engine: Engine) -> ModelFacts:
    m = engine.manifest
    return ModelFacts(m.model, m.embedding_size, m.vocab_size, m.served_max_length, m.pooling, m.normalize,
                      engine.precision, engine.embeddings_variant.runs_as, quantization_ranges=m.quantization_ranges,
                      sparse=m.sparse, multi_vector=m.multi_vector is not None,
                      late_chunking=m.late_chunkable,
                      bge_m3_vector_size=None if m.bge_m3 is None else int(m.bge_m3["colbert_dim"]))


class LocalEncoder:
    """Each chunk through this process's engine, one after another."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def facts(self) -> ModelFacts:
        return engine_facts(self.engine)

    def encode(self, chunks: Iterator[Chunk], session: Session) -> Generator[EncodedChunk, None, None]:
        for chunk in chunks:
            encoded, refused = encode_inputs(self.engine, inputs_of(chunk.records), session.normalize,
                                             session.on_batch, session.prompt, session.input_type, session.late,
                                             session.outputs)
            for position, reason in refused.items():
                session.refuse(chunk.records[position], reason)
            yield EncodedChunk(chunk, encoded.embeddings, encoded.num_tokens, encoded.truncated, encoded.stats,
                               refused, encoded.chunks, encoded.sparse, encoded.multi_vector)


def encode_file(engine: Engine, job: EncodeJob, **driver) -> EncodeResult:
    """Encode job.input into job.output with `engine`, resuming an unfinished run of the same job."""
    return run_job(job, LocalEncoder(engine), **driver)


def read_embeddings(path: Path) -> np.ndarray:
    """(N, D) from an output file, float32 or the codes `--precision-out` wrote: a convenience for tests and
    notebooks."""
    table = pq.read_table(path, columns=["embedding"])
    column = table.column("embedding").combine_chunks()
    return column.values.to_numpy().reshape(len(table), -1)
