"""int8 recipes: one way each of quantizing an fp32 graph with onnxruntime's quantizer, built from a description.

Export builds the recipe that export/optimize.py chooses; bench/bench_int8.py builds every candidate and measures
them side by side (bench/int8_candidates.md). A recipe says how, not which graph: the same recipe applies to any
encoder export makes, and the nodes it keeps in fp32 are chosen by name (FIRST_FFN_DOWN) or by measured error
(sensitivity.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .external_data import has_external_data

# Node types onnxruntime's quantizer turns into integer ops. The fused graph's Attention node (its Q, K and V
# projection) has an integer form only in dynamic mode (QAttention); static QDQ/QOperator quantize MatMul.
DYNAMIC_OPS = ("MatMul", "Attention")
STATIC_OPS = ("MatMul",)


def u8s8_saturates(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether onnxruntime's u8s8 int8 kernels saturate on this CPU: x86 with AVX2 but neither VNNI nor AMX, where
    they add pairs of u8 x s8 products in int16 (vpmaddubsw)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = set(next((line.split(":", 1)[1] for line in text.splitlines() if line.startswith("flags")), "").split())
    return "avx2" in flags and not flags & {"avx512_vnni", "avx_vnni", "amx_int8"}


def weight_type() -> str:
    """The int8 weights' type for this CPU's kernels: s8 (QInt8, u8s8 kernels: VNNI, AMX, ARM), or u8 (QUInt8,
    u8u8 kernels, which widen to int16 before adding and so never saturate) where u8s8 saturates.

    Measured on an AVX2-only EPYC against the fp32 graph, 7 texts, per-channel dynamic, every MatMul quantized:
    tiny ModernBERT s8 mean cosine 0.930 (saturated), s8 with reduce_range (7-bit weights, onnxruntime's other
    advice) 0.9945 with a min of 0.983, u8 0.9967 with a min of 0.992; all-MiniLM-L6-v2 s8 0.9873, s8
    reduce_range 0.9859, u8 0.9879. u8u8 ran 0.9 to 1.2 times as fast as s8 with reduce_range there (MiniLM's
    fused graph, 32 x 128 tokens). Both kinds of graph run on every CPU."""
    return "QUInt8" if u8s8_saturates() else "QInt8"


@dataclass(frozen=True)
class Int8Recipe:
    name: str
    static: bool = False  # False: activations quantized at run time (quantize_dynamic)
    per_channel: bool = True  # one weight scale per output channel, not one per tensor
    reduce_range: bool = False  # 7-bit weights (bench/bench_int8.py's candidates; export uses weight_type())
    weight_type: str = "QInt8"  # QInt8 (u8s8 kernels) or QUInt8 (u8u8: export's where u8s8 saturates)
    quant_format: str = "QDQ"  # static only: QDQ (onnxruntime fuses Q/DQ into integer kernels) or QOperator
    calibrate_method: str = "MinMax"  # static only: MinMax, Percentile or Entropy
    op_types: tuple[str, ...] = ()  # () = the mode's default (DYNAMIC_OPS / STATIC_OPS)
    keep_fp32: tuple[str, ...] = field(default=())  # node names left in fp32
    # static + this: the Attention nodes' Q/K/V projections quantized dynamically after the static pass
    dynamic_attention: bool = False
    # The exact (erf) GELU computed by onnxruntime's FastGelu, its tanh approximation: at most 4.7e-4 from erf's
    # (at x = 2.7), far below int8's own error, and faster on CPU (bench/int8_candidates.md).
    fast_gelu: bool = False

    def excluding(self, nodes: Iterable[str], name: str) -> Int8Recipe:
        from dataclasses import replace

        return replace(self, name=name, keep_fp32=tuple(sorted(set(self.keep_fp32) | set(nodes))))


class FeedsReader:
    """onnxruntime's CalibrationDataReader over ready model feeds ({"input_ids": (B, T), "attention_mask": ...})."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = feeds
        self._next: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._next, None)

    def rewind(self) -> None:
        self._next = iter(self._feeds)


