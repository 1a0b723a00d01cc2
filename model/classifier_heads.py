"""The sequence-classification heads cross-encoders end in: one row per transformers architecture.

A head reads the encoder's last hidden states (B, T, H) and the attention mask (B, T) and returns logits
(B, num_labels), exactly as the architecture's transformers class computes them (dropout is off at inference).
Each row says which config.json model_type the head sits on, which options it reads from config.json (refused
in one line where this code does not reproduce them), its weights' keys (checkpoint key -> the head module's
key) and how to build it. A new family's head (Qwen3ForSequenceClassification: a linear "score" on the last real
token) is one more row, with its own module where no existing one computes it.

Read from transformers 5.24:
- BertForSequenceClassification: classifier(tanh(bert.pooler.dense(h[:, 0])));
- RobertaForSequenceClassification, XLMRobertaForSequenceClassification, MPNetForSequenceClassification:
  their ClassificationHead, out_proj(tanh(dense(h[:, 0]))): BERT's arithmetic under other names;
- DistilBertForSequenceClassification: classifier(relu(pre_classifier(h[:, 0])));
- ModernBertForSequenceClassification: classifier(norm(act(dense(pool(h))))), pool the first token ("cls") or
  the mean over real tokens ("mean"), act config.classifier_activation, dense's bias config.classifier_bias,
  norm's eps and bias the encoder's norm_eps and norm_bias; the classifier always has a bias;
- DebertaV2ForSequenceClassification: classifier(act(pooler.dense(h[:, 0]))), its ContextPooler, act
  config.pooler_hidden_act (pooler_hidden_size must be hidden_size, which the classifier reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnserve.errors import CheckpointError

from .config_reading import flag


class FirstTokenHead(nn.Module):
    """out(activation(dense(h[:, 0]))): BERT's pooler and classifier, RoBERTa's ClassificationHead (tanh) and
    DistilBERT's pre_classifier and classifier (ReLU)."""

    def __init__(self, hidden_size: int, num_labels: int, activation: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, num_labels)
        self.activation = activation

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, H), attention_mask (B, T) -> logits (B, num_labels); the first token is [CLS] or <s>."""
        return self.out(self.activation(self.dense(hidden[:, 0])))  # (B, num_labels)


@dataclass(frozen=True)
class ModernBertHeadOptions:
    pooling: str  # "cls" or "mean"
    activation: str  # a key of MODERNBERT_ACTIVATIONS
    dense_bias: bool  # classifier_bias
    norm_eps: float
    norm_bias: bool


# transformers' ACT2FN names this head may use; "gelu" is the exact erf form there.
MODERNBERT_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu,
    "silu": F.silu, "tanh": torch.tanh,
}


class ModernBertHead(nn.Module):
    def __init__(self, hidden_size: int, num_labels: int, options: ModernBertHeadOptions):
        super().__init__()
        self.options = options
        self.dense = nn.Linear(hidden_size, hidden_size, bias=options.dense_bias)
        self.norm = nn.LayerNorm(hidden_size, eps=options.norm_eps, bias=options.norm_bias)
        self.out = nn.Linear(hidden_size, num_labels)
        self.activation = MODERNBERT_ACTIVATIONS[options.activation]

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, H), attention_mask (B, T) -> logits (B, num_labels)."""
        if self.options.pooling == "cls":
            pooled = hidden[:, 0]  # (B, H)
        else:  # the mean over real tokens, as transformers divides: by the mask's sum
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)  # (B, H)
        return self.out(self.norm(self.activation(self.dense(pooled))))  # (B, num_labels)


@dataclass(frozen=True)
class HeadRow:
    model_type: str  # config.json's model_type the head sits on
    read: Callable[[dict, Path], Any]  # config.json -> the head's options, or a one-line CheckpointError
    keys: Callable[[Any], dict[str, str]]  # options -> {checkpoint key: head module key}
    build: Callable[[Any, int, int], nn.Module]  # (options, hidden size, num_labels) -> the head, weights unset


def _no_options(raw: dict, path: Path) -> None:
    return None


def _linear_keys(pairs: dict[str, str]) -> dict[str, str]:
    """{checkpoint Linear: head Linear} -> their weight and bias keys."""
    return {f"{theirs}.{param}": f"{ours}.{param}" for theirs, ours in pairs.items() for param in ("weight", "bias")}


# BERT's pooler is the encoder's module in the checkpoint (bert.pooler), the head's here.
BERT_HEAD = _linear_keys({"bert.pooler.dense": "dense", "classifier": "out"})
CLASSIFICATION_HEAD = _linear_keys({"classifier.dense": "dense", "classifier.out_proj": "out"})
DISTILBERT_HEAD = _linear_keys({"pre_classifier": "dense", "classifier": "out"})


def _first_token(activation: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Any, int, int], nn.Module]:
    return lambda options, hidden, labels: FirstTokenHead(hidden, labels, activation)


