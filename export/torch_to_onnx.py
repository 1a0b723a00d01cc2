"""torch Encoder -> ONNX graph with dynamic batch and sequence axes."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from attnserve.model.encoder import SentenceEncoder

from .token_ids import made_up_token_ids

# Opset 17 has LayerNormalization as one op; every onnxruntime >= 1.14 runs it.
OPSET = 17
INPUTS = ("input_ids", "attention_mask")
# Only a model with more than one token type takes them (EncoderConfig.has_token_types).
TOKEN_TYPES = "token_type_ids"


def export_graph(module: SentenceEncoder, path: Path) -> None:
    """Write the graph: inputs (B, T) int64 (input_ids, attention_mask and, where the model has token types,
    token_type_ids); outputs last_hidden_state (B, T, H), sentence_embedding (B, D) and, for the attention
    graph, attentions (L, B, nh, T, T)."""
    cfg = module.encoder.config
    inputs = INPUTS + ((TOKEN_TYPES,) if cfg.has_token_types else ())
    outputs = ["last_hidden_state", "sentence_embedding"] + (["attentions"] if module.output_attentions else [])
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            TOKEN_TYPES: {0: "batch", 1: "sequence"},
            "last_hidden_state": {0: "batch", 1: "sequence"}, "sentence_embedding": {0: "batch"},
            "attentions": {1: "batch", 3: "sequence", 4: "sequence"}}
    # Trace on a padded batch so that the mask path is live in the graph, and on two segments.
    ids = torch.full((2, 8), made_up_token_ids(cfg.vocab_size)[0], dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    types = torch.zeros_like(ids)
    types[:, 3:5] = 1
    # The TorchScript exporter, not dynamo: its graph is the one onnxruntime's
    # transformers optimizer fuses into Attention nodes (dynamo's optimised graph is not).
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (ids, mask, types) if cfg.has_token_types else (ids, mask), str(path), dynamo=False,
            opset_version=OPSET, input_names=list(inputs), output_names=outputs,
            dynamic_axes={k: v for k, v in axes.items() if k in inputs or k in outputs},
        )
