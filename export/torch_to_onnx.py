"""torch Encoder -> ONNX graph with dynamic batch and sequence axes, its weights streamed into a data file.

The TorchScript exporter traces the module with its parameters as graph inputs (export_params=False): the graph
it returns is structure alone, and the weights never pass through it. trace() then writes each parameter into
the data file itself, one tensor at a time, and makes it an initializer there. The exporter's own way, with
export_params, holds the weights three times at its peak beside the module's (its folded copies, the protobuf,
the serialized bytes): all-mpnet-base-v2's 0.44 GB of weights took the tracing process from 0.66 GB to 2.07 GB.
Streamed, the trace adds one tensor to what the module holds, and takes 2.3 s of 5.6.

The exporter's last pass, ONNX shape inference over the whole graph, is handed the parameters' values too
(shapes_without_weight_values): it serialized every weight into a protobuf for it, 0.19 GB of all-mpnet-base-v2's
export peak and 5.8 s of its 6.6 s trace. The weights are graph inputs whose shapes the graph already has, and no
shape in these graphs is computed from a weight's values: handed none, it gives the same graph, byte for byte
(tests/test_export.py checks every family), in 0.8 s and 0.01 GB.

The one fold the exporter would have made that matters is done here too: nn.Linear exports as MatMul(x, W^T), and
a weight whose every use is that 2-D Transpose is written transposed, the Transpose nodes gone, as constant
folding leaves it (the graph onnxruntime's transformer optimizer fuses). The other constants the exporter would
fold (an Unsqueeze of a constant) onnxruntime folds when a session opens.
"""

from __future__ import annotations

import io
import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import onnx
import torch

from attnserve.engine.token_ids import made_up_token_ids
from attnserve.model.encoder import SentenceEncoder

from .external_data import SIZE_THRESHOLD, SharedWeights, TensorWriter, data_file, point_at

# Opset 17 has LayerNormalization as one op; every onnxruntime >= 1.14 runs it.
OPSET = 17
INPUTS = ("input_ids", "attention_mask")
# Only a model with more than one token type takes them (EncoderConfig.has_token_types).
TOKEN_TYPES = "token_type_ids"
# The attention graph's outputs beyond the embeddings graph's: the maps and each head's value norms.
MAPS = ("attentions", "value_norms")
# torch dtype -> ONNX's, for the weights a module holds.
ONNX_DTYPES = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16,
               torch.bfloat16: onnx.TensorProto.BFLOAT16, torch.int64: onnx.TensorProto.INT64,
               torch.int32: onnx.TensorProto.INT32, torch.bool: onnx.TensorProto.BOOL}


def export_graph(module: SentenceEncoder, path: Path, data: Path | None = None,
                 shared: SharedWeights | None = None) -> None:
    """Write the graph: inputs (B, T) int64 (input_ids, attention_mask and, where the model has token types,
    token_type_ids); outputs last_hidden_state (B, T, H), sentence_embedding (B, D) and, for the attention
    graph, attentions (L, B, nh, T, T) and value_norms (L, B, nh, T) (model/value_norms.py). Its weights go into
    `data` (default: data_file(path)), but for those `shared` already stores (trace())."""
    cfg = module.encoder.config
    inputs = INPUTS + ((TOKEN_TYPES,) if cfg.has_token_types else ())
    outputs = ["last_hidden_state", "sentence_embedding"] + (list(MAPS) if module.output_attentions else [])
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            TOKEN_TYPES: {0: "batch", 1: "sequence"},
            "last_hidden_state": {0: "batch", 1: "sequence"}, "sentence_embedding": {0: "batch"},
            "attentions": {1: "batch", 3: "sequence", 4: "sequence"}, "value_norms": {1: "batch", 3: "sequence"}}
    # Trace on a padded batch so that the mask path is live in the graph, and on two segments; where the module is.
    device = next(module.parameters()).device
    ids = torch.full((2, 8), made_up_token_ids(cfg.vocab_size)[0], dtype=torch.int64, device=device)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    types = torch.zeros_like(ids)
    types[:, 3:5] = 1
    trace(module, (ids, mask, types) if cfg.has_token_types else (ids, mask), inputs, outputs,
          {k: v for k, v in axes.items() if k in inputs or k in outputs}, path, data, shared)


def trace(module: torch.nn.Module, args: tuple[torch.Tensor, ...], input_names: Sequence[str],
          output_names: Sequence[str], dynamic_axes: dict[str, dict[int, str]], path: Path,
          data: Path | None = None, shared: SharedWeights | None = None) -> None:
    """module traced by the TorchScript exporter into the graph at path, its parameters and buffers written into
    `data` (default: data_file(path), which must sit beside path), each tensor found in `shared` read from there
    instead (module docstring)."""
    buffer = io.BytesIO()
    # The TorchScript exporter, not dynamo: its graph is the one onnxruntime's transformers optimizer fuses into
    # Attention nodes (dynamo's optimised graph is not).
    with warnings.catch_warnings(), torch.no_grad(), shapes_without_weight_values():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buffer, dynamo=False, opset_version=OPSET,  # type: ignore[arg-type]
                          export_params=False, do_constant_folding=False, input_names=list(input_names),
                          output_names=list(output_names), dynamic_axes=dynamic_axes)
    model = onnx.load_model_from_string(buffer.getvalue())
    del buffer
    data = data or data_file(path)
    if data.parent != path.parent:
        raise ValueError(f"{data} must sit beside {path}: a graph reads its data files from its own folder")
    _weights_as_initializers(model, module, set(input_names), TensorWriter(data), shared)
    onnx.save_model(model, str(path))


