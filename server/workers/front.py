"""A front-door worker's view of the engine process (`serve --workers N`): the models as the core reads them, with
their tokenizers and heads here and their batchers there. RemoteModels is the implementation of the contract the
core runs on (server/contract.py) across the link, as models.Models is in one process; mypy checks it against the
contract (the end of this module).

Each worker keeps one ZeroMQ DEALER connection to the engine process (EngineLink). A model's batcher here is a
RemoteBatcher: submit() sends the request's token ids and awaits its rows; cancelling it (the client left, the
deadline passed) cancels the submit in the engine, which drops its queued inputs. When the connection is lost (the
engine process died: ZeroMQ's monitor reports the disconnect at once), every request in flight ends with
EngineStoppedError (UNAVAILABLE / 503, retryable) and the worker stops serving.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from attnserve.config import EngineConfig
from attnserve.engine.engine import host_parts
from attnserve.engine.image_encoder import ImageEncoder
from attnserve.engine.manifest import Manifest, load_manifest
from attnserve.engine.rows import RowOutput
from attnserve.engine.tasks import check_task
from attnserve.errors import EngineStoppedError, GraphUnavailableError

from ..batcher import QueuedInput
from ..contract import ModelsContract
from ..models import ModelInfo, NamedModels
from . import wire

log = logging.getLogger("attnserve.server")
HELLO_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EngineEntry:
    """A model's (or one task's) engine as a worker needs it."""

    directory: Path
    takes_token_types: bool
    provider: str
    precision: str
    config: EngineConfig


@dataclass(frozen=True)
class ModelEntry:
    name: str
    info: ModelInfo
    pooling: str  # served_pooling's: what a request that names none gets
    engine: EngineEntry
    tasks: dict[str, EngineEntry]


@dataclass(frozen=True)
class ModelTable:
    models: list[ModelEntry]  # the default first


class EngineLink:
    """One worker's connection to the engine process."""

    def __init__(self, address: str, on_lost: Callable[[], None]):
        self._address, self._on_lost = address, on_lost
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.ROUTING_ID, f"worker-{os.getpid()}".encode())
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}
        self._outbox = wire.Outbox(self._send_now)
        self._tasks: list[asyncio.Task] = []
        self.lost = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._loop_thread: int | None = None

    async def connect(self) -> ModelTable:
        """Connect, and read the model table (the engine process is serving when it answers)."""
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._socket.connect(self._address)
        self._tasks = [self.loop.create_task(self._read(), name="attnserve-engine-link"),
                       self.loop.create_task(self._watch(self._monitor), name="attnserve-engine-watch")]
        head, frames = await asyncio.wait_for(self.call({"k": "hello"}), HELLO_TIMEOUT_S)
        table = wire.unpack_table(frames[0])
        assert isinstance(table, ModelTable)
        return table

    async def call(self, head: dict, frames: Sequence = ()) -> tuple[dict, list]:
        """Send a message and await its answer: (header, frames); an error answered is raised here. Cancelled, it
        cancels the engine's work for it."""
        if self.lost:
            raise EngineStoppedError("the server's engine process stopped; retry on another replica")
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        head["id"] = request_id
        try:
            self._outbox.put(head, frames)
            return await future
        except asyncio.CancelledError:
            if not self.lost:
                self.post({"k": "cancel", "id": request_id})
            raise
        finally:
            self._waiting.pop(request_id, None)

    def _send_now(self, frames: list) -> None:
        sent = asyncio.ensure_future(self._socket.send_multipart(frames, copy=False))  # no high-water mark: at once
        sent.add_done_callback(self._sent)

    def _sent(self, sent: asyncio.Future) -> None:
        error = None if sent.cancelled() else sent.exception()
        if error is not None and not self.lost:
            log.error("engine link: a message to the engine was not sent", exc_info=error)

    def post(self, head: dict) -> None:
        """A message that takes no answer (an outcome, a cancel)."""
        if not self.lost:
            self._outbox.put(head)

    async def _read(self) -> None:
        while True:
            frames = await self._socket.recv_multipart(copy=False)
            try:
                for head, body in wire.messages([f.buffer for f in frames]):
                    future = self._waiting.get(head["id"])
                    if future is None or future.done():
                        continue  # cancelled here before its answer came
                    if head["k"] == "error":
                        future.set_exception(wire.unpack_error(head["error"]))
                    else:
                        future.set_result((head, body))
            except Exception:  # noqa: BLE001 (a malformed message from our own engine is a bug: logged, not fatal)
                log.exception("engine link: a message from the engine could not be read")

    async def _watch(self, monitor) -> None:
        connected = False
        while True:
            event = await recv_monitor_message(monitor)
            if event["event"] == zmq.EVENT_CONNECTED:
                connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED and connected:
                self._lose()
                return

    def _lose(self) -> None:
        self.lost = True
        log.error("the engine process is gone: every request in flight ends with UNAVAILABLE, and this worker "
                  "stops serving", extra={"fields": {"event": "engine_lost"}})
        error = EngineStoppedError("the server's engine process stopped; retry on another replica")
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)
        self._on_lost()

    def call_from_thread(self, head: dict, timeout: float = 30.0) -> tuple[dict, list]:
        """call() from a thread of the pool (prepare's require): the loop runs it. Never from the loop's own thread,
        which would wait for itself (requests.light keeps such requests off the loop)."""
        assert self.loop is not None
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("the engine link was called synchronously from its own event loop")
        return asyncio.run_coroutine_threadsafe(self.call(head), self.loop).result(timeout)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Every socket closed before the context ends (term() waits for them).
        if self._monitor is not None:
            self._socket.disable_monitor()
            self._monitor.close(0)
        self._socket.close(0)
        self._context.term()


