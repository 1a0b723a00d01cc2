"""Graph variants built with onnxruntime's own tools: attention fusion, int8 and fp16."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import onnx

from attnserve.errors import ExportVerificationError

from . import isolated
from .external_data import SharedWeights, has_external_data, save_streamed

if TYPE_CHECKING:  # torch is not imported here: these steps run in child processes that need none of it
    from attnserve.model.encoder import EncoderConfig
    from attnserve.model.family import ModelConfig

# The TorchScript exporter names nodes after module paths (model/encoder.py).
FIRST_FFN_DOWN = "/encoder/layers.0/feed_forward/down/MatMul"
# The nodes onnxruntime's transformers optimizer fuses subgraphs into.
# (The rotary families' "fused" graphs hold SimplifiedLayerNormalization: Qwen3's RMSNorm, 113 nodes in the 0.6B.)
FUSED_OPS = ("Attention", "MultiHeadAttention", "Gelu", "FastGelu", "BiasGelu", "SkipLayerNormalization",
             "EmbedLayerNormalization", "RotaryEmbedding", "SimplifiedLayerNormalization",
             "SkipSimplifiedLayerNormalization")
# The lookup of token type embeddings, in graphs of models with token types: a table of two rows, kept in fp32
# so that zeros give the int8 graph exactly the output it had before the graphs took token types.
TOKEN_TYPE_LOOKUP = "/encoder/embeddings/token_type/Gather"
# MPNet's lookup of its relative position bias (buckets x heads): a table of 384 numbers that every attention
# score adds; nothing is gained by quantizing it.
RELATIVE_BIAS_LOOKUP = "/encoder/relative_attention_bias/Gather"
# Families whose int8 graph keeps every feed-forward projection in fp32 (measured in quantize_int8).
FP32_FEED_FORWARD = ("mpnet",)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(collections.Counter(node.op_type for node in model.graph.node))


@contextlib.contextmanager
def quiet():
    """Libraries' chatter off: the optimizer logs every fusion pass, the quantizer advises pre-processing
    on the root logger, transformers warns about tokenizer details; export prints its own summary and
    checks what matters itself."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


# The families whose attention onnxruntime's attention fusion matches: BERT's subgraph (model/encoder.py).
ATTENTION_FUSION_FAMILIES = ("bert", "roberta", "xlm-roberta", "distilbert")


def expects_attention_fusion(cfg: EncoderConfig | ModelConfig | Shape) -> bool:
    """Whether onnxruntime's attention fusion must match every layer. It matches BERT's attention subgraph
    (encoder.py); the rotary families' attention (ModernBERT, Qwen3, ...) is another subgraph, which it leaves
    unfused: there the "fused" variants have the fusions the optimizer does make (Gelu, and
    SkipLayerNormalization in fp16), verified like any other. MPNet adds a relative position bias to the
    scores, which the fusion does not match either."""
    return cfg.family in ATTENTION_FUSION_FAMILIES