@contextmanager
def shapes_without_weight_values() -> Iterator[None]:
    """Within the block, the TorchScript exporter's whole-graph shape inference gets no parameter values (module
    docstring). Its pass is looked up by name on torch._C, where torch.onnx's exporter calls it; where a torch has
    it not, nothing changes."""
    passes = torch._C
    name = "_jit_pass_onnx_graph_shape_type_inference"
    original = getattr(passes, name, None)
    if original is None:
        yield
        return

    def without_values(graph, params_dict, opset_version):  # noqa: ARG001 (the values are what is dropped)
        return original(graph, {}, opset_version)

    setattr(passes, name, without_values)
    try:
        yield
    finally:
        setattr(passes, name, original)


def _weights_as_initializers(model: onnx.ModelProto, module: torch.nn.Module, inputs: set[str],
                             writer: TensorWriter, shared: SharedWeights | None) -> None:
    """The graph's parameter inputs made initializers, their bytes written one tensor at a time (a weight used only
    through a 2-D Transpose written transposed, the Transposes dropped)."""
    graph = model.graph
    tensors = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers(remove_duplicate=False))
    weights = [i for i in graph.input if i.name not in inputs]
    missing = [w.name for w in weights if w.name not in tensors]
    if missing:
        raise ValueError(f"the traced graph takes inputs that are no weight of the module: {missing[:5]}")
    users: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            users[name].append(node)
    renamed: dict[str, str] = {}  # a dropped Transpose's output -> the transposed weight
    dropped: set[int] = set()
    try:
        for weight in weights:
            tensor = tensors[weight.name].detach()
            name = weight.name
            if tensor.dim() == 2 and users[name] and all(_is_transpose_2d(n) for n in users[name]):
                tensor, name = tensor.t(), f"{weight.name}.T"
                for node in users[weight.name]:
                    renamed[node.output[0]] = name
                    dropped.add(id(node))
            graph.initializer.append(_initializer(name, tensor.contiguous().cpu(), writer, shared))
    finally:
        writer.close()
    kept = [node for node in graph.node if id(node) not in dropped]
    for node in kept:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    del graph.node[:]
    graph.node.extend(kept)
    real = [i for i in graph.input if i.name in inputs]
    del graph.input[:]
    graph.input.extend(real)


def _is_transpose_2d(node: onnx.NodeProto) -> bool:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return node.op_type == "Transpose" and perm == [1, 0]


def _initializer(name: str, tensor: torch.Tensor, writer: TensorWriter, shared: SharedWeights | None
                 ) -> onnx.TensorProto:
    """The initializer of a contiguous tensor, its bytes in writer's file (or where shared has them) unless small."""
    if tensor.dtype not in ONNX_DTYPES:
        raise ValueError(f"weight {name} is {tensor.dtype}, which export does not write")
    proto = onnx.TensorProto(name=name, data_type=ONNX_DTYPES[tensor.dtype], dims=list(tensor.shape))
    # The bytes as they lie in memory (bf16 has no numpy type: seen as int16), not copied.
    array = (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy()
    raw = array.data.cast("B")
    if len(raw) < SIZE_THRESHOLD:
        proto.raw_data = raw.tobytes()
        return proto
    found = shared.find(raw) if shared is not None else None
    if found is None:
        found = (writer.path.name, *writer.write(raw))
        if shared is not None:
            shared.add(raw, *found)
    point_at(proto, *found)
    return proto


def without_output(src: Path, dst: Path, output: str | tuple[str, ...]) -> None:
    """src's graph without one of its outputs (or several), and without the nodes and weights only they needed.

    Weights stay where src keeps them: dst names src's data files, so it must sit beside src.
    """
    model = onnx.load(str(src), load_external_data=False)
    onnx.save_model(pruned(model, (output,) if isinstance(output, str) else output, src.name), str(dst))


def pruned(model: onnx.ModelProto, dropped: tuple[str, ...], name: str = "the graph") -> onnx.ModelProto:
    """model without the outputs `dropped`, and without the nodes and weights only they needed (changed in place)."""
    kept_outputs = [o for o in model.graph.output if o.name not in dropped]
    if len(kept_outputs) != len(model.graph.output) - len(dropped):
        raise ValueError(f"{name} lacks one of the outputs {dropped!r}")
    del model.graph.output[:]
    model.graph.output.extend(kept_outputs)
    needed = {o.name for o in kept_outputs}
    kept_nodes = []
    for node in reversed(model.graph.node):  # the exporter's order is topological (and added nodes come last)
        if needed.intersection(node.output):
            kept_nodes.append(node)
            needed.update(node.input)
    kept_nodes.reverse()
    del model.graph.node[:]
    model.graph.node.extend(kept_nodes)
    weights = [t for t in model.graph.initializer if t.name in needed]
    del model.graph.initializer[:]
    model.graph.initializer.extend(weights)
    return model
