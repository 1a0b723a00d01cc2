"""A BERT-family Transformer encoder, written out in full.

Reading order: config, embeddings, multi-head self-attention, feed-forward,
one encoder layer, the stack, then the sentence encoder that adds the
sentence-transformers modules after it (sentence_head.py). The code follows the original
BERT layout (post-LayerNorm) so that BERT-family checkpoints (MiniLM, BGE,
E5, GTE) load into it key for key; see bert_likes.py for the key map.

The BERT-like families differ from BERT only in a few places, each a field of
EncoderConfig (bert_likes.py sets them from config.json's model_type):
- RoBERTa, XLM-RoBERTa: positions count from after the padding index, one token type;
- DistilBERT: no token types (and its own key names and config names, bert_likes.py);
- MPNet: positions as RoBERTa's, no token types, and a relative position bias
  shared by every layer, added to the attention scores.

Shapes: B batch, T sequence, H hidden, nh heads, hs head size (H // nh),
F feed-forward size, L layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import SelfAttention
from .value_norms import keep_value_norms, stacked_value_norms

if TYPE_CHECKING:  # the other families' encoders have the same forward as Encoder (family.py)
    from .family import EncoderModule


@dataclass
class EncoderConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    # Positions are learned, so this is a hard ceiling on sequence length.
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    # BERT checkpoints use 1e-12; a different eps changes outputs at ~1e-6.
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # config.json's model_type: "bert", "roberta", "xlm-roberta", "distilbert" or "mpnet".
    family: str = "bert"
    hidden_act: str = "gelu"  # a key of ACTIVATIONS
    # RoBERTa, XLM-R and MPNet number real tokens from pad_token_id + 1 on and give padding tokens
    # position pad_token_id (fairseq's make_positions); BERT and DistilBERT number from 0.
    positions_after_padding: bool = False
    # MPNet: buckets of the relative position bias that every layer adds to its scores; 0: none.
    relative_attention_buckets: int = 0

    def __post_init__(self) -> None:
        assert self.hidden_size % self.num_heads == 0, "hidden_size must divide evenly into heads"
        assert self.hidden_act in ACTIVATIONS, f"hidden_act {self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}"

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def has_token_types(self) -> bool:
        """Whether the model tells segments apart: only then do its graphs take token_type_ids."""
        return self.type_vocab_size > 1

    @property
    def usable_positions(self) -> int:
        """The longest input the position table holds: fewer than its rows where positions start after padding."""
        return self.max_position_embeddings - (self.pad_token_id + 1 if self.positions_after_padding else 0)


# config.json's activation names, as transformers maps them: BERT's "gelu" is the exact erf form,
# not the tanh approximation; DistilBERT checkpoints may use "relu".
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"gelu": F.gelu, "relu": F.relu}


# A large negative added to the scores of padded keys. exp() of it underflows
# to exactly 0 in fp32, so padded keys get exactly zero attention weight.
# -10000 (not finfo.min) keeps the graph finite when converted to fp16, and
# it is the constant onnxruntime's attention fusion recognises.
MASK_VALUE = -10000.0


class Embeddings(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        # DistilBERT and MPNet have no token type embeddings at all; RoBERTa has one type.
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size) if cfg.type_vocab_size else None
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> position ids (B, T) or (1, T)."""
        if self.cfg.positions_after_padding:
            # transformers' create_position_ids_from_input_ids: real tokens count on from pad_token_id + 1 and
            # padding tokens (by id, whatever the mask says) get pad_token_id.
            real = input_ids.ne(self.cfg.pad_token_id).long()  # (B, T)
            return torch.cumsum(real, dim=1) * real + self.cfg.pad_token_id  # (B, T)
        return torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)  # (1, T)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, token_type_ids: (B, T); token_type_ids None: every token has type 0."""
        x = self.word(input_ids) + self.position(self.positions(input_ids))  # (B, T, H)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if token_type_ids is None else self.token_type(token_type_ids))
        return self.norm(x)


class MultiHeadSelfAttention(SelfAttention):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.nh, self.hs, self.divisor = cfg.num_heads, cfg.head_size, math.sqrt(cfg.head_size)
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)  # W_O

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        return x.view(B, T, self.nh, self.hs).permute(0, 2, 1, 3)  # (B, nh, T, hs)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H); key_mask: additive, 0 for real keys and MASK_VALUE for padding: (B, 1, 1, T), or
        (B, nh, T, T) with MPNet's relative position bias added. Returns the output and the maps (attention.py)."""
        q, k, v = (self.split_heads(proj(x)) for proj in (self.query, self.key, self.value))  # (B, nh, T, hs) each
        return self.attend(q, k, v, key_mask)


