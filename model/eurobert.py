"""EuroBERT: Llama's blocks as a bidirectional encoder, and its checkpoints' config and key map.

As transformers' EuroBertModel (5.x) runs it:
- no position embeddings: rotary positions 0..T-1 on queries and keys in every layer, one base (rope_theta);
- pre-norm layers with RMSNorm (scale = weight, Llama's): x + attention(norm(x)), then x + feed_forward(norm(x)),
  and a final norm after the stack;
- grouped-query attention where num_key_value_heads < num_attention_heads, scores scaled by head_dim^-0.5;
- SwiGLU feed-forward: down(silu(gate(x)) * up(x));
- every query attends to every real key (bidirectional); there are no token types.
classifier_pooling (clf_pooling in the original remote code) only chooses how a classification head pools, and a
classification head is refused; pretraining_tp is not read by EuroBERT's feed-forward.

Shapes: B batch, T sequence, H hidden, nh query heads, nkv key/value heads, hs head size, L layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from attnserve.errors import CheckpointError

from .blocks import (
    GATE_ACTIVATIONS,
    LLAMA_STYLE_SIZES,
    LlamaStyleConfig,
    PreNormEncoder,
    PreNormLayer,
    llama_style_key_map,
)
from .config_reading import (
    check_architectures,
    check_object,
    check_positive,
    check_supported,
    flag,
    invalid_config,
    refuse_rope_scaling,
    single_rope_theta,
)
from .family import Family, WeightNames

MODEL_TYPE = "eurobert"


@dataclass(frozen=True)
class EuroBertConfig(LlamaStyleConfig):
    # Encoder sizes under the names EncoderConfig uses, so export and verification read either config.
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int  # config.json's head_dim, hidden_size // num_attention_heads by default
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    activation: str = "silu"  # hidden_act, a key of blocks.GATE_ACTIVATIONS
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    mlp_bias: bool = False
    pad_token_id: int = 0
    family: ClassVar[str] = MODEL_TYPE  # as EncoderConfig.family: config.json's model_type

    @property
    def out_bias(self) -> bool:
        """W_O's bias: attention_bias's, as for the queries, keys and values (blocks.llama_style_key_map)."""
        return self.attention_bias


class EuroBertEncoder(PreNormEncoder):
    """Pre-norm layers (blocks.PreNormLayer), bidirectional attention."""

    def __init__(self, cfg: EuroBertConfig):
        super().__init__(cfg, cfg.rope_theta, lambda: PreNormLayer(cfg, cfg.activation, math.sqrt(cfg.head_size),
                                                                   mlp_bias=cfg.mlp_bias),
                         name="EuroBERT", causal=False)


# The bare model, and the masked-LM model used as an encoder (EuroBERT's released checkpoints are
# EuroBertForMaskedLM; AutoModel, which sentence-transformers loads, leaves its lm_head unused).
ENCODER_ARCHITECTURES = ("EuroBertModel", "EuroBertForMaskedLM")
TASK_PREFIX = "model."
ENCODER_PARTS = ("embed_tokens.", "layers.", "norm.")
UNUSED_HEADS = ("lm_head.",)
DEFAULT_ROPE_THETA = 10_000.0  # transformers' default_theta, which EuroBertConfig keeps
DEFAULT_PAD_TOKEN_ID = 128001  # EuroBertConfig's: <|end_of_text|>, also the end-of-sequence token


def read_config(raw: dict[str, Any], path: Path) -> EuroBertConfig:
    """config.json of a EuroBERT checkpoint, as transformers' EuroBertConfig reads it (the rope settings in the 4.x
    or the 5.x form), or a one-line refusal of what the export does not run."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES)
    activation = check_supported(path, "hidden_act", raw.get("hidden_act", "silu"), sorted(GATE_ACTIVATIONS))
    flags = {key: flag(raw, key, path) for key in ("attention_bias", "mlp_bias")}
    with invalid_config(path):
        hidden_size, num_heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        cfg = EuroBertConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden_size,
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_size=int(raw.get("head_dim") or hidden_size // num_heads),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
            rope_theta=_rope_theta(raw, path),
            activation=activation,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            attention_bias=flags["attention_bias"],
            mlp_bias=flags["mlp_bias"],
            pad_token_id=int(raw.get("pad_token_id", DEFAULT_PAD_TOKEN_ID) or 0),
        )
    check_positive(cfg, path, LLAMA_STYLE_SIZES, "rms_norm_eps and rope_theta", cfg.rms_norm_eps, cfg.rope_theta)
    return cfg


def _rope_theta(raw: dict[str, Any], path: Path) -> float:
    """rope_parameters["rope_theta"] (transformers 5), else rope_theta (4.x). Only plain rotary (rope_type
    "default") is reproduced: EuroBERT's released checkpoints use it."""
    refuse_rope_scaling(raw, path)  # before the others: a config with several is refused for its rope_scaling
    if raw.get("partial_rotary_factor") is not None:
        raise CheckpointError(f"{path}: cannot reproduce partial_rotary_factor {raw['partial_rotary_factor']!r} "
                              "(only rotary over the whole head)")
    check_object(raw.get("rope_parameters"), path, "rope_parameters")
    return single_rope_theta(raw, path, DEFAULT_ROPE_THETA)


FAMILY = Family(MODEL_TYPE, read_config, llama_style_key_map, EuroBertEncoder,
                             WeightNames(TASK_PREFIX, ENCODER_PARTS, UNUSED_HEADS, ()))
