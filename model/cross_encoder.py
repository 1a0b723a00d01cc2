"""Cross-encoders (rerankers): an encoder and its classification head, scoring sentence pairs.

A checkpoint whose config.json names one of classifier_heads.HEADS (BertForSequenceClassification,
XLMRobertaForSequenceClassification, ModernBertForSequenceClassification, ...) is exported as a reranker, never
as an embedder: its output is the head's logits over the pair ("[CLS] query [SEP] document [SEP]", "<s> query
</s></s> document </s>", as its tokenizer joins a pair), computed as the architecture's transformers class does.
sentence-transformers' CrossEncoder then applies its activation (a sigmoid for one label): the graph returns the
raw logits and the manifest names the activation, so that a request may ask for either.

This file owns what a reranker adds to an encoder checkpoint whatever its family: the CrossEncoder's files
(modules.json, config_sentence_transformers.json, sentence_bert_config.json) and activation, read as
sentence-transformers 6.2 reads them or refused with one line, and the module that is exported: the encoder
and its head (classifier_heads.py) over its hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn as nn

from attnserve.errors import CheckpointError

from .checkpoint_files import read_json, tokenizer_lowercases
from .classifier_heads import Head
from .family import EncoderModule
from .tokenizer_files import tokenizer_json
from .value_norms import keep_value_norms, stacked_value_norms
from .weights_files import Weights

# CrossEncoder activations (their dotted class paths, as sentence-transformers saves them) -> the manifest's names.
ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
}
# What a CrossEncoder's Transformer module must say to run the classifier as transformers does.
TRANSFORMER_EXPECTED = {
    "transformer_task": "sequence-classification",
    "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
    "module_output_name": "scores",
}
TRANSFORMER_FREE = {"max_seq_length", "do_lower_case", "model_kwargs", "processor_kwargs", "config_kwargs",
                    "tokenizer_args", "model_args", "config_args", "processing_kwargs"}


@dataclass(frozen=True)
class RerankerSpec:
    num_labels: int
    score_activation: str  # one of ACTIVATIONS' values
    max_seq_length: int | None  # from sentence_bert_config.json; None: the tokenizer's (pipeline.py)


def num_labels(raw: dict, path: Path) -> int:
    """transformers' rule: as many labels as id2label names, else num_labels, else 2."""
    labels = raw.get("id2label")
    n = len(labels) if isinstance(labels, dict) and labels else raw.get("num_labels", 2)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise CheckpointError(f"{path}: num_labels must be a positive integer, got {n!r}")
    return n


PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


def label_names(raw: dict, n: int, path: Path) -> tuple[str, ...]:
    """The labels in output order: config.json's id2label ({"0": "negative", ...}), else transformers' LABEL_i."""
    labels = raw.get("id2label")
    if not isinstance(labels, dict) or not labels:
        return tuple(f"LABEL_{i}" for i in range(n))
    try:
        by_index = {int(k): str(v) for k, v in labels.items()}
    except (TypeError, ValueError):
        raise CheckpointError(f"{path}: id2label keys must be label indices, got {sorted(labels)!r}") from None
    if sorted(by_index) != list(range(n)):
        raise CheckpointError(f"{path}: id2label must name labels 0..{n - 1}, got {sorted(by_index)}")
    return tuple(by_index[i] for i in range(n))


def problem_type(raw: dict, path: Path) -> str | None:
    """config.json's problem_type, which decides a classifier's scores (softmax or sigmoid), or None."""
    value = raw.get("problem_type")
    if value is not None and value not in PROBLEM_TYPES:
        raise CheckpointError(f"{path}: problem_type {value!r} is not one of {', '.join(PROBLEM_TYPES)}")
    return value


def read_reranker(directory: Path, config: dict) -> RerankerSpec:
    """The CrossEncoder's settings over a checkpoint with a classification head, or a one-line refusal."""
    labels = num_labels(config, directory / "config.json")
    architecture = (config.get("architectures") or ["classification"])[0]  # one of HEADS (classifier_heads.py)
    activation_path = None
    model_config = directory / "config_sentence_transformers.json"
    if model_config.exists():
        raw = _object(read_json(model_config), model_config)
        if raw.get("model_type", "CrossEncoder") != "CrossEncoder":
            raise CheckpointError(f"{model_config}: cannot reproduce model_type {raw['model_type']!r} over a "
                                  f"{architecture} checkpoint (it is exported as a CrossEncoder)")
        if raw.get("default_prompt_name") not in (None, "") and (raw.get("prompts") or {}).get(
                raw["default_prompt_name"]) != "":
            raise CheckpointError(f"{model_config}: cannot reproduce default_prompt_name "
                                  f"{raw['default_prompt_name']!r}: predict() prepends its prompt")
        activation_path = raw.get("activation_fn")
    if activation_path is None:  # sentence-transformers 4 and 5 kept it in config.json, older ones under another key
        st = config.get("sentence_transformers")
        activation_path = (st.get("activation_fn") if isinstance(st, dict) else None) \
            or config.get("sbert_ce_default_activation_function")
    if activation_path is None:
        activation = "sigmoid" if labels == 1 else "identity"
    elif activation_path in ACTIVATIONS:
        activation = ACTIVATIONS[activation_path]
    else:
        raise CheckpointError(f"{directory}: cannot reproduce the CrossEncoder activation {activation_path!r} "
                              f"(only {', '.join(ACTIVATIONS)})")
    return RerankerSpec(labels, activation, _transformer_max_length(directory, architecture))