def same_shape(feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """One row per feed, right-padded (ids 0, mask 0) to the widest feed's length: (1, T) each.
    The padded positions enter the histograms too (the price of onnxruntime's stacking)."""
    width = max(feed["input_ids"].shape[1] for feed in feeds)
    return [{name: np.pad(x[row : row + 1], ((0, 0), (0, width - x.shape[1]))) for name, x in feed.items()}
            for feed in feeds for row in range(len(feed["input_ids"]))]


def quantizable_nodes(model: onnx.ModelProto, op_types: Iterable[str] = DYNAMIC_OPS) -> list[str]:
    """Names of the nodes a recipe could quantize: those of the given types with a constant weight."""
    weights = {init.name for init in model.graph.initializer}
    return [n.name for n in model.graph.node
            if n.op_type in op_types and len(n.input) > 1 and n.input[1] in weights]


def build(recipe: Int8Recipe, src: Path, dst: Path, calibration: list[dict[str, np.ndarray]] | None = None,
          only: list[str] | None = None) -> None:
    """Quantize src into dst by the recipe. calibration: model feeds, needed by static recipes.
    only: quantize just these nodes (the sensitivity probe), else every quantizable node not kept in fp32."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    # The fused Attention op is from the com.microsoft domain, so shape inference cannot type its output; it is fp32.
    extra: dict[str, object] = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    common = dict(per_channel=recipe.per_channel, reduce_range=recipe.reduce_range,
                  use_external_data_format=has_external_data(src),
                  weight_type=getattr(QuantType, recipe.weight_type), nodes_to_quantize=only,
                  nodes_to_exclude=list(recipe.keep_fp32))
    if not recipe.static:
        with _shapes_reloaded_without_a_copy():
            quantize_dynamic(str(src), str(dst), op_types_to_quantize=list(recipe.op_types or DYNAMIC_OPS),
                             extra_options=extra, **common)
        _approximate_gelu(recipe, dst)
        return
    if not calibration:
        raise ValueError(f"int8 recipe {recipe.name!r} is static and needs calibration feeds")
    if "token_type_ids" in {i.name for i in onnx.load(str(src), load_external_data=False).graph.input}:
        # Graphs of models with token types take them: zeros, as the engine feeds single texts.
        calibration = [{**feed, "token_type_ids": np.zeros_like(feed["input_ids"])} for feed in calibration]
    if recipe.calibrate_method == "Percentile":
        extra["CalibPercentile"] = 99.999
    if recipe.calibrate_method != "MinMax":  # histogram calibrators stack every batch: one shape for all
        calibration = same_shape(calibration)
    quantize_static(str(src), str(dst), FeedsReader(calibration),
                    quant_format=getattr(QuantFormat, recipe.quant_format),
                    op_types_to_quantize=list(recipe.op_types or STATIC_OPS),
                    activation_type=QuantType.QUInt8,  # u8 activations x s8 weights: the VNNI/AMX kernels
                    calibrate_method=getattr(CalibrationMethod, recipe.calibrate_method),
                    extra_options=extra, **common)
    if recipe.dynamic_attention:
        quantize_dynamic(str(dst), str(dst), op_types_to_quantize=["Attention"], extra_options=extra, **common)
    _approximate_gelu(recipe, dst)


@contextmanager
def _shapes_reloaded_without_a_copy() -> Iterator[None]:
    """onnxruntime's dynamic quantizer holding the fp32 weights once, not three times.

    Its ONNXQuantizer re-runs shape inference on the graph it loaded (onnx_quantizer.py calls quant_utils'
    save_and_reload_model_with_shape_infer), and that helper deep-copies the model, saves the copy with external
    data and loads it again, while the first is still held: the fp32 weights three times at once, 7.1 GiB for the
    Qwen3-0.6B shape's 2.2 (issue 20 bounds all of export at 3x). Shape inference reads the graph, not the
    weights, so here it runs on the graph with its large initializers as bare shapes, and the value infos it
    finds are put on the model the quantizer holds: the same inference, no copy."""
    from onnxruntime.quantization import onnx_quantizer, quant_utils

    def infer_in_place(model: onnx.ModelProto) -> onnx.ModelProto:
        inferred = onnx.shape_inference.infer_shapes(_without_large_weights(model))
        del model.graph.value_info[:]
        model.graph.value_info.extend(inferred.graph.value_info)
        quant_utils.add_infer_metadata(model)
        return model

    copying = onnx_quantizer.save_and_reload_model_with_shape_infer
    onnx_quantizer.save_and_reload_model_with_shape_infer = infer_in_place
    try:
        yield
    finally:
        onnx_quantizer.save_and_reload_model_with_shape_infer = copying


def _without_large_weights(model: onnx.ModelProto, smallest: int = 1024) -> onnx.ModelProto:
    """A copy of model whose initializers of `smallest` bytes or more are bare shapes: external data that is never
    read (shape inference takes their type and dims; it reads the values of small ones, a Reshape's shape)."""
    shell = onnx.ModelProto()
    _copy_fields(model, shell, skip="graph")
    _copy_fields(model.graph, shell.graph, skip="initializer")
    weights = model.graph.initializer
    for weight in weights:
        if weight.ByteSize() < smallest:
            shell.graph.initializer.append(weight)
            continue
        bare = shell.graph.initializer.add(name=weight.name, data_type=weight.data_type, dims=weight.dims,
                                           data_location=onnx.TensorProto.EXTERNAL)
        bare.external_data.add(key="location", value="never-read")
    return shell


def _copy_fields(src, dst, skip: str) -> None:
    """Every field set on the protobuf message src, but `skip`, copied onto dst (CopyFrom copies all)."""
    for descriptor, value in src.ListFields():
        if descriptor.name == skip:
            continue
        if descriptor.is_repeated:
            getattr(dst, descriptor.name).extend(value)
        elif descriptor.type == descriptor.TYPE_MESSAGE:
            getattr(dst, descriptor.name).CopyFrom(value)
        else:
            setattr(dst, descriptor.name, value)


# onnxruntime's erf GELU ops (its com.microsoft domain), with the inputs FastGelu takes alike: (X) or (X, bias).
ERF_GELU_OPS = ("Gelu", "BiasGelu")


def _approximate_gelu(recipe: Int8Recipe, path: Path) -> None:
    """With recipe.fast_gelu, every erf GELU node of the graph at path becomes onnxruntime's FastGelu, in place."""
    if not recipe.fast_gelu:
        return
    model = onnx.load(str(path), load_external_data=False)
    gelus = [n for n in model.graph.node if n.op_type in ERF_GELU_OPS and n.domain == "com.microsoft"]
    for node in gelus:
        node.op_type = "FastGelu"
    if gelus:
        onnx.save(model, str(path))
