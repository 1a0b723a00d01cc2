"""The one offline job driver: read -> check rows -> resume -> encode -> write -> progress -> finish.

It stands over a chunk encoder (ChunkEncoder), of which there are three: the local engine
(offline/encode.py), an actor pool on Ray (offline/ray_encode.py) and a running server
(offline/remote.py). Everything else lives here, once: the input is read in chunks of
job.chunk_rows rows and checked row by row (offline/checks.py); the output's integrity, its
lock and the resumable parts are offline/partial.py's; each chunk the encoder gives back, in
order, is written as a part; the progress bar moves as the encoder reports each batch; at
the end the output is assembled and the totals returned for the summary line.

An encoder gets each chunk's good rows and gives back, per chunk and in order, their
embeddings, num_tokens and truncated, and the rows it could not encode (with the reason),
which the driver fails on or sets aside, as it does the rows the checks found.

Images (a folder of them, or a Parquet column: offline/image_readers.py) are rows like any
other: the same chunks, checks, parts and resume, each row's bytes its input, which an
image-text model's image tower encodes (offline/image_encode.py) and a text model refuses
before anything is read. Their embeddings are written as texts' are, num_tokens counting
the tower's positions.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from attnserve import __version__
from attnserve.engine.dimensions import check_dimensions
from attnserve.engine.engine import EncodeStats
from attnserve.engine.late_chunking import CHUNKERS
from attnserve.engine.multi_vector import INPUT_TYPES
from attnserve.engine.output_options import OutputOptions, SparseOptions
from attnserve.engine.quantize import RANGED, check_embedding_types
from attnserve.errors import ConfigError, InvalidInputError
from attnserve.images import DEFAULT_MAX_PIXELS

from .checks import RowChecks, bad_row_error, error_line, where_of
from .image_readers import is_image_folder, open_input
from .partial import PartialRun, input_digest
from .readers import Record
from .rows import (
    BGE_M3_COLUMNS,
    LateChunks,
    Prompt,
    late_chunks_schema,
    late_chunks_table,
    output_schema,
    output_table,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from tqdm import tqdm

    from .image_readers import ImageFolder
    from .readers import InputFile


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
    dimensions: int | None = None  # keep the first N dimensions (engine/dimensions.py's rule); None: all
    prompt: Prompt = field(default_factory=Prompt)  # before every text; unset: the model's default prompt
    model: str | None = None  # through a server: the served model to use (None: its default)
    task: str | None = None  # the task adapter (jina v3; engine/tasks.py); None: none
    # The embedding column's type (engine/quantize.py, `--precision-out`): float, int8, uint8, binary, ubinary.
    embedding_type: str = "float"
    # A ColBERT model's texts are its "document"s or "query"s (engine/multi_vector.py); other models refuse "query".
    input_type: str = "document"
    # Late chunking (engine/late_chunking.py): one output row per chunk of each text, cut by this chunker; None: not.
    late_chunking: LateChunks | None = None
    # A bge-m3 model's columns to write, from one pass: some of rows.BGE_M3_COLUMNS; (): the model's own column.
    outputs: tuple[str, ...] = ()
    # Images: a Parquet column of their bytes or paths (an input folder's files are images without it).
    image_column: str | None = None
    max_image_pixels: int = DEFAULT_MAX_PIXELS  # more is a bad row (attnserve/images.py), locally and on Ray

    @property
    def errors_path(self) -> Path:
        return self.output.with_name(self.output.name.removesuffix(".parquet") + ".errors.jsonl")

    @property
    def images(self) -> bool:
        """The input's rows are images: a folder, or a Parquet column of them."""
        return self.image_column is not None or is_image_folder(self.input)


@dataclass
class EncodeResult(EncodeStats):
    skipped: int = 0  # bad rows set aside (on_error "skip")
    resumed_rows: int = 0  # rows an earlier, interrupted run had already encoded
    padding_known: bool = True  # False through a server, which batches out of sight


@dataclass(frozen=True)
class ImageFacts:
    """An image-text model's image tower, as a run of images needs to know it."""

    embedding_size: int  # D, of the space its texts share
    precision: str | None = None  # its graph's, where this process can know it (not through a server)
    graph_sha256: str | None = None


