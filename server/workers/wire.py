"""What crosses between a front-door worker and the engine process (`serve --workers N`), over one ZeroMQ
connection each: a msgspec-encoded header frame listing the messages it carries, then each numpy array of each
message as a raw frame of its own. A sender gathers what it has to send over one turn of its event loop into one
ZeroMQ message (Outbox): under load, the replies of a batch, or the requests a worker took in one turn, cost one
send and one wake-up instead of one each.

Arrays are never pickled: pyzmq sends an array's own buffer (copy=False), and the receiver views the frame it got
(np.frombuffer), so token ids, embeddings and attention maps are written once into the message and read in place.
A row's attention maps are a strided view into their batch's array and are made contiguous once, to be sent.

Messages, by header["k"]:
  worker -> engine   hello {id}; submit {id, model, task, attention, deadline, last_layer, token_states, inputs}
                     + its inputs' arrays; cancel {id}; outcome {model, ok, seconds}; stats {id, model, version}
  engine -> worker   table {id, table}; rows {id, rows} + the rows' arrays; error {id, error}; stats {id, stats}
The deadline is a time.monotonic() value: CLOCK_MONOTONIC is one clock for every process of the machine.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable, Iterator, Sequence

import msgspec
import numpy as np

from attnserve import errors
from attnserve.engine.image_encoder import ImageInput
from attnserve.engine.rows import RowOutput
from attnserve.engine.tokenizer import TokenizedInput

_ENCODE = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder()
# RowOutput's array fields, in the order their frames follow a row's header.
# RowOutput.normalized is not sent: it is sentence_embedding normalised, which the worker's reply computes again
# rather than have every embedding cross the link twice.
ROW_ARRAYS = ("sentence_embedding", "token_embeddings", "attentions", "scores", "value_norms", "rollout")


class Outbox:
    """Messages to one peer, sent together at the end of the event loop's turn: send(frames) sends one ZeroMQ
    message (it must not block)."""

    def __init__(self, send: Callable[[list], None]):
        self._send = send
        self._heads: list[dict] = []
        self._frames: list = []
        self._scheduled = False

    def put(self, head: dict, frames: Sequence = ()) -> None:
        head["n"] = len(frames)
        self._heads.append(head)
        self._frames.extend(frames)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        heads, frames = self._heads, self._frames
        self._heads, self._frames = [], []
        if heads:
            self._send([_ENCODE.encode(heads), *frames])


def messages(frames: Sequence) -> Iterator[tuple[dict, list]]:
    """Each (header, its frames) of one ZeroMQ message an Outbox sent (frames: its buffers)."""
    at = 1
    for head in _DECODE.decode(frames[0]):
        n = head["n"]
        yield head, list(frames[at:at + n])
        at += n


def _array_meta(array: np.ndarray) -> list:
    return [array.dtype.str, list(array.shape)]


def _view(meta: list, frame) -> np.ndarray:
    dtype, shape = meta
    return np.frombuffer(frame, dtype=np.dtype(dtype)).reshape(shape)


# --- inputs ------------------------------------------------------------------------------------------------------


def pack_inputs(inputs: Sequence[TokenizedInput | ImageInput]) -> tuple[list, list[np.ndarray]]:
    """(each input's header [truncated, has token types, pair_start, attended, unpooled], the arrays that follow):
    ids, then its token types where it has them; an image's header ["image", positions, its pixels' dtype and
    shape], then its pixels."""
    metas, frames = [], []
    for x in inputs:
        if isinstance(x, ImageInput):
            metas.append(["image", int(x.positions), _array_meta(x.pixels)])
            frames.append(np.ascontiguousarray(x.pixels))
            continue
        metas.append([bool(x.truncated), x.type_ids is not None, None if x.pair_start is None else int(x.pair_start),
                      None if x.attended is None else int(x.attended), int(x.unpooled)])
        frames.append(np.ascontiguousarray(x.ids, dtype=np.int64))
        if x.type_ids is not None:
            frames.append(np.ascontiguousarray(x.type_ids, dtype=np.int64))
    return metas, frames


def unpack_inputs(metas: list, frames: Sequence) -> list[TokenizedInput | ImageInput]:
    out: list[TokenizedInput | ImageInput] = []
    i = 0
    for meta in metas:
        if meta[0] == "image":
            out.append(ImageInput(_view(meta[2], frames[i]), int(meta[1])))
            i += 1
            continue
        truncated, has_types, pair_start, attended, unpooled = meta
        ids = np.frombuffer(frames[i], dtype=np.int64)
        i += 1
        types = None
        if has_types:
            types = np.frombuffer(frames[i], dtype=np.int64)
            i += 1
        out.append(TokenizedInput(ids, truncated, types, pair_start, attended, unpooled))
    if i != len(frames):
        raise ValueError(f"{len(frames)} input frames for inputs that take {i}")
    return out


# --- rows --------------------------------------------------------------------------------------------------------


def pack_rows(rows: Sequence[RowOutput]) -> tuple[list, list]:
    """(each row's header: its arrays' dtype and shape, None where absent, and its map layers; the arrays)."""
    metas, frames = [], []
    for row in rows:
        arrays: list[list | None] = []
        for name in ROW_ARRAYS:
            array = getattr(row, name)
            if array is None:
                arrays.append(None)
                continue
            array = np.ascontiguousarray(array)
            arrays.append(_array_meta(array))
            frames.append(array)
        metas.append([arrays, list(row.map_layers) if row.map_layers is not None else None])
    return metas, frames


def unpack_rows(metas: list, frames: Sequence) -> list[RowOutput]:
    rows, i = [], 0
    for arrays, map_layers in metas:
        values: dict[str, np.ndarray | None] = {}
        for name, meta in zip(ROW_ARRAYS, arrays, strict=True):
            if meta is None:
                values[name] = None
            else:
                values[name] = _view(meta, frames[i])
                i += 1
        rows.append(RowOutput(values.pop("sentence_embedding"), values.pop("token_embeddings"),
                              values.pop("attentions"), **values,
                              map_layers=tuple(map_layers) if map_layers is not None else None))
    return rows


# --- errors ------------------------------------------------------------------------------------------------------


def pack_error(error: BaseException) -> dict:
    """An error a request met in the engine, as the worker raises it again: attnserve's own by class, message and
    attributes (retry_after, field, ...); anything else as a failed batch (the engine logged it)."""
    if isinstance(error, errors.AttnserveError):
        try:
            attributes = {k: v for k, v in vars(error).items() if _plain(v)}
            return {"type": type(error).__name__, "message": str(error), "attributes": attributes}
        except TypeError:
            pass
    return {"type": "BatchFailedError", "message": f"the server's engine failed ({type(error).__name__}); retry",
            "attributes": {}}


def _plain(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool)) or (
        isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) for v in value))


def unpack_error(packed: dict) -> errors.AttnserveError:
    cls = getattr(errors, packed["type"], None)
    if not (isinstance(cls, type) and issubclass(cls, errors.AttnserveError)):
        cls = errors.BatchFailedError
    error = cls.__new__(cls)
    Exception.__init__(error, packed["message"])
    for name, value in packed["attributes"].items():
        setattr(error, name, tuple(value) if isinstance(value, list) else value)
    return error


# --- the model table (once per worker, between our own processes) -------------------------------------------------


def pack_table(table: object) -> bytes:
    return pickle.dumps(table)


def unpack_table(raw) -> object:
    return pickle.loads(raw)  # noqa: S301 (our own engine process, over a socket only our processes can open)