def read_modernbert_head(raw: dict, path: Path) -> ModernBertHeadOptions:
    pooling = raw.get("classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise CheckpointError(f"{path}: cannot reproduce classifier_pooling {pooling!r} (only 'cls' or 'mean')")
    activation = raw.get("classifier_activation", "gelu")
    if activation not in MODERNBERT_ACTIVATIONS:
        raise CheckpointError(f"{path}: cannot reproduce classifier_activation {activation!r} (only "
                              f"{', '.join(MODERNBERT_ACTIVATIONS)})")
    try:
        eps = float(raw.get("norm_eps", 1e-5))
    except (TypeError, ValueError):
        raise CheckpointError(f"{path}: norm_eps must be a number, got {raw.get('norm_eps')!r}") from None
    return ModernBertHeadOptions(pooling, activation, flag(raw, "classifier_bias", path), eps,
                                 flag(raw, "norm_bias", path))


def modernbert_head_keys(options: ModernBertHeadOptions) -> dict[str, str]:
    keys = {"head.dense.weight": "dense.weight", "head.norm.weight": "norm.weight",
            "classifier.weight": "out.weight", "classifier.bias": "out.bias"}
    if options.dense_bias:
        keys["head.dense.bias"] = "dense.bias"
    if options.norm_bias:
        keys["head.norm.bias"] = "norm.bias"
    return keys


DEBERTA_HEAD = _linear_keys({"pooler.dense": "dense", "classifier": "out"})


def read_deberta_head(raw: dict, path: Path) -> str:
    """The ContextPooler's activation; its size must be the encoder's."""
    size, hidden = raw.get("pooler_hidden_size", raw.get("hidden_size")), raw.get("hidden_size")
    if size != hidden:
        raise CheckpointError(f"{path}: cannot reproduce pooler_hidden_size {size!r} (only hidden_size, {hidden!r})")
    activation = raw.get("pooler_hidden_act", "gelu")
    if activation not in MODERNBERT_ACTIVATIONS:
        raise CheckpointError(f"{path}: cannot reproduce pooler_hidden_act {activation!r} (only "
                              f"{', '.join(MODERNBERT_ACTIVATIONS)})")
    return str(activation)


HEADS: dict[str, HeadRow] = {
    "BertForSequenceClassification": HeadRow("bert", _no_options, lambda _: BERT_HEAD, _first_token(torch.tanh)),
    "RobertaForSequenceClassification": HeadRow("roberta", _no_options, lambda _: CLASSIFICATION_HEAD,
                                                _first_token(torch.tanh)),
    "XLMRobertaForSequenceClassification": HeadRow("xlm-roberta", _no_options, lambda _: CLASSIFICATION_HEAD,
                                                   _first_token(torch.tanh)),
    "MPNetForSequenceClassification": HeadRow("mpnet", _no_options, lambda _: CLASSIFICATION_HEAD,
                                              _first_token(torch.tanh)),
    "DistilBertForSequenceClassification": HeadRow("distilbert", _no_options, lambda _: DISTILBERT_HEAD,
                                                   _first_token(F.relu)),
    "ModernBertForSequenceClassification": HeadRow("modernbert", read_modernbert_head, modernbert_head_keys,
                                                   lambda options, hidden, labels: ModernBertHead(hidden, labels,
                                                                                                  options)),
    "DebertaV2ForSequenceClassification": HeadRow(
        "deberta-v2", read_deberta_head, lambda _: DEBERTA_HEAD,
        lambda activation, hidden, labels: FirstTokenHead(hidden, labels, MODERNBERT_ACTIVATIONS[activation])),
}


@dataclass(frozen=True)
class Head:
    """One checkpoint's head: its architecture (a key of HEADS) and the options its config.json gave."""

    architecture: str
    options: Any

    @property
    def keys(self) -> dict[str, str]:
        """Checkpoint key -> the head module's key: exactly the keys the checkpoint's head must have."""
        return HEADS[self.architecture].keys(self.options)

    def build(self, hidden_size: int, num_labels: int) -> nn.Module:
        return HEADS[self.architecture].build(self.options, hidden_size, num_labels)


def architectures_on(model_type: str) -> list[str]:
    """The cross-encoder heads served over a family."""
    return [name for name, row in HEADS.items() if row.model_type == model_type]


def head_of(raw: dict, path: Path) -> Head | None:
    """The classifier head config.json names, read (or refused in one line); None for a checkpoint without one of
    HEADS (its family's reader then takes or refuses its architectures)."""
    architectures = raw.get("architectures")
    if not isinstance(architectures, list):
        return None
    named = [a for a in architectures if isinstance(a, str) and a in HEADS]
    if not named:
        return None
    if len(architectures) != 1:
        raise CheckpointError(f"{path}: cannot reproduce architectures {architectures!r} (a cross-encoder names "
                              "its one classification architecture)")
    row = HEADS[named[0]]
    if raw.get("model_type") != row.model_type:
        raise CheckpointError(f"{path}: architecture {named[0]} sits on model_type {row.model_type!r}, but "
                              f"config.json says {raw.get('model_type')!r}")
    return Head(named[0], row.read(raw, path))
