"""NomicBERT (nomic-embed-text-v1 / v1.5): its config.json, its key map, and the rotary BERT-layout encoder
(rotary_bert.py) with a SwiGLU feed-forward. nomic-embed-text-v2-moe, the same model_type with mixtures of experts,
is nomic_moe.py's, which read_config, build and key_map hand its config to.

NomicBERT is BERT (post-LayerNorm, two token types, normalised embeddings) with rotary positions instead of
position embeddings, a SwiGLU feed-forward (silu(fc12(x)) * fc11(x), then fc2), and no bias in any linear layer.
The reference is transformers' NomicBertModel (eager and sdpa, transformers 5.x); tests compare against it.

config.json comes in two namings: transformers 5's (hidden_size, num_hidden_layers, rope_parameters, ...) and
the one the published checkpoints carry, written for nomic's own remote code (n_embd, n_layer, rotary_emb_base,
activation_function, and flags for options that code has). Both are read; a size given under both names must
agree, and each option of the remote code that is not NomicBERT's published setting is refused. transformers
itself reads only its own names (it leaves n_embd & co. to its defaults, which are nomic-embed-text-v1.5's).
The weights are stored under the remote code's names in either case (transformers saves them that way too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from attnserve.errors import CheckpointError

from . import nomic_moe
from .blocks import GATE_ACTIVATIONS, GatedFeedForward
from .config_reading import check_architectures, check_settings, invalid_config
from .family import Family, WeightNames
from .rotary import default_inv_freq
from .rotary_bert import RotaryBertConfig, RotaryBertEncoder, check_sizes

MODEL_TYPE = "nomic_bert"
ENCODER_ARCHITECTURES = ("NomicBertModel", "NomicBertForMaskedLM")
# NomicBertForMaskedLM keeps the encoder under "nomic_bert." and its unused masked-LM head under "cls.".
TASK_PREFIX = "nomic_bert."
ENCODER_PARTS = ("embeddings.", "emb_ln.", "encoder.")
UNUSED_HEADS = ("cls.",)

# RotaryBertConfig field -> (transformers' config key, the remote code's key), and transformers' default.
SIZES: dict[str, tuple[tuple[str, ...], Any]] = {
    "vocab_size": (("vocab_size",), 30528),
    "hidden_size": (("hidden_size", "n_embd"), 768),
    "num_layers": (("num_hidden_layers", "n_layer"), 12),
    "num_heads": (("num_attention_heads", "n_head"), 12),
    "intermediate_size": (("intermediate_size", "n_inner"), 3072),
    "max_position_embeddings": (("max_position_embeddings", "n_positions"), 2048),
    "type_vocab_size": (("type_vocab_size",), 2),
    "layer_norm_eps": (("layer_norm_eps", "layer_norm_epsilon"), 1e-12),
    "pad_token_id": (("pad_token_id",), 0),
}
# The remote code's options, at the value this encoder runs. rotary_emb_fraction < 1 rotates only part of each
# head, interleaved rotates pairs (x[2i], x[2i+1]) rather than halves, scale_base is xPos, rotary_scaling_factor
# dynamic NTK; the rest change the layer's layout. Irrelevant to the outputs, and accepted as they are: dropout,
# use_flash_attn, fused_bias_fc, fused_dropout_add_ln, pad_vocab_size_multiple, max_trained_positions.
REPRODUCED = {
    "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
    "rotary_scaling_factor": None, "rope_scaling": None, "prenorm": False, "parallel_block": False,
    "use_rms_norm": False, "causal": False, "is_decoder": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
    "mlp_fc2_bias": False, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
}
# The remote code's activation_function -> transformers' hidden_act: "swiglu" is silu on the gate.
REMOTE_ACTIVATIONS = {"swiglu": "silu"}
DEFAULT_THETA = 1000.0  # transformers' NomicBertConfig.default_theta


def read_config(raw: dict[str, Any], path: Path) -> RotaryBertConfig:
    """config.json of a NomicBERT checkpoint in either naming, or a one-line refusal of what the export does not
    run; no weight is read. One whose moe_every_n_layers is above 0 (nomic-embed-text-v2-moe) is read by
    nomic_moe.py, as the remote code then builds mixtures of experts."""
    if nomic_moe.moe_every_n_layers(raw, path) > 0:
        return nomic_moe.read_config(raw, path)
    check_architectures(raw, path, ENCODER_ARCHITECTURES)
    check_settings(raw, path, REPRODUCED)
    with invalid_config(path):
        values = {field: _value(raw, keys, default, path) for field, (keys, default) in SIZES.items()}
        hidden, heads = int(values["hidden_size"]), int(values["num_heads"])
        cfg = RotaryBertConfig(
            vocab_size=int(values["vocab_size"]), hidden_size=hidden, num_layers=int(values["num_layers"]),
            num_heads=heads, head_size=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=int(values["intermediate_size"]),
            max_position_embeddings=int(values["max_position_embeddings"]),
            type_vocab_size=int(values["type_vocab_size"]), layer_norm_eps=float(values["layer_norm_eps"]),
            pad_token_id=int(values["pad_token_id"] or 0), activation=_activation(raw, path),
            rope_theta=_rope_theta(raw, path), ntk_factor=1.0, qkv_bias=False, out_bias=False, up_bias=False,
            down_bias=False, family=MODEL_TYPE)
    check_sizes(cfg, path)
    return cfg


def _value(raw: dict[str, Any], keys: tuple[str, ...], default: Any, path: Path) -> Any:
    """A setting under transformers' name or the remote code's; both given, they must agree."""
    given = {k: raw[k] for k in keys if raw.get(k) is not None}
    if any(v != next(iter(given.values())) for v in given.values()):  # 1000 and 1000.0 agree
        raise CheckpointError(f"{path}: {' and '.join(f'{k} {v!r}' for k, v in given.items())} disagree")
    return next(iter(given.values()), default)


def _activation(raw: dict[str, Any], path: Path) -> str:
    remote = raw.get("activation_function")
    if remote is not None and remote not in REMOTE_ACTIVATIONS:
        raise CheckpointError(f"{path}: activation_function {remote!r} is not supported (only 'swiglu')")
    implied = REMOTE_ACTIVATIONS[remote] if remote is not None else "silu"  # silu: transformers' default
    act = raw.get("hidden_act") or implied
    if remote is not None and act != implied:
        raise CheckpointError(f"{path}: hidden_act {act!r} and activation_function {remote!r} disagree")
    if act not in GATE_ACTIVATIONS:
        raise CheckpointError(f"{path}: hidden_act {act!r} is not supported (only {', '.join(GATE_ACTIVATIONS)})")
    return act


def _rope_theta(raw: dict[str, Any], path: Path) -> float:
    """The rope base: rope_parameters' rope_theta (transformers 5), rope_theta, or rotary_emb_base (remote code)."""
    params = raw.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{path}: rope_parameters must be an object, got {params!r}")
    if params.get("rope_type", "default") != "default" or params.get("partial_rotary_factor", 1.0) != 1.0 or (
            set(params) - {"rope_type", "rope_theta", "partial_rotary_factor"}):
        raise CheckpointError(f"{path}: cannot reproduce rope_parameters {params!r} (only rope_type 'default' "
                              "with its rope_theta)")
    theta = _value({"rope_parameters.rope_theta": params.get("rope_theta"), "rope_theta": raw.get("rope_theta"),
                    "rotary_emb_base": raw.get("rotary_emb_base")},
                   ("rope_parameters.rope_theta", "rope_theta", "rotary_emb_base"), DEFAULT_THETA, path)
    return float(theta)


