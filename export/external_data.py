"""Graphs whose weights live beside them in a data file (ONNX external data), for models past protobuf's 2 GB.

A serialized ONNX model is one protobuf message, which cannot exceed 2 GiB: a 0.6B-parameter model's fp32 graph
(2.4 GB of weights) can only be written with its tensors in a separate file, `<graph>.onnx.data` beside
`<graph>.onnx` (onnxruntime's own naming, which its optimizer's save_model_to_file uses too). Export decides once,
from the checkpoint's fp32 weight bytes, when it traces the first graph; every graph derived from it (fused, int8,
fp16, the int8 search's probes) keeps its source's layout, so one decision carries through (has_external_data).

ATTNSERVE_EXTERNAL_DATA_ABOVE (bytes of fp32 weights) sets the threshold; 0 forces external data on any model,
which is how the tests run this path on a small model: the same code a graph over 2 GB takes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

THRESHOLD_ENV = "ATTNSERVE_EXTERNAL_DATA_ABOVE"
# Graphs with more fp32 weight bytes than this are written with external data. Below protobuf's 2 GiB with room:
# the int8 search adds fp32 side paths to the graph, and the graph's own structure takes space too.
DEFAULT_THRESHOLD = 3 * 2**29  # 1.5 GiB
# Tensors smaller than this stay inside the graph (onnx's and onnxruntime's default).
SIZE_THRESHOLD = 1024


def threshold() -> int:
    raw = os.environ.get(THRESHOLD_ENV, "")
    if not raw:
        return DEFAULT_THRESHOLD
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        from attnserve.errors import ConfigError

        raise ConfigError(f"{THRESHOLD_ENV}={raw!r} is not a number of bytes (0 or more)")
    return value


def wants_external_data(weight_bytes: int) -> bool:
    return weight_bytes > threshold()


def data_file(graph: Path) -> Path:
    """Where a graph's external data goes: beside it, named after it."""
    return graph.with_name(graph.name + ".data")


def save(model: onnx.ModelProto, path: Path, external: bool) -> None:
    """Write the model, with its tensors in data_file(path) when external (an old data file is replaced, never
    appended to)."""
    if not external:
        onnx.save_model(model, str(path))
        return
    data_file(path).unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_file(path).name, size_threshold=SIZE_THRESHOLD)


def external_files(path: Path) -> list[str]:
    """The file names, relative to the graph's folder, that the graph at path reads its tensors from (sorted;
    none for a self-contained graph)."""
    from onnx.external_data_helper import ExternalDataInfo

    # Initializers only: export's graphs keep no tensor in node attributes outside the graph (save() leaves
    # attributes inline, as onnx does by default).
    model = onnx.load(str(path), load_external_data=False)
    return sorted({ExternalDataInfo(t).location for t in model.graph.initializer if uses_external_data(t)})


def has_external_data(path: Path) -> bool:
    return bool(external_files(path))


def save_streamed(model: onnx.ModelProto, path: Path, source_dir: Path,
                  convert: dict[str, Callable[[bytes], bytes]] | None = None) -> None:
    """Write a graph whose tensors may still be in other graphs' data files (it was loaded with
    load_external_data=False from a graph in source_dir), with every tensor of SIZE_THRESHOLD bytes or more in
    data_file(path): each is read from where it is, converted by convert[name] if there, and written, one at a
    time, so that no more than one tensor's bytes is in memory beyond the graph's own. The tensors in memory
    (ones a step made) go there too, and tensors under SIZE_THRESHOLD bytes into the graph, as save() puts them.
    Where source_dir is path's folder, the source's data files must be other files than data_file(path)."""
    from onnx.external_data_helper import ExternalDataInfo

    convert = convert or {}
    data = data_file(path)
    data.unlink(missing_ok=True)
    with open(data, "wb") as out:
        for tensor in model.graph.initializer:
            if tensor.HasField("raw_data") and uses_external_data(tensor):  # read by a step, maybe changed
                raw = tensor.raw_data
                tensor.ClearField("raw_data")
                del tensor.external_data[:]
            elif uses_external_data(tensor):
                info = ExternalDataInfo(tensor)
                with open(source_dir / info.location, "rb") as f:
                    f.seek(info.offset or 0)
                    raw = f.read() if info.length is None else f.read(info.length)
                del tensor.external_data[:]
                tensor.ClearField("data_location")
            elif tensor.HasField("raw_data") and len(tensor.raw_data) >= SIZE_THRESHOLD:  # made by a step
                raw = tensor.raw_data
                tensor.ClearField("raw_data")
            else:
                continue
            if tensor.name in convert:
                raw = convert[tensor.name](raw)
            if len(raw) < SIZE_THRESHOLD:  # inside the graph, as save() keeps it
                tensor.ClearField("data_location")
                tensor.raw_data = raw
                continue
            offset = out.tell()
            out.write(raw)
            del raw
            # What onnx's set_external_data writes (which asks for the bytes in raw_data).
            del tensor.external_data[:]
            for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(out.tell() - offset))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensor.data_location = onnx.TensorProto.EXTERNAL
    # Tensors in node attributes (a Constant's value: the exporter writes large ones to files of their own) go
    # into the graph, as onnx.load then save() leave them.
    for node in model.graph.node:
        for attribute in node.attribute:
            for tensor in (attribute.t, *attribute.tensors):
                if uses_external_data(tensor):
                    info = ExternalDataInfo(tensor)
                    with open(source_dir / info.location, "rb") as f:
                        f.seek(info.offset or 0)
                        tensor.raw_data = f.read() if info.length is None else f.read(info.length)
                    del tensor.external_data[:]
                    tensor.ClearField("data_location")
    onnx.save_model(model, str(path))
