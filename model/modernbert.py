"""ModernBERT beside the BERT encoder (encoder.py), and its checkpoints' config and key map.

It differs from BERT in these places, and only these:
- positions are rotary (RoPE), applied to queries and keys in every layer, with one base (rope_theta) for the
  global layers and another for the local ones; there are no position embeddings;
- layers are pre-LayerNorm (the sublayer's input is normalised, the residual sum is not), layer 0 has no
  attention norm, and a final norm follows the stack;
- the feed-forward is GeGLU: one projection makes 2*F features, gelu(first half) * second half goes down;
- query, key and value come from one projection (Wqkv), and by default no Linear or LayerNorm has a bias;
- every `global_attn_every_n_layers`-th layer (from layer 0) attends globally, the others locally: a token
  attends to the keys at most local_attention // 2 positions away on either side;
- there are no token types.
The reference is transformers' ModernBertModel (eager and sdpa paths, transformers 5.x); tests compare against it.

Shapes: B batch, T sequence, H hidden, nh heads, hs head size (H // nh), F intermediate size, L layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnserve.errors import CheckpointError

from .attention_reach import EVERY_KEY, Reach
from .blocks import padding_mask, run_layers, window_mask, windowed_mask
from .config_reading import (
    check_architectures,
    check_positive,
    flag,
    invalid_config,
    layer_type_rope_theta,
    listed_layer_types,
)
from .family import EncoderSizes, Family, NoTokenTypes, WeightNames
from .rotary import RotaryPositions, global_and_local
from .rotary_bert import RotarySelfAttention

MODEL_TYPE = "modernbert"
GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' names of the two layer types


@dataclass(frozen=True)
class ModernBertConfig(EncoderSizes, RotaryPositions, NoTokenTypes):
    layer_types: tuple[str, ...]  # GLOBAL or LOCAL, one per layer
    local_attention: int  # the local window's width: local_attention // 2 keys either side of a token
    global_rope_theta: float
    local_rope_theta: float
    layer_norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    pad_token_id: int = 0
    family: ClassVar[str] = MODEL_TYPE  # as EncoderConfig.family: config.json's model_type

    def __post_init__(self) -> None:
        assert self.hidden_size % self.num_heads == 0, "hidden_size must divide evenly into heads"
        assert (self.hidden_size // self.num_heads) % 2 == 0, "rotary embeddings need an even head size"
        assert len(self.layer_types) == self.num_layers, "one layer type per layer"

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def half_window(self) -> int:
        return self.local_attention // 2

    # What rotary_bert's attention reads: Wqkv (query, key and value from one projection) and Wo share one bias flag.
    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias

    @property
    def out_bias(self) -> bool:
        return self.attention_bias


class GeGLU(nn.Module):
    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)  # Wi
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)  # Wo

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.up(x).chunk(2, dim=-1)  # (B, T, F) each
        # transformers' "gelu" is the exact erf form.
        return self.down(F.gelu(value) * gate)  # (B, T, H)


class ModernBertLayer(nn.Module):
    def __init__(self, cfg: ModernBertConfig, index: int):
        super().__init__()
        # Layer 0's input is the embeddings' output, already normalised.
        self.attention_norm: nn.Module = (nn.Identity() if index == 0 else
                                          nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.norm_bias))
        self.attention = RotarySelfAttention(cfg)
        self.feed_forward_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)
        self.feed_forward = GeGLU(cfg)
        self.is_global = cfg.layer_types[index] == GLOBAL

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                has_key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """has_key: (B, T, 1) bool, a local layer's: the query's window holds a real key."""
        # Pre-LN: each sublayer reads a normalised copy; the residual stream itself is never normalised here.
        attended, probs = self.attention(self.attention_norm(x), mask, cos, sin)  # (B, T, H)
        if has_key is not None:
            # A query whose window holds no real key (a ColBERT query's unattended [MASK] far from its text):
            # transformers' SDPA gives it no attention at all (torch's safe softmax: every weight 0), so W_O's
            # bias alone.
            bias = self.attention.out.bias
            attended = torch.where(has_key, attended, torch.zeros((), dtype=attended.dtype) if bias is None else bias)
        x = x + attended  # (B, T, H)
        x = x + self.feed_forward(self.feed_forward_norm(x))  # (B, T, H)
        return x, probs


class ModernBertEncoder(nn.Module):
    """The same forward as encoder.Encoder: SentenceEncoder, export and verification take either."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.config = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embeddings_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)
        self.rotary_global, self.rotary_local = global_and_local(cfg)
        self.layers = nn.ModuleList(ModernBertLayer(cfg, i) for i in range(cfg.num_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, attention_mask: (B, T) int64, mask 1 for real tokens and 0 for padding. ModernBERT has no
        token types: token_type_ids is taken (as Encoder's forward takes it) and must be None.

        Returns last_hidden_state (B, T, H) and, if asked, every layer's attention probabilities
        stacked as (L, B, nh, T, T).
        """
        assert token_type_ids is None, "ModernBERT has no token types (its graphs take no token_type_ids)"
        T = input_ids.shape[1]
        x = self.embeddings_norm(self.word(input_ids))  # (B, T, H)
        padding = padding_mask(attention_mask, x.dtype)  # (B, 1, 1, T)
        local_mask = windowed_mask(padding, window_mask(T, self.config.half_window, x.device, x.dtype))  # (B, 1, T, T)
        positions = torch.arange(T, device=x.device)
        in_window = (positions[None, :] - positions[:, None]).abs() <= self.config.half_window  # (T, T)
        has_key = (in_window[None] & (attention_mask[:, None, :] > 0)).any(dim=-1, keepdim=True)  # (B, T, 1)
        global_inputs = (padding, *self.rotary_global(T))
        local_inputs = (local_mask, *self.rotary_local(T), has_key)
        x, attentions = run_layers(self.layers, x, output_attentions,
                                   lambda layer: global_inputs if layer.is_global else local_inputs)
        return self.final_norm(x), attentions

    def attention_reach(self) -> tuple[Reach, ...]:
        """A global layer every key; a local one half_window keys either side."""
        half = self.config.half_window
        return tuple(EVERY_KEY if layer.is_global else (half, half) for layer in self.layers)


# The architectures whose encoder output is the checkpoint's own output: the bare model, and the masked-LM
# model used as an encoder (its head unused, as transformers' AutoModel leaves it). Any other ends in a head.
ENCODER_ARCHITECTURES = ("ModernBertModel", "ModernBertForMaskedLM")
# A task model (ModernBertForX) keeps the encoder under "model."; the masked-LM head is "head." and "decoder.".
TASK_PREFIX = "model."
ENCODER_PARTS = ("embeddings.", "layers.", "final_norm.")
UNUSED_HEADS = ("head.", "decoder.")


def read_config(raw: dict[str, Any], path: Path) -> ModernBertConfig:
    """config.json of a ModernBERT checkpoint, as transformers' ModernBertConfig reads it (the rope and layer
    settings in either the 4.x form or the 5.x form), or a one-line refusal of what the export does not run."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES,
                        runs=f"the bare encoder: {' or '.join(ENCODER_ARCHITECTURES)}, or a reranker: "
                        "ModernBertForSequenceClassification")
    if raw.get("hidden_activation", "gelu") != "gelu":
        raise CheckpointError(f"{path}: hidden_activation {raw['hidden_activation']!r} is not supported (only 'gelu')")
    with invalid_config(path):
        num_layers = int(raw["num_hidden_layers"])
        cfg = ModernBertConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_layers=num_layers,
            num_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
            layer_types=_layer_types(raw, num_layers, path),
            local_attention=int(raw.get("local_attention", 128)),
            global_rope_theta=_rope_theta(raw, GLOBAL, "global_rope_theta", 160_000.0, path),
            local_rope_theta=_rope_theta(raw, LOCAL, "local_rope_theta", 10_000.0, path),
            layer_norm_eps=float(raw.get("norm_eps", 1e-5)),
            norm_bias=flag(raw, "norm_bias", path),
            attention_bias=flag(raw, "attention_bias", path),
            mlp_bias=flag(raw, "mlp_bias", path),
            pad_token_id=int(raw.get("pad_token_id") or 0),
        )
    check_positive(cfg, path, ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                               "max_position_embeddings", "local_attention"),
                   "norm_eps and rope_theta", cfg.layer_norm_eps, cfg.global_rope_theta, cfg.local_rope_theta)
    return cfg