class RemoteBatcher:
    """A model's (or task's) batcher in the engine process, as the core submits to it (contract.BatcherContract)."""

    def __init__(self, link: EngineLink, model: str, task: str | None):
        self._link, self._model, self._task = link, model, task

    def check_room(self, n_inputs: int) -> None:
        """Admission is the engine's, at submit (one queue across every worker); here only a lost engine refuses."""
        if self._link.lost:
            raise EngineStoppedError("the server's engine process stopped; retry on another replica")

    async def submit(self, inputs: Sequence[QueuedInput], attention: bool, deadline: float | None,
                     last_layer: bool = False, token_states: bool = True) -> list[RowOutput]:
        metas, frames = wire.pack_inputs(inputs)
        head, body = await self._link.call({
            "k": "submit", "model": self._model, "task": self._task, "attention": attention, "deadline": deadline,
            "last_layer": last_layer, "token_states": token_states, "inputs": metas}, frames)
        return wire.unpack_rows(head["rows"], body)


class EngineFront:
    """What the core reads of a model's engine, in a worker (contract.EngineContract): the manifest, tokenizers and
    heads; a graph a request needs is required of the engine process, which builds it (GraphBuildingError until
    then)."""

    def __init__(self, entry: EngineEntry, link: EngineLink, model: str, task: str | None):
        self.manifest: Manifest = load_manifest(entry.directory)
        self.heads = host_parts(self.manifest)
        self.tokenizer, self.multi_vector = self.heads.tokenizer, self.heads.multi_vector
        self.takes_token_types, self.provider, self.precision = (entry.takes_token_types, entry.provider,
                                                                 entry.precision)
        # An image-text model's images are decoded and preprocessed here, and run in the engine process.
        self.images = None if self.manifest.images is None else ImageEncoder(
            self.manifest, entry.precision, entry.provider, sessions=False)
        self.config = entry.config
        self._link, self._model, self._task = link, model, task

    def require(self, needs: Sequence[str], what: str) -> Manifest:
        """The manifest, once what is needed is built (Engine.require, in the engine process)."""
        try:
            self._link.call_from_thread({"k": "require", "model": self._model, "task": self._task,
                                         "needs": list(needs), "what": what})
        except TimeoutError:
            raise GraphUnavailableError(f"{what}: the engine process did not answer in time; retry") from None
        self.manifest = load_manifest(self.manifest.directory)  # what the engine built is in it now
        return self.manifest


class RemoteStatistics:
    """A model's statistics as a worker's core records them (contract.StatisticsContract): each request's outcome,
    to the engine's."""

    def __init__(self, link: EngineLink, model: str):
        self._link, self._model = link, model

    def request(self, ok: bool, seconds: float) -> None:
        self._link.post({"k": "outcome", "model": self._model, "ok": ok, "seconds": seconds})


@dataclass(frozen=True)
class RemoteMetrics:
    """What a worker's core records of a model (contract.MetricsContract): its statistics, kept by the engine
    process, which serves the metrics."""

    statistics: RemoteStatistics


class RemoteModel:
    """One served model in a worker (contract.ModelContract), as ServedModel is in one process."""

    def __init__(self, entry: ModelEntry, link: EngineLink):
        self.name, self.info, self.pooling = entry.name, entry.info, entry.pooling
        self.engine = EngineFront(entry.engine, link, entry.name, None)
        self.batcher = RemoteBatcher(link, entry.name, None)
        self.tasks = {task: (EngineFront(e, link, entry.name, task), RemoteBatcher(link, entry.name, task))
                      for task, e in entry.tasks.items()}
        self.metrics = RemoteMetrics(RemoteStatistics(link, entry.name))

    def for_task(self, task: str | None) -> tuple[EngineFront, RemoteBatcher]:
        """The engine and batcher of a request's task (None: the model's own), as ServedModel.for_task."""
        check_task(self.engine.manifest, task)
        return (self.engine, self.batcher) if task is None else self.tasks[task]


class RemoteModels(NamedModels[RemoteModel]):
    """The served models in a worker, the default first (contract.ModelsContract)."""

    def __init__(self, table: ModelTable, link: EngineLink):
        super().__init__([RemoteModel(entry, link) for entry in table.models])
        self._link = link

    async def statistics(self, name: str, version: str | None) -> dict:
        """Triton's statistics (open_inference.model_statistics), kept by the engine process for every worker."""
        head, _ = await self._link.call({"k": "stats", "model": name, "version": version})
        return head["stats"]


if TYPE_CHECKING:  # mypy checks this implementation against the contract the core runs on
    _contract: type[ModelsContract] = RemoteModels
