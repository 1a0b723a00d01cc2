"""DeBERTa-v2 and -v3 (mDeBERTa, mxbai-rerank-v1's encoder) as an encoder, and their checkpoints' config and key map.

BERT's post-LayerNorm layers (encoder.py's layout: attention, W_O, LayerNorm of the residual sum, a GELU feed-forward,
LayerNorm again), with disentangled attention in place of absolute positions, as transformers' DebertaV2Model runs it:
- each layer's scores add, to content-to-content q·k, content-to-position (c2p: the query against the key's relative
  position) and position-to-content (p2c: the key against the query's relative position), each over sqrt(hs times
  one plus the number of position terms); the position vectors are the layer's own query and key projections
  (share_att_key) of one table of relative-position embeddings, LayerNorm-ed once (norm_rel_ebd "layer_norm");
- a relative position is query - key, bucketed logarithmically past position_buckets / 2 (make_log_bucket_position)
  and clamped to the table's span; the bucket of every distance the positions allow is computed once, in fp32, and
  looked up in the graph (as MPNet's, encoder.py: the fp16 graph computes no log);
- the embeddings: words (of embedding_size, projected to hidden_size where they differ), absolute positions only
  where position_biased_input, token types only where type_vocab_size > 0, a LayerNorm, padding zeroed.
The softmax is the one attention core's (attention.py): the position terms reach it added to the padding mask.
Refused in one line: relative_attention false, share_att_key false, the convolution layer (conv_kernel_size),
position terms other than c2p and p2c, an activation other than gelu or relu.

Shapes: B batch, T sequence, H hidden, nh heads, hs head size, S the relative-position table's span (its rows / 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn as nn

from attnserve.errors import CheckpointError

from .attention import SelfAttention
from .config_reading import check_architectures, check_supported, flag, invalid_config
from .encoder import ACTIVATIONS, MASK_VALUE, FeedForward
from .family import Family, WeightNames

MODEL_TYPE = "deberta-v2"
POSITION_TERMS = ("c2p", "p2c")


@dataclass(frozen=True)
class DebertaV2Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    embedding_size: int  # the word embeddings' (projected to hidden_size where it differs)
    type_vocab_size: int  # 0: no token type embeddings (DeBERTa-v3)
    position_biased_input: bool  # absolute position embeddings added to the input
    position_buckets: int  # > 0: relative positions bucketed logarithmically past half of it; <= 0: not bucketed
    max_relative_positions: int  # the reach of the buckets' logarithm (max_position_embeddings where config gives -1)
    position_terms: tuple[str, ...]  # of POSITION_TERMS, as pos_att_type lists them
    norm_relative_embeddings: bool  # norm_rel_ebd "layer_norm"
    layer_norm_eps: float = 1e-7
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    family: ClassVar[str] = MODEL_TYPE

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def span(self) -> int:
        """S: the relative-position table holds 2S rows, distances clamped to [-S, S)."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    @property
    def has_token_types(self) -> bool:
        return self.type_vocab_size > 1

    @property
    def usable_positions(self) -> int:
        """The distances the bucket table holds (and the absolute positions, where the input has them)."""
        return self.max_position_embeddings


def log_bucket(distance: torch.Tensor, buckets: int, reach: int) -> torch.Tensor:
    """transformers' make_log_bucket_position, in fp32: a distance within buckets / 2 is its own bucket, a longer
    one shares a logarithmically wider bucket, up to reach. distance: int64, any shape; returns int64 of its shape."""
    sign = torch.sign(distance)
    mid = buckets // 2
    near = (distance < mid) & (distance > -mid)
    magnitude = torch.where(near, torch.tensor(mid - 1).type_as(distance), distance.abs())
    log_position = torch.ceil(torch.log(magnitude / mid) / torch.log(torch.tensor((reach - 1) / mid)) * (mid - 1)) \
        + mid
    return torch.where(magnitude <= mid, distance.type_as(log_position), log_position * sign).to(torch.int64)


class DebertaEmbeddings(nn.Module):
    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.embedding_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.embedding_size) \
            if cfg.position_biased_input else None
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.embedding_size) if cfg.type_vocab_size else None
        self.projection = nn.Linear(cfg.embedding_size, cfg.hidden_size, bias=False) \
            if cfg.embedding_size != cfg.hidden_size else None
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.word(input_ids)  # (B, T, E)
        if self.position is not None:
            x = x + self.position(torch.arange(input_ids.shape[1], device=input_ids.device))[None]
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if token_type_ids is None else self.token_type(token_type_ids))
        if self.projection is not None:
            x = self.projection(x)  # (B, T, H)
        return self.norm(x) * attention_mask[:, :, None].to(x.dtype)  # padding zeroed, as transformers does


