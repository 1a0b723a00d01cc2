"""Gemma 3's text model (EmbeddingGemma) as an encoder, and its checkpoints' config and key map.

The blocks are Gemma 3's, as transformers' Gemma3TextModel (5.x) runs them:
- the token embedding is multiplied by sqrt(hidden_size), a constant in the weights' dtype (fp32 here);
- every RMSNorm scales by 1 + weight (Gemma stores weight - 1), and each layer has four ("sandwich" norms):
  before and after the attention, before and after the feed-forward; a final norm follows the stack;
- each query and key head is RMSNorm-ed before its rotation, and scores are scaled by query_pre_attn_scalar^-0.5
  (not head_dim^-0.5); head_dim need not be hidden / heads, and key/value heads are shared by groups of query
  heads (grouped-query attention);
- the feed-forward is GeGLU with the tanh gelu: down(gelu_tanh(gate(x)) * up(x));
- rotary positions with one base for the sliding layers (rope_local_base_freq) and another for the full ones
  (rope_theta), positions 0..T-1 whatever the padding (transformers' position_ids);
- layer_types says which layers attend within a sliding window and which attend to every key.
With use_bidirectional_attention (EmbeddingGemma) full layers see every real key and sliding layers the keys at most
sliding_window // 2 positions away on either side: transformers halves the config's window (sliding_window // 2 + 1,
exclusive). Without it the model is a decoder: full layers are causal, sliding layers see the sliding_window - 1
keys before a query and the query itself.

attn_logit_softcapping is accepted and not applied, as transformers' Gemma3 attention never passes it on (Gemma 2
did); final_logit_softcapping caps the language-model head's logits, which an encoder does not have.

Shapes: B batch, T sequence, H hidden, nh query heads, nkv key/value heads, hs head size, L layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn as nn

from attnserve.errors import CheckpointError

from .attention_reach import EVERY_KEY, Reach, causal_within
from .blocks import (
    GATE_ACTIVATIONS,
    LLAMA_STYLE_SIZES,
    LlamaStyleConfig,
    PreNormLayer,
    RMSNorm,
    causal_mask,
    padding_mask,
    run_layers,
    window_mask,
    windowed_mask,
)
from .config_reading import (
    check_architectures,
    check_positive,
    check_supported,
    flag,
    invalid_config,
    layer_type_rope_theta,
    listed_layer_types,
)
from .encoder import MASK_VALUE
from .family import Family, WeightNames
from .rotary import global_and_local

MODEL_TYPE = "gemma3_text"
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' names of the two layer types


@dataclass(frozen=True)
class Gemma3Config(LlamaStyleConfig):
    # Encoder sizes under the names EncoderConfig uses, so export and verification read either config.
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int  # config.json's head_dim
    intermediate_size: int
    max_position_embeddings: int
    layer_types: tuple[str, ...]  # FULL or SLIDING, one per layer
    sliding_window: int  # as config.json gives it (transformers halves it for bidirectional attention)
    bidirectional: bool  # use_bidirectional_attention
    global_rope_theta: float  # rope_parameters["full_attention"], or rope_theta
    local_rope_theta: float  # rope_parameters["sliding_attention"], or rope_local_base_freq
    query_pre_attn_scalar: float
    activation: str = "gelu_pytorch_tanh"  # hidden_activation, a key of blocks.GATE_ACTIVATIONS
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    pad_token_id: int = 0
    family: ClassVar[str] = MODEL_TYPE  # as EncoderConfig.family: config.json's model_type
    head_norm: ClassVar[bool] = True  # each query and key head RMS-normalised (Gemma 2's config: none)
    sandwich: ClassVar[bool] = True  # four norms a layer (Gemma's config: Llama's two)

    def __post_init__(self) -> None:
        super().__post_init__()
        assert len(self.layer_types) == self.num_layers, "one layer type per layer"

    @property
    def score_divisor(self) -> float:
        return self.query_pre_attn_scalar ** 0.5


class Gemma3Layer(PreNormLayer):
    """Sandwich norms: each sublayer reads a normalised copy and its output is normalised again before the residual
    sum; the residual stream itself is only normalised once, after the last layer."""

    def __init__(self, cfg: Gemma3Config, index: int):
        super().__init__(cfg, cfg.activation, cfg.score_divisor, head_norm=cfg.head_norm, unit_offset=True,
                         sandwich=cfg.sandwich, out_bias=getattr(cfg, "out_bias", None))
        self.is_sliding = cfg.layer_types[index] == SLIDING


class Gemma3Encoder(nn.Module):
    """The same forward as encoder.Encoder: SentenceEncoder, export and verification take either. Gemma 2's encoder
    is this one with its own layers (gemma2.py)."""

    embed_scale: torch.Tensor
    layer_class: type[Gemma3Layer] = Gemma3Layer  # Gemma 2's: gemma2.Gemma2Layer

    def __init__(self, cfg: Gemma3Config):
        super().__init__()
        self.config = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # sqrt(H) rounded to the weights' dtype, as transformers' Gemma3TextScaledWordEmbedding keeps it.
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size ** 0.5, dtype=torch.float32),
                             persistent=False)
        self.rotary_global, self.rotary_local = global_and_local(cfg)
        self.layers = nn.ModuleList(self.layer_class(cfg, i) for i in range(cfg.num_layers))
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)

    def _masks(self, attention_mask: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Additive masks of the full and the sliding layers, each broadcastable to (B, nh, T, T)."""
        cfg, T, device = self.config, attention_mask.shape[1], attention_mask.device
        padding = padding_mask(attention_mask, dtype)  # (B, 1, 1, T)
        if cfg.bidirectional:
            return padding, windowed_mask(padding, window_mask(T, cfg.sliding_window // 2, device, dtype))
        future = causal_mask(T, device, dtype)  # (T, T)
        positions = torch.arange(T, device=device)
        offset = positions[None, :] - positions[:, None]  # (T, T): key position - query position
        outside_window = future + (offset <= -cfg.sliding_window).to(dtype) * MASK_VALUE  # (T, T)
        # Padding counts twice in the full layers too (as blocks.PreNormEncoder's causal mask): a padded query before
        # every real token (left padding) then prefers the future real keys, and padded keys get exactly 0 weight.
        return 2 * padding + future, windowed_mask(padding, outside_window)  # (B, 1, T, T) each

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, attention_mask: (B, T) int64, mask 1 for real tokens and 0 for padding (on the right: positions
        are 0..T-1, as transformers numbers them). Gemma 3 has no token types: token_type_ids must be None.

        Returns last_hidden_state (B, T, H) and, if asked, every layer's attention probabilities per query head,
        stacked as (L, B, nh, T, T).
        """
        assert token_type_ids is None, "Gemma has no token types (its graphs take no token_type_ids)"
        T = input_ids.shape[1]
        x = self.word(input_ids) * self.embed_scale  # (B, T, H)
        full_mask, sliding_mask = self._masks(attention_mask, x.dtype)
        global_cos_sin, local_cos_sin = self.rotary_global(T), self.rotary_local(T)
        sliding, full = (sliding_mask, *local_cos_sin), (full_mask, *global_cos_sin)
        x, attentions = run_layers(self.layers, x, output_attentions,
                                   lambda layer: sliding if layer.is_sliding else full)
        return self.final_norm(x), attentions

    def attention_reach(self) -> tuple[Reach, ...]:
        """As _masks builds them: a sliding layer within its window (sliding_window // 2 either side where
        bidirectional, sliding_window - 1 behind where causal), a full layer every key (every earlier key)."""
        cfg = self.config
        if cfg.bidirectional:
            half = cfg.sliding_window // 2
            return tuple((half, half) if layer.is_sliding else EVERY_KEY for layer in self.layers)
        return tuple(causal_within(cfg.sliding_window if layer.is_sliding else None) for layer in self.layers)


# The bare text model is EmbeddingGemma's; a causal LM's or a classifier's head would be dropped by the export.
ENCODER_ARCHITECTURES = ("Gemma3TextModel",)
# transformers' Gemma3TextConfig defaults for what a config.json may leave out.
DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}
LEGACY_THETA_KEYS = {FULL: "rope_theta", SLIDING: "rope_local_base_freq"}
SLIDING_WINDOW_PATTERN = 6  # without layer_types: every 6th layer full, the others sliding


def read_config(raw: dict[str, Any], path: Path) -> Gemma3Config:
    """config.json of a Gemma 3 text checkpoint, as transformers' Gemma3TextConfig reads it (rope settings in the
    4.x or the 5.x form), or a one-line refusal of what the export does not run."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES)
    activation = check_supported(path, "hidden_activation", raw.get("hidden_activation", "gelu_pytorch_tanh"),
                                 sorted(GATE_ACTIVATIONS))
    bidirectional = flag(raw, "use_bidirectional_attention", path, none_is_false=True)
    attention_bias = flag(raw, "attention_bias", path)
    with invalid_config(path):
        num_layers = int(raw["num_hidden_layers"])
        cfg = Gemma3Config(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_layers=num_layers,
            num_heads=int(raw["num_attention_heads"]),
            num_kv_heads=int(raw["num_key_value_heads"]),
            head_size=int(raw.get("head_dim", 256)),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 131_072)),
            layer_types=_layer_types(raw, num_layers, path),
            sliding_window=int(raw.get("sliding_window", 4096)),
            bidirectional=bidirectional,
            global_rope_theta=_rope_theta(raw, FULL, path),
            local_rope_theta=_rope_theta(raw, SLIDING, path),
            query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", 256)),
            activation=activation,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            attention_bias=attention_bias,
            pad_token_id=int(raw.get("pad_token_id") or 0),
        )
    check_positive(cfg, path, (*LLAMA_STYLE_SIZES, "sliding_window"),
                   "rms_norm_eps, query_pre_attn_scalar and the rope bases", cfg.rms_norm_eps,
                   cfg.query_pre_attn_scalar, cfg.global_rope_theta, cfg.local_rope_theta)
    return cfg


