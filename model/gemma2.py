"""Gemma 2 (bge-multilingual-gemma2) as an encoder, and its checkpoints' config and key map.

Gemma 2's blocks are Gemma 3's (gemma3.py: the embedding times sqrt(hidden_size), RMSNorms scaling by 1 + weight,
four sandwich norms a layer, scores scaled by query_pre_attn_scalar^-0.5, grouped-query attention, GeGLU with the tanh
gelu, sliding and full layers as layer_types says), as transformers' Gemma2Model (5.x) runs them, with these
differences:
- no norm over each query and key head;
- the attention scores are soft-capped before the mask: attn_logit_softcapping * tanh(scores / it) (the attention
  core's softcap, model/attention.py), as transformers' eager attention computes them, the only one it runs for
  Gemma 2 (sdpa has no soft-capping);
- one rope base (rope_theta) for every layer;
- causal: full layers see every earlier key, sliding layers the sliding_window - 1 keys before a query and the query
  itself; layer 0 slides, layer 1 is full, and so on, where config.json lists no layer_types.
use_bidirectional_attention is refused; final_logit_softcapping caps the language-model head's logits, which an
encoder does not have.

Shapes: as gemma3.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from attnserve.errors import CheckpointError

from .blocks import GATE_ACTIVATIONS, LLAMA_STYLE_SIZES
from .config_reading import (
    check_architectures,
    check_positive,
    check_supported,
    flag,
    invalid_config,
    listed_layer_types,
    single_rope_theta,
)
from .family import Family, WeightNames
from .gemma3 import FULL, SLIDING, Gemma3Config, Gemma3Encoder, Gemma3Layer, key_map

MODEL_TYPE = "gemma2"


@dataclass(frozen=True)
class Gemma2Config(Gemma3Config):
    attn_logit_softcapping: float | None = 50.0  # None: no soft-capping
    family: ClassVar[str] = MODEL_TYPE  # as Gemma3Config.family: config.json's model_type
    head_norm: ClassVar[bool] = False
    causal: ClassVar[bool] = True  # padding on either side gives the same real outputs (tokenizer_parity.py)


class Gemma2Layer(Gemma3Layer):
    """Gemma 3's layer without the per-head norms (the config's head_norm), its scores soft-capped."""

    def __init__(self, cfg: Gemma3Config, index: int):
        super().__init__(cfg, index)
        self.attention.softcap = getattr(cfg, "attn_logit_softcapping", None)


class Gemma2Encoder(Gemma3Encoder):
    """Gemma 3's encoder (causal masks, the sliding and full layers) over Gemma 2's layers; one rope base."""

    layer_class = Gemma2Layer


# The bare model (bge-multilingual-gemma2's) and the causal LM used as an encoder (its lm_head, tied to the
# embedding, unused).
ENCODER_ARCHITECTURES = ("Gemma2Model", "Gemma2ForCausalLM")
DEFAULT_ROPE_THETA = 10_000.0


def read_config(raw: dict[str, Any], path: Path) -> Gemma2Config:
    """config.json of a Gemma 2 checkpoint, as transformers' Gemma2Config reads it (rope in the 4.x or the 5.x form),
    or a one-line refusal of what the export does not run."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES, runs=" or ".join(ENCODER_ARCHITECTURES))
    activation = check_supported(path, "hidden_activation", raw.get("hidden_activation", "gelu_pytorch_tanh"),
                                 sorted(GATE_ACTIVATIONS))
    if flag(raw, "use_bidirectional_attention", path, none_is_false=True):
        raise CheckpointError(f"{path}: cannot reproduce use_bidirectional_attention true (Gemma 2 runs causal)")
    attention_bias = flag(raw, "attention_bias", path)
    softcap = raw.get("attn_logit_softcapping", 50.0)
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, int | float) or softcap <= 0):
        raise CheckpointError(f"{path}: attn_logit_softcapping must be a positive number or null, got {softcap!r}")
    theta = single_rope_theta(raw, path, DEFAULT_ROPE_THETA)
    with invalid_config(path):
        num_layers = int(raw["num_hidden_layers"])
        cfg = Gemma2Config(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_layers=num_layers,
            num_heads=int(raw["num_attention_heads"]),
            num_kv_heads=int(raw["num_key_value_heads"]),
            head_size=int(raw.get("head_dim", 256)),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
            layer_types=_layer_types(raw, num_layers, path),
            sliding_window=int(raw.get("sliding_window") or 4096),
            bidirectional=False,
            global_rope_theta=theta,
            local_rope_theta=theta,
            query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", 256)),
            activation=activation,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            attention_bias=attention_bias,
            pad_token_id=int(raw.get("pad_token_id") or 0),
            attn_logit_softcapping=None if softcap is None else float(softcap),
        )
    check_positive(cfg, path, (*LLAMA_STYLE_SIZES, "sliding_window"),
                   "rms_norm_eps, query_pre_attn_scalar and rope_theta", cfg.rms_norm_eps,
                   cfg.query_pre_attn_scalar, cfg.global_rope_theta)
    return cfg


def _layer_types(raw: dict[str, Any], num_layers: int, path: Path) -> tuple[str, ...]:
    """layer_types, or transformers' default: layer i slides when (i + 1) is odd (0, 2, 4, ...), the others full."""
    listed = listed_layer_types(raw, num_layers, (FULL, SLIDING), path)
    return listed if listed is not None else tuple(SLIDING if (i + 1) % 2 else FULL for i in range(num_layers))


FAMILY = Family(MODEL_TYPE, read_config, key_map, Gemma2Encoder,
                WeightNames("model.", ("embed_tokens.", "layers.", "norm."), ("lm_head.",), ()))
