"""The models one server serves: where each comes from (--artifacts, --model NAME=DIR, --model-repository DIR),
the names a request may call it by, and per model its engine, its own batcher, its metrics and its description.

Every request names its model or takes the default one (the first given, or the first folder of a repository by
name); the core resolves the name here, once, for every door. The onnxruntime threads are shared out: each of N
models gets max(1, T // N) intra-op threads, T being --threads or, at 0, one per physical core, so that models
running batches at the same time do not oversubscribe the cores. A single model keeps --threads as it is.

ServedModel and Models are the in-process implementation of the contract the core runs on (contract.py
ModelContract, ModelsContract); a front-door worker of `serve --workers N` has the other (workers/front.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from attnserve import __version__
from attnserve.config import EngineConfig, ServerConfig
from attnserve.engine.engine import Engine
from attnserve.engine.manifest import REQUEST_POOLINGS, Manifest
from attnserve.engine.quantize import EMBEDDING_TYPES, RANGED
from attnserve.engine.session import CPU
from attnserve.engine.tasks import check_task, task_directory
from attnserve.errors import ConfigError, ModelNotFoundError

from .batch_pairs import BatchPairs
from .batcher import Batcher, BatcherLimits
from .contract import ModelContract, ModelsContract
from .metrics import Metrics, ModelMetrics
from .model_sources import ModelSource

log = logging.getLogger("attnserve.server")


def request_poolings(manifest: Manifest, served: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the poolings a request may name, those under which int8 and uint8 need the request's ranges), for a model
    served with `served` (served_pooling) as what "default" means (server/requests.py prepare and _ranges)."""
    dense = manifest.kind == "embedder" and not manifest.sparse and manifest.multi_vector is None
    if dense and manifest.poolable_at_request_time:
        named: tuple[str, ...] = ("default", *REQUEST_POOLINGS)
    else:
        named = ("default", manifest.pooling) if manifest.pooling in REQUEST_POOLINGS else ("default",)
    ranged = tuple(p for p in named if (served if p == "default" else p) not in ("default", manifest.pooling))
    return named, ranged


def served_pooling(name: str, manifest: Manifest, pooling: str) -> str:
    """What a request to this model that names no pooling gets under the server's --pooling: "default" (the
    graph's own) or a pooling of the token embeddings. It applies to dense embedding models; a reranker's scores, a
    SPLADE model's weights and a ColBERT model's vectors have no pooling to choose. A dense model whose sentence
    embedding is not a plain pooling (a Dense layer after it, two poolings) cannot be served with another: the
    start is refused rather than answer with vectors that are not what was configured."""
    if pooling == "default" or manifest.pooling == pooling:
        return "default"
    if manifest.kind != "embedder" or manifest.sparse or manifest.multi_vector is not None:
        kind = "a reranker" if manifest.kind != "embedder" else "sparse" if manifest.sparse else "multi-vector"
        log.info("--pooling %s does not apply to model %s (%s): it has no pooling to choose", pooling, name, kind)
        return "default"
    if not manifest.poolable_at_request_time:
        raise ConfigError(f"--pooling {pooling}: model {name!r} cannot be pooled otherwise: its pipeline is "
                          f"{' -> '.join(manifest.modules)}, and its sentence embedding is more than a pooling of "
                          "its token embeddings; serve it without --pooling")
    return pooling


# A precision in full, as TEI's Info names a model's dtype (both of TEI's doors: HTTP /info, gRPC Info).
VERSION = "1"  # every model's one version (KServe v2 names versions)
DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "int8": "int8", "bf16": "bfloat16"}