class SwiGLU(GatedFeedForward):
    """down(silu(gate(x)) * up(x)), no biases: fc12 is the gate, fc11 the up projection, fc2 down."""

    def __init__(self, cfg: RotaryBertConfig):
        super().__init__(cfg.hidden_size, cfg.intermediate_size, cfg.activation, bias=False)


def build(cfg: RotaryBertConfig) -> nn.Module:
    if isinstance(cfg, nomic_moe.NomicMoeConfig):
        return nomic_moe.build(cfg)
    return RotaryBertEncoder(cfg, lambda c, _: SwiGLU(c), default_inv_freq(cfg.head_size, cfg.rope_theta))


def key_map(cfg: RotaryBertConfig) -> dict[str, str]:
    """Checkpoint key (nomic's naming, which transformers also saves) -> RotaryBertEncoder key."""
    if isinstance(cfg, nomic_moe.NomicMoeConfig):
        return nomic_moe.key_map(cfg)
    keys = {"embeddings.word_embeddings.weight": "word.weight",
            "emb_ln.weight": "embeddings_norm.weight", "emb_ln.bias": "embeddings_norm.bias"}
    if cfg.type_vocab_size:
        keys["embeddings.token_type_embeddings.weight"] = "token_type.weight"
    per_layer = {"attn.Wqkv.weight": "attention.qkv.weight", "attn.out_proj.weight": "attention.out.weight",
                 "mlp.fc11.weight": "feed_forward.up.weight", "mlp.fc12.weight": "feed_forward.gate.weight",
                 "mlp.fc2.weight": "feed_forward.down.weight",
                 "norm1.weight": "attention_norm.weight", "norm1.bias": "attention_norm.bias",
                 "norm2.weight": "output_norm.weight", "norm2.bias": "output_norm.bias"}
    for i in range(cfg.num_layers):
        keys |= {f"encoder.layers.{i}.{theirs}": f"layers.{i}.{ours}" for theirs, ours in per_layer.items()}
    return keys


FAMILY = Family(MODEL_TYPE, read_config, key_map, build,
                             WeightNames(TASK_PREFIX, ENCODER_PARTS, UNUSED_HEADS, ()))