class Shape(Protocol):
    """What the optimizer and the quantizer read of a model: a family's config, or a manifest (a graph built later
    from an artifact directory needs no checkpoint)."""

    @property
    def num_heads(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def family(self) -> str: ...


def _shape(cfg: EncoderConfig | ModelConfig | Shape) -> dict[str, Any]:
    """What the optimizer and the quantizer need of the model's config, for a child process (JSON)."""
    return {"num_heads": cfg.num_heads, "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
            "family": cfg.family, "attention_fusion": expects_attention_fusion(cfg)}


def fused_attention_nodes(counts: dict[str, int]) -> int:
    return counts.get("Attention", 0) + counts.get("MultiHeadAttention", 0)


def describe_fusions(counts: dict[str, int]) -> str:
    """The optimizer's fused nodes in a graph (onnxruntime's contrib ops), for the export's log."""
    fused = {op: n for op, n in sorted(counts.items()) if op in FUSED_OPS}
    return ", ".join(f"{n} {op}" for op, n in fused.items()) or "none"


@contextlib.contextmanager
def _graph(src: Path):
    """What the optimizer is given: src's path, or for a graph with external data, its graph loaded without its
    tensors' bytes, which stay in their data file and are read only where a fusion needs a tensor's values
    (onnx's numpy_helper.to_array reads an external tensor relative to the working directory, src's folder
    meanwhile). The optimizer, its shape inference (which copies the whole graph) and the fp16 converter then
    hold the graph's structure, not its weights (_save writes them, one at a time)."""
    if not has_external_data(src):
        yield str(src)
        return
    previous = os.getcwd()
    os.chdir(src.parent)
    try:
        yield onnx.load(str(src), load_external_data=False)
    finally:
        os.chdir(previous)


def _save(model, dst: Path, src: Path, convert: dict[str, Callable[[bytes], bytes]] | None = None) -> None:
    """The optimizer's model (an OnnxModel) written as save_model_to_file writes it (in topological order, with
    the com.microsoft opset where it has such nodes), external data as src has: for a graph from _graph, each
    tensor read from src's data file (converted by convert[name] if there), and stored once: where src's data
    files hold its bytes already, dst reads it from there, and only the tensors the step made or changed go into
    dst's own (export/external_data.py)."""
    if not has_external_data(src):
        model.save_model_to_file(str(dst))
        return
    model.topological_sort()
    proto = model.model
    if any(n.domain == "com.microsoft" for n in proto.graph.node) and not any(
            o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.add(domain="com.microsoft", version=1)
    save_streamed(proto, dst, src.parent, convert, SharedWeights.of_graphs([src]))


def _fused(graph, name: str, shape: dict[str, Any], skip_layer_norm: bool):
    """onnxruntime's transformer optimizer on graph (a path, or a model from _graph) named name."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    # Every family is exported in model/encoder.py's one layout, which is BERT's graph: the optimizer's
    # "bert" fusions are the ones that match it (it has no RoBERTa, DistilBERT or MPNet model type).
    options = FusionOptions("bert")
    options.enable_skip_layer_norm = options.enable_bias_skip_layer_norm = skip_layer_norm
    # EmbedLayerNormalization computes positions 0..T-1 itself (not RoBERTa's or MPNet's) and, fed
    # token_type_ids, would change the fp16 graph of models with token types from what zeros gave before.
    options.enable_embed_layer_norm = False
    # opt_level=0: only the transformers fusions here; onnxruntime applies its
    # provider-specific graph optimisations itself when a session opens.
    model = optimizer.optimize_model(
        graph, model_type="bert", num_heads=shape["num_heads"], hidden_size=shape["hidden_size"], opt_level=0,
        optimization_options=options,
    )
    counts = op_counts(model.model)
    fused = fused_attention_nodes(counts)
    # Where the fusion cannot match (ModernBERT, MPNet), the graph is the best the optimizer makes, unfused.
    if fused != shape["num_layers"] and (shape["attention_fusion"] or fused != 0):
        raise ExportVerificationError(
            f"attention fusion matched {fused} of {shape['num_layers']} layers in {name}; op counts: {counts}"
        )
    return model


def fuse_attention(src: Path, dst: Path, cfg: EncoderConfig | ModelConfig | Shape) -> dict[str, int]:
    """Fuse each layer's attention subgraph into one Attention node, for the CPU provider.

    SkipLayerNormalization is left unfused: on CPU its kernel is slower than the
    Add + LayerNormalization it replaces (measured on the mixed-length corpus,
    2 cores: 7,751 tokens/s without it, 7,369 with it).

    Runs in a child process (export/isolated.py): the optimizer's copies of the graph die with it.
    """
    return isolated.run("fusing attention", f"{__name__}:_fuse",
                        {"src": str(src), "dst": str(dst), "shape": _shape(cfg), "skip_layer_norm": False})


def _fuse(src: str, dst: str, shape: dict[str, Any], skip_layer_norm: bool) -> dict[str, int]:
    """The child's side of fuse_attention and fuse_half: the same optimizer pass, SkipLayerNorm fused or not."""
    with quiet(), _graph(Path(src).resolve()) as graph:
        model = _fused(graph, Path(src).name, shape, skip_layer_norm=skip_layer_norm)
        _save(model, Path(dst).resolve(), Path(src).resolve())
    return op_counts(model.model)


FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)


def float_to_integer_casts(model: onnx.ModelProto) -> list[str]:
    """The Cast nodes that turn a float tensor into an integer one: float arithmetic that decides an index.

    The fp16 converter would run that arithmetic in half precision and move its results across integer
    boundaries: MPNet's relative position buckets, computed by log() and a cast in the graph, put distances
    16, 32 and 64 in the next bucket (issue 19). The model computes such tables in fp32 ahead of the graph
    (model/encoder.py), and export refuses a graph that still has one."""
    typed = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*typed.graph.value_info, *typed.graph.input)}
    return [node.name for node in model.graph.node if node.op_type == "Cast" and types.get(node.input[0]) in FLOAT_TYPES
            and next(a.i for a in node.attribute if a.name == "to") not in FLOAT_TYPES]