@dataclass(frozen=True)
class ModelFacts:
    """What the driver needs to know of the model an encoder runs; read without running it."""

    model: str
    embedding_size: int  # the size of each sentence embedding
    vocab_size: int
    max_seq_length: int
    pooling: str
    normalize: bool  # the checkpoint's own pipeline L2-normalises
    precision: str
    graph_sha256: str | None = None  # the graph that runs (GraphVariant.runs_as), where this process can know it
    server: str | None = None  # the server that encodes, if one does
    # (dimensions, normalize) -> the model's (2, D) int8 / uint8 ranges (Manifest.quantization_ranges), or None
    # where they are not known here: the artifacts hold none, or a server encodes.
    quantization_ranges: Callable[[int | None, bool], np.ndarray | None] = lambda dimensions, normalize: None
    sparse: bool = False  # a SPLADE model: its weights are written as (index, value) pairs (sparse_embedding)
    multi_vector: bool = False  # a ColBERT model: its vectors of each row are written (multi_vector)
    late_chunking: bool = False  # its embedding is a pooling of its token embeddings: late chunking applies
    bge_m3_vector_size: int | None = None  # a bge-m3 model's ColBERT vectors' size (its sparse too); None: not one
    images: ImageFacts | None = None  # an image-text model's image tower; None: a text model


@dataclass(eq=False)
class Chunk:
    """One chunk of the input to encode."""

    index: int
    rows: int  # every row of the chunk, bad ones included
    records: list[Record]  # the good rows, in input order: what the encoder encodes
    bad: list[tuple[Record, str]]  # rows the checks set aside, with their reasons
    digest: str  # of the chunk's input rows (partial.input_digest)


@dataclass(eq=False)
class EncodedChunk:
    chunk: Chunk
    # (n, D) float32: the rows of chunk.records not refused, in order; a ColBERT model's (n,) of (K_i, d) arrays
    embeddings: np.ndarray
    num_tokens: np.ndarray  # (n,)
    truncated: np.ndarray  # (n,)
    stats: EncodeStats
    refused: dict[int, str] = field(default_factory=dict)  # position in chunk.records -> reason, set aside
    # Late chunking's (embeddings then (n,) of (k_i, D) chunk means): each row's (k_i, 3) start, stop, token count.
    chunks: np.ndarray | None = None
    # A bge-m3 model's other outputs, where asked (Encoded.sparse, Encoded.multi_vector): (n,) each.
    sparse: np.ndarray | None = None
    multi_vector: np.ndarray | None = None


@dataclass
class Session:
    """What the driver hands an encoder for one run."""

    chunks_left: int  # about how many chunks there are to encode (for sizing a pool)
    # The outputs' dimensions, normalisation, embedding type and ranges, which each encoder's rows come back in,
    # assembled as a server's reply is (engine/outputs.py).
    options: OutputOptions
    on_batch: Callable[[int], None]  # n rows were encoded: moves the progress bar
    refuse: Callable[[Record, str], None]  # a row the encoder cannot encode: raises (on_error fail) or returns
    prompt: Prompt = field(default_factory=Prompt)  # what goes before every text
    task: str | None = None  # a server's task adapter to ask for (local and Ray runs open the task's graphs)
    input_type: str = "document"  # a ColBERT model's: its texts are its documents or its queries
    late: LateChunks | None = None  # late chunking's chunker: each row's chunks, not its embedding
    outputs: tuple[str, ...] = ()  # a bge-m3 model's columns (EncodeJob.outputs)
    # The rows are images, each decoded within this many pixels (rows.encode_inputs); None: texts or token ids.
    image_pixels: int | None = None


class ChunkEncoder(Protocol):
    def facts(self) -> ModelFacts:
        """The model, without encoding anything: checked before any work, and part of the run's fingerprint."""

    def encode(self, chunks: Iterator[Chunk], session: Session) -> Generator[EncodedChunk, None, None]:
        """Every chunk, encoded, in the order given; reads ahead of what it gives back by a bounded amount.

        The driver closes the generator when it stops early; an encoder frees what it holds then."""


