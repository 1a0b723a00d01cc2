"""Graph variants built with onnxruntime's own tools: attention fusion, int8 and fp16."""

from __future__ import annotations

import collections
import logging
import warnings
from pathlib import Path

import onnx

from attnserve.errors import ExportVerificationError
from attnserve.model.encoder import EncoderConfig


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(collections.Counter(node.op_type for node in model.graph.node))


def _quiet():
    # The optimizer logs every fusion pass at INFO/WARNING; export prints its own summary.
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")


def _optimized(src: Path, cfg: EncoderConfig):
    from onnxruntime.transformers import optimizer

    # opt_level=0: only the transformers fusions here; onnxruntime applies its
    # provider-specific graph optimisations itself when a session opens.
    model = optimizer.optimize_model(
        str(src), model_type="bert", num_heads=cfg.num_heads, hidden_size=cfg.hidden_size, opt_level=0
    )
    counts = op_counts(model.model)
    fused = counts.get("Attention", 0) + counts.get("MultiHeadAttention", 0)
    if fused != cfg.num_layers:
        raise ExportVerificationError(
            f"attention fusion matched {fused} of {cfg.num_layers} layers in {src.name}; op counts: {counts}"
        )
    return model


def fuse_attention(src: Path, dst: Path, cfg: EncoderConfig) -> dict[str, int]:
    """Fuse each layer's attention subgraph into one Attention node (plus SkipLayerNorm, BiasGelu)."""
    with warnings.catch_warnings():
        _quiet()
        model = _optimized(src, cfg)
        model.save_model_to_file(str(dst))
    return op_counts(model.model)


def convert_fp16(src: Path, dst: Path, cfg: EncoderConfig) -> dict[str, int]:
    """The fused graph in fp16 for the CUDA provider; inputs and outputs stay int64/fp32."""
    with warnings.catch_warnings():
        _quiet()
        model = _optimized(src, cfg)
        model.convert_float_to_float16(keep_io_types=True)
        model.save_model_to_file(str(dst))
    return op_counts(model.model)


def quantize_int8(src: Path, dst: Path) -> dict[str, int]:
    """Dynamic int8 quantisation of the fused graph's weights, per output channel.

    Per-tensor scales lose too much (min cosine 0.84 against fp32 on the sample
    texts); per-channel keeps mean cosine above 0.99. Activations are quantised
    at run time, so no calibration set is needed.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with warnings.catch_warnings():
        _quiet()
        quantize_dynamic(
            str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
            # The fused Attention op is from the com.microsoft domain, so shape
            # inference cannot type its output; it is fp32.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    return op_counts(onnx.load(str(dst), load_external_data=False))
