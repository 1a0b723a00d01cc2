"""The sentence-transformers modules after the encoder, in torch: Pooling, then Dense and Normalize in order.

The module the export traces ends here, before a trailing Normalize (the engine applies that one, so that
a request can ask for the embedding unnormalised). Dense weights come from the module's model.safetensors
only (a pickle file can run code on load), through the same loud key checks as the encoder's.
Shapes: B batch, T sequence, H hidden, D the sentence embedding's size.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file

from attnserve.errors import CheckpointError
from attnserve.pooling_modes import PROMPT_TOKEN

from .checkpoint_files import read_json
from .colbert import TokenVectors
from .dense import DENSE_WEIGHTS, Dense, Normalize
from .pipeline import Pipeline
from .pooling import Pooling
from .splade import load_splade_head
from .weights_files import Weights


class DenseLayer(nn.Module):
    """sentence-transformers' Dense: activation(linear(x)) (+ x, projected without bias when sizes differ)."""

    def __init__(self, spec: Dense):
        super().__init__()
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.activation = getattr(nn, spec.activation)()
        self.use_residual = spec.use_residual
        self.residual = (nn.Linear(spec.in_features, spec.out_features, bias=False)
                         if spec.use_residual and spec.in_features != spec.out_features else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in) -> (B, out)"""
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (x if self.residual is None else self.residual(x))
        return out


class L2Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2.0, dim=-1)  # eps 1e-12, as sentence-transformers' Normalize


class SentenceHead(nn.Module):
    """(B, T, H) hidden states, (B, T) mask -> (B, D): the pipeline's sentence embedding, not normalised."""

    def __init__(self, pipeline: Pipeline):
        super().__init__()
        # include_prompt false: the prompt's tokens are PROMPT_TOKEN in the mask (attended to, left out of the pooling)
        self.excludes_prompt = not pipeline.include_prompt
        self.pooling = Pooling(pipeline.pooling, pipeline.pads_zeroed)
        self.modules_after = nn.ModuleList(DenseLayer(m) if isinstance(m, Dense) else L2Normalize()
                                           for m in pipeline.after_pooling)

    def forward(self, last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.excludes_prompt:
            attention_mask = (attention_mask != PROMPT_TOKEN).to(attention_mask.dtype) * attention_mask  # (B, T) 0/1
        x = self.pooling(last_hidden_state, attention_mask)  # (B, len(modes) * H)
        for module in self.modules_after:
            x = module(x)
        return x


def load_head(directory: Path, pipeline: Pipeline) -> nn.Module:
    """The head with each Dense module's weights loaded from its folder; a SparseEncoder's SPLADE head
    (model/splade.py) with its MLM head's weights; a MultiVectorEncoder's mean of its token vectors."""
    if pipeline.splade is not None:
        return load_splade_head(Weights(directory), pipeline.splade, read_json(directory / "config.json"))
    if pipeline.multi_vector is not None:  # the mean of the vectors (model/colbert.py): the graph's shape, unserved
        return Pooling(("mean",)).eval()

    head = SentenceHead(pipeline)
    for spec, layer in zip(pipeline.after_pooling, head.modules_after, strict=True):
        if isinstance(spec, Dense):
            load_dense(directory, spec, layer)
        else:
            assert isinstance(spec, Normalize)
    return head.eval()


def load_dense(directory: Path, spec: Dense, layer: nn.Module) -> None:
    """A Dense module's weights from its folder's model.safetensors, under loud key and shape checks."""
    path = directory / spec.folder / DENSE_WEIGHTS
    if spec.checkpoint_keys:  # the checkpoint's own weights hold it (CLIP's text_projection)
        weights = Weights(directory)
        tensors = {ours: weights.get(theirs) for ours, theirs in zip(("linear.weight", "linear.bias"),
                                                                      spec.checkpoint_keys, strict=False)}
    else:
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"corrupt weights file {path}: {e}") from None
    own = layer.state_dict()
    if set(tensors) != set(own):
        raise CheckpointError(f"{path}: keys do not match {spec.describe()} (expected {sorted(own)}, "
                              f"found {sorted(tensors)})")
    for key, tensor in tensors.items():
        if tensor.shape != own[key].shape:
            raise CheckpointError(f"{path}: {key} has shape {tuple(tensor.shape)}, expected "
                                  f"{tuple(own[key].shape)}")
    layer.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)


def load_token_vectors(directory: Path, encoder: nn.Module, pipeline: Pipeline) -> nn.Module:
    """A MultiVectorEncoder's encoder: ours, then its Dense modules and Normalize on each token (model/colbert.py)."""
    assert pipeline.multi_vector is not None
    layers: list[nn.Module] = []
    for spec in pipeline.multi_vector.dense:
        layer = DenseLayer(spec)
        load_dense(directory, spec, layer)
        layers.append(layer)
    return TokenVectors(encoder, layers, pipeline.multi_vector.dimension, pipeline.multi_vector.normalize).eval()