@dataclass(frozen=True)
class ModelInfo:
    """A model and the server's limits, as every door describes them."""

    model: str  # the name it is served under
    names: tuple[str, ...]  # that name and the aliases a request may use for it
    hidden_size: int
    embedding_size: int  # of each sentence embedding: differs from hidden_size with Dense or several poolings
    num_layers: int
    num_heads: int
    max_seq_length: int
    vocab_size: int
    pooling: str
    normalize: bool
    provider: str
    precision: str
    version: str
    max_inputs_per_request: int
    max_batch_tokens: int
    max_batch_size: int
    max_queue_tokens: int
    max_request_bytes: int
    max_response_bytes: int
    max_wait_ms: float
    max_queue_wait_ms: float
    auto_truncate: bool = True  # whether a request that does not say `truncate` has an over-long input taken
    long_inputs: str = "truncate"  # how (--long-inputs): truncate, chunk, or refuse (auto_truncate false)
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)  # the checkpoint's, by name
    default_prompt_name: str | None = None
    kind: str = "embedder"  # or "reranker" (manifest.kind)
    num_labels: int = 0  # a reranker's scores per pair
    tasks: tuple[str, ...] = ()  # the task adapters a request may choose (jina v3), none for other models
    labels: tuple[str, ...] = ()  # a reranker's (a classifier's) label names, in output order
    # What the model gives, by the request that asks for it: an embedder "embed" (its sentence embeddings, and token
    # embeddings), "attention" and "similarity" (a SPLADE model also "embed_sparse"); a reranker "rerank" (one label)
    # and "predict"; a ColBERT model "embed_multi" and "rerank".
    outputs: tuple[str, ...] = ()
    # The sentence embedding's types a request may ask for without ranges of its own (engine/quantize.py): int8
    # and uint8 where the artifacts hold calibration embeddings.
    embedding_types: tuple[str, ...] = ()
    multi_vector_size: int = 0  # a ColBERT model's or bge-m3's vectors' size; 0: it gives none
    # The values a request's `pooling` may take ("default": the model's own, or the server's --pooling), and those
    # under which int8 and uint8 embeddings need the request's own ranges (the model's are of its own pooling).
    request_poolings: tuple[str, ...] = ("default",)
    ranged_poolings: tuple[str, ...] = ()
    # An image-text model's image tower: (image_size, patch_size, num_layers, num_heads, max_patches); image_size 0
    # and max_patches the most an image has for SigLIP 2's NaFlex (images of their own size); None for a text model.
    image_tower: tuple[int, int, int, int, int] | None = None


def model_outputs(manifest: Manifest) -> tuple[str, ...]:
    """What a model answers (ModelInfo.outputs)."""
    if manifest.kind == "reranker":
        if manifest.pair_template is not None:  # an LLM reranker: a templated (query, document) pair only
            return ("rerank",)
        # A cross-encoder also shows the attention of the pairs it scores.
        return ("rerank", "predict", "attention") if manifest.num_labels == 1 else ("predict", "attention")
    if manifest.multi_vector is not None:  # ColBERT: its vectors (of queries or documents), and MaxSim reranking
        return ("embed_multi", "rerank")
    if manifest.sparse:
        return ("embed", "embed_sparse", "attention", "similarity")
    if manifest.bge_m3 is not None:  # bge-m3: dense, sparse and ColBERT outputs of one pass
        return ("embed", "embed_sparse", "embed_multi", "attention", "similarity", "late_chunking")
    # Late chunking mean-pools token embeddings: where the model's embedding is a pooling of them. An image-text
    # model (CLIP, SigLIP) embeds images too, in its texts' space.
    # A static model (a token table and a mean: model/static_embedding.py) has no attention to show.
    return ("embed", *(("attention",) if manifest.static is None else ()), "similarity",
            *(("late_chunking",) if manifest.late_chunkable else ()),
            *(("embed_image",) if manifest.images is not None else ()))


def image_tower_info(images: dict) -> tuple[int, int, int, int, int]:
    """The manifest's images entry -> ModelInfo.image_tower: a NaFlex tower (max_patches) takes no one image size."""
    max_patches = int(images.get("max_patches", 0))
    return (0 if max_patches else int(images["image_size"]), int(images["patch_size"]), int(images["num_layers"]),
            int(images["num_heads"]), max_patches)