class Progress(Protocol):
    def start(self, total: int) -> None: ...

    def advance(self, rows: int, tokens_per_s: float | None = None) -> None: ...

    def close(self) -> None: ...


class Bar:
    """The progress bar on a terminal (never in logs or pipes), moved per batch."""

    def __init__(self, enabled: bool, unit: str = "text"):
        self.enabled, self.unit = enabled, unit
        self._bar: tqdm | None = None  # made by start(): tqdm draws as soon as it is made

    def start(self, total: int) -> None:
        from tqdm import tqdm

        # disable=None: tqdm draws only on a terminal.
        self._bar = tqdm(total=total, unit=self.unit, disable=None if self.enabled else True, dynamic_ncols=True,
                         desc="encode")

    def advance(self, rows: int, tokens_per_s: float | None = None) -> None:
        assert self._bar is not None, "start() comes first"  # run_job starts the progress before any row
        if tokens_per_s is not None:
            self._bar.set_postfix(tokens_per_s=f"{tokens_per_s:.0f}", refresh=False)
        self._bar.update(rows)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def notice_on_stderr(message: str) -> None:
    print(f"attnserve: {message}", file=sys.stderr, flush=True)


class EncodeInterrupted(KeyboardInterrupt):
    """Ctrl-C: the message says how to resume."""