def fuse_half(src: Path, dst: Path, cfg: EncoderConfig | ModelConfig | Shape) -> dict[str, int]:
    """A graph traced in fp16 (export/half_precision.py) fused as convert_fp16 fuses the fp32 one, SkipLayerNorm
    too: the same fp16 graph for CUDA, without an fp32 graph to convert. Runs in a child process."""
    return isolated.run("fusing the fp16 graph", f"{__name__}:_fuse",
                        {"src": str(src), "dst": str(dst), "shape": _shape(cfg), "skip_layer_norm": True})


def convert_fp16(src: Path, dst: Path, cfg: EncoderConfig | ModelConfig | Shape) -> dict[str, int]:
    """The fused graph in fp16 for the CUDA provider, SkipLayerNorm fused too (it pays on GPUs);
    inputs and outputs stay int64/fp32. Runs in a child process (export/isolated.py)."""
    return isolated.run("fp16 conversion", f"{__name__}:_convert_fp16",
                        {"src": str(src), "dst": str(dst), "shape": _shape(cfg)})


def _convert_fp16(src: str, dst: str, shape: dict[str, Any]) -> dict[str, int]:
    integer_casts = float_to_integer_casts(onnx.load(src, load_external_data=False))
    if integer_casts:
        raise ExportVerificationError(f"{Path(src).name} computes integers from floats ({', '.join(integer_casts)}), "
                                      "which fp16 would change; compute them ahead of the graph")
    with quiet(), _graph(Path(src).resolve()) as graph, _fp16_later() as pending:
        model = _fused(graph, Path(src).name, shape, skip_layer_norm=True)
        model.convert_float_to_float16(keep_io_types=True)
        _save(model, Path(dst).resolve(), Path(src).resolve(), pending)
    return op_counts(model.model)


@contextlib.contextmanager
def _fp16_later():
    """onnxruntime's fp16 converter made to leave the bytes of tensors still in a data file (_graph) where they
    are: such a tensor gets its fp16 type, and the conversion it would have made (the same function, the same
    limits) goes into the dict yielded, tensor name -> fp32 bytes -> fp16 bytes, for _save to apply as it writes
    the tensor. Tensors in memory are converted as the converter converts them. Undone on leaving."""
    import sys

    import numpy as np
    from onnx.external_data_helper import uses_external_data
    from onnxruntime.transformers import onnx_model

    # The converter's module as OnnxModel imports it (onnxruntime.transformers puts its folder on sys.path, so
    # that is `float16`, not onnxruntime.transformers.float16).
    float16: Any = sys.modules[onnx_model.convert_float_to_float16.__module__]

    pending: dict[str, Callable[[bytes], bytes]] = {}
    convert_tensor, value_info = float16.convert_tensor_float_to_float16, float16.make_value_info_from_tensor

    def later(tensor, min_positive_val=5.96e-08, max_finite_val=65504.0):
        if tensor.data_type != onnx.TensorProto.FLOAT or not uses_external_data(tensor) or tensor.HasField("raw_data"):
            return convert_tensor(tensor, min_positive_val, max_finite_val)
        tensor.data_type = onnx.TensorProto.FLOAT16
        pending[tensor.name] = lambda raw: float16.convert_np_to_float16(
            np.frombuffer(raw, dtype=np.float32), min_positive_val, max_finite_val).tobytes()
        return tensor

    def from_dims(tensor):  # the converter's own reads the tensor's values for its shape
        return onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))

    float16.convert_tensor_float_to_float16, float16.make_value_info_from_tensor = later, from_dims
    try:
        yield pending
    finally:
        float16.convert_tensor_float_to_float16, float16.make_value_info_from_tensor = convert_tensor, value_info


