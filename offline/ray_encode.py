"""`attnserve encode --engine ray`: the chunk encoder that runs on a pool of Ray actors, one engine per actor.

The job driver (offline/job.py) reads and checks the input in this process, as for a local
run, and hands over chunks; each chunk's inputs (texts, token ids or image files' bytes, nothing
else) go to an actor as the arguments of one call, through Ray's object store, so the actors may sit on any
node of a cluster. An actor encodes the chunk with the code a local run uses
(rows.encode_inputs): the same chunk gives the same bits, so the output is the same file,
byte for byte, as a local run with the same --chunk-rows.

Plain Ray actors and calls, no Ray Data: a chunk is the unit of work, and the driver keeps
at most CHUNKS_PER_ACTOR chunks per actor in flight, so neither this process nor the object
store ever holds more than that of the input. Each call is a streaming generator that yields
a count per engine batch (the progress bar moves per batch) and then the chunk's result.
Results are taken in input order.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import queue
import sys
import threading
from collections import deque
from collections.abc import Generator, Iterator
from pathlib import Path

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine, embeddings_graph
from attnserve.engine.image_encoder import ImageEncoder
from attnserve.engine.manifest import load_manifest
from attnserve.engine.output_options import OutputOptions
from attnserve.errors import AttnserveError, ConfigError

from .encode import image_facts
from .job import Chunk, EncodedChunk, EncodeJob, EncodeResult, ModelFacts, Session, run_job
from .rows import LateChunks, Prompt, encode_inputs, inputs_of

# onnxruntime threads per actor when neither --threads nor --ray-actors says. Measured on a 2-core
# CPU, 2000 mixed-length texts in 8 chunks: 1 actor x 2 threads 4900-5300 tokens/s, 2 actors x 1
# thread 4700-4750 (the local engine 6200-6900); and one actor holds one engine in memory, not two.
THREADS_PER_ACTOR = 2
# How long the actor pool may take to start before the run gives up: a cluster without the CPUs asked for.
ACTOR_START_TIMEOUT_S = 600
# Chunks in flight per actor: the one it encodes and the next, already in its queue, so that it never
# waits for this process between chunks. This bounds the input held here and in the object store.
CHUNKS_PER_ACTOR = 2


def encode_file_ray(job: EncodeJob, config: EngineConfig, artifacts_dir: Path, ray_address: str | None = None,
                    ray_actors: int | None = None, **driver) -> EncodeResult:
    """The local job on Ray: the same output file, byte for byte, and the same errors."""
    _import_ray()
    if ray_actors is not None and ray_actors < 1:
        raise ConfigError(f"--ray-actors must be positive, got {ray_actors}")
    return run_job(job, RayEncoder(config, artifacts_dir, ray_address, ray_actors), **driver)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise AttnserveError("--engine ray needs the ray extra: pip install 'attnserve[ray]'") from None
    return ray


class RayEncoder:
    def __init__(self, config: EngineConfig, artifacts_dir: Path, address: str | None, actors: int | None):
        # The manifest alone says what runs: no session opens in this process. Its graph files are
        # checked (sha256) by each actor as it opens its engine.
        self.manifest = load_manifest(artifacts_dir, check_hashes=False)
        _, precision, self.graph = embeddings_graph(self.manifest, config)
        # The actors run what is fingerprinted: this graph, not one each calibrates on its own machine.
        self.config = dataclasses.replace(config, precision=precision, graph=self.graph.name)
        self.artifacts_dir, self.address, self.actors = artifacts_dir, address, actors

    def facts(self) -> ModelFacts:
        m = self.manifest
        return ModelFacts(m.model, m.embedding_size, m.vocab_size, m.served_max_length, m.pooling, m.normalize,
                          self.config.precision, self.graph.runs_as, quantization_ranges=m.quantization_ranges,
                          sparse=m.sparse, multi_vector=m.multi_vector is not None, late_chunking=m.late_chunkable,
                          bge_m3_vector_size=None if m.bge_m3 is None else int(m.bge_m3["colbert_dim"]),
                          # the tower each actor's engine opens beside this graph (no session opened here)
                          images=None if m.images is None else image_facts(
                              ImageEncoder(m, self.graph.precision, "cpu", sessions=False)))

    def encode(self, chunks: Iterator[Chunk], session: Session) -> Generator[EncodedChunk, None, None]:
        ray = _import_ray()
        started = _start_ray(ray, self.address)
        actors: list = []
        try:
            count, threads, cpus = _plan_actors(ray, self.config, self.actors, session.chunks_left)
            actor_class = ray.remote(num_cpus=cpus)(_EncoderActor)
            config = dataclasses.replace(self.config, threads=threads)
            actors = [actor_class.remote(str(self.artifacts_dir), config, session.options, session.prompt,
                                         session.input_type, session.late, session.outputs, session.image_pixels)
                      for _ in range(count)]
            _wait_ready(ray, actors)
            yield from _in_order(ray, actors, chunks, session)
        finally:
            if started:
                ray.shutdown()
            else:  # a cluster we joined: leave it as we found it
                for actor in actors:
                    ray.kill(actor)


# What Ray raises when a node it starts has not registered within its own fixed 30 s (a busy machine).
NODE_START_TIMEOUT = "timed out during startup"


def _start_ray(ray, address: str | None) -> bool:
    """Join `address`, or start a local Ray; False when this process already has one (it is left running).

    A local Ray whose node did not come up within Ray's own 30 s (it gives up on a loaded machine: two cores busy
    with other work) is shut down and started once more; a second failure is a one-line error."""
    if ray.is_initialized():
        return False
    for attempt in (1, 2):
        try:
            ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
            break
        except ConnectionError as e:
            raise ConfigError(f"cannot connect to Ray at {address}: {e}") from None
        except Exception as e:  # Ray raises a bare Exception for a node that did not start
            if address is not None or NODE_START_TIMEOUT not in str(e):
                raise
            ray.shutdown()  # what the first try started
            if attempt == 2:
                raise ConfigError(f"a local Ray did not start (twice): {str(e).splitlines()[0]}") from None
    _undo_colorama()
    return True


def _undo_colorama() -> None:
    """Ray's CLI logger, which ray.init imports, runs colorama.init(): colorama then wraps sys.stdout and
    sys.stderr and, at exit, writes a reset code (ESC [0m) to the terminal after our last line. Undo both."""
    initialise = sys.modules.get("colorama.initialise")
    if initialise is not None:
        atexit.unregister(initialise.reset_all)
        initialise.deinit()


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


def _wait_ready(ray, actors: list) -> None:
    """Every actor has opened its engine; its errors (artifacts missing on a node, say) are raised here."""
    calls = [actor.ready.remote() for actor in actors]
    _, waiting = ray.wait(calls, num_returns=len(calls), timeout=ACTOR_START_TIMEOUT_S)
    if waiting:
        raise ConfigError(f"Ray could not start {len(waiting)} of {len(actors)} actors within "
                          f"{ACTOR_START_TIMEOUT_S} s: the cluster lacks the CPUs they ask for (fewer --ray-actors "
                          "or --threads)")
    for call in calls:
        _get(ray, call)


def _in_order(ray, actors: list, chunks: Iterator[Chunk], session: Session) -> Iterator[EncodedChunk]:
    """Chunks to the least busy actor, at most CHUNKS_PER_ACTOR each in flight; results back in input order."""
    busy = [0] * len(actors)
    in_flight: deque = deque()  # (chunk, actor index, the call's generator of results), in input order
    chunks = iter(chunks)
    more = True
    while True:
        while more and len(in_flight) < CHUNKS_PER_ACTOR * len(actors):
            chunk = next(chunks, None)
            if chunk is None:
                more = False
                break
            i = min(range(len(actors)), key=busy.__getitem__)
            call = actors[i].encode.options(num_returns="streaming").remote(inputs_of(chunk.records))
            busy[i] += 1
            in_flight.append((chunk, i, call))
        if not in_flight:
            return
        chunk, i, call = in_flight.popleft()
        result: tuple | None = None  # the call's last item, after a count per batch
        for ref in call:
            item = _get(ray, ref)
            if isinstance(item, int):
                session.on_batch(item)
            else:
                result = item
        busy[i] -= 1
        # The actor's generator ends with the result or raises, which _get raises here: never with neither.
        assert result is not None
        embeddings, num_tokens, truncated, stats, refused, late_chunks, sparse, vectors = result
        for position, reason in refused.items():
            session.refuse(chunk.records[position], reason)
        yield EncodedChunk(chunk, embeddings, num_tokens, truncated, stats, refused, late_chunks, sparse, vectors)


def _get(ray, ref):
    """ray.get, with attnserve's own errors raised as themselves (one line) and an actor's death as one line."""
    from ray.exceptions import RayActorError, RayError

    try:
        return ray.get(ref)
    except RayActorError as e:
        raise AttnserveError(f"a Ray actor stopped while encoding ({type(e).__name__}); run the same command "
                             "again to resume") from None
    except RayError as e:
        cause = _attnserve_cause(e)
        if cause is None:
            raise
        raise type(cause)(str(cause)) from None


def _attnserve_cause(error: BaseException | None) -> AttnserveError | None:
    """The AttnserveError that a Ray error wraps (an actor's), if any.

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


class _EncoderActor:
    """One engine; a chunk's inputs in, a count per batch and then the chunk's encoded rows out."""

    def __init__(self, artifacts_dir: str, config: EngineConfig, options: OutputOptions, prompt: Prompt,
                 input_type: str = "document", late: LateChunks | None = None, outputs: tuple[str, ...] = (),
                 image_pixels: int | None = None):
        self.artifacts_dir, self.config, self.options, self.prompt = artifacts_dir, config, options, prompt
        self.input_type = input_type  # a ColBERT model's: its texts are its documents or its queries
        self.late = late  # late chunking's chunker, where the run asks for it
        self.outputs = outputs  # a bge-m3 model's columns, where the run asks for them
        self.image_pixels = image_pixels  # the inputs are images, decoded within this many pixels; None: texts
        self.engine: Engine | None = None

    def ready(self) -> bool:
        """Opens the engine; raised here, its errors reach the driver as themselves (a failed __init__ would not)."""
        self.engine = Engine.from_directory(self.artifacts_dir, self.config)
        return True

    def encode(self, inputs: list):
        """Yields the rows of each batch as it runs, then (embeddings, num_tokens, truncated, stats, refused,
        chunks, sparse, multi_vector): late chunking's spans and bge-m3's other outputs (Encoded's), or None.

        The engine runs in a thread of its own so that this generator can hand out the counts while it works.
        """
        engine = self.engine
        assert engine is not None, "ready() opens the engine first"  # the driver waits for it (_wait_ready)
        counts: queue.SimpleQueue = queue.SimpleQueue()
        outcome: list = []

        def work() -> None:
            try:
                outcome.append(encode_inputs(engine, inputs, self.options, counts.put, self.prompt,
                                             self.input_type, self.late, self.outputs, self.image_pixels))
            except BaseException as e:  # handed to the caller below, as if raised there
                outcome.append(e)
            finally:
                counts.put(None)

        thread = threading.Thread(target=work, name="attnserve-encode-chunk")
        thread.start()
        while (count := counts.get()) is not None:
            yield count
        thread.join()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        encoded, refused = outcome[0]
        yield (encoded.embeddings, encoded.num_tokens, encoded.truncated, encoded.stats, refused, encoded.chunks,
               encoded.sparse, encoded.multi_vector)
