"""Qwen3 (Qwen3-Embedding), a decoder used as an encoder, and its checkpoints' config and key map.

It differs from BERT in these places, and only these:
- positions are rotary (RoPE, one base: rope_theta), applied to queries and keys; no position embeddings;
- attention is causal: a token sees itself and the tokens before it, so the attention maps are lower-triangular
  and the sentence embedding is the last real token's hidden state (sentence-transformers' lasttoken pooling);
- grouped-query attention: num_key_value_heads key/value heads, each shared by a group of query heads, with a
  head size (head_dim) of its own, not hidden_size / heads;
- each query and key head is RMS-normalised before the rotation (q_norm, k_norm: one weight for all heads);
- layers are pre-RMSNorm, the feed-forward is SwiGLU (down(silu(gate(x)) * up(x))), a final RMSNorm follows;
- no biases (unless attention_bias), no token types, no embedding norm.
Padding: a token's output depends only on the real tokens before it and their distances to it (rotary), so
right padding (the engine's) and left padding (Qwen3-Embedding's tokenizer's) give the same real outputs.
The reference is transformers' Qwen3Model (eager and sdpa paths, transformers 5.x); tests compare against it.
A Qwen3ForCausalLM checkpoint is read here too: as an encoder its lm_head is unused; as a reranker
(llm_reranker.py) only the rows of "yes" and "no" are.

Shapes: B batch, T sequence, H hidden, nh query heads, nkv key/value heads, hs head size, F intermediate size,
L layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from attnserve.errors import CheckpointError

from .blocks import GATE_ACTIVATIONS, LLAMA_STYLE_SIZES, LlamaStyleConfig, PreNormEncoder, PreNormLayer
from .config_reading import (
    check_architectures,
    check_positive,
    check_supported,
    flag,
    invalid_config,
    single_rope_theta,
)
from .family import Family, WeightNames

MODEL_TYPE = "qwen3"
FULL = "full_attention"  # transformers' name of a layer that sees every earlier token (the only kind run here)


@dataclass(frozen=True)
class Qwen3Config(LlamaStyleConfig):
    # Encoder sizes under the names EncoderConfig uses, so export and verification read either config.
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_size: int  # config.json's head_dim
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    pad_token_id: int = 0
    family: ClassVar[str] = MODEL_TYPE  # as EncoderConfig.family: config.json's model_type
    causal: ClassVar[bool] = True  # padding on either side gives the same real outputs (tokenizer_parity.py)


class Qwen3Encoder(PreNormEncoder):
    """Pre-norm layers (blocks.PreNormLayer) with each query and key head RMS-normalised, causal attention."""

    def __init__(self, cfg: Qwen3Config):
        super().__init__(cfg, cfg.rope_theta, lambda: PreNormLayer(cfg, cfg.hidden_act, math.sqrt(cfg.head_size),
                                                                   head_norm=True),
                         name="Qwen3", causal=True)


# The architectures whose encoder output is the checkpoint's own: the bare model, and the causal LM used as an
# encoder (its lm_head unused, as sentence-transformers' AutoModel leaves it) or as a reranker.
ENCODER_ARCHITECTURES = ("Qwen3Model", "Qwen3ForCausalLM")
CAUSAL_LM = "Qwen3ForCausalLM"
TASK_PREFIX = "model."  # where Qwen3ForCausalLM keeps the encoder's keys
ENCODER_PARTS = ("embed_tokens.", "layers.", "norm.")
UNUSED_HEADS = ("lm_head.",)
# config.json settings that change nothing at inference (use_cache, dropout, ...) need no check; those that
# would, and that this file does not reproduce, are refused by name below.


def read_config(raw: dict[str, Any], path: Path) -> Qwen3Config:
    """config.json of a Qwen3 checkpoint, as transformers' Qwen3Config reads it (rope in the 4.x form or the 5.x
    form), or a one-line refusal of what the export does not run."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES, runs=" or ".join(ENCODER_ARCHITECTURES))
    act = check_supported(path, "hidden_act", raw.get("hidden_act", "silu"), GATE_ACTIVATIONS)
    if raw.get("use_sliding_window"):
        raise CheckpointError(f"{path}: cannot reproduce use_sliding_window true (sliding-window layers)")
    types = raw.get("layer_types")
    if types is not None and (not isinstance(types, list) or any(t != FULL for t in types)):
        raise CheckpointError(f"{path}: cannot reproduce layer_types {types!r} (only {FULL!r} layers)")
    if raw.get("is_causal") is False or raw.get("use_bidirectional_attention"):
        raise CheckpointError(f"{path}: cannot reproduce bidirectional attention (Qwen3 attention is causal)")
    with invalid_config(path):
        heads_count = int(raw["num_attention_heads"])
        kv_heads = raw.get("num_key_value_heads")
        hidden = int(raw["hidden_size"])
        cfg = Qwen3Config(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads_count,
            num_kv_heads=heads_count if kv_heads is None else int(kv_heads),
            head_size=int(raw.get("head_dim") or hidden // heads_count),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            rope_theta=single_rope_theta(raw, path, 10_000.0),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            hidden_act=act,
            attention_bias=flag(raw, "attention_bias", path),
            pad_token_id=int(raw.get("pad_token_id") or 0),
        )
    check_positive(cfg, path, LLAMA_STYLE_SIZES, "rms_norm_eps and rope_theta", cfg.rms_norm_eps, cfg.rope_theta)
    return cfg


def key_map(cfg: Qwen3Config) -> dict[str, str]:
    """Checkpoint key (transformers' Qwen3Model naming) -> Qwen3Encoder key."""
    keys = {"embed_tokens.weight": "word.weight", "norm.weight": "final_norm.weight"}
    linear = ("weight", "bias") if cfg.attention_bias else ("weight",)
    per_layer = [("input_layernorm", "attention_norm", ("weight",)),
                 ("self_attn.q_proj", "attention.query", linear),
                 ("self_attn.k_proj", "attention.key", linear),
                 ("self_attn.v_proj", "attention.value", linear),
                 ("self_attn.o_proj", "attention.out", linear),
                 ("self_attn.q_norm", "attention.query_norm", ("weight",)),
                 ("self_attn.k_norm", "attention.key_norm", ("weight",)),
                 ("post_attention_layernorm", "feed_forward_norm", ("weight",)),
                 ("mlp.gate_proj", "feed_forward.gate", ("weight",)),
                 ("mlp.up_proj", "feed_forward.up", ("weight",)),
                 ("mlp.down_proj", "feed_forward.down", ("weight",))]
    for i in range(cfg.num_layers):
        for theirs, ours, params in per_layer:
            for p in params:
                keys[f"layers.{i}.{theirs}.{p}"] = f"layers.{i}.{ours}.{p}"
    return keys


FAMILY = Family(MODEL_TYPE, read_config, key_map, Qwen3Encoder,
                             WeightNames(TASK_PREFIX, ENCODER_PARTS, UNUSED_HEADS, ()))
