"""`attnserve encode`: the local chunk encoder (the Engine in this process) and its entry point."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from attnserve.engine.engine import Encoded, Engine
from attnserve.engine.image_encoder import ImageEncoder

from .job import Chunk, EncodedChunk, EncodeJob, EncodeResult, ImageFacts, ModelFacts, Session, run_job
from .rows import TokenizedChunk, encode_inputs, encode_tokenized_inputs, inputs_of, tokenize_inputs


def engine_facts(engine: Engine) -> ModelFacts:
    m = engine.manifest
    return ModelFacts(m.model, m.embedding_size, m.vocab_size, m.served_max_length, m.pooling, m.normalize,
                      engine.precision, engine.embeddings_variant.runs_as, quantization_ranges=m.quantization_ranges,
                      sparse=m.sparse, multi_vector=m.multi_vector is not None,
                      late_chunking=m.late_chunkable,
                      bge_m3_vector_size=None if m.bge_m3 is None else int(m.bge_m3["colbert_dim"]),
                      images=None if engine.images is None else image_facts(engine.images))


def image_facts(tower: ImageEncoder) -> ImageFacts:
    """The graph an image tower runs (local and Ray runs choose it alike, by the text graph's precision)."""
    graph = tower.settings["graphs"][tower.graph]
    # As GraphVariant.runs_as: the file's sha256 and its data files' (the file names its weights, not holds them).
    runs_as = graph["sha256"] + "".join(f" {sha}" for _, sha in sorted(graph["data_files"].items()))
    return ImageFacts(tower.embedding_size, tower.precision, runs_as)


class LocalEncoder:
    """Each chunk through this process's engine, in order. While the engine runs one chunk, a thread tokenizes the
    next (the tokenizers library and onnxruntime both release the GIL), and the driver reads the one after and
    writes the one before (offline/job.py): reading, tokenizing, running and writing overlap. Late chunking
    tokenizes each text as it encodes it, a chunk at a time; images are decoded a batch ahead of the one that runs
    (offline/image_encode.py), a chunk at a time."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def facts(self) -> ModelFacts:
        return engine_facts(self.engine)

    def encode(self, chunks: Iterator[Chunk], session: Session) -> Generator[EncodedChunk, None, None]:
        if session.late is not None or session.image_pixels is not None:
            for chunk in chunks:
                yield self._done(chunk, session, *encode_inputs(
                    self.engine, inputs_of(chunk.records), session.options, session.on_batch, session.prompt,
                    session.input_type, session.late, session.outputs, session.image_pixels))
            return
        yield from self._pipelined(chunks, session)

    def _pipelined(self, chunks: Iterator[Chunk], session: Session) -> Generator[EncodedChunk, None, None]:
        with ThreadPoolExecutor(1, thread_name_prefix="attnserve-tokenize") as pool:
            def tokenizing(chunk: Chunk) -> Future[TokenizedChunk]:
                return pool.submit(tokenize_inputs, self.engine, inputs_of(chunk.records), session.prompt,
                                   session.input_type)

            upcoming = iter(chunks)
            current = next(upcoming, None)
            tokens = tokenizing(current) if current is not None else None
            while current is not None and tokens is not None:
                failure: Exception | None = None
                try:  # the next chunk read and checked while the thread tokenizes this one
                    following = next(upcoming, None)
                except Exception as error:  # noqa: BLE001 (a bad row there: raised after this chunk is done)
                    following, failure = None, error
                tokenized = tokens.result()
                tokens = tokenizing(following) if following is not None else None  # beside this chunk's run
                yield self._done(current, session, *encode_tokenized_inputs(
                    self.engine, tokenized, session.options, session.on_batch, session.input_type,
                    session.outputs))
                if failure is not None:
                    raise failure
                current = following

    @staticmethod
    def _done(chunk: Chunk, session: Session, encoded: Encoded, refused: dict[int, str]) -> EncodedChunk:
        for position, reason in refused.items():
            session.refuse(chunk.records[position], reason)
        return EncodedChunk(chunk, encoded.embeddings, encoded.num_tokens, encoded.truncated, encoded.stats,
                            refused, encoded.chunks, encoded.sparse, encoded.multi_vector)


def encode_file(engine: Engine, job: EncodeJob, **driver) -> EncodeResult:
    """Encode job.input into job.output with `engine`, resuming an unfinished run of the same job."""
    return run_job(job, LocalEncoder(engine), **driver)


def read_embeddings(path: Path) -> np.ndarray:
    """(N, D) from an output file, float32 or the codes `--precision-out` wrote: a convenience for tests and
    notebooks."""
    table = pq.read_table(path, columns=["embedding"])
    column = table.column("embedding").combine_chunks()
    if len(table) == 0:  # reshape(0, -1) cannot infer the width: the schema's, where the list has a fixed size
        return np.zeros((0, getattr(column.type, "list_size", 0)), column.type.value_type.to_pandas_dtype())
    return column.values.to_numpy().reshape(len(table), -1)