def run_job(job: EncodeJob, encoder: ChunkEncoder, progress: Progress | None = None,
            notice: Callable[[str], None] = notice_on_stderr) -> EncodeResult:
    """Encode job.input into job.output, resuming an unfinished run of the same job; returns the totals."""
    source = open_input(job.input, job.text_column, job.id_column, job.image_column, job.max_image_pixels)
    facts, normalize, ranges = _checked_facts(job, encoder)
    errors_path = job.errors_path if job.on_error == "skip" else None
    asked = _asked(job, facts)
    fingerprint = {"input": str(job.input.resolve()), "text_column": job.text_column, "id_column": job.id_column,
                   "chunk_rows": job.chunk_rows, "normalize": normalize, "model": facts.model,
                   "precision": facts.precision, "graph_sha256": facts.graph_sha256, "server": facts.server,
                   "attnserve": __version__, **asked}
    # A ColBERT model's vectors are normalised (or not) by its graph, each token's: no run's choice.
    metadata = {"model": facts.model, "precision": facts.precision, "pooling": facts.pooling,
                **({"inputs": "images"} if job.images else {}),
                **({} if facts.multi_vector else {"normalize": normalize}), "input": str(job.input),
                **({"server": facts.server} if facts.server else {}),
                **asked, **({"ranges": ranges.tolist()} if ranges is not None else {})}
    progress = progress or Bar(job.progress, "image" if job.images else "text")
    result, start = EncodeResult(padding_known=facts.server is None), time.perf_counter()
    with PartialRun(job.output, job.input, errors_path, fingerprint, job.overwrite, notice) as run:
        total = source.count_rows()
        progress.start(total)
        parts = _Parts(job, facts, source, run, progress, result, start, metadata)
        session = Session(chunks_left=max(1, -(-total // job.chunk_rows) - run.chunks_done),
                          options=_output_options(job, facts, normalize, ranges), on_batch=progress.advance,
                          refuse=parts.refuse, prompt=job.prompt, task=job.task, input_type=job.input_type,
                          late=job.late_chunking, outputs=job.outputs,
                          image_pixels=job.max_image_pixels if job.images else None)
        try:
            parts.encode(encoder, session)
        except KeyboardInterrupt:
            raise EncodeInterrupted(f"interrupted after {run.rows_recorded()} of {total} rows; the same command "
                                    "resumes after them") from None
        finally:
            progress.close()
    result.seconds = time.perf_counter() - start
    return result


def _checked_facts(job: EncodeJob, encoder: ChunkEncoder) -> tuple[ModelFacts, bool, np.ndarray | None]:
    """The model's facts (its image tower's, for images), checked against what the job asks before anything is
    read: (the facts, whether the run normalises, the int8 / uint8 ranges or None)."""
    facts = encoder.facts()
    if job.images:
        facts = _image_facts(job, facts)
    normalize = facts.normalize if job.normalize is None else job.normalize
    check_dimensions(job.dimensions, facts.embedding_size)  # the same rule as a request's
    _check_sparse(job, facts)
    _check_multi_vector(job, facts)
    _check_late_chunking(job, facts)
    _check_outputs(job, facts)
    return facts, normalize, _ranges(job, facts, normalize)


def _asked(job: EncodeJob, facts: ModelFacts) -> dict:
    """What the job asks beyond the defaults, for the run's fingerprint and the output's metadata: set only when
    asked, so that the runs of earlier versions' settings read the same."""
    late = job.late_chunking
    return {key: value for key, value in (
        ("dimensions", job.dimensions), ("prompt_name", job.prompt.name), ("prompt", job.prompt.text),
        ("task", job.task), ("embedding_type", None if job.embedding_type == "float" else job.embedding_type),
        ("input_type", job.input_type if facts.multi_vector else None),
        ("late_chunking", f"{late.chunker}:{late.chunk_tokens}" if late else None),
        ("outputs", list(job.outputs) if job.outputs else None), ("image_column", job.image_column),
        # a server decodes within its own limit
        ("max_image_pixels", job.max_image_pixels if job.images and facts.server is None else None))
            if value is not None}


class _Parts:
    """One run's chunks inside its PartialRun: those to encode handed to the encoder, each encoded one written as
    its part in a writer thread while the encoder runs the next, the totals added up in result."""

    def __init__(self, job: EncodeJob, facts: ModelFacts, source: InputFile | ImageFolder, run: PartialRun,
                 progress: Progress, result: EncodeResult, start: float, metadata: dict):
        """start: the run's perf_counter() time, from which rate() counts."""
        self.job, self.facts, self.source, self.run, self.progress = job, facts, source, run, progress
        self.result, self.start, self.metadata = result, start, metadata
        self.size = job.dimensions or facts.embedding_size
        self.checks = RowChecks(facts.vocab_size, source.ids_can_repeat)
        self.schema: pa.Schema | None = None  # made with the first chunk read (chunks())

    def encode(self, encoder: ChunkEncoder, session: Session) -> None:
        """Every chunk encoded and written, then the output assembled."""
        # Each chunk is written (its table built, compressed, recorded) in a thread while the encoder runs the
        # next: one write at a time, in order, each recorded before the next begins.
        with ThreadPoolExecutor(1, thread_name_prefix="attnserve-write") as writer, \
                closing(encoder.encode(self.chunks(), session)) as encoded:
            part: Future | None = None
            for done in encoded:
                if part is not None:
                    self.written(part)
                part = writer.submit(self.write, done)
            if part is not None:
                self.written(part)
        # An empty input (an empty partition, say) gives an empty output with the same schema.
        self.run.finish(self.schema or self.new_schema())

    def new_schema(self) -> pa.Schema:
        job, facts = self.job, self.facts
        if job.late_chunking is not None:
            return late_chunks_schema(self.source.id_type or int, self.size, self.metadata)
        return output_schema(self.source.id_type or int, self.size, self.metadata, job.embedding_type, facts.sparse,
                             facts.multi_vector, job.outputs, facts.bge_m3_vector_size)

    def rate(self) -> float:
        return self.result.tokens / max(time.perf_counter() - self.start, 1e-9)

    def refuse(self, record: Record, reason: str) -> None:
        if self.job.on_error == "fail":
            raise bad_row_error(self.source.path, record.where, reason)

    def chunks(self) -> Iterator[Chunk]:
        """The chunks to encode; the finished ones are read and checked (ids seen), then passed over."""
        job, run, source = self.job, self.run, self.source
        for index, records in enumerate(source.chunks(job.chunk_rows)):
            bad = self.checks.bad(records)
            self.schema = self.schema or self.new_schema()
            digest = input_digest(records)
            if run.trusts(index, digest):
                first = run.first_error(index)
                if job.on_error == "fail" and first is not None:  # set aside by a run with --on-error skip
                    raise bad_row_error(source.path, where_of(first), first["reason"])
                self.result.resumed_rows += len(records)
                self.progress.advance(len(records))
                continue
            if bad and job.on_error == "fail":
                raise bad_row_error(source.path, bad[0][0].where, bad[0][1])
            bad_rows = {r.row for r, _ in bad}
            good = [r for r in records if r.row not in bad_rows] if bad else records
            yield Chunk(index, len(records), good, bad, digest)

    def write(self, done: EncodedChunk) -> tuple[EncodeStats, int]:
        """One chunk's rows (and those set aside) as its part, in the writer thread: (its stats, rows set aside)."""
        job, chunk, schema = self.job, done.chunk, self.schema
        assert schema is not None, "chunks() makes it before handing out a chunk"
        kept = chunk.records if not done.refused else \
            [r for i, r in enumerate(chunk.records) if i not in done.refused]
        # The encoder's rows are cut, normalised and typed as Session.options asked (engine/outputs.py).
        if job.late_chunking is not None:
            assert done.chunks is not None
            table = late_chunks_table(schema, kept, done.embeddings, done.chunks)
        else:
            table = output_table(schema, kept, done.embeddings, done.num_tokens, done.truncated, done.sparse,
                                 done.multi_vector)
        set_aside = chunk.bad + [(chunk.records[i], reason) for i, reason in done.refused.items()]
        set_aside.sort(key=lambda item: item[0].row)
        self.run.write_chunk(chunk.index, table, chunk.rows, [error_line(r, why) for r, why in set_aside],
                             chunk.digest)
        return done.stats, len(set_aside)

    def written(self, part: Future) -> None:
        stats, set_aside = part.result()  # a write's error is raised here, in this thread
        self.result.add(stats)
        self.result.skipped += set_aside
        self.progress.advance(set_aside, self.rate())


def _image_facts(job: EncodeJob, facts: ModelFacts) -> ModelFacts:
    """A run of images: the model's image tower, whose embeddings and graph the run's are; what applies to texts
    alone, or to a text model, refused in one line before anything is read."""
    if facts.images is None:
        raise ConfigError(f"{facts.model} is a text model: it embeds no images")
    for flag, asked in (("--prompt-name / --prompt", job.prompt.asked), ("--task", job.task is not None),
                        ("--late-chunking", job.late_chunking is not None), ("--outputs", bool(job.outputs)),
                        ("--input-type", job.input_type != "document")):
        if asked:
            raise ConfigError(f"{flag} applies to texts; {job.input} holds images")
    if job.embedding_type in RANGED:
        raise ConfigError(f"--precision-out {job.embedding_type} takes the model's ranges, calibrated on texts; "
                          "images take float, binary or ubinary")
    if job.max_image_pixels < 1:
        raise ConfigError(f"--max-image-pixels must be positive, got {job.max_image_pixels}")
    tower = facts.images
    # The tower's own pooled and projected output, in the space the texts share.
    return dataclasses.replace(facts, embedding_size=tower.embedding_size, pooling="image_tower",
                               precision=tower.precision or facts.precision, graph_sha256=tower.graph_sha256)


def _check_sparse(job: EncodeJob, facts: ModelFacts) -> None:
    """A SPLADE model's weights are written whole, as (index, value) pairs: no cut, normalisation or type."""
    if not facts.sparse:
        return
    for flag, asked in (("--dimensions", job.dimensions is not None), ("--normalize", bool(job.normalize)),
                        ("--precision-out", job.embedding_type != "float")):
        if asked:
            raise ConfigError(f"{flag} does not apply to {facts.model}, a SPLADE model: its sparse embeddings are "
                              "written whole as (index, value) pairs")


def _check_multi_vector(job: EncodeJob, facts: ModelFacts) -> None:
    """A ColBERT model's vectors are written whole, of its queries or documents; other models have no input type."""
    if not facts.multi_vector:
        if job.input_type != "document":
            raise ConfigError(f"--input-type {job.input_type} applies to multi-vector (ColBERT) models only; "
                              f"{facts.model} is not one")
        return
    if job.input_type not in INPUT_TYPES:
        raise ConfigError(f"--input-type {job.input_type!r} is not one of {', '.join(INPUT_TYPES)}")
    for flag, asked in (("--dimensions", job.dimensions is not None), ("--normalize", job.normalize is not None),
                        ("--precision-out", job.embedding_type != "float"),
                        ("--prompt-name / --prompt", job.prompt.asked), ("--task", job.task is not None)):
        if asked:
            raise ConfigError(f"{flag} does not apply to {facts.model}, a multi-vector (ColBERT) model: its vectors "
                              "are written whole, with its own query or document prompt (--input-type)")


def _check_outputs(job: EncodeJob, facts: ModelFacts) -> None:
    """--outputs: a bge-m3 model's columns, each known and once."""
    if not job.outputs:
        return
    if facts.bge_m3_vector_size is None:
        raise ConfigError(f"--outputs chooses among a bge-m3 model's outputs; {facts.model} has no bge-m3 heads "
                          "(colbert_linear.pt, sparse_linear.pt)")
    unknown = [name for name in job.outputs if name not in BGE_M3_COLUMNS]
    if unknown or len(set(job.outputs)) != len(job.outputs):
        raise ConfigError(f"--outputs {','.join(job.outputs)}: give some of {', '.join(BGE_M3_COLUMNS)}, each once")
    if job.late_chunking is not None:
        raise ConfigError("--outputs and --late-chunking write different rows: give one of them")


def _check_late_chunking(job: EncodeJob, facts: ModelFacts) -> None:
    """Late chunking: a chunker, and a model whose embedding is a pooling of its token embeddings, written whole."""
    late = job.late_chunking
    if late is None:
        return
    if late.chunker not in CHUNKERS:
        raise ConfigError(f"--late-chunking {late.chunker!r} is not one of {', '.join(CHUNKERS)}")
    if late.chunk_tokens < 1:
        raise ConfigError(f"--chunk-tokens must be positive, got {late.chunk_tokens}")
    if not facts.late_chunking:
        raise ConfigError(f"--late-chunking mean-pools token embeddings, and {facts.model}'s embedding is not a "
                          "pooling of them")
    if job.embedding_type != "float":
        raise ConfigError("--precision-out does not apply to --late-chunking: its chunks are written as float32")


def _output_options(job: EncodeJob, facts: ModelFacts, normalize: bool, ranges: np.ndarray | None
                    ) -> OutputOptions:
    """The run's outputs, as a request would ask them: a SPLADE model's sparse weights in place of its vector; a
    ColBERT model's and bge-m3's other outputs are asked by their engine calls (input_type, outputs)."""
    return OutputOptions(None, normalize, job.dimensions, False, None, embedding_types=(job.embedding_type,),
                         ranges=ranges, sparse=SparseOptions() if facts.sparse else None, dense=not facts.sparse)


def _ranges(job: EncodeJob, facts: ModelFacts, normalize: bool) -> np.ndarray | None:
    """The int8 / uint8 ranges of the run: the model's calibrated ones, cut and normalised as the run's vectors."""
    try:
        check_embedding_types([job.embedding_type], "precision_out")
    except InvalidInputError as e:
        raise ConfigError(f"--precision-out: {e}") from None
    if job.embedding_type not in RANGED:
        return None
    ranges = facts.quantization_ranges(job.dimensions, normalize)
    if ranges is None:
        raise ConfigError(
            f"--precision-out {job.embedding_type} needs the model's calibrated ranges, which "
            + (f"the server {facts.server} does not send: encode with --artifacts (this machine's engine), or ask "
               "for binary or ubinary" if facts.server else
               f"{facts.model}'s artifacts do not hold (exported before quantized embeddings): re-export the model "
               "with `attnserve export`, or ask for binary or ubinary"))
    return ranges


def summary_line(stats: EncodeResult, output: Path, errors_path: Path | None = None, rows: str = "texts") -> str:
    """rows: what the rows are, "texts" or "images" (whose tokens are the image tower's positions)."""
    rate = stats.tokens / stats.seconds if stats.seconds else 0.0
    padding = f"{stats.padding_fraction:.1%}" if stats.padding_known else "n/a"
    line = (f"encoded {stats.texts} {rows}, {stats.tokens} tokens in {stats.seconds:.2f}s: "
            f"{rate:.0f} tokens/s, padding {padding} -> {output}")
    if stats.resumed_rows:
        line += f" (resumed after {stats.resumed_rows} rows)"
    if errors_path is not None:
        line += f"; skipped {stats.skipped} bad rows -> {errors_path}"
    return line
