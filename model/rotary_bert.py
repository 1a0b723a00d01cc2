"""BERT's post-LayerNorm layout with rotary positions: the shared encoder of NomicBERT (nomic_bert.py), GTE v1.5
(gte.py), nomic-embed-text-v2-moe (nomic_moe.py: a mixture of experts in every other layer) and
jina-embeddings-v3 (jina_v3.py: XLM-R with rotary positions and BERT's plain feed-forward).

It differs from BERT (encoder.py) in these places, and only these:
- positions are rotary (RoPE, rotary.py), applied to queries and keys in every layer; there are no position
  embeddings, so an input may use every position;
- query, key and value come from one projection (Wqkv / qkv_proj), heads inside each;
- the feed-forward is gated (down(act(gate(x)) * up(x))), its two input projections separate or fused as the
  family stores them (feed_forward is given by the family's file), or BERT's plain one (PlainFeedForward, jina),
  or, in nomic-embed-text-v2-moe's every other layer, a mixture of experts (nomic_moe.py);
- biases are where the family has them (NomicBERT: none in the linear layers; GTE: on qkv, out and down; jina:
  everywhere).
As in BERT, each sublayer's output is added to its input and the sum is normalised (post-LN), the embeddings
are normalised, and no norm follows the stack.

Shapes: B batch, T sequence, H hidden, nh heads, hs head size, F feed-forward size, L layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn

from attnserve.errors import CheckpointError

from .attention import SelfAttention
from .blocks import GATE_ACTIVATIONS, padding_mask, run_layers
from .config_reading import check_positive
from .encoder import ACTIVATIONS
from .family import ModelConfig
from .rotary import RotaryEmbedding, RotaryPositions, rotate


@dataclass(frozen=True)
class RotaryBertConfig(RotaryPositions):
    # Encoder sizes under the names EncoderConfig uses, so export and verification read either config.
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_size: int  # transformers' head_dim: hidden_size // num_heads unless the config says otherwise
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int  # 0: no token type embedding at all; 1: one row, added to every token
    layer_norm_eps: float
    pad_token_id: int
    activation: str  # a key of blocks.GATE_ACTIVATIONS, applied to the gate
    rope_theta: float
    # NTK scaling (GTE's rope_scaling type "ntk"): 1.0 is plain RoPE; gte.py says how the factor enters.
    ntk_factor: float
    qkv_bias: bool
    out_bias: bool
    up_bias: bool  # the gate's and up projection's
    down_bias: bool
    family: str  # config.json's model_type

    def __post_init__(self) -> None:
        assert self.head_size % 2 == 0, "rotary embeddings need an even head size"
        assert self.activation in GATE_ACTIVATIONS, f"activation {self.activation!r} unknown"

    @property
    def has_token_types(self) -> bool:
        """Whether the model tells segments apart: only then do its graphs take token_type_ids."""
        return self.type_vocab_size > 1


class RotaryBertSizes(ModelConfig, Protocol):
    """The config fields the encoder reads (RotaryBertConfig, jina_v3.JinaV3Config)."""

    @property
    def head_size(self) -> int: ...
    @property
    def type_vocab_size(self) -> int: ...
    @property
    def layer_norm_eps(self) -> float: ...
    @property
    def qkv_bias(self) -> bool: ...
    @property
    def out_bias(self) -> bool: ...


class RotarySelfAttention(SelfAttention):
    def __init__(self, cfg: RotaryBertSizes):
        super().__init__()
        self.nh, self.hs, self.divisor = cfg.num_heads, cfg.head_size, math.sqrt(cfg.head_size)
        # Query, key and value from one projection, as the checkpoints store them (Wqkv; transformers' jina splits
        # it into q_proj, k_proj and v_proj on load).
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.num_heads * cfg.head_size, bias=cfg.qkv_bias)
        self.out = nn.Linear(cfg.num_heads * cfg.head_size, cfg.hidden_size, bias=cfg.out_bias)  # W_O

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H); mask: additive, broadcastable to (B, nh, T, T); cos, sin: (T, hs). Returns the output
        and the maps (attention.py)."""
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.nh, self.hs)  # query, key, value in this order, heads inside each
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # (B, nh, T, hs) each
        return self.attend(rotate(q, cos, sin), rotate(k, cos, sin), v, mask)


class PlainFeedForward(nn.Module):
    """BERT's feed-forward, down(act(up(x))) with biases (jina's fc1 and fc2); activation: a key of
    encoder.ACTIVATIONS."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str):
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)  # fc1
        self.down = nn.Linear(intermediate_size, hidden_size)  # fc2
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(x)))  # (B, T, H)


class PostNormLayer(nn.Module):
    """BERT's layer order: x = norm(x + attention(x)); x = norm(x + feed_forward(x))."""

    def __init__(self, cfg: RotaryBertSizes, feed_forward: nn.Module):
        super().__init__()
        self.attention = RotarySelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.feed_forward = feed_forward  # its last Linear is named `down` (export's int8 fallback finds it)
        self.output_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        attended, probs = self.attention(x, mask, cos, sin)
        x = self.attention_norm(x + attended)  # (B, T, H)
        x = self.output_norm(x + self.feed_forward(x))  # (B, T, H)
        return x, probs


class RotaryBertEncoder(nn.Module):
    """The same forward as encoder.Encoder: SentenceEncoder, export and verification take either."""

    def __init__(self, cfg: RotaryBertSizes, feed_forward: Callable[[Any, int], nn.Module], inv_freq: torch.Tensor):
        """feed_forward: the family's feed-forward of layer i, built from (cfg, i) (nomic-embed-text-v2-moe's
        differs by layer); inv_freq: (hs/2,) the rotary frequencies, as the family computes them (plain, or
        NTK-scaled)."""
        super().__init__()
        self.config = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size) if cfg.type_vocab_size else None
        self.embeddings_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.rotary = RotaryEmbedding(inv_freq, cfg.max_position_embeddings)
        self.layers = nn.ModuleList(PostNormLayer(cfg, feed_forward(cfg, i)) for i in range(cfg.num_layers))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, attention_mask, token_type_ids: (B, T) int64, mask 1 for real tokens and 0 for padding;
        token_type_ids None: every token has type 0, as transformers fills them.

        Returns last_hidden_state (B, T, H) and, if asked, every layer's attention probabilities
        stacked as (L, B, nh, T, T).
        """
        x = self.word(input_ids)  # (B, T, H)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if token_type_ids is None else self.token_type(token_type_ids))
        x = self.embeddings_norm(x)
        mask = padding_mask(attention_mask, x.dtype)  # (B, 1, 1, T)
        cos, sin = self.rotary(input_ids.shape[1])  # (T, hs) each
        return run_layers(self.layers, x, output_attentions, lambda _: (mask, cos, sin))


def check_sizes(cfg: RotaryBertConfig, path: Path) -> None:
    check_positive(cfg, path, ("vocab_size", "hidden_size", "num_layers", "num_heads", "head_size",
                               "intermediate_size", "max_position_embeddings"),
                   "layer_norm_eps and the rope base", cfg.layer_norm_eps, cfg.rope_theta)
    if cfg.type_vocab_size < 0:
        raise CheckpointError(f"{path}: invalid config: type_vocab_size must not be negative, "
                              f"got {cfg.type_vocab_size}")
