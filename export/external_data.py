"""Where the graphs keep their weights: in data files beside them (ONNX external data), each tensor stored once.

Every graph of an artifact directory reads its weights from data files in the directory, never from inside the
graph file, for two reasons:
- a graph past protobuf's 2 GiB (a 0.6B model's fp32 weights are 2.4 GB) can only be written that way;
- graphs that hold the same tensor read it from the same place. The embeddings graph, the attention graphs and
  the plain half of the fused graph are one set of fp32 weights: written once, by the trace, into
  `weights.fp32.data` (weights_file). A graph built later from another (fused, int8, fp16) writes only the tensors
  it changed, into a data file of its own (`<graph>.onnx.data`, onnxruntime's naming), and reads every tensor it
  kept from where it already is (SharedWeights: tensors found by their bytes). The default artifact directory is
  then about its checkpoint's size, and `export --all` a little over twice it, where every graph once held its own
  copy (all-mpnet-base-v2: 2.2 GB for a 438 MB checkpoint).

Data files are written once and never changed: the manifest holds each one's sha256. Large tensors start at
ALIGNMENT in their file, so that onnxruntime and OpenVINO can map them into memory rather than copy them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from attnserve.engine.mapped_pages import external_files as external_files  # where the engine reads it too

# Tensors smaller than this stay inside the graph (onnx's and onnxruntime's default).
SIZE_THRESHOLD = 1024
# Tensors of ALIGN_ABOVE bytes or more start at a multiple of ALIGNMENT (onnx's align_offset defaults: 1 MiB and
# Windows' allocation granularity, which Linux's 4 KiB pages divide): onnxruntime maps such a tensor from the file
# instead of reading it into memory of its own (its ModelSavingOptions' comment), and so does OpenVINO.
ALIGN_ABOVE = 2**20
ALIGNMENT = 2**16


def data_file(graph: Path) -> Path:
    """Where a graph's own tensors go: beside it, named after it."""
    return graph.with_name(graph.name + ".data")


def weights_file(directory: Path, precision: str) -> Path:
    """The weights a trace writes, that every graph of the same precision reads: weights.fp32.data, ..."""
    return directory / f"weights.{precision}.data"


def has_external_data(path: Path) -> bool:
    return bool(external_files(path))


def save(model: onnx.ModelProto, path: Path, external: bool = True) -> None:
    """Write a model whose tensors are in memory, with those of SIZE_THRESHOLD bytes or more in data_file(path) (an
    old data file is replaced, never appended to); external False: all inside the graph file (a small graph)."""
    if not external:
        onnx.save_model(model, str(path))
        return
    data_file(path).unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_file(path).name, size_threshold=SIZE_THRESHOLD)


def tensor_bytes(tensor: onnx.TensorProto, base: Path) -> bytes:
    """A tensor's raw bytes, from the graph or from the data file it names (relative to base, its graph's folder)."""
    if not uses_external_data(tensor):
        return tensor.raw_data
    info = ExternalDataInfo(tensor)
    with open(base / info.location, "rb") as f:
        f.seek(info.offset or 0)
        return f.read() if info.length is None else f.read(info.length)


