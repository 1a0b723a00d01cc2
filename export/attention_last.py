"""The last-layer attention graph: the attention graph with only the last layer's maps and attention rollout.

Most attention requests ask for the default layer (the last) or for rollout alone (docs/attention.md). The attention
graph answers them by stacking every layer's maps into one [L, B, nh, T, T] output, beside each head's value norms,
and the server computes rollout from the stack in numpy: that graph ran at 1.2-1.5x the embeddings graph's time a
batch, and rollout in numpy added 0.15-0.36 more (docs/performance.md, "The attention path"). onnxruntime runs every
node of a graph whatever outputs a run fetches, so fetching fewer outputs saves nothing: a graph of its own is what
leaves the other layers' maps unkept.

This graph is built from the attention graph's trace, not traced again: its outputs are the embeddings graph's, then

  last_attentions  (B, nh, T, T)  the last layer's softmax, the tensor the attention graph stacks last;
  rollout          (B, T, T)      attnserve/attention_analyses.py's rollout, in float32: per layer the heads' mean A,
                                  0.5 A + 0.5 I with its rows re-normalised, multiplied from the first layer to the
                                  last (R = Â_L ... Â_1);

and the stack, the value norms and every node only they needed are pruned. The maps it reads are the inputs of the
attention graph's stack: torch.stack exports as one Concat of an Unsqueeze per layer, each of that layer's softmax.

A padded batch gives each row's real block exactly: a real query gives a padded key weight 0 (verification checks
it), so Â[:n, n:] is 0 and (Â R)[:n, :n] = Â[:n, :n] R[:n, :n]; the server cuts each row to [:n, :n] as it cuts the
maps. export/verify.py compares both outputs with PyTorch's maps (rollout: attnserve/attention_analyses.py's rollout of
them, per row), as it compares every graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .torch_to_onnx import MAPS, pruned

LAST_MAPS, ROLLOUT = "last_attentions", "rollout"


def layer_maps(graph: onnx.GraphProto) -> list[str]:
    """The names of every layer's maps (B, nh, T, T), in layer order: the stacked inputs of the `attentions`
    output."""
    producers = {out: node for node in graph.node for out in node.output}
    stack = producers.get("attentions")
    if stack is None or stack.op_type != "Concat":
        raise ValueError("the attention graph's `attentions` is not a Concat of its layers' maps")
    maps = []
    for name in stack.input:
        unsqueeze = producers.get(name)
        if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
            raise ValueError(f"the attention graph stacks {name}, which is no Unsqueeze of a layer's maps")
        maps.append(unsqueeze.input[0])
    return maps


def _rollout_nodes(maps: list[str]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing ROLLOUT (B, T, T) from each layer's maps (B, nh, T, T), in ONNX opset 17 (torch_to_onnx.py).
    The last node writes ROLLOUT itself: an Identity to name it would copy it."""
    constants = [numpy_helper.from_array(np.array([0], np.int64), "rollout/first"),
                 numpy_helper.from_array(np.array([-1], np.int64), "rollout/keys")]
    nodes: list[onnx.NodeProto] = []
    result = None  # the product so far, R = Â_l ... Â_1
    for layer, probs in enumerate(maps):
        p = f"rollout/{layer}/"
        a = ROLLOUT if len(maps) == 1 else p + "a"  # one layer: Â_1 I is the rollout
        nodes += [
            helper.make_node("ReduceMean", [probs], [p + "mean"], axes=[1], keepdims=0),  # (B, T, T): heads' mean
            # I (T, T), the shape of one row's mean: EyeLike takes a 2-D input.
            helper.make_node("Gather", [p + "mean", "rollout/first"], [p + "row"], axis=0),  # (1, T, T)
            helper.make_node("Squeeze", [p + "row", "rollout/first"], [p + "square"]),  # (T, T)
            helper.make_node("EyeLike", [p + "square"], [p + "eye"]),  # (T, T)
            # 0.5 A + 0.5 I with its rows re-normalised is (A + I) / its row sums: halving is exact, and cancels.
            helper.make_node("Add", [p + "mean", p + "eye"], [p + "plus"]),  # (B, T, T)
            helper.make_node("ReduceSum", [p + "plus", "rollout/keys"], [p + "rows"], keepdims=1),  # (B, T, 1)
            helper.make_node("Div", [p + "plus", p + "rows"], [a]),  # Â
        ]
        if result is None:
            result = a
        else:  # this layer's flow on top of the layers below it: (B, T, T)
            product = ROLLOUT if layer == len(maps) - 1 else p + "product"
            nodes.append(helper.make_node("MatMul", [a, result], [product]))
            result = product
    return nodes, constants


def build_attention_last(src: Path, dst: Path) -> None:
    """dst: src's attention graph with LAST_MAPS and ROLLOUT in place of its MAPS. Weights stay where src keeps
    them (with external data dst names src's data file, so it sits beside src), as torch_to_onnx.without_output."""
    model = onnx.load(str(src), load_external_data=False)
    graph = model.graph
    maps = layer_maps(graph)
    # The last layer's maps renamed LAST_MAPS where they are made and used: an Identity to name them would copy them.
    for node in graph.node:
        for names in (node.input, node.output):
            for i, name in enumerate(names):
                if name == maps[-1]:
                    names[i] = LAST_MAPS
    maps[-1] = LAST_MAPS
    nodes, constants = _rollout_nodes(maps)
    graph.node.extend(nodes)
    graph.initializer.extend(constants)
    heads = next(o for o in graph.output if o.name == "attentions").type.tensor_type.shape.dim[2]
    graph.output.extend([
        helper.make_tensor_value_info(LAST_MAPS, TensorProto.FLOAT, ["batch", heads.dim_value or heads.dim_param,
                                                                     "sequence", "sequence"]),
        helper.make_tensor_value_info(ROLLOUT, TensorProto.FLOAT, ["batch", "sequence", "sequence"])])
    onnx.save_model(pruned(model, tuple(o.name for o in graph.output if o.name in MAPS)), str(dst))