def quantize_int8(src: Path, dst: Path, cfg: EncoderConfig | ModelConfig | Shape) -> dict[str, int]:
    """Dynamic int8 quantisation of the fused graph's weights, per output channel: export's fallback where
    quantize_int8_measured cannot reach its bar (which it says in the log).

    Activations are quantised at run time, so no calibration set is needed.
    Measured against fp32 (per-tensor on the 1,512 sample texts, the rest on the 2,000-text bench corpus):
      per-tensor scales                      cosine mean 0.960, p1 0.924, min 0.845: unacceptable
      per-channel, every MatMul              1.89x fp32, mean 0.9922, p1 0.9843, min 0.9773
      per-channel, first FFN down in fp32    1.83x fp32, mean 0.9937, p1 0.9881, min 0.9802 (chosen)
      per-channel, every FFN down in fp32    1.39x fp32, mean 0.9958, p1 0.9921
    The first layer's feed-forward output carries BERT's large activation
    outliers; keeping that one projection in fp32 buys most of the accuracy
    for 3% of the speed.

    MPNet (all-mpnet-base-v2, 128 sample texts at max_seq_length 128) is far more sensitive: with the first FFN
    down in fp32, mean cosine 0.875 (min 0.71); every FFN down in fp32, 0.990 (min 0.973), at the tolerance's
    edge; the whole feed-forward in fp32 (attention alone in int8), mean 0.9975, p1 0.9939, min 0.9918 (chosen
    for the families in FP32_FEED_FORWARD).

    Runs in a child process (export/isolated.py).
    """
    return isolated.run("int8 quantization", f"{__name__}:_quantize_int8",
                        {"src": str(src), "dst": str(dst), "family": cfg.family})