def _layer_types(raw: dict[str, Any], num_layers: int, path: Path) -> tuple[str, ...]:
    """transformers 5 saves layer_types; 4.x configs give global_attn_every_n_layers (layer 0 is global)."""
    listed = listed_layer_types(raw, num_layers, (GLOBAL, LOCAL), path)
    if listed is not None:
        return listed
    every = int(raw.get("global_attn_every_n_layers", 3))
    if every < 1:
        raise CheckpointError(f"{path}: global_attn_every_n_layers must be positive, got {every}")
    return tuple(LOCAL if i % every else GLOBAL for i in range(num_layers))


def _rope_theta(raw: dict[str, Any], layer_type: str, legacy_key: str, default: float, path: Path) -> float:
    """The rope base of one layer type: rope_parameters[layer_type] (transformers 5), else the 4.x key."""
    return layer_type_rope_theta(raw, layer_type, raw.get(legacy_key, default), path)


def key_map(cfg: ModernBertConfig) -> dict[str, str]:
    """Checkpoint key (transformers' ModernBertModel naming) -> ModernBertEncoder key."""
    norm = ("weight", "bias") if cfg.norm_bias else ("weight",)
    keys = {f"embeddings.tok_embeddings.{p}": f"word.{p}" for p in ("weight",)}
    keys |= {f"embeddings.norm.{p}": f"embeddings_norm.{p}" for p in norm}
    keys |= {f"final_norm.{p}": f"final_norm.{p}" for p in norm}
    per_layer = [("attn_norm", "attention_norm", norm),
                 ("attn.Wqkv", "attention.qkv", ("weight", "bias") if cfg.attention_bias else ("weight",)),
                 ("attn.Wo", "attention.out", ("weight", "bias") if cfg.attention_bias else ("weight",)),
                 ("mlp_norm", "feed_forward_norm", norm),
                 ("mlp.Wi", "feed_forward.up", ("weight", "bias") if cfg.mlp_bias else ("weight",)),
                 ("mlp.Wo", "feed_forward.down", ("weight", "bias") if cfg.mlp_bias else ("weight",))]
    for i in range(cfg.num_layers):
        for theirs, ours, params in per_layer:
            if i == 0 and theirs == "attn_norm":
                continue  # an Identity: no weights
            for p in params:
                keys[f"layers.{i}.{theirs}.{p}"] = f"layers.{i}.{ours}.{p}"
    return keys


FAMILY = Family(MODEL_TYPE, read_config, key_map, ModernBertEncoder,
                             WeightNames(TASK_PREFIX, ENCODER_PARTS, UNUSED_HEADS, ()))
