"""Outlier channels of the feed-forward computed apart, in fp32, so that int8 quantizes the rest well.

BERT-family encoders carry a few "massive activations": one hidden unit of the feed-forward, in one token (mostly
[CLS]), far larger than all the others. In all-MiniLM-L6-v2 the down-projection's input (the GELU output, F = 1536
units) peaks at 24.6 in unit 856 of layer 0, 20.4 in layer 1, 14.6 and 17.5 in layer 2, 13.7 in layer 3, while
every other unit stays under about 5 (calibration texts). onnxruntime's dynamic quantization takes one scale per
activation tensor, so that one value makes the step five times coarser for every other value: quantized whole, the
down-projections cost most of int8's error (bench/int8_candidates.md), and export used to keep three of them in fp32.

LLM.int8() (Dettmers et al., 2022) splits a matrix product by input column: the outlier columns in floating point,
the rest in int8. Here, per layer, with C the outlier units (chosen on calibration texts):

    up:    h = x W_up + b_up                      (B, T, F)
    gelu:  g = gelu(h)                            (B, T, F)
    down:  y = g W_down = g[:, ¬C] W_down[¬C] + g[:, C] W_down[C]

The rewrite computes g[:, C] from x by a small fp32 product (H × |C|), its own GELU and a |C| × H product, and adds
it to the int8 down-projection's output. In the main path the units of C are switched off exactly: their bias
becomes -1e4, where GELU (erf or tanh form) is 0.0 in fp32, and their rows of W_down become 0. The fp32 graph
this gives computes the same function as the original, up to summation order (cosine 1.0000 on the bench corpus).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from attnserve.engine.session import CHECK_SPIN, CPU, open_session

from . import external_data

# A unit is an outlier when its largest |activation| on the calibration texts exceeds this many times the 99th
# percentile of all the units' largest values. MiniLM: thresholds 7.4-9.8, outliers 13.7-24.6, the next unit ≤ 5.
OUTLIER_FACTOR = 2.0
# At most this many outlier units per layer (the largest): beyond a few, the side path stops being small.
MOST_OUTLIERS = 8
# The bias that switches a unit off in the main path: GELU(x - 1e4) is exactly 0.0 in fp32 for any x the
# up-projection gives (|x| < 1e3 by far).
OFF = -1.0e4
GELU_WITH_BIAS = "BiasGelu"  # onnxruntime's fused gelu(x + bias), which the optimizer makes of every BERT layout


@dataclass(frozen=True)
class FeedForward:
    """One layer's up MatMul -> BiasGelu -> down MatMul, as nodes of the fused graph."""
    up: onnx.NodeProto
    gelu: onnx.NodeProto
    down: onnx.NodeProto


def feed_forwards(model: onnx.ModelProto) -> list[FeedForward]:
    """Each MatMul fed by a BiasGelu fed by a MatMul, the two with constant weights: the layers this can split.
    Other shapes (ModernBERT's gated GeGLU, ReLU) are left as they are."""
    weights = {init.name for init in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    found = []
    for node in model.graph.node:
        gelu = producer.get(node.input[0]) if node.op_type == "MatMul" else None
        if gelu is None or gelu.op_type != GELU_WITH_BIAS:
            continue
        up = producer.get(gelu.input[0])
        if up is not None and up.op_type == "MatMul" and {node.input[1], up.input[1], gelu.input[1]} <= weights:
            found.append(FeedForward(up, gelu, node))
    return found


def largest_activations(path: Path, layers: list[FeedForward], feeds: list[dict[str, np.ndarray]]
                        ) -> list[np.ndarray]:
    """Per layer, each down-projection input unit's largest |value| over the real tokens of the feeds: (F,) each."""
    model = onnx.load(str(path), load_external_data=False)
    model.graph.output.extend(helper.make_tensor_value_info(ff.down.input[0], onnx.TensorProto.FLOAT, None)
                              for ff in layers)
    # Beside the graph: a graph with external data names its data file relative to its own folder.
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.stem}-activations-", suffix=".onnx") as probe:
        onnx.save(model, probe.name)
        # An arena emptied after each run (engine/session.py _ArenaPerRun).
        session = open_session(Path(probe.name), CPU, arena="per_run", spin=CHECK_SPIN)
        takes_types = "token_type_ids" in {i.name for i in session.get_inputs()}
        largest = [np.zeros(0, dtype=np.float32)] * len(layers)
        for feed in feeds:
            if takes_types:  # zeros, as the engine feeds single texts
                feed = {**feed, "token_type_ids": np.zeros_like(feed["input_ids"])}
            real = feed["attention_mask"].astype(bool)  # (B, T)
            outputs = session.run([ff.down.input[0] for ff in layers], feed)  # (B, T, F) each
            largest = [np.maximum(m, np.abs(o[real]).max(axis=0)) if m.size else np.abs(o[real]).max(axis=0)
                       for m, o in zip(largest, outputs, strict=True)]
    return largest


