"""What the core needs of a served model, declared once: the contract the core and the doors run on, as vLLM's core
runs on its EngineCoreClient and TEI's router on its Backend trait.

Two implementations, neither a look-alike of the other:

- in one process (and the engine process of `serve --workers N`): models.Models of models.ServedModel, each with
  its engine.engine.Engine, its batcher.Batcher and its metrics.ModelMetrics (statistics.InferenceStatistics);
- in a front-door worker of `serve --workers N`: workers/front.RemoteModels of RemoteModel, each with its
  EngineFront, RemoteBatcher and RemoteStatistics, across the ZeroMQ link to the engine process.

The core (core.py) holds a ModelsContract, and every door reaches models through the core only, so a member the
core starts reading must be declared here first, and mypy then checks both implementations for it (.ci/typecheck:
models.py and workers/front.py each end by assigning their class to ModelsContract, and server/app.py hands either
to Core), rather than `--workers` failing at run time. tests/test_engine_contract.py checks the same at run time.

Members are read-only properties: an implementation may hold a narrower type (Engine for EngineContract) or
replace it (a manifest read again after a build).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from attnserve.engine.image_encoder import ImageEncoder
from attnserve.engine.manifest import Manifest
from attnserve.engine.multi_vector import MultiVectorTokenizer
from attnserve.engine.output_options import OutputHeads
from attnserve.engine.rows import RowOutput
from attnserve.engine.tokenizer import TextTokenizer

from .batcher import QueuedInput

if TYPE_CHECKING:  # models.py's generic base is bound to ModelContract (a run-time import would be circular)
    from .models import ModelInfo

__all__ = ["BatcherContract", "EngineContract", "MetricsContract", "ModelContract", "ModelsContract",
           "StatisticsContract"]


@runtime_checkable
class EngineContract(Protocol):
    """What the core reads of a model's engine (one task's, for a model with task adapters): the host-side parts a
    request is prepared with, and require() for a graph a request needs that is not built yet."""

    @property
    def manifest(self) -> Manifest:
        """The manifest as it is now: a build may add variants (require)."""
        ...

    @property
    def tokenizer(self) -> TextTokenizer: ...

    @property
    def multi_vector(self) -> MultiVectorTokenizer | None:
        """A ColBERT model's query and document inputs; None for other models."""
        ...

    @property
    def heads(self) -> OutputHeads:
        """Its output heads, which a reply is assembled with (engine/outputs.py): the tokenizer, a ColBERT model's
        inputs, bge-m3's sparse and ColBERT heads."""
        ...

    @property
    def takes_token_types(self) -> bool:
        """Whether the graph takes token_type_ids."""
        ...

    @property
    def images(self) -> ImageEncoder | None:
        """An image-text model's image tower, which decodes and preprocesses a request's images; None: a text model."""
        ...

    def require(self, needs: Sequence[str], what: str) -> Manifest:
        """The manifest, once the variants `needs` names are built (engine/engine.py Engine.require); it raises
        GraphBuildingError while they are built, GraphUnavailableError where they cannot be. Called off the event
        loop."""
        ...


@runtime_checkable
class BatcherContract(Protocol):
    """A model's (one task's) queue, as the core submits to it (batcher.py Batcher)."""

    def check_room(self, n_inputs: int) -> None:
        """Refuse a request before any work is spent on it (QueueFullError, ShuttingDownError, EngineStoppedError)."""
        ...

    async def submit(self, inputs: Sequence[QueuedInput], attention: bool, deadline: float | None,
                     last_layer: bool = False, token_states: bool = True) -> list[RowOutput]:
        """One request's inputs queued; their rows, in the order given. Cancelled, its inputs not run are dropped."""
        ...


@runtime_checkable
class StatisticsContract(Protocol):
    """A model's request statistics, as the core records each request's outcome (statistics.py)."""

    def request(self, ok: bool, seconds: float) -> None: ...


@runtime_checkable
class MetricsContract(Protocol):
    """What the core records of a model (metrics.py ModelMetrics): its Triton statistics."""

    @property
    def statistics(self) -> StatisticsContract: ...


@runtime_checkable
class ModelContract(Protocol):
    """One served model, as the core and the doors read it."""

    @property
    def name(self) -> str:
        """The name it is served under."""
        ...

    @property
    def info(self) -> ModelInfo:
        """Its description and the server's limits, as every door describes them."""
        ...

    @property
    def pooling(self) -> str:
        """What a request that names no pooling gets: "default" (the graph's own) or serve --pooling's."""
        ...

    @property
    def engine(self) -> EngineContract:
        """The model's own engine (no task adapter)."""
        ...

    @property
    def batcher(self) -> BatcherContract: ...

    @property
    def metrics(self) -> MetricsContract: ...

    def for_task(self, task: str | None) -> tuple[EngineContract, BatcherContract]:
        """The engine and batcher of a request's task (None: the model's own), or InvalidInputError for a task the
        model has no adapter for."""
        ...


@runtime_checkable
class ModelsContract(Protocol):
    """The served models, the default first, found by any of their names."""

    @property
    def all(self) -> Sequence[ModelContract]: ...

    @property
    def default(self) -> ModelContract: ...

    @property
    def names(self) -> list[str]:
        """Every name a request may use, each model's in turn."""
        ...

    def get(self, name: str | None) -> ModelContract:
        """The model a request names (None or "": the default), or ModelNotFoundError naming those served."""
        ...

    async def statistics(self, name: str, version: str | None) -> dict:
        """Triton's statistics of the model named, or of every model when name is empty (KServe's doors)."""
        ...
