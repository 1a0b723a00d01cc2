"""`attnserve encode --engine ray`: the local encode job on Ray Data, one engine per actor.

The unit of work is the local path's chunk (rows [k*chunk_rows, (k+1)*chunk_rows)),
and each chunk travels through Ray Data as ONE row:

    read_datasource(_ChunkDatasource)   the local reader and row checks, in one sequential
                                        read task: {chunk, rows, records, errors} per chunk
    map_batches(_ChunkEncoder)          an actor pool, one Engine per actor: the chunk's
                                        output rows through encode_records
    this process                        each chunk, in order, into the local path's
                                        resumable parts (partial.py), then the output file

Ray never splits or merges a row, so every chunk is batched exactly as the local
engine batches it: the embeddings are the same bits and the output file the same
bytes. Rows are numbered, ids typed, bad rows found (duplicate ids across the whole
file included) and runs resumed exactly as locally, because the same code does it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import time
import warnings
from pathlib import Path

import pyarrow as pa

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine
from attnserve.errors import AttnserveError, ConfigError, InvalidInputError

from .encode import EncodeJob, EncodeResult, RowChecks, error_line, fingerprint, good_rows
from .partial import PartialRun
from .readers import InputFile
from .rows import encode_records, output_schema

try:
    from ray.data import Datasource
except ImportError:  # ray is an optional extra: without it encode_file_ray stops at _import_ray's install hint
    Datasource = object

# onnxruntime threads per actor when neither --threads nor --ray-actors says. Measured on a 2-core
# CPU, 2000 mixed-length texts in 8 chunks: 1 actor x 2 threads 4900-5300 tokens/s, 2 actors x 1
# thread 4700-4750 (the local engine 6200-6900); and one actor holds one engine in memory, not two.
THREADS_PER_ACTOR = 2
# How long the actor pool may take to start before the run gives up: a cluster without the CPUs asked for.
ACTOR_START_TIMEOUT_S = 600


def encode_file_ray(job: EncodeJob, config: EngineConfig, artifacts_dir: Path, ray_address: str | None = None,
                    ray_actors: int | None = None) -> EncodeResult:
    """encode_file's job on Ray Data: the same output file, byte for byte, and the same errors."""
    ray = _import_ray()
    if ray_actors is not None and ray_actors < 1:
        raise ConfigError(f"--ray-actors must be positive, got {ray_actors}")
    # An engine here checks the artifacts and settings before Ray starts, and fixes what the actors run.
    engine = Engine.from_directory(artifacts_dir, config)
    source = InputFile(job.input, job.text_column, job.id_column)
    if job.output.is_dir():
        raise InvalidInputError(f"output {job.output} is a directory; give a .parquet file name")
    normalize = engine.manifest.normalize if job.normalize is None else job.normalize
    run = PartialRun(job.output, fingerprint(engine, job, normalize), job.overwrite)
    rows = source.count_rows()
    spec = _ChunkSpec(job, vocab_size=engine.manifest.vocab_size, chunks_done=run.chunks_done,
                      track_ids=source.format == "jsonl" or (source.format == "parquet" and source.id_type is not None))
    schema = output_schema(_id_type(source, job.chunk_rows), engine.manifest.hidden_size,
                           {"model": engine.manifest.model, "precision": engine.precision,
                            "pooling": engine.manifest.pooling, "normalize": normalize, "input": str(job.input)})
    # The actors open the graph this engine opened; this process needs no engine of its own from here on.
    config = dataclasses.replace(config, precision=engine.precision)
    del engine

    started = _start_ray(ray, ray_address)
    try:
        start = time.perf_counter()
        chunks = -(-rows // job.chunk_rows) - run.chunks_done
        actors, threads, cpus = _plan_actors(ray, config, ray_actors, chunks)
        encoder = {"artifacts_dir": str(artifacts_dir), "config": dataclasses.replace(config, threads=threads),
                   "source_label": str(source.path), "normalize": normalize, "schema": schema}
        result = _write(_dataset(ray, spec, encoder, actors, cpus), job, run, schema, rows)
        result.seconds = time.perf_counter() - start
        return result
    finally:
        if started:
            ray.shutdown()


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401  (a bare ray lacks Ray Data; the extra installs ray[data])
    except ImportError:
        raise AttnserveError("--engine ray needs the ray extra: pip install 'attnserve[ray]'") from None
    return ray


def _id_type(source: InputFile, chunk_rows: int) -> type:
    """int or str, fixed as the local path fixes it: by the ids of the first chunk (read here for that)."""
    if source.format == "jsonl":
        next(iter(source.chunks(chunk_rows)), None)
    return source.id_type or int


def _start_ray(ray, address: str | None) -> bool:
    """Join `address`, or start a local Ray; False when this process already has one (it is left running)."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    except ConnectionError as e:
        raise ConfigError(f"cannot connect to Ray at {address}: {e}") from None
    _quiet_ray_data()
    return True


def _quiet_ray_data() -> None:
    """Ray Data narrates each execution on the console, errors included; its log file under /tmp/ray keeps it all.

    A failure reaches the user once, as the one-line error that _results makes of it.
    """
    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.CRITICAL)


def _plan_actors(ray, config: EngineConfig, ray_actors: int | None, chunks: int) -> tuple[int, int, float]:
    """(actors, onnxruntime threads per actor, CPUs each actor reserves): every CPU of the cluster, by default.

    A chunk is the unit of work, so by default there are no more actors than chunks to encode:
    an input of one chunk gets one actor with every thread, as the local engine would.
    """
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if ray_actors:
        actors = ray_actors
    else:
        actors = max(1, min(cpus // (config.threads or THREADS_PER_ACTOR), chunks))
    threads = config.threads or max(1, cpus // actors)
    # Never reserve more than there is: an actor that cannot be placed would stall the whole job.
    return actors, threads, min(threads, cpus / actors)


@dataclasses.dataclass(frozen=True)
class _ChunkSpec:
    """What the read task needs to read and check the input as the local path does."""

    job: EncodeJob
    vocab_size: int
    chunks_done: int  # chunks an interrupted run finished: read and checked (ids seen), not sent
    track_ids: bool


def _dataset(ray, spec: _ChunkSpec, encoder: dict, actors: int, cpus: float):
    # Reading is light next to encoding: it takes no CPU slot, so it never waits behind actors that hold them all.
    # One read task, one output per chunk: Ray would otherwise split the read's output into empty blocks.
    chunks = ray.data.read_datasource(_ChunkDatasource(spec), num_cpus=0, override_num_blocks=1)
    context = chunks.context  # this dataset's own copy: other datasets of the process keep their settings
    context.execution_options.preserve_order = True  # chunks come back in input order
    # Every chunk its own block: Ray Data would merge the reader's rows into blocks of up to 128 MiB,
    # and a block goes to one actor, so all chunks would be encoded one after another.
    context.target_max_block_size = 1
    # Start encoding once the whole pool is up, so that chunks spread over every actor from the first.
    context.wait_for_min_actors_s = ACTOR_START_TIMEOUT_S
    context.enable_progress_bars = False  # _write draws the local path's bar, per chunk written
    context.print_on_execution_start = False
    with warnings.catch_warnings():
        # max_restarts is passed the only way Ray 2.60 takes it, which it reports as deprecated.
        warnings.simplefilter("ignore")
        return chunks.map_batches(
            _ChunkEncoder,
            fn_constructor_kwargs=encoder,
            batch_size=1,  # one chunk per call
            batch_format="pyarrow",
            # A chunk is long work: the next one goes to whichever actor is free, so that none sits
            # idle at the end while another still has a queue.
            compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
            num_cpus=cpus,
            # A dead actor fails the run (which resumes) instead of restarting: a restart needs constructor
            # arguments that Ray keeps in the object store, and Ray says so on stderr for every actor.
            max_restarts=0,
        )


def _write(dataset, job: EncodeJob, run: PartialRun, schema: pa.Schema, rows: int) -> EncodeResult:
    """Each encoded chunk, in order, into the run's parts; then the output file, as encode_file does."""
    from tqdm import tqdm

    result = EncodeResult(resumed_rows=run.rows_done)
    # disable=None: a bar on a terminal only, never in logs or pipes.
    bar = tqdm(total=rows, initial=run.rows_done, unit="text", disable=None if job.progress else True,
               dynamic_ncols=True, desc="encode")
    start = time.perf_counter()
    try:
        for chunk in _results(dataset):
            if chunk["error"]:
                raise pickle.loads(chunk["error"])
            if chunk["chunk"] != run.chunks_done:  # preserve_order broken: writing on would misplace rows
                raise RuntimeError(f"Ray returned chunk {chunk['chunk']} where chunk {run.chunks_done} was due")
            table = pa.ipc.open_stream(chunk["table"]).read_all()
            run.write_chunk(chunk["chunk"], table, chunk["rows"], pickle.loads(chunk["errors"]))
            result.add(pickle.loads(chunk["stats"]))
            result.skipped += chunk["rows"] - len(table)
            bar.update(chunk["rows"])
            bar.set_postfix(tokens_per_s=f"{result.tokens / (time.perf_counter() - start):.0f}", refresh=False)
        run.finish(schema, job.errors_path if job.on_error == "skip" else None)
    finally:
        bar.close()
    return result


def _results(dataset):
    """The encoded chunks as dicts, in order; an AttnserveError raised in the read task comes out as itself."""
    from ray.exceptions import GetTimeoutError, RayError

    try:
        for block in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
            yield from block.to_pylist()
    except GetTimeoutError:
        raise ConfigError(f"Ray could not start the actors within {ACTOR_START_TIMEOUT_S} s: the cluster lacks the "
                          "CPUs they ask for (fewer --ray-actors or --threads)") from None
    except RayError as e:
        cause = _attnserve_cause(e)
        if cause is None:
            raise
        # Ray Data appends its retry advice to the message, after a newline; attnserve's messages are one line.
        raise type(cause)(str(cause).split("\n", 1)[0]) from None


def _attnserve_cause(error: BaseException | None) -> AttnserveError | None:
    """The AttnserveError that a Ray error wraps (the read task's), if any.

    Ray re-raises a task's exception as a class derived from both RayError and the original: its
    message is a traceback. The original, with its one-line message, is further down the chain.
    """
    from ray.exceptions import RayError

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, AttnserveError) and not isinstance(error, RayError):
            return error
        seen.add(id(error))
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__
    return None