class DisentangledAttention(SelfAttention):
    """Content-to-content scores plus the c2p and p2c position terms, all over sqrt(hs * (1 + terms))."""

    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.nh, self.hs, self.terms = cfg.num_heads, cfg.head_size, cfg.position_terms
        self.divisor = math.sqrt(self.hs * (1 + len(self.terms)))
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)  # W_O (DebertaV2SelfOutput's dense)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.nh, self.hs).permute(0, 2, 1, 3)  # (B, nh, T, hs)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, relative: torch.Tensor,
                table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H); key_mask: (B, 1, 1, T) additive; relative: (T, T) int64, the bucket of query - key;
        table: (2S, H) the relative-position embeddings. Returns the output and the maps (attention.py)."""
        q, k, v = (self.split_heads(proj(x)) for proj in (self.query, self.key, self.value))  # (B, nh, T, hs) each
        B, nh, T, _ = q.shape
        span = table.shape[0] // 2
        bias = torch.zeros((), dtype=x.dtype, device=x.device)
        if "c2p" in self.terms:  # each query against its keys' relative positions
            positions = self.split_heads(self.key(table[None]))  # (1, nh, 2S, hs)
            index = (relative + span).clamp(0, 2 * span - 1).expand(B, nh, T, T)
            bias = bias + torch.matmul(q, positions.transpose(-1, -2)).gather(-1, index) / self.divisor
        if "p2c" in self.terms:  # each key against its queries' relative positions, read back per query
            positions = self.split_heads(self.query(table[None]))  # (1, nh, 2S, hs)
            index = (span - relative).clamp(0, 2 * span - 1).expand(B, nh, T, T)
            bias = bias + torch.matmul(k, positions.transpose(-1, -2)).gather(-1, index).transpose(-1, -2) \
                / self.divisor
        return self.attend(q, k, v, key_mask + bias)  # (B, nh, T, T) scores: content + the position terms


class DebertaLayer(nn.Module):
    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.attention = DisentangledAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.output_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, relative: torch.Tensor, table: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attention(x, key_mask, relative, table)
        x = self.attention_norm(x + attended)  # (B, T, H): post-LN, as BERT
        return self.output_norm(x + self.feed_forward(x)), probs


class DebertaV2Encoder(nn.Module):
    relative_buckets: torch.Tensor  # (2P - 1,) int64: the bucket of each distance, a buffer (__init__)

    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        self.config = cfg
        self.embeddings = DebertaEmbeddings(cfg)
        self.layers = nn.ModuleList(DebertaLayer(cfg) for _ in range(cfg.num_layers))
        self.relative_embeddings = nn.Embedding(2 * cfg.span, cfg.hidden_size)
        self.relative_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) \
            if cfg.norm_relative_embeddings else None
        reach = cfg.max_position_embeddings - 1
        distances = torch.arange(-reach, reach + 1)  # (2P - 1,): distance n at index n + P - 1
        buckets = log_bucket(distances, cfg.position_buckets, cfg.max_relative_positions) \
            if cfg.position_buckets > 0 else distances
        self.register_buffer("relative_buckets", buckets, persistent=False)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, attention_mask, token_type_ids: (B, T) int64, mask 1 for real tokens; token_type_ids None:
        type 0 (and ignored where the model has no token types). Returns last_hidden_state (B, T, H) and, if asked,
        every layer's maps (L, B, nh, T, T)."""
        if not self.config.has_token_types:
            token_type_ids = None
        x = self.embeddings(input_ids, attention_mask, token_type_ids)  # (B, T, H)
        key_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * MASK_VALUE  # (B, 1, 1, T)
        positions = torch.arange(x.shape[1], device=x.device)  # (T,)
        relative = self.relative_buckets[positions[:, None] - positions[None, :]
                                         + self.config.max_position_embeddings - 1]  # (T, T)
        table = self.relative_embeddings.weight  # (2S, H)
        if self.relative_norm is not None:
            table = self.relative_norm(table)
        attentions = []
        for layer in self.layers:
            x, probs = layer(x, key_mask, relative, table)
            if output_attentions:
                attentions.append(probs)
        return x, (torch.stack(attentions) if output_attentions else None)


ENCODER_ARCHITECTURES = ("DebertaV2Model", "DebertaV2ForMaskedLM")
TASK_PREFIX = "deberta."
ENCODER_PARTS = ("embeddings.", "encoder.")
UNUSED_HEADS = ("cls.", "lm_predictions.")  # DebertaV2ForMaskedLM's (legacy and current), unused by AutoModel


def _position_terms(raw: dict[str, Any], path: Path) -> tuple[str, ...]:
    value = raw.get("pos_att_type")
    terms = [t.strip() for t in value.lower().split("|")] if isinstance(value, str) else value
    if not isinstance(terms, list) or not terms or any(t not in POSITION_TERMS for t in terms):
        raise CheckpointError(f"{path}: cannot reproduce pos_att_type {value!r} (only c2p and p2c)")
    return tuple(terms)