def point_at(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make tensor read its bytes from location[offset:offset + length] (what onnx's set_external_data writes,
    which asks for the bytes in raw_data)."""
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL


def _digest(raw: bytes | memoryview) -> bytes:
    return hashlib.blake2b(raw, digest_size=20).digest()


class TensorWriter:
    """Appends tensors' bytes to a data file, large ones aligned; created on the first tensor written."""

    def __init__(self, path: Path):
        self.path = path
        self._file: BinaryIO | None = None

    def write(self, raw: bytes | memoryview) -> tuple[int, int]:
        """(offset, length) of raw in the file."""
        if self._file is None:
            self.path.unlink(missing_ok=True)  # never appended to: a new file
            self._file = open(self.path, "wb")  # noqa: SIM115 (closed by close(), after many writes)
        offset = self._file.tell()
        if len(raw) >= ALIGN_ABOVE and offset % ALIGNMENT:
            self._file.write(b"\0" * (ALIGNMENT - offset % ALIGNMENT))
            offset = self._file.tell()
        self._file.write(raw)
        return offset, len(raw)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class SharedWeights:
    """Tensors already stored in a directory's data files, found by their bytes: a graph being saved reads each
    tensor it shares with them from there instead of storing it again. Bytes alone decide: a tensor read from the
    same bytes is the same tensor, whatever the graph that first wrote it called it.

    Lazy, for data files of gigabytes: a stored tensor is read and hashed only when a tensor of its length is
    looked up, and a tensor a step passed through untouched (still naming its place in one of these files) is kept
    there without being read at all (save_streamed)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self.files: set[str] = set()  # the data files, by name (relative to directory)
        self._stored: dict[int, list[tuple[str, int]]] = {}  # length -> places (file, offset) not hashed yet
        self._where: dict[bytes, tuple[str, int, int]] = {}  # digest -> (file name, offset, length)

    @classmethod
    def of_graphs(cls, graphs: Iterable[Path]) -> SharedWeights:
        """The tensors the graphs read from data files (all in one folder, where their data files are)."""
        graphs = list(graphs)
        shared = cls(graphs[0].parent if graphs else None)
        for graph in graphs:
            model = onnx.load(str(graph), load_external_data=False)
            for tensor in model.graph.initializer:
                info = ExternalDataInfo(tensor) if uses_external_data(tensor) else None
                if info is not None and info.length is not None:
                    shared.files.add(info.location)
                    shared._stored.setdefault(info.length, []).append((info.location, info.offset or 0))
        return shared

    def holds(self, tensor: onnx.TensorProto, source_dir: Path) -> bool:
        """Whether tensor, as it is, names its place in one of these files (and so is stored already)."""
        if self.directory is None or not uses_external_data(tensor) or tensor.HasField("raw_data"):
            return False
        return source_dir.resolve() == self.directory.resolve() and ExternalDataInfo(tensor).location in self.files

    def add(self, raw: bytes | memoryview, location: str, offset: int, length: int) -> None:
        self._where.setdefault(_digest(raw), (location, offset, length))

    def find(self, raw: bytes | memoryview) -> tuple[str, int, int] | None:
        for location, offset in self._stored.pop(len(raw), ()):  # the stored tensors of this length, hashed now
            assert self.directory is not None
            with open(self.directory / location, "rb") as f:
                f.seek(offset)
                self.add(f.read(len(raw)), location, offset, len(raw))
        return self._where.get(_digest(raw))


def save_streamed(model: onnx.ModelProto, path: Path, source_dir: Path,
                  convert: dict[str, Callable[[bytes], bytes]] | None = None,
                  shared: SharedWeights | None = None) -> None:
    """Write the graph at path with every tensor of SIZE_THRESHOLD bytes or more outside it: each read from where
    it is (in memory, or a data file of source_dir that the graph, loaded with load_external_data=False, names),
    converted by convert[name] if there, then read from a data file of `shared` where its bytes are already
    stored there, else written into data_file(path), one at a time: no more than one tensor's bytes is in memory
    beyond the graph's own. data_file(path) is only made for tensors that are new. Tensors under SIZE_THRESHOLD
    bytes go into the graph. source_dir's data files must be other files than data_file(path)."""
    convert = convert or {}
    own = TensorWriter(data_file(path))
    try:
        for tensor in model.graph.initializer:
            if not uses_external_data(tensor) and not (tensor.HasField("raw_data")
                                                       and len(tensor.raw_data) >= SIZE_THRESHOLD):
                continue  # a small tensor in the graph, or one in typed fields (float_data, ...)
            if uses_external_data(tensor) and source_dir / ExternalDataInfo(tensor).location == own.path:
                raise ValueError(f"{path.name} would overwrite the data file its tensors are read from")
            if shared is not None and tensor.name not in convert and shared.holds(tensor, source_dir):
                continue  # passed through as it is: it reads the place it names, nothing read or written
            raw = tensor.raw_data if tensor.HasField("raw_data") else tensor_bytes(tensor, source_dir)
            if tensor.name in convert:
                raw = convert[tensor.name](raw)
            if len(raw) < SIZE_THRESHOLD:  # inside the graph, as onnx keeps a small tensor
                del tensor.external_data[:]
                tensor.ClearField("data_location")
                tensor.raw_data = raw
                continue
            found = shared.find(raw) if shared is not None else None
            if found is None:
                offset, length = own.write(raw)
                found = (own.path.name, offset, length)
                if shared is not None:  # a later tensor of this graph with the same bytes reads these
                    shared.add(raw, *found)
            del raw
            point_at(tensor, *found)
    finally:
        own.close()
    # Tensors in node attributes (a Constant's value: the exporter writes large ones to files of their own) go
    # into the graph, as onnx.load then save leave them.
    for node in model.graph.node:
        for attribute in node.attribute:
            for tensor in (attribute.t, *attribute.tensors):
                if uses_external_data(tensor):
                    tensor.raw_data = tensor_bytes(tensor, source_dir)
                    del tensor.external_data[:]
                    tensor.ClearField("data_location")
    onnx.save_model(model, str(path))


def share(path: Path, shared: SharedWeights) -> None:
    """Rewrite the graph at path, which a tool saved with all its tensors in data_file(path) (onnxruntime's
    quantizer and optimizer do), so that the tensors `shared` already stores are read from there and only the
    others stay in data_file(path) (none left: the file goes)."""
    own = data_file(path)
    held = own.with_name(f".{own.name}.{os.getpid()}.held")
    if own.exists():
        os.replace(own, held)
    try:
        model = onnx.load(str(path), load_external_data=False)
        attributes = [t for node in model.graph.node for a in node.attribute for t in (a.t, *a.tensors)]
        for tensor in (*model.graph.initializer, *attributes):  # a tool may put a Constant's value outside too
            if uses_external_data(tensor) and ExternalDataInfo(tensor).location == own.name:
                for entry in tensor.external_data:
                    if entry.key == "location":
                        entry.value = held.name
        save_streamed(model, path, path.parent, shared=shared)
    finally:
        held.unlink(missing_ok=True)
