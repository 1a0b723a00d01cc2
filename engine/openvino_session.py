"""An exported ONNX graph run by the OpenVINO runtime, behind the session interface (engine/session.py Session).

Why a second runtime: on CPUs with native bfloat16 (AVX512-BF16, AMX) OpenVINO's CPU plugin runs a graph's
matrix products in bf16 (its INFERENCE_PRECISION_HINT), 1.9x onnxruntime's fp32 speed on MiniLM at a cosine of
0.99998 to fp32 (docs/performance.md), and onnxruntime's CPU provider has no bf16 path on x86. The artifact stays
the exported ONNX graph, verified at export like every variant (export/artifacts.py); OpenVINO reads it as it is.

The plain graphs only: OpenVINO does not implement onnxruntime's contrib ops (Attention, SkipLayerNormalization,
BiasGelu, MatMulInteger's dynamic quantization), so it runs `embeddings.onnx` and `attention.onnx`, and fuses
them itself when it compiles.

The `openvino` package is an optional extra (`attnserve[openvino]`): nothing imports it unless a bf16 graph or
the openvino backend is asked for.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attnserve.errors import ArtifactError, ConfigError

from .machine import this_machine
from .mapped_pages import external_files, paging_out

if TYPE_CHECKING:
    from .session import Session

# attnserve's precision word -> OpenVINO's INFERENCE_PRECISION_HINT.
HINTS = {"fp32": "f32", "bf16": "bf16"}


@dataclass(frozen=True)
class OpenVINOPort:
    """A graph's input or output as a session lists them (session.GraphPort: onnxruntime's NodeArg has the same
    .name)."""

    name: str


@functools.cache
def openvino_version() -> str | None:
    """The installed OpenVINO's version (its release, e.g. 2026.4.1), None where it is not installed."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino.__version__.split("-")[0]


def openvino_available() -> bool:
    return openvino_version() is not None


def _read(core, path: Path):
    """The graph at path as OpenVINO is to compile it. A half-precision trace (export/half_precision.py: fp16
    weights and activations) becomes an fp32 graph whose fp16 weights stay fp16: OpenVINO's own "FP16 IR" form, each
    fp16 constant followed by a Convert to fp32 marked as decompression. Any other graph is returned as read.

    Why: the CPU plugin upcasts an fp16 graph's constants to fp32 and keeps them beside the bf16 copies its matrix
    products pack, about 5.7 bytes a parameter (Qwen3-0.6B's 1.2 GB of fp16 weights held 3.4 GB once compiled; the
    4B shape did not fit in 24 GiB). Marked as decompression, the weights stay the fp16 constants read from the data
    file (mapped, not copied) and the packed copy is the process's only own one: 1.05 GB for the 0.6B shape, with the
    same outputs (a cosine of 1.0 to the unmarked graph's) and no slower. The mark is the one OpenVINO's fp16
    compression writes (ov.save_model(compress_to_fp16=True)); its Python API cannot set it, so the marked Converts
    come from that compression run over one-element stand-ins, and are then fed the real constants.
    """
    import openvino as ov
    import openvino.opset13 as ops
    from openvino._offline_transformations import compress_model_transformation

    model = core.read_model(str(path))
    f16 = ov.Type.f16
    weights = [op for op in model.get_ordered_ops()
               if op.get_type_name() == "Constant" and op.get_output_element_type(0) == f16]
    if not weights:
        return model
    stand_ins = ov.Model([ops.result(ops.constant(np.ones((1,), np.float32))) for _ in weights], [])
    compress_model_transformation(stand_ins)
    converts = [result.input_value(0).get_node() for result in stand_ins.get_results()]
    if any(convert.get_type_name() != "Convert" for convert in converts):
        return model  # an OpenVINO whose compression writes another form: the graph as it is
    for constant, convert in zip(weights, converts, strict=True):
        consumers = list(constant.output(0).get_target_inputs())
        convert.input(0).replace_source_output(constant.output(0))
        for consumer in consumers:
            consumer.replace_source_output(convert.output(0))
    # The trace's casts to fp16 (activations) now cast to fp32: the graph computes in fp32, and the precision
    # hint (bf16) decides what the plugin runs in, as for an fp32 graph.
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Convert" and op.get_output_element_type(0) == f16:
            op.set_attribute("destination_type", "f32")
    model.validate_nodes_and_infer_types()
    left = [op.get_friendly_name() for op in model.get_ordered_ops() if op.get_type_name() != "Constant"
            and any(op.get_output_element_type(i) == f16 for i in range(op.get_output_size()))]
    # An fp16 output no cast makes (an op with its own output type): the graph as it was read, uncompressed.
    return core.read_model(str(path)) if left else model


