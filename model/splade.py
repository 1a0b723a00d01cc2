"""SPLADE: sparse lexical embeddings from a masked-language-model head (sentence-transformers' SparseEncoder).

A SparseEncoder's pipeline is Transformer (its task "fill-mask": the encoder and its MLM head, giving logits over
the vocabulary for every token) -> SpladePooling. This file reproduces both after our encoder, as
sentence-transformers 6.2 computes them:

  logits = decoder(LayerNorm(act(dense(h)))) + bias          (B, T, V)   BertForMaskedLM's cls.predictions
  w = log1p(relu(logits * mask))                             (B, T, V)   "log1p_relu": log1p once more
  sparse = max over T of w  (or the sum)                     (B, V)

relu and log1p do not decrease, so for max pooling they commute with the max: the graph takes the max of the
masked logits first and applies them to (B, V) rather than to every token's (B, T, V) logits, the same numbers
(a monotonic function of the largest element is the largest of the function's values) for two fewer passes over
the largest tensor of the graph.

The decoder is the word embeddings (tied, as config.json's tie_word_embeddings says by default) or its own
weight. The graph's sentence_embedding is then the (B, V) vector, almost all zeros: the engine and the replies
turn it into (index, value) pairs. Only BERT's MLM head is reproduced; another family's is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnserve.errors import CheckpointError

from .checkpoint_files import legacy_renamed
from .weights_files import Weights

STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
# BertForMaskedLM's head, as transformers saves it (the decoder's weight only when untied).
HEAD_KEYS = ("cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
             "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
             "cls.predictions.bias")
DECODER_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
# transformers' ACT2FN names that BERT configs use for the transform's activation.
TRANSFORM_ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                         "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


@dataclass(frozen=True)
class Splade:
    """A SpladePooling module's settings, and the vocabulary it spans."""

    strategy: str  # "max" or "sum" over the tokens
    activation: str  # "relu" (log1p(relu(x))) or "log1p_relu" (log1p(log1p(relu(x))))
    vocab_size: int

    def describe(self) -> str:
        return f"SpladePooling({self.strategy}, {self.activation})"


class SpladeHead(nn.Module):
    """(B, T, H) hidden states, (B, T) mask -> (B, V) SPLADE weights."""

    def __init__(self, splade: Splade, hidden_size: int, layer_norm_eps: float, hidden_act: str):
        super().__init__()
        self.splade = splade
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.act = TRANSFORM_ACTIVATIONS[hidden_act]
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, splade.vocab_size)

    def forward(self, last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.act(self.dense(last_hidden_state)))  # (B, T, H)
        logits = self.decoder(h)  # (B, T, V)
        mask = attention_mask.unsqueeze(-1).to(logits.dtype)  # (B, T, 1)
        masked = logits * mask  # (B, T, V), 0 at padding
        if self.splade.strategy == "max":
            w = torch.log1p(torch.relu(masked.amax(dim=1)))  # (B, V): the max first, then the activation
        else:
            w = torch.log1p(torch.relu(masked))  # (B, T, V)
        if self.splade.activation == "log1p_relu":
            w = torch.log1p(w)
        return w if self.splade.strategy == "max" else w.sum(dim=1)  # (B, V)


def check_head_keys(keys: set[str], weights: Path) -> None:
    """The checkpoint's keys outside the encoder must be BERT's MLM head."""
    missing = [k for k in HEAD_KEYS if k not in keys]
    if missing:
        raise CheckpointError(f"{weights}: a SparseEncoder's fill-mask Transformer needs BertForMaskedLM's head; "
                              f"missing {', '.join(missing)}")


def load_splade_head(weights: Weights, splade: Splade, config: dict) -> SpladeHead:
    """The head with its weights from the checkpoint's (the decoder tied to the word embeddings unless saved)."""
    head = SpladeHead(splade, int(config["hidden_size"]), float(config.get("layer_norm_eps", 1e-12)),
                      str(config.get("hidden_act", "gelu")))
    keys = {legacy_renamed(k): k for k in weights.keys()}  # current name -> as saved (LayerNorm.gamma, ...)
    check_head_keys(set(keys), Path(weights.name))
    tensors = {k: weights.get(keys[k]).float() for k in (*HEAD_KEYS, *DECODER_KEYS) if k in keys}
    decoder = tensors.get("cls.predictions.decoder.weight")
    if decoder is None:
        if WORD_EMBEDDINGS not in keys:
            raise CheckpointError(f"{weights.name}: the MLM decoder is tied to {WORD_EMBEDDINGS}, which is missing")
        decoder = weights.get(keys[WORD_EMBEDDINGS]).float()
    state = {"dense.weight": tensors["cls.predictions.transform.dense.weight"],
             "dense.bias": tensors["cls.predictions.transform.dense.bias"],
             "norm.weight": tensors["cls.predictions.transform.LayerNorm.weight"],
             "norm.bias": tensors["cls.predictions.transform.LayerNorm.bias"],
             "decoder.weight": decoder,
             # transformers ties cls.predictions.decoder.bias to cls.predictions.bias
             "decoder.bias": tensors.get("cls.predictions.decoder.bias", tensors["cls.predictions.bias"])}
    own = head.state_dict()
    for key, tensor in state.items():
        if tensor.shape != own[key].shape:
            raise CheckpointError(f"{weights.name}: the MLM head's {key} has shape {tuple(tensor.shape)}, expected "
                                  f"{tuple(own[key].shape)}")
    head.load_state_dict(state, strict=True)
    return head.eval()