def physical_cores() -> int:
    """Physical cores this process may run on (onnxruntime's default thread count), from Linux's topology."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:
            return len(cpus)  # no topology to read: count logical CPUs
    return max(1, len(cores))


def thread_share(threads: int, models: int) -> int:
    """Intra-op threads of each of `models` models: --threads (0: one per physical core) shared out evenly."""
    if models == 1:
        return threads
    return max(1, (threads or physical_cores()) // models)


class ServedModel:
    """One model: its engine, its own batcher (run in its own inference thread) and its metrics; a model with
    per-task adapters (jina v3) has an engine and a batcher per task too, sharing that one inference thread: each
    batcher owns its task's queue, so a batch never mixes tasks, and the tasks' batches take turns on the cores."""

    def __init__(self, name: str, aliases: tuple[str, ...], engine: Engine, config: ServerConfig,
                 metrics: Metrics, task_engines: dict[str, Engine] | None = None):
        self.name, self.engine = name, engine
        if config.max_queue_tokens < engine.manifest.served_max_length:
            raise ConfigError(f"max_queue_tokens {config.max_queue_tokens} cannot hold one input of "
                              f"max_seq_length {engine.manifest.served_max_length} (model {name!r})")
        self.metrics: ModelMetrics = metrics.for_model(name)
        gpu = engine.provider != CPU
        self.in_flight = config.batches_in_flight_on(gpu)
        # --pair-batches: each engine's graph also on half the threads, run in two threads of their own; the batchers
        # share one account of the cores (batch_pairs.py), and the full-width batches keep one thread.
        self.pairs = BatchPairs(ThreadPoolExecutor(2, thread_name_prefix=f"attnserve-half-{name}")
                                ) if config.pairs_batches_on(gpu) else None
        self.inference = ThreadPoolExecutor(1 if self.pairs else self.in_flight,
                                            thread_name_prefix=f"attnserve-inference-{name}")
        if self.pairs is not None:
            for each in (engine, *(task_engines or {}).values()):
                each.open_narrow_session()
        self.batcher = self._batcher(engine, config)
        self.tasks = {task: (task_engine, self._batcher(task_engine, config))
                      for task, task_engine in (task_engines or {}).items()}
        # serve --build: what each engine lacks of the graphs named, built once the server serves (start_builds);
        # a name of no graph fails the start here, before anything serves.
        self._builds = [(e, e.build_names(config.build)) for e in (engine, *(t for t, _ in self.tasks.values()))]
        m, batch = engine.manifest, self.batcher.limits
        self.pooling = served_pooling(name, m, config.pooling)
        poolings, ranged_poolings = request_poolings(m, self.pooling)
        self.info = ModelInfo(
            model=name, names=(name, *aliases),
            hidden_size=m.hidden_size, embedding_size=m.embedding_size, num_layers=m.num_layers, num_heads=m.num_heads,
            max_seq_length=m.served_max_length, vocab_size=m.vocab_size,
            pooling=m.pooling if self.pooling == "default" else self.pooling, normalize=m.normalize,
            provider=engine.provider, precision=engine.precision, version=__version__,
            # The configured limit; batches may be planned smaller where calibration timed that faster (its
            # start-up line says so).
            max_inputs_per_request=config.max_inputs_per_request, max_batch_tokens=engine.config.max_batch_tokens,
            max_batch_size=batch.max_batch_size, max_queue_tokens=batch.max_queue_tokens,
            max_request_bytes=config.max_request_bytes, max_response_bytes=config.max_response_bytes,
            max_wait_ms=batch.max_wait_s * 1e3, max_queue_wait_ms=batch.max_queue_wait_s * 1e3,
            auto_truncate=config.long_inputs != "refuse", long_inputs=config.long_inputs,
            prompts=dict(m.prompts), default_prompt_name=m.default_prompt_name, kind=m.kind, num_labels=m.num_labels,
            tasks=m.tasks, labels=m.label_names if m.kind == "reranker" else (), outputs=model_outputs(m),
            # A ColBERT model's vectors are float only; a reranker has no embeddings.
            # int8 and uint8 need the model's ranges: held, or built when first asked for (engine/builds.py).
            embedding_types=() if m.kind == "reranker" else ("float",) if m.multi_vector is not None else tuple(
                t for t in EMBEDDING_TYPES if t not in RANGED or m.quantization is not None or m.source is not None),
            request_poolings=poolings, ranged_poolings=ranged_poolings,
            multi_vector_size=int(m.bge_m3["colbert_dim"]) if m.bge_m3 is not None else
            m.embedding_size if m.multi_vector is not None else 0,
            image_tower=None if m.images is None else image_tower_info(m.images))

    def shutdown(self) -> None:
        """Stop the inference threads, once their batches have ended."""
        self.inference.shutdown(wait=True)
        if self.pairs is not None:
            self.pairs.executor.shutdown(wait=True)

    def start_builds(self) -> None:
        """Start building serve --build's graphs in the background, where the model lacks them: the first calls
        that need them then wait for less, or not at all (server/build_wait.py)."""
        for engine, names in self._builds:
            engine.build_in_background(names, "serve --build named them")

    def _batcher(self, engine: Engine, config: ServerConfig) -> Batcher:
        return Batcher(engine.run, BatcherLimits(
            engine.batch_tokens, engine.config.max_batch_size, config.max_queue_tokens,
            config.max_wait_ms / 1e3, config.max_queue_wait_ms / 1e3, self.in_flight,
            engine.config.batch_cost_tokens), self.metrics,
            self.inference, self.pairs)

    def for_task(self, task: str | None) -> tuple[Engine, Batcher]:
        """The engine and batcher of a request's task (None: the model's own, no adapter), or InvalidInputError
        for a task the model has no adapter for."""
        check_task(self.engine.manifest, task)
        return (self.engine, self.batcher) if task is None else self.tasks[task]

    def calibrate(self, stop: threading.Event | None = None) -> None:
        """The graph timing a first start on this CPU deferred (Engine.calibrate_pending), for the model and each
        task, run now (seconds, beside the requests being served), its batches planned at the budget it chose.
        stop: a drain's (engine/calibration.py CalibrationStopped once set)."""
        for engine, batcher in [(self.engine, self.batcher), *self.tasks.values()]:
            how = engine.calibrate_pending(stop)
            if how is not None:
                batcher.limits = dataclasses.replace(batcher.limits, max_batch_tokens=engine.batch_tokens)
                log.info("calibrated %s: %s", self.name, how, extra={"fields": {
                    "event": "calibrated", "model": self.name, "graph": engine.embeddings_variant.name,
                    "batch_tokens": engine.batch_tokens}})

    @property
    def batchers(self) -> list[Batcher]:
        """Every batcher of the model: its own and its tasks'."""
        return [self.batcher, *(batcher for _, batcher in self.tasks.values())]


