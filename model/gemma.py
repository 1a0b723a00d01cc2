"""Gemma (v1: Gemma 2B and 7B, bge-reranker-v2-gemma's base) as an encoder, and its checkpoints' config and key map.

Gemma's blocks are Gemma 3's encoder (gemma3.py: the embedding times sqrt(hidden_size) in the weights' dtype, RMSNorms
scaling by 1 + weight, rotary positions 0..T-1, GeGLU with the tanh gelu, a final norm), as transformers' GemmaModel
(5.x) runs them, with these differences:
- Llama's layer: one norm before the attention and one before the feed-forward (post_attention_layernorm is the
  latter, as in Llama), no norms after either sublayer, none over each query and key head;
- scores scaled by head_dim^-0.5; no soft-capping, no sliding window: every layer is full and causal;
- one rope base (rope_theta); key/value heads shared by groups of query heads (multi-query attention on the 2B);
- biases on q, k, v and W_O together where attention_bias says.
hidden_act "gelu" (the published configs' legacy value) is the tanh gelu, as transformers' GemmaConfig reads it;
use_bidirectional_attention is refused.

Shapes: as gemma3.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from attnserve.errors import CheckpointError

from .blocks import GATE_ACTIVATIONS, LLAMA_STYLE_SIZES, llama_style_key_map
from .config_reading import (
    check_architectures,
    check_positive,
    check_supported,
    flag,
    invalid_config,
    single_rope_theta,
)
from .family import Family, WeightNames
from .gemma3 import FULL, Gemma3Config, Gemma3Encoder, Gemma3Layer

MODEL_TYPE = "gemma"


@dataclass(frozen=True)
class GemmaConfig(Gemma3Config):
    family: ClassVar[str] = MODEL_TYPE  # as Gemma3Config.family: config.json's model_type
    head_norm: ClassVar[bool] = False
    sandwich: ClassVar[bool] = False  # Llama's two norms a layer
    causal: ClassVar[bool] = True  # padding on either side gives the same real outputs (tokenizer_parity.py)
    mlp_bias: ClassVar[bool] = False

    @property
    def out_bias(self) -> bool:
        """W_O's bias: attention_bias, as q's, k's and v's (llama_style_key_map reads it)."""
        return self.attention_bias


class GemmaEncoder(Gemma3Encoder):
    """Gemma 3's encoder (its embedding scale, causal mask and final norm) over Gemma's layers, all full."""

    layer_class = Gemma3Layer  # with the config's sandwich and head_norm off: Llama's layer with Gemma's norms


# The bare model, and the causal LM used as an encoder (bge-reranker-v2-gemma's: model/llm_reranker.py reads its two
# answer rows of the tied lm_head).
ENCODER_ARCHITECTURES = ("GemmaModel", "GemmaForCausalLM")
DEFAULT_ROPE_THETA = 10_000.0
LEGACY_GELU = {"gelu": "gelu_pytorch_tanh"}  # transformers' GemmaConfig.__post_init__


def read_config(raw: dict[str, Any], path: Path) -> GemmaConfig:
    """config.json of a Gemma checkpoint, as transformers' GemmaConfig reads it (rope in the 4.x or the 5.x form),
    or a one-line refusal of what the export does not run."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES, runs=" or ".join(ENCODER_ARCHITECTURES))
    act = raw.get("hidden_act", "gelu_pytorch_tanh")
    activation = check_supported(path, "hidden_act", LEGACY_GELU.get(act, act) if isinstance(act, str) else act,
                                 sorted(GATE_ACTIVATIONS))
    if flag(raw, "use_bidirectional_attention", path, none_is_false=True):
        raise CheckpointError(f"{path}: cannot reproduce use_bidirectional_attention true (Gemma runs causal)")
    attention_bias = flag(raw, "attention_bias", path)
    theta = single_rope_theta(raw, path, DEFAULT_ROPE_THETA)
    with invalid_config(path):
        num_layers = int(raw["num_hidden_layers"])
        heads = int(raw["num_attention_heads"])
        kv_heads = raw.get("num_key_value_heads")
        head_size = int(raw.get("head_dim") or 256)
        positions = int(raw.get("max_position_embeddings") or 8192)
        cfg = GemmaConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=heads if kv_heads is None else int(kv_heads),
            head_size=head_size,
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=positions,
            layer_types=(FULL,) * num_layers,
            sliding_window=positions,  # no layer slides
            bidirectional=False,
            global_rope_theta=theta,
            local_rope_theta=theta,
            query_pre_attn_scalar=float(head_size),  # scores over sqrt(head_dim)
            activation=activation,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            attention_bias=attention_bias,
            pad_token_id=int(raw.get("pad_token_id") or 0),
        )
    check_positive(cfg, path, LLAMA_STYLE_SIZES, "rms_norm_eps and rope_theta", cfg.rms_norm_eps,
                   cfg.global_rope_theta)
    return cfg


FAMILY = Family(MODEL_TYPE, read_config, llama_style_key_map, GemmaEncoder,
                WeightNames("model.", ("embed_tokens.", "layers.", "norm."), ("lm_head.",), ()))