class _ChunkDatasource(Datasource):
    """The input file as one row per chunk to encode: {chunk, rows, records, errors}.

    One sequential read task, with the local reader and RowChecks: rows are numbered, ids
    typed and bad rows found just as locally (a duplicate id anywhere in the file included),
    and the first bad row fails the run with the local message. Records travel pickled, so
    every value the reader accepted reaches the engine as it was. Reading is cheap next to
    encoding: one reader keeps many actors busy.
    """

    def __init__(self, spec: _ChunkSpec):
        super().__init__()
        self.spec = spec

    def get_name(self) -> str:
        return "ReadChunks"

    def estimate_inmemory_data_size(self) -> int:
        return self.spec.job.input.stat().st_size

    @property
    def supports_distributed_reads(self) -> bool:
        return False  # the input is a file on the machine that runs the command

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context=None):
        from ray.data.block import BlockMetadata
        from ray.data.datasource import ReadTask

        metadata = BlockMetadata(num_rows=None, size_bytes=self.estimate_inmemory_data_size(), exec_stats=None,
                                 input_files=[str(self.spec.job.input)])
        return [ReadTask(self._read, metadata, per_task_row_limit=per_task_row_limit)]

    def _read(self):
        spec, job = self.spec, self.spec.job
        source = InputFile(job.input, job.text_column, job.id_column)
        checks = RowChecks(spec.vocab_size, spec.track_ids)
        for index, records in enumerate(source.chunks(job.chunk_rows)):
            bad = checks.bad(records)
            if index < spec.chunks_done:
                continue
            good = good_rows(source, records, bad, job.on_error)
            yield _one_row(chunk=index, rows=len(records), records=pickle.dumps(good),
                           errors=pickle.dumps([error_line(r, reason) for r, reason in bad]))