M = TypeVar("M", bound=ModelContract)


class NamedModels(Generic[M]):
    """The served models in order, the default first, found by any of their names: what both implementations of
    contract.ModelsContract share, Models here and a front-door worker's RemoteModels (workers/front.py)."""

    def __init__(self, models: list[M]):
        assert models, "a server serves at least one model"
        self.all = models
        self.default = models[0]
        self._by_name = {name: model for model in models for name in model.info.names}

    def get(self, name: str | None) -> M:
        """The model a request names (None or "": the default), or ModelNotFoundError naming those served."""
        if not name:
            return self.default
        model = self._by_name.get(name)
        if model is None:
            raise ModelNotFoundError(f"the model {name!r} does not exist here; this server serves "
                                     + ", ".join(repr(n) for n in self._by_name))
        return model

    @property
    def names(self) -> list[str]:
        """Every name a request may use, each model's in turn."""
        return list(self._by_name)


class Models(NamedModels[ServedModel]):
    """The models this process serves (contract.ModelsContract in one process, and in the engine process of
    `serve --workers N`): each its engine, batcher and metrics."""

    @classmethod
    def load(cls, sources: list[ModelSource], engine_config: EngineConfig, config: ServerConfig,
             metrics: Metrics) -> Models:
        """Open every model's sessions (each with its share of the threads); a name given twice is refused."""
        # Each model's share of the threads; by default they spin within a batch, not between (EngineConfig.spin_wait).
        serving = dataclasses.replace(engine_config, threads=thread_share(engine_config.threads, len(sources)),
                                      spin_wait="run" if engine_config.spin_wait == "auto" else engine_config.spin_wait)
        # A first start on a CPU serves at once and times its graphs afterwards (calibrate_in_background).
        engines = [Engine.from_directory(source.directory, serving, attention=True, defer_calibration=True)
                   for source in sources]
        # A model with task adapters: one engine per task's merged graphs (engine/tasks.py).
        task_engines = [{task: Engine.from_directory(task_directory(engine.manifest, task), serving, attention=True,
                                                     defer_calibration=True)
                         for task in engine.manifest.tasks} for engine in engines]
        for engine in [*engines, *(e for tasks in task_engines for e in tasks.values())]:
            engine.background_builds()  # what a request needs that is not built yet (attention graphs)
        names = [source.name or engine.manifest.model for source, engine in zip(sources, engines, strict=True)]
        aliases = [tuple(config.served_model_name) if i == 0 else () for i in range(len(names))]
        seen: set[str] = set()
        for given in [n for name, alias in zip(names, aliases, strict=True) for n in (name, *alias)]:
            if given in seen:
                raise ConfigError(f"the model name {given!r} is given twice; each model and alias needs its own")
            seen.add(given)
        return cls([ServedModel(name, alias, engine, config, metrics, tasks)
                    for name, alias, engine, tasks in zip(names, aliases, engines, task_engines, strict=True)])

    async def statistics(self, name: str, version: str | None) -> dict:
        """Triton's statistics of the model named, or of every model when name is empty (KServe's doors)."""
        return model_statistics(self, name, version)


def check_version(info: ModelInfo, version: str | None) -> None:
    """version: as a request names it (KServe's doors); None or "": the model's one version."""
    if version and version != VERSION:
        raise ModelNotFoundError(f"the model {info.model!r} has no version {version!r}; its one version is "
                                 f"{VERSION!r}")


def model_statistics(models: Models, name: str, version: str | None) -> dict:
    """Triton's statistics of the model named, or of every model when name is empty, in their JSON form
    (server/statistics.py says what each counter counts)."""
    served = models.all if not name else [models.get(name)]
    for model in served:
        check_version(model.info, version)
    return {"model_stats": [model.metrics.statistics.as_dict(model.name, VERSION) for model in served]}


if TYPE_CHECKING:  # mypy checks this implementation against the contract the core runs on
    _contract: type[ModelsContract] = Models