def _quantize_int8(src: str, dst: str, family: str) -> dict[str, int]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .int8_recipes import weight_type

    model = onnx.load(src, load_external_data=False)
    keep_fp32 = [n.name for n in model.graph.node if n.name in (FIRST_FFN_DOWN, TOKEN_TYPE_LOOKUP, RELATIVE_BIAS_LOOKUP)
                 or (family in FP32_FEED_FORWARD and n.name.startswith("/encoder/layers.")
                     and n.name.endswith(("/feed_forward/up/MatMul", "/feed_forward/down/MatMul")))]
    if FIRST_FFN_DOWN not in keep_fp32:
        raise ExportVerificationError(f"{Path(src).name}: no node {FIRST_FFN_DOWN!r} to keep in fp32")
    del model
    with quiet():
        quantize_dynamic(
            src, dst, weight_type=getattr(QuantType, weight_type()), per_channel=True, nodes_to_exclude=keep_fp32,
            use_external_data_format=has_external_data(Path(src)),
            # The fused Attention op is from the com.microsoft domain, so shape
            # inference cannot type its output; it is fp32.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    return op_counts(onnx.load(dst, load_external_data=False))


# The int8 graph's accuracy against the fp32 graph (issue 14): cosine of sentence embeddings, mean and 1st percentile.
INT8_COSINE_MEAN, INT8_COSINE_P1 = 0.995, 0.99
# The choice is made on 64 calibration texts, and must hold on others: it asks this much more of them. Measured on
# MiniLM: 2 nodes in fp32 gave mean 0.9956 / p1 0.9916 on the calibration texts but 0.9949 / 0.9899 on the 2,000-text
# bench corpus; 3 nodes gave 0.9956 / 0.9914 there (bench/int8_candidates.md).
INT8_CHOICE_MARGIN = 0.001
# Most nodes the measured recipe may keep in fp32 before export falls back to quantize_int8's recipe.
INT8_MOST_FP32 = 6


def quantize_int8_measured(src: Path, dst: Path, calibration: list[dict],
                           on_stage: Callable[[str], None] = lambda what: None
                           ) -> tuple[dict[str, int], list[str], dict, dict[str, list[int]]]:
    """int8 with the feed-forwards' outlier units computed apart and the nodes kept in fp32 chosen by measured
    error, not by name (bench/int8_candidates.md).

    The recipe is dynamic per-channel: s8 weights against u8 activations, the pair onnxruntime's VNNI/AMX
    kernels take, u8 weights where those kernels saturate (int8_recipes.weight_type: AVX2 without VNNI); GELU as
    onnxruntime's FastGelu. First the outlier
    units of each feed-forward, found on the calibration feeds, get an fp32 side path (export/int8_outliers.py).
    If the whole graph then misses INT8_COSINE_MEAN / INT8_COSINE_P1 (plus INT8_CHOICE_MARGIN) against fp32 on
    those feeds, each quantizable node is quantized alone, its cosine drop measured, and the worst are kept in
    fp32, fewest first, until it holds. ValueError when INT8_MOST_FP32 nodes do not suffice. Returns op counts,
    the nodes kept, the measures and the layers split (down-projection -> outlier units). on_stage(what) is told
    as each stage starts (progress). Runs in a child process (export/isolated.py); the calibration feeds go to it
    in a file.
    """
    import numpy as np

    with tempfile.TemporaryDirectory(prefix=".int8-feeds-", dir=dst.parent) as tmp:
        feeds = Path(tmp) / "feeds.npz"
        np.savez(feeds, **{f"{i}/{name}": array for i, feed in enumerate(calibration) for name, array in feed.items()})
        counts, kept, measures, split = isolated.run(
            "int8 quantization", f"{__name__}:_quantize_int8_measured",
            {"src": str(src), "dst": str(dst), "feeds": str(feeds), "_on_stage": True}, on_stage)
    return counts, kept, measures, {layer: units for layer, units in split.items()}


def _quantize_int8_measured(src: str, dst: str, feeds: str, on_stage: Callable[[str], None]
                            ) -> tuple[dict[str, int], list[str], dict, dict[str, list[int]]]:
    import numpy as np

    calibration: list[dict] = []
    with np.load(feeds) as saved:
        for key in sorted(saved.files, key=lambda k: (int(k.split("/")[0]), k)):
            i, name = key.split("/")
            while len(calibration) <= int(i):
                calibration.append({})
            calibration[int(i)][name] = saved[key]
    return _measured(Path(src), Path(dst), calibration, on_stage)


def _measured(src: Path, dst: Path, calibration: list[dict], on_stage: Callable[[str], None]
              ) -> tuple[dict[str, int], list[str], dict, dict[str, list[int]]]:
    from .int8_outliers import side_path_nodes, split_outliers
    from .int8_recipes import Int8Recipe, build, weight_type
    from .int8_sensitivity import fewest_fp32_nodes

    with quiet(), tempfile.TemporaryDirectory() as tmp:
        split_graph = Path(tmp) / src.name
        on_stage("int8: finding the feed-forwards' outlier units")
        split = split_outliers(src, split_graph, calibration)
        on_stage("int8: measuring the int8 graph, and each node's sensitivity if it misses")
        recipe = Int8Recipe("dynamic per-channel, FastGelu, outlier units apart", fast_gelu=True,
                            keep_fp32=tuple(side_path_nodes(split)), weight_type=weight_type())
        kept, measures = fewest_fp32_nodes(recipe, split_graph, calibration, INT8_COSINE_MEAN + INT8_CHOICE_MARGIN,
                                           INT8_COSINE_P1 + INT8_CHOICE_MARGIN, INT8_MOST_FP32)
        on_stage("int8: writing the chosen int8 graph")
        build(recipe.excluding(kept, recipe.name), split_graph, dst)
    return op_counts(onnx.load(str(dst), load_external_data=False)), kept, measures, split