def read_config(raw: dict[str, Any], path: Path) -> DebertaV2Config:
    """config.json of a DeBERTa-v2/v3 checkpoint, as transformers' DebertaV2Config reads it, or a one-line refusal."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES)
    act = check_supported(path, "hidden_act", raw.get("hidden_act", "gelu"), ACTIVATIONS)
    if not flag(raw, "relative_attention", path):
        raise CheckpointError(f"{path}: cannot reproduce relative_attention false (only DeBERTa's disentangled "
                              "attention)")
    if not flag(raw, "share_att_key", path):
        raise CheckpointError(f"{path}: cannot reproduce share_att_key false (only position vectors projected by "
                              "the layer's own query and key)")
    if raw.get("conv_kernel_size") not in (None, 0):
        raise CheckpointError(f"{path}: cannot reproduce conv_kernel_size {raw['conv_kernel_size']!r} (the first "
                              "layer's convolution, DeBERTa-v2-xlarge's; only 0)")
    norms = [x.strip() for x in str(raw.get("norm_rel_ebd") or "none").lower().split("|")]
    if any(n not in ("none", "layer_norm") for n in norms):
        raise CheckpointError(f"{path}: cannot reproduce norm_rel_ebd {raw['norm_rel_ebd']!r} (only layer_norm)")
    terms = _position_terms(raw, path)
    with invalid_config(path):
        hidden, positions = int(raw["hidden_size"]), int(raw.get("max_position_embeddings", 512))
        reach = int(raw.get("max_relative_positions", -1))
        cfg = DebertaV2Config(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=positions,
            embedding_size=int(raw.get("embedding_size") or hidden),
            type_vocab_size=int(raw.get("type_vocab_size", 0)),
            position_biased_input=flag(raw, "position_biased_input", path) if "position_biased_input" in raw
            else True,
            position_buckets=int(raw.get("position_buckets", -1)),
            max_relative_positions=reach if reach >= 1 else positions,
            position_terms=terms,
            norm_relative_embeddings="layer_norm" in norms,
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-7)),
            hidden_act=act,
            pad_token_id=int(raw.get("pad_token_id") or 0),
        )
        assert cfg.hidden_size % cfg.num_heads == 0, "hidden_size must divide evenly into heads"
    sizes = (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size, positions,
             cfg.embedding_size, cfg.span)
    # Past half the buckets, a distance's bucket is a logarithm over (max_relative_positions - 1) / that half, which
    # must exceed 1 (transformers would divide by log(1) = 0 and bucket every long distance as NaN).
    if cfg.position_buckets > 0 and cfg.max_relative_positions - 1 <= cfg.position_buckets // 2:
        raise CheckpointError(f"{path}: cannot reproduce max_relative_positions {cfg.max_relative_positions} with "
                              f"position_buckets {cfg.position_buckets} (it must exceed half the buckets plus one)")
    if min(sizes) < 1 or not cfg.layer_norm_eps > 0 or (cfg.position_buckets > 0 and cfg.position_buckets < 4):
        raise CheckpointError(f"{path}: invalid config: sizes must be positive (position_buckets, where given, at "
                              "least 4) and layer_norm_eps above 0")
    return cfg


def key_map(cfg: DebertaV2Config) -> dict[str, str]:
    """Checkpoint key (transformers' DebertaV2Model naming) -> DebertaV2Encoder key."""
    keys = {"embeddings.word_embeddings.weight": "embeddings.word.weight",
            "embeddings.LayerNorm.weight": "embeddings.norm.weight",
            "embeddings.LayerNorm.bias": "embeddings.norm.bias",
            "encoder.rel_embeddings.weight": "relative_embeddings.weight"}
    if cfg.position_biased_input:
        keys["embeddings.position_embeddings.weight"] = "embeddings.position.weight"
    if cfg.type_vocab_size:
        keys["embeddings.token_type_embeddings.weight"] = "embeddings.token_type.weight"
    if cfg.embedding_size != cfg.hidden_size:
        keys["embeddings.embed_proj.weight"] = "embeddings.projection.weight"
    if cfg.norm_relative_embeddings:
        keys |= {"encoder.LayerNorm.weight": "relative_norm.weight", "encoder.LayerNorm.bias": "relative_norm.bias"}
    per_layer = {"attention.self.query_proj": "attention.query", "attention.self.key_proj": "attention.key",
                 "attention.self.value_proj": "attention.value", "attention.output.dense": "attention.out",
                 "attention.output.LayerNorm": "attention_norm", "intermediate.dense": "feed_forward.up",
                 "output.dense": "feed_forward.down", "output.LayerNorm": "output_norm"}
    for i in range(cfg.num_layers):
        for theirs, ours in per_layer.items():
            for p in ("weight", "bias"):
                keys[f"encoder.layer.{i}.{theirs}.{p}"] = f"layers.{i}.{ours}.{p}"
    return keys


FAMILY = Family(MODEL_TYPE, read_config, key_map, DebertaV2Encoder,
                WeightNames(TASK_PREFIX, ENCODER_PARTS, UNUSED_HEADS, ()))