def _object(raw, path: Path) -> dict:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _transformer_max_length(directory: Path, architecture: str) -> int | None:
    """modules.json must hold the one Transformer at the root; its config must run the classifier."""
    modules = directory / "modules.json"
    if modules.exists():
        raw = read_json(modules)
        if not isinstance(raw, list) or len(raw) != 1 or not isinstance(raw[0], dict) \
                or not str(raw[0].get("type", "")).endswith(".Transformer") or raw[0].get("path") != "":
            raise CheckpointError(f"{modules}: cannot reproduce this pipeline over a {architecture} checkpoint (a "
                                  "CrossEncoder's is one Transformer module at the checkpoint's root)")
    path = directory / "sentence_bert_config.json"
    if not path.exists():
        return None
    raw = _object(read_json(path), path)
    for key, value in raw.items():
        if key in TRANSFORMER_FREE:
            if key.endswith(("kwargs", "args")) and value not in (None, {}):
                raise CheckpointError(f"{path}: cannot reproduce {key} {value!r}")
            continue
        if key not in TRANSFORMER_EXPECTED or value != TRANSFORMER_EXPECTED[key]:
            raise CheckpointError(f"{path}: cannot reproduce the Transformer setting {key} {value!r}")
    if raw.get("do_lower_case") and not tokenizer_lowercases(tokenizer_json(directory)):
        # sentence-transformers then puts a Lowercase normalizer in front of the tokenizer's own.
        raise CheckpointError(f"{path}: cannot reproduce do_lower_case true: sentence-transformers adds a Lowercase "
                              "normalizer that tokenizer.json does not have")
    length = raw.get("max_seq_length")
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 1):
        raise CheckpointError(f"{path}: max_seq_length must be a positive integer, got {length!r}")
    return length


class Reranker(nn.Module):
    """The exported module: the encoder and its classification head -> raw logits."""

    def __init__(self, encoder: EncoderModule, head: nn.Module, output_attentions: bool = False):
        super().__init__()
        self.encoder, self.head, self.output_attentions = encoder, head, output_attentions

    def with_attentions(self) -> Reranker:
        """The same weights, returning every layer's attention probabilities too."""
        return Reranker(self.encoder, self.head, output_attentions=True).eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None):
        """(B, T) int64 each (token_type_ids only for families with token types) -> scores (B, num_labels) and,
        for the attention graph, attentions (L, B, nh, T, T) and value norms (L, B, nh, T) (model/value_norms.py)."""
        keep_value_norms(cast(nn.Module, self.encoder), self.output_attentions)
        hidden, attentions = self.encoder(input_ids, attention_mask, self.output_attentions, token_type_ids)
        scores = self.head(hidden, attention_mask)  # (B, num_labels)
        if self.output_attentions:
            return scores, attentions, stacked_value_norms(cast(nn.Module, self.encoder))
        return scores


def load_reranker(weights: Weights, encoder: EncoderModule, head: Head, labels: int) -> Reranker:
    """The head's weights (exactly head.keys) on top of a loaded encoder, under the same loud checks."""
    module = head.build(encoder.config.hidden_size, labels)
    own = module.state_dict()
    tensors = {}
    missing = sorted(set(head.keys) - set(weights.keys()))
    if missing:
        raise CheckpointError(f"{weights.name}: the {head.architecture} head lacks {', '.join(missing)}")
    for theirs, ours in head.keys.items():
        if weights.shape(theirs) != tuple(own[ours].shape):
            raise CheckpointError(f"{weights.name}: {theirs} has shape {weights.shape(theirs)}, "
                                  f"expected {tuple(own[ours].shape)}")
        tensors[ours] = weights.get(theirs).float()
    module.load_state_dict(tensors, strict=True)
    return Reranker(encoder, module).eval()
