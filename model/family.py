"""What a model family tells checkpoint.py: how to read its config.json, name its weights and build its encoder.

Each family is a Family value, declared in its own file in model/ (qwen3.FAMILY, ...; the BERT-likes, which share
encoder.py, as rows of bert_likes.py) and listed once in families.py, keyed by config.json's model_type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
import torch.nn as nn


class ModelConfig(Protocol):
    """What export, verification and the manifest read from any family's config."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_heads(self) -> int: ...  # query heads: the attention maps have one per layer and query head
    @property
    def intermediate_size(self) -> int: ...
    @property
    def max_position_embeddings(self) -> int: ...
    @property
    def pad_token_id(self) -> int: ...
    @property
    def family(self) -> str: ...  # config.json's model_type
    @property
    def has_token_types(self) -> bool: ...
    @property
    def usable_positions(self) -> int: ...


@dataclass(frozen=True)
class EncoderSizes:
    """The sizes every config gives, first among its fields, under the names EncoderConfig uses, so that export and
    verification read any family's config."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int  # query heads
    intermediate_size: int
    max_position_embeddings: int


class NoTokenTypes:
    """Base of the config of a family without token types: the graphs take token_type_ids only where a family has
    more than one."""

    type_vocab_size: ClassVar[int] = 1
    has_token_types: ClassVar[bool] = False


class EncoderModule(Protocol):
    """The forward every encoder has (encoder.Encoder's): SentenceEncoder, export and verification take any."""

    config: Any

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
                 token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass(frozen=True)
class WeightNames:
    """Where a family's checkpoints keep the encoder's weights, and the keys they carry that it does not use."""
    task_prefix: str  # where a task model (XForMaskedLM, ...) puts the encoder's keys
    encoder_parts: tuple[str, ...]  # the prefixes of the encoder's own keys
    unused_heads: tuple[str, ...]  # heads AutoModel (what sentence-transformers loads) leaves unused
    ignored: tuple[str, ...]  # whole keys that are neither


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's model_type
    read_config: Callable[[dict[str, Any], Path], Any]  # -> the family's config, or CheckpointError in one line
    key_map: Callable[[Any], dict[str, str]]  # config -> {checkpoint key: encoder key}
    build: Callable[[Any], nn.Module]  # config -> the encoder, weights uninitialised
    weights: WeightNames
    # (config, encoder) -> None, run once the checkpoint's weights are in: jina v3 merges a task's adapter here.
    after_load: Callable[[Any, nn.Module], None] | None = None
    # (checkpoint directory, config) -> the sentence pipeline (pipeline.Pipeline), for a family whose checkpoints
    # say it themselves rather than in sentence-transformers' files: CLIP's text tower pools its end-of-text token
    # and projects it (clip.py). None: the sentence-transformers pipeline the directory holds.
    pipeline: Callable[[Path, Any], Any] | None = None