def _layer_types(raw: dict[str, Any], num_layers: int, path: Path) -> tuple[str, ...]:
    """layer_types, or transformers' default from sliding_window_pattern: layer i is full when (i + 1) % pattern
    is 0. (transformers reads the key sliding_window_pattern; configs also carry _sliding_window_pattern, which it
    does not read for this.)"""
    listed = listed_layer_types(raw, num_layers, (FULL, SLIDING), path)
    if listed is not None:
        return listed
    pattern = raw.get("sliding_window_pattern", SLIDING_WINDOW_PATTERN)
    if not isinstance(pattern, int) or pattern < 1:
        raise CheckpointError(f"{path}: sliding_window_pattern must be a positive integer, got {pattern!r}")
    return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(num_layers))


def _rope_theta(raw: dict[str, Any], layer_type: str, path: Path) -> float:
    """The rope base of one layer type: rope_parameters[layer_type] (transformers 5), else rope_theta or
    rope_local_base_freq (4.x). Only plain rotary (rope_type "default") is reproduced: EmbeddingGemma's."""
    return layer_type_rope_theta(raw, layer_type, raw.get(LEGACY_THETA_KEYS[layer_type], DEFAULT_THETA[layer_type]),
                                 path)


# Checkpoint names (transformers' Gemma3TextModel) -> Gemma3Encoder names, per layer.
LAYER_KEYS = {
    "input_layernorm": "attention_norm",
    "self_attn.q_proj": "attention.query",
    "self_attn.k_proj": "attention.key",
    "self_attn.v_proj": "attention.value",
    "self_attn.o_proj": "attention.out",
    "self_attn.q_norm": "attention.query_norm",
    "self_attn.k_norm": "attention.key_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "feed_forward_norm",
    "mlp.gate_proj": "feed_forward.gate",
    "mlp.up_proj": "feed_forward.up",
    "mlp.down_proj": "feed_forward.down",
    "post_feedforward_layernorm": "post_feed_forward_norm",
}
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
HEAD_NORMS = ("self_attn.q_norm", "self_attn.k_norm")


def key_map(cfg: Gemma3Config) -> dict[str, str]:
    """Checkpoint key (transformers' Gemma3TextModel or Gemma2Model naming) -> Gemma3Encoder key; the head norms'
    only where the config has them (Gemma 2's has none)."""
    keys = {"embed_tokens.weight": "word.weight", "norm.weight": "final_norm.weight"}
    for i in range(cfg.num_layers):
        for theirs, ours in LAYER_KEYS.items():
            if theirs in HEAD_NORMS and not cfg.head_norm:
                continue
            keys[f"layers.{i}.{theirs}.weight"] = f"layers.{i}.{ours}.weight"
            if cfg.attention_bias and theirs in PROJECTIONS:
                keys[f"layers.{i}.{theirs}.bias"] = f"layers.{i}.{ours}.bias"
    return keys


# A task model (Gemma3ForX) would keep the encoder under "model."; those are refused by architecture above.
FAMILY = Family(MODEL_TYPE, read_config, key_map, Gemma3Encoder,
                             WeightNames("model.", ("embed_tokens.", "layers.", "norm."), (), ()))