class FeedForwardSizes(Protocol):
    """What the feed-forward reads of a config (EncoderConfig, deberta_v2.DebertaV2Config)."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def hidden_act(self) -> str: ...


class FeedForward(nn.Module):
    def __init__(self, cfg: FeedForwardSizes):
        super().__init__()
        self.up = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.activation = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(x)))  # (B, T, H)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.attention = MultiHeadSelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.output_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Post-LN, as in BERT: the residual sum is normalised, not the sublayer input.
        attended, probs = self.attention(x, key_mask)
        x = self.attention_norm(x + attended)  # (B, T, H)
        x = self.output_norm(x + self.feed_forward(x))  # (B, T, H)
        return x, probs


def relative_position_bucket(n: torch.Tensor, num_buckets: int, max_distance: int = 128) -> torch.Tensor:
    """MPNet's (T5's bidirectional) bucket of each distance n = query position - key position (int64, any shape):
    int64 of n's shape, in [0, num_buckets).

    Half the buckets are for keys before the query, half for keys after; in each half, distances below a
    quarter of the buckets get a bucket each and longer ones share logarithmically wider buckets up to
    max_distance. Written as transformers' MPNetEncoder.relative_position_bucket computes it, in fp32.
    """
    half = num_buckets // 2
    ret = (n < 0).long() * half  # keys after the query use the upper half
    n = n.abs()
    max_exact = half // 2
    # Only used where n >= max_exact, so the clamp changes no bucket; it keeps log() finite.
    large = max_exact + (torch.log(n.clamp(min=max_exact).float() / max_exact)
                         / math.log(max_distance / max_exact) * (half - max_exact)).long()
    large = torch.clamp(large, max=half - 1)
    return ret + torch.where(n < max_exact, n, large)


class Encoder(nn.Module):
    relative_buckets: torch.Tensor  # (2P - 1,) int64: MPNet's bucket of each distance, a buffer (__init__)

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))
        # MPNet: one table of per-head biases, shared by all layers.
        self.relative_attention_bias = (nn.Embedding(cfg.relative_attention_buckets, cfg.num_heads)
                                        if cfg.relative_attention_buckets else None)
        if cfg.relative_attention_buckets:
            # The bucket of every distance query - key the position table allows, computed here once in fp32:
            # (2P - 1,) int64, distance n at index n + P - 1. The graph then finds buckets by integer arithmetic
            # and a lookup. Computed in the graph, the log() and the cast to an integer that decide a bucket ran
            # in half precision in the fp16 graph and moved distances 16, 32 and 64 to the next bucket (issue 19:
            # cosine 0.985 against PyTorch on one row of 39 tokens).
            reach = cfg.max_position_embeddings - 1
            distances = torch.arange(-reach, reach + 1)  # (2P - 1,)
            self.register_buffer("relative_buckets", relative_position_bucket(
                distances, cfg.relative_attention_buckets), persistent=False)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, attention_mask, token_type_ids: (B, T) int64, mask 1 for real tokens and 0 for padding;
        token_type_ids None: every token has type 0.

        Returns last_hidden_state (B, T, H) and, if asked, every layer's
        attention probabilities stacked as (L, B, nh, T, T).
        """
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        key_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * MASK_VALUE  # (B, 1, 1, T)
        if self.relative_attention_bias is not None:
            # Computed once per forward: the same bias for every layer and every row of the batch.
            positions = torch.arange(x.shape[1], device=x.device)  # (T,)
            reach = self.config.max_position_embeddings - 1
            buckets = self.relative_buckets[positions[:, None] - positions[None, :] + reach]  # (T, T)
            bias = self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, nh, T, T)
            key_mask = bias + key_mask  # (B, nh, T, T): real keys get exactly the bias
        attentions = []
        for layer in self.layers:
            x, probs = layer(x, key_mask)
            if output_attentions:
                attentions.append(probs)
        return x, (torch.stack(attentions) if output_attentions else None)


class SentenceEncoder(nn.Module):
    """The encoder plus the checkpoint's sentence head (model/sentence_head.py): the module that is exported to ONNX."""

    def __init__(self, encoder: EncoderModule, head: nn.Module, output_attentions: bool = False):
        super().__init__()
        self.encoder, self.head, self.output_attentions = encoder, head, output_attentions

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None):
        keep_value_norms(cast(nn.Module, self.encoder), self.output_attentions)
        # A head that leaves the prompt out of its pooling (include_prompt false) finds the prompt's tokens marked
        # PROMPT_TOKEN (2) in the mask: the encoder attends to them as to every real token.
        attended = attention_mask.clamp(max=1) if getattr(self.head, "excludes_prompt", False) else attention_mask
        hidden, attentions = self.encoder(input_ids, attended, self.output_attentions, token_type_ids)
        sentence = self.head(hidden, attention_mask)  # (B, D), not normalised
        if self.output_attentions:  # with each head's value norms (L, B, nh, T): model/value_norms.py
            return hidden, sentence, attentions, stacked_value_norms(cast(nn.Module, self.encoder))
        return hidden, sentence