class OpenVINOSession:
    """onnxruntime's InferenceSession interface as the engine uses it (engine/session.py Session): run(output names,
    feed), get_inputs() and get_outputs().

    One compiled model; each calling thread gets its own infer request (a request is not shared between threads,
    the compiled model is), so run() is safe from several threads as onnxruntime's is."""

    def __init__(self, path: Path, precision: str, threads: int = 0):
        import openvino as ov

        if precision not in HINTS:
            raise ConfigError(f"OpenVINO runs fp32 or bf16 graphs, not {precision}")
        if precision == "bf16" and not this_machine().native_bf16:
            raise ConfigError("bf16 asked for, but this CPU has no native bfloat16 (AVX512-BF16 or AMX): it would "
                              "be emulated, slower than fp32; use fp32 or int8")
        core = ov.Core()
        config = {
            "INFERENCE_PRECISION_HINT": HINTS[precision],
            # One stream, every thread on it: the engine runs one batch at a time per session, as onnxruntime does.
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": "1",
        }
        if threads:
            config["INFERENCE_NUM_THREADS"] = str(threads)
        try:
            self._compiled = core.compile_model(_read(core, path), "CPU", config)
        except Exception as e:  # OpenVINO raises RuntimeError with multi-line C++ context
            raise ArtifactError(f"OpenVINO could not load {path}: {str(e).strip().splitlines()[0]}") from None
        # The weight files OpenVINO maps: the first run packs the weights, and what it reads of them is handed back
        # as it goes (mapped_pages.py: else the weights are held twice).
        self._weight_files = [path.parent / name for name in external_files(path)]
        self._packed = False
        self._first_run = threading.Lock()
        self._inputs = [OpenVINOPort(port.get_any_name()) for port in self._compiled.inputs]
        # Every name of each output: OpenVINO merges tensors, and a graph output that is also another node's tensor
        # (Qwen3's last-token pooling) keeps both names, get_any_name() giving either; run() takes any of them.
        self._outputs = {name: port for port in self._compiled.outputs for name in port.get_names()}
        self._output_ports = [OpenVINOPort(port.get_any_name()) for port in self._compiled.outputs]
        self._local = threading.local()

    def get_inputs(self) -> list[OpenVINOPort]:
        return list(self._inputs)

    def get_outputs(self) -> list[OpenVINOPort]:
        """One per output, in the graph's order; a merged output's name is any one of its names (run() takes each)."""
        return list(self._output_ports)

    def run(self, output_names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        names = list(self._outputs) if output_names is None else list(output_names)
        unknown = [n for n in names if n not in self._outputs]
        if unknown:
            raise ValueError(f"the graph has no output {unknown[0]!r}")
        missing = [i.name for i in self._inputs if i.name not in feed]
        if missing:  # OpenVINO would run on the request's stale buffers: refuse as onnxruntime does
            raise ValueError(f"the graph's input {missing[0]!r} is not fed")
        if not self._packed:
            with self._first_run:  # the run that packs the weights, their mapped pages handed back as it reads them
                if not self._packed:  # else another thread's first run packed them meanwhile
                    with paging_out(self._weight_files):
                        request.infer(feed)
                    self._packed = True
                    return self._outputs_of(request, names)
        request.infer(feed)
        return self._outputs_of(request, names)

    def _outputs_of(self, request, names: list[str]) -> list[np.ndarray]:
        # The request owns its output buffers and reuses them on the next run: copy what is returned.
        return [np.array(request.get_tensor(self._outputs[n]).data, copy=True) for n in names]


if TYPE_CHECKING:  # mypy checks this session against the interface the engine calls
    _session: type[Session] = OpenVINOSession