def outlier_units(largest: np.ndarray) -> np.ndarray:
    """The outlier units of one layer, largest first, at most MOST_OUTLIERS."""
    threshold = OUTLIER_FACTOR * np.percentile(largest, 99)
    above = np.flatnonzero(largest > threshold)
    return above[np.argsort(-largest[above])][:MOST_OUTLIERS]


def split_outliers(src: Path, dst: Path, feeds: list[dict[str, np.ndarray]]) -> dict[str, list[int]]:
    """Write to dst src's fp32 graph with each feed-forward's outlier units computed apart (module docstring).
    Returns the layers split: down-projection node name -> its outlier units."""
    external = external_data.has_external_data(src)
    # With external data, the graph without its weights' bytes: the split reads the few it changes (to_array reads
    # an external tensor from base), and dst gets the others copied one at a time (save_streamed).
    model = onnx.load(str(src), load_external_data=not external)
    base = str(src.parent) if external else ""
    layers = feed_forwards(model)
    largest = largest_activations(src, layers, feeds) if layers else []
    weights = {init.name: init for init in model.graph.initializer}
    split: dict[str, list[int]] = {}
    for ff, values in zip(layers, largest, strict=True):
        units = outlier_units(values)
        if units.size == 0:
            continue
        prefix = ff.down.name.rsplit("/", 1)[0] + "/outliers"
        w_up = numpy_helper.to_array(weights[ff.up.input[1]], base)  # (H, F)
        b_up = numpy_helper.to_array(weights[ff.gelu.input[1]], base).copy()  # (F,)
        w_down = numpy_helper.to_array(weights[ff.down.input[1]], base).copy()  # (F, H)
        model.graph.initializer.extend([
            numpy_helper.from_array(np.ascontiguousarray(w_up[:, units]), f"{prefix}/up.weight"),  # (H, k)
            numpy_helper.from_array(b_up[units], f"{prefix}/up.bias"),  # (k,)
            numpy_helper.from_array(np.ascontiguousarray(w_down[units]), f"{prefix}/down.weight"),  # (k, H)
        ])
        b_up[units], w_down[units] = OFF, 0.0
        weights[ff.gelu.input[1]].CopyFrom(numpy_helper.from_array(b_up, ff.gelu.input[1]))
        weights[ff.down.input[1]].CopyFrom(numpy_helper.from_array(w_down, ff.down.input[1]))
        output = ff.down.output[0]
        ff.down.output[0] = f"{prefix}/main_output"
        side = [
            helper.make_node("MatMul", [ff.up.input[0], f"{prefix}/up.weight"], [f"{prefix}/up_output"],
                             name=f"{prefix}/up/MatMul"),  # (B, T, k)
            helper.make_node(GELU_WITH_BIAS, [f"{prefix}/up_output", f"{prefix}/up.bias"], [f"{prefix}/gelu_output"],
                             name=f"{prefix}/{GELU_WITH_BIAS}", domain="com.microsoft"),  # (B, T, k)
            helper.make_node("MatMul", [f"{prefix}/gelu_output", f"{prefix}/down.weight"], [f"{prefix}/down_output"],
                             name=f"{prefix}/down/MatMul"),  # (B, T, H)
            helper.make_node("Add", [f"{prefix}/main_output", f"{prefix}/down_output"], [output],
                             name=f"{prefix}/Add"),  # (B, T, H): what the down-projection gave before
        ]
        at = list(model.graph.node).index(ff.down) + 1
        for offset, node in enumerate(side):
            model.graph.node.insert(at + offset, node)
        split[ff.down.name] = [int(u) for u in units]
    if external:
        external_data.save_streamed(model, dst, src.parent)
    else:
        external_data.save(model, dst, external)
    return split


def side_path_nodes(split: dict[str, list[int]]) -> list[str]:
    """The fp32 MatMul nodes of the side paths split_outliers() added: quantizing them would undo the split."""
    return [f"{down.rsplit('/', 1)[0]}/outliers/{part}/MatMul" for down in split for part in ("up", "down")]
