"""The engine process's side of `serve --workers N`: one ZeroMQ ROUTER socket on the engine's event loop, beside the
batchers. Every worker's submit goes to its model's batcher, so there is still one length-sorted queue per model
(and per task) across every worker's requests, and admission (QueueFullError), deadlines and the drain are decided
there, as in one process. Each submit runs as a task of its own, cancelled when its worker cancels it (its client
left, its deadline passed) or dies; a cancelled submit's queued inputs are dropped by the batcher as ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial

import zmq
import zmq.asyncio

from ..models import Models, model_statistics
from . import wire

log = logging.getLogger("attnserve.server")


class EngineService:
    def __init__(self, models: Models, table: Callable[[], object]):
        """table(): what a worker's hello is answered with (front.ModelTable), read when asked: calibration may
        change a model's batch budget after the start."""
        self._models, self._table = models, table
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a worker that is gone raises, not vanishes
        # No high-water mark: what is queued is bounded by admission (the batchers' queues) and the replies due.
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._pending: dict[tuple[bytes, int], asyncio.Task] = {}
        self._outboxes: dict[bytes, wire.Outbox] = {}  # per worker
        self._reader: asyncio.Task | None = None
        self.greeted = 0  # hellos answered: workers that started serving, restarted ones included
        self._greeting = asyncio.Event()

    def bind(self, address: str) -> None:
        self._socket.bind(address)

    def start(self) -> None:
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="attnserve-engine-service")

    async def _read(self) -> None:
        while True:
            frames = await self._socket.recv_multipart(copy=False)
            identity = frames[0].bytes
            try:
                messages = list(wire.messages([f.buffer for f in frames[1:]]))
            except Exception:  # noqa: BLE001 (a malformed message from our own worker is a bug: logged, not fatal)
                log.exception("engine link: a worker's message could not be read")
                continue
            for message, body in messages:
                try:
                    self._take(identity, message, body)
                except Exception as error:  # noqa: BLE001 (the rest of the messages still taken)
                    log.exception("engine link: a worker's message could not be taken")
                    if "id" in message and message.get("k") != "cancel":  # its caller waits: it gets the error
                        self._send(identity, {"k": "error", "id": message["id"], "error": wire.pack_error(error)})

    def _take(self, identity: bytes, message: dict, body: list) -> None:
        kind = message["k"]
        if kind == "submit":
            key = (identity, message["id"])
            task = asyncio.get_running_loop().create_task(self._submit(identity, message, body))
            self._pending[key] = task
            task.add_done_callback(lambda _: self._pending.pop(key, None))
        elif kind == "cancel":
            pending = self._pending.get((identity, message["id"]))
            if pending is not None:
                pending.cancel()
        elif kind == "outcome":
            self._models.get(message["model"]).metrics.statistics.request(message["ok"], message["seconds"])
        elif kind == "stats":
            self._answer(identity, message["id"], lambda: {
                "k": "stats", "stats": model_statistics(self._models, message["model"], message["version"])})
        elif kind == "require":
            def require() -> dict:
                engine, _ = self._models.get(message["model"]).for_task(message["task"])
                engine.require(message["needs"], message["what"])
                return {"k": "done"}
            self._answer(identity, message["id"], require)
        elif kind == "hello":
            self._send(identity, {"k": "table", "id": message["id"]}, [wire.pack_table(self._table())])
            self.greeted += 1
            self._greeting.set()
        else:
            raise ValueError(f"unknown message kind {kind!r}")

    def _answer(self, identity: bytes, request_id: int, answer: Callable[[], dict]) -> None:
        try:
            reply = answer()
        except Exception as error:  # noqa: BLE001 (every error goes back to the worker that asked)
            reply = {"k": "error", "error": wire.pack_error(error)}
        reply["id"] = request_id
        self._send(identity, reply)

    async def _submit(self, identity: bytes, message: dict, body: list) -> None:
        request_id = message["id"]
        try:
            model = self._models.get(message["model"])
            _, batcher = model.for_task(message["task"])
            inputs = wire.unpack_inputs(message["inputs"], body)
            rows = await batcher.submit(inputs, message["attention"], message["deadline"], message["last_layer"],
                                        message["token_states"])
            metas, arrays = wire.pack_rows(rows)
            self._send(identity, {"k": "rows", "id": request_id, "rows": metas}, arrays)
        except asyncio.CancelledError:  # the worker cancelled it, or died: nobody waits for an answer
            raise
        except Exception as error:  # noqa: BLE001
            self._send(identity, {"k": "error", "id": request_id, "error": wire.pack_error(error)})

    def _send(self, identity: bytes, head: dict, frames: Sequence = ()) -> None:
        outbox = self._outboxes.get(identity)
        if outbox is None:
            outbox = self._outboxes[identity] = wire.Outbox(partial(self._send_now, identity))
        outbox.put(head, frames)

    def _send_now(self, identity: bytes, frames: list) -> None:
        # A worker's queue in ZeroMQ holds its replies until it reads them (no high-water mark: a reply is never
        # dropped for a busy worker); the send completes at once.
        sent = asyncio.ensure_future(self._socket.send_multipart([identity, *frames], copy=False))
        sent.add_done_callback(partial(_sent, identity))

    async def wait_greeted(self, count: int) -> None:
        """Until `count` workers have said hello."""
        while self.greeted < count:
            self._greeting.clear()
            await self._greeting.wait()

    def forget(self, identity: bytes) -> int:
        """A worker died: cancel its submits (their queued inputs are dropped). Returns how many there were."""
        self._outboxes.pop(identity, None)
        tasks = [task for (who, _), task in list(self._pending.items()) if who == identity]
        for task in tasks:
            task.cancel()
        return len(tasks)

    async def close(self) -> None:
        reader = self._reader
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        for task in list(self._pending.values()):
            task.cancel()
        self._socket.close(0)
        self._context.term()


def _sent(identity: bytes, sent: asyncio.Future) -> None:
    error = None if sent.cancelled() else sent.exception()
    if isinstance(error, zmq.ZMQError):  # the worker is gone (EHOSTUNREACH): its client got a reset connection
        log.info("engine link: worker %s is gone (%s)", identity.decode(errors="replace"), error.strerror)
    elif error is not None:
        log.error("engine link: a reply to worker %s was not sent", identity.decode(errors="replace"),
                  exc_info=error)
