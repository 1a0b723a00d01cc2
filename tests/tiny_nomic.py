"""A tiny random-weight NomicBERT saved by transformers itself (NomicBertModel), with a lowercasing WordPiece
tokenizer as nomic-embed-text's, and the published checkpoints' config naming."""

from __future__ import annotations

import json
from pathlib import Path

from .checkpoints import save_rotary_bert


def save_tiny_nomic(directory: Path, model_class: str = "NomicBertModel", seed: int = 0, **config) -> Path:
    """checkpoints.save_rotary_bert's NomicBERT, rope base 1000. config: NomicBertConfig settings over these."""
    return save_rotary_bert(directory, "NomicBertConfig", model_class, seed, **{
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}, **config})


# transformers 5's config key -> the key nomic-embed-text-v1.5's config.json (nomic's remote code) uses.
REMOTE_NAMES = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                "intermediate_size": "n_inner", "max_position_embeddings": "n_positions",
                "layer_norm_eps": "layer_norm_epsilon"}


def as_published(config_path: Path) -> None:
    """Rewrite a transformers-saved config.json into the published checkpoints' naming, with their settings."""
    raw = json.loads(config_path.read_text())
    remote = {REMOTE_NAMES.get(k, k): v for k, v in raw.items() if k not in ("hidden_act", "rope_parameters")}
    remote |= {"activation_function": "swiglu", "rotary_emb_base": int(raw["rope_parameters"]["rope_theta"]),
               "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
               "rotary_scaling_factor": None, "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
               "prenorm": False, "parallel_block": False, "use_rms_norm": False, "causal": False,
               "use_flash_attn": True, "fused_bias_fc": True, "max_trained_positions": 2048,
               "scale_attn_weights": True, "pad_vocab_size_multiple": 64}
    config_path.write_text(json.dumps(remote, indent=2))