class _ChunkEncoder:
    """The actor: one Engine; a chunk's records in, its output rows out (as Arrow IPC) with its stats."""

    def __init__(self, artifacts_dir: str, config: EngineConfig, source_label: str, normalize: bool,
                 schema: pa.Schema):
        self.artifacts_dir, self.config = artifacts_dir, config
        self.source_label, self.normalize, self.schema = source_label, normalize, schema
        self.engine: Engine | None = None

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.concat_tables([self._encode(chunk) for chunk in batch.to_pylist()])  # batch_size=1: one chunk

    def _encode(self, chunk: dict) -> pa.Table:
        """The chunk's output rows, or the AttnserveError that stopped them, for _write to raise.

        Raised here, the error would reach this process as a UserCodeException without it: its
        cause does not survive the trip between processes, only a traceback's text does.
        """
        try:
            if self.engine is None:  # opened by the first call: its errors are a call's errors too
                self.engine = Engine.from_directory(self.artifacts_dir, self.config)
            records = pickle.loads(chunk["records"])
            table, stats = encode_records(self.engine, self.source_label, records, self.normalize, self.schema)
        except AttnserveError as e:
            return _chunk_result(chunk, error=pickle.dumps(e))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as stream:
            stream.write_table(table)
        return _chunk_result(chunk, table=sink.getvalue().to_pybytes(), stats=pickle.dumps(stats))


def _chunk_result(chunk: dict, table: bytes = b"", stats: bytes = b"", error: bytes = b"") -> pa.Table:
    """One encoded chunk (table, stats), or its error: the same columns either way, for one schema."""
    return _one_row(chunk=chunk["chunk"], rows=chunk["rows"], errors=chunk["errors"], table=table, stats=stats,
                    error=error, actor_pid=os.getpid())


def _one_row(**values) -> pa.Table:
    """A one-row block: ints as int64, bytes as large_binary (a chunk can pass 2 GiB)."""
    return pa.table({name: pa.array([value], pa.int64() if isinstance(value, int) else pa.large_binary())
                     for name, value in values.items()})
