"""torch Encoder -> ONNX graph with dynamic batch and sequence axes."""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import onnx
import torch

from attnserve.model.encoder import SentenceEncoder

from . import external_data
from .token_ids import made_up_token_ids

# Opset 17 has LayerNormalization as one op; every onnxruntime >= 1.14 runs it.
OPSET = 17
INPUTS = ("input_ids", "attention_mask")
# Only a model with more than one token type takes them (EncoderConfig.has_token_types).
TOKEN_TYPES = "token_type_ids"
# The attention graph's outputs beyond the embeddings graph's: the maps and each head's value norms.
MAPS = ("attentions", "value_norms")


def export_graph(module: SentenceEncoder, path: Path, external: bool = False) -> None:
    """Write the graph: inputs (B, T) int64 (input_ids, attention_mask and, where the model has token types,
    token_type_ids); outputs last_hidden_state (B, T, H), sentence_embedding (B, D) and, for the attention
    graph, attentions (L, B, nh, T, T) and value_norms (L, B, nh, T) (model/value_norms.py). external: its weights
    in one data file beside it (external_data.py)."""
    cfg = module.encoder.config
    inputs = INPUTS + ((TOKEN_TYPES,) if cfg.has_token_types else ())
    outputs = ["last_hidden_state", "sentence_embedding"] + (list(MAPS) if module.output_attentions else [])
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            TOKEN_TYPES: {0: "batch", 1: "sequence"},
            "last_hidden_state": {0: "batch", 1: "sequence"}, "sentence_embedding": {0: "batch"},
            "attentions": {1: "batch", 3: "sequence", 4: "sequence"}, "value_norms": {1: "batch", 3: "sequence"}}
    # Trace on a padded batch so that the mask path is live in the graph, and on two segments.
    ids = torch.full((2, 8), made_up_token_ids(cfg.vocab_size)[0], dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    types = torch.zeros_like(ids)
    types[:, 3:5] = 1
    # The TorchScript exporter, not dynamo: its graph is the one onnxruntime's
    # transformers optimizer fuses into Attention nodes (dynamo's optimised graph is not).
    # Past 2 GB the exporter writes each tensor to a file of its own beside the graph: it writes into a folder of
    # its own, and the graph is saved again with its tensors in one data file (the same path a forced small graph
    # takes).
    traced = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=path.parent)) / path.name if external else path
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module, (ids, mask, types) if cfg.has_token_types else (ids, mask), str(traced), dynamo=False,
                opset_version=OPSET, input_names=list(inputs), output_names=outputs,
                dynamic_axes={k: v for k, v in axes.items() if k in inputs or k in outputs},
            )
        if external:  # the tensors copied one at a time: the graph is never whole in memory beside the model
            external_data.save_streamed(onnx.load(str(traced), load_external_data=False), path, traced.parent)
    finally:
        if external:
            shutil.rmtree(traced.parent, ignore_errors=True)


def without_output(src: Path, dst: Path, output: str | tuple[str, ...]) -> None:
    """src's graph without one of its outputs (or several), and without the nodes and weights only they needed: the
    embeddings graph from the attention graph's one trace (each is what tracing without that output gives: the
    attention maps are the softmax that attention computes anyway, stacked).

    Weights stay where src keeps them: with external data, dst names src's data file, so it must sit beside src.
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
