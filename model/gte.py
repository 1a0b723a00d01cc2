"""GTE v1.5 (Alibaba-NLP gte-base-en-v1.5, gte-large-en-v1.5, gte-multilingual-base): its config.json, its key
map, NTK-scaled rotary frequencies, and the rotary BERT-layout encoder (rotary_bert.py) with a GLU feed-forward.

GTE is BERT's layout (post-LayerNorm: norm(x + attention(x)), then norm(x + feed_forward(x)); normalised
embeddings; 0, 1 or 2 token types) with rotary positions instead of position embeddings, query, key and value
from one projection (qkv_proj, with bias), and a GLU feed-forward: up_gate_proj (no bias) makes 2*F features,
up = the first half, gate = the second, then down_proj(act(gate) * up) (with bias); act is gelu (exact erf).

Rotary scaling: the published v1.5 configs set rope_scaling {"type": "ntk", "factor": f} over rope_theta. That
is Alibaba's fixed NTK scaling (its remote code's NTKScalingRotaryEmbedding, also vLLM's), applied at every
length: the base becomes rope_theta * f and every frequency is further divided by f^(2/d), d the head size:
    inv_freq_i = (rope_theta * f)^(-2i/d) / f^(2/d)
transformers 5.24's GteModel has no "ntk" rope type (its rotary embedding fails with KeyError 'ntk'), so the
tests check this formula by loading the same frequencies into transformers' GteModel.
The reference is transformers' GteModel (eager and sdpa, transformers 5.x) for everything else.

Two config.json forms, one family each (families.FAMILIES is keyed by model_type):
- "gte": transformers 5's GteModel / GteForMaskedLM (encoder keys under "gte." in the latter);
- "new": the published checkpoints as they are on the Hub, written for their remote code (auto_map to
  Alibaba-NLP/new-impl): NewModel, NewForMaskedLM (encoder keys under "new."), and NewForTokenClassification with
  one label (gte-multilingual-base: its token-weight classifier is unused, as by sentence-transformers, which
  loads AutoModel, NewModel). The key names are the same in both: transformers 5 renames the remote code's
  names when it loads (conversion_mapping.py's "gte" entry) and writes them back when it saves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from attnserve.errors import CheckpointError

from .blocks import GATE_ACTIVATIONS
from .config_reading import check_architectures, check_settings, invalid_config
from .family import Family, WeightNames
from .rotary import default_inv_freq
from .rotary_bert import RotaryBertConfig, RotaryBertEncoder, check_sizes

MODEL_TYPE = "gte"
ENCODER_ARCHITECTURES = ("GteModel", "GteForMaskedLM")
# GteForMaskedLM keeps the encoder under "gte." and its unused masked-LM head under "lm_head.".
TASK_PREFIX = "gte."
ENCODER_PARTS = ("embeddings.", "encoder.")
UNUSED_HEADS = ("lm_head.",)
PUBLISHED_MODEL_TYPE = "new"
PUBLISHED_ARCHITECTURES = ("NewModel", "NewForMaskedLM", "NewForTokenClassification")
PUBLISHED_TASK_PREFIX = "new."
PUBLISHED_UNUSED_HEADS = ("lm_head.", "classifier.")  # NewForMaskedLM's; NewForTokenClassification's (one label)
REMOTE_CODE = "Alibaba-NLP/new-impl"  # auto_map's "<repo>--<module>.<class>" values name it
# NewConfig's defaults are not GteConfig's: a published config must say these itself.
PUBLISHED_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                      "max_position_embeddings", "type_vocab_size", "rope_theta")
DEFAULT_THETA = 160_000.0  # transformers' GteConfig.default_theta
# The remote code's options (the published config.json's), at the value this encoder runs. Irrelevant to the
# outputs, and accepted as they are: unpad_inputs, use_memory_efficient_attention, dropout.
REPRODUCED = {"layer_norm_type": "layer_norm", "position_embedding_type": "rope", "pack_qkv": True,
              "logn_attention_scale": False, "logn_attention_clip1": False, "is_decoder": False}
ROPE_TYPES = ("default", "ntk")


def read_config(raw: dict[str, Any], path: Path) -> RotaryBertConfig:
    """config.json of a GTE checkpoint, as transformers' GteConfig reads it (sizes default as there) with the
    published configs' rope_theta and rope_scaling, or a one-line refusal of what the export does not run."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES)
    return _read_config(raw, path, MODEL_TYPE)


def read_published_config(raw: dict[str, Any], path: Path) -> RotaryBertConfig:
    """config.json of a GTE v1.5 checkpoint as published (model_type "new", for Alibaba-NLP/new-impl's remote
    code): the same fields, read the same way, once the remote code is known to be GTE v1.5's."""
    auto_map = raw.get("auto_map")
    targets = list(auto_map.values()) if isinstance(auto_map, dict) else []
    if not targets or not all(isinstance(t, str) and t.startswith(f"{REMOTE_CODE}--") for t in targets):
        raise CheckpointError(f"{path}: model_type 'new' is read only as GTE v1.5, whose auto_map names "
                              f"{REMOTE_CODE}, but auto_map is {auto_map!r}")
    check_architectures(raw, path, PUBLISHED_ARCHITECTURES)
    labels = raw.get("id2label") or {}
    if "NewForTokenClassification" in (raw.get("architectures") or []) and len(labels) != 1:
        raise CheckpointError(f"{path}: cannot reproduce NewForTokenClassification with {len(labels) or 'default'} "
                              "labels (only gte-multilingual-base's one, whose classifier goes unused)")
    missing = [k for k in PUBLISHED_REQUIRED if raw.get(k) is None]
    if missing:
        raise CheckpointError(f"{path}: a published GTE config must give {', '.join(missing)}")
    return _read_config(raw, path, PUBLISHED_MODEL_TYPE)


def _read_config(raw: dict[str, Any], path: Path, family: str) -> RotaryBertConfig:
    check_settings(raw, path, REPRODUCED)
    act = raw.get("hidden_act", "gelu")
    if act not in GATE_ACTIVATIONS:
        raise CheckpointError(f"{path}: hidden_act {act!r} is not supported (only {', '.join(GATE_ACTIVATIONS)})")
    theta, factor = _rope(raw, path)
    with invalid_config(path):
        hidden, heads = int(raw.get("hidden_size", 768)), int(raw.get("num_attention_heads", 12))
        cfg = RotaryBertConfig(
            vocab_size=int(raw.get("vocab_size", 250048)), hidden_size=hidden,
            num_layers=int(raw.get("num_hidden_layers", 12)), num_heads=heads,
            head_size=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=int(raw.get("intermediate_size", 3072)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
            type_vocab_size=int(raw.get("type_vocab_size", 1)),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            pad_token_id=int(raw["pad_token_id"] if raw.get("pad_token_id") is not None else 1),
            activation=act, rope_theta=theta, ntk_factor=factor,
            qkv_bias=True, out_bias=True, up_bias=False, down_bias=True, family=family)
    check_sizes(cfg, path)
    return cfg


def _rope(raw: dict[str, Any], path: Path) -> tuple[float, float]:
    """(rope base, NTK factor; 1.0: none) from rope_parameters (transformers 5) or rope_theta and rope_scaling
    (the published configs; transformers 5 reads them into rope_parameters the same way)."""
    if raw.get("rope_parameters") is not None and raw.get("rope_scaling") is not None:
        raise CheckpointError(f"{path}: give rope_parameters or rope_scaling, not both")
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{path}: rope_parameters must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES or set(params) - {"rope_type", "type", "rope_theta", "factor"}:
        # mixed_b is the remote code's "mixed" NTK, partial_rotary_factor a partly rotated head.
        raise CheckpointError(f"{path}: cannot reproduce rope settings {params!r} (only rope_type 'default', or "
                              "'ntk' with a factor, and rope_theta)")
    try:
        theta = float(params.get("rope_theta", raw.get("rope_theta", DEFAULT_THETA)))
        factor = float(params["factor"]) if rope_type == "ntk" else 1.0
    except KeyError:
        raise CheckpointError(f"{path}: rope_type 'ntk' needs a factor") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: invalid rope settings {params!r}: {e}") from None
    if not factor >= 1.0:
        raise CheckpointError(f"{path}: the ntk factor must be at least 1, got {factor}")
    return theta, factor


def ntk_inv_freq(head_size: int, theta: float, factor: float) -> torch.Tensor:
    """(hs/2,) fp32: Alibaba's fixed NTK frequencies (module docstring); factor 1 gives plain RoPE's."""
    return default_inv_freq(head_size, theta * factor) / factor ** (2 / head_size)


class UpGateFeedForward(nn.Module):
    """down(act(gate) * up), up and gate the two halves of one projection (up_gate_proj), as GTE stores them."""

    def __init__(self, cfg: RotaryBertConfig):
        super().__init__()
        self.up_gate = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.up_bias)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.down_bias)
        self.activation = GATE_ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, gate = self.up_gate(x).chunk(2, dim=-1)  # (B, T, F) each
        return self.down(self.activation(gate) * up)  # (B, T, H)


def build(cfg: RotaryBertConfig) -> nn.Module:
    return RotaryBertEncoder(cfg, lambda c, _: UpGateFeedForward(c),
                             ntk_inv_freq(cfg.head_size, cfg.rope_theta, cfg.ntk_factor))


def key_map(cfg: RotaryBertConfig) -> dict[str, str]:
    """Checkpoint key (the remote code's naming, which transformers also saves) -> RotaryBertEncoder key."""
    keys = {"embeddings.word_embeddings.weight": "word.weight",
            "embeddings.LayerNorm.weight": "embeddings_norm.weight",
            "embeddings.LayerNorm.bias": "embeddings_norm.bias"}
    if cfg.type_vocab_size:
        keys["embeddings.token_type_embeddings.weight"] = "token_type.weight"
    per_layer = {"attention.qkv_proj": "attention.qkv", "attention.o_proj": "attention.out",
                 "mlp.down_proj": "feed_forward.down", "attn_ln": "attention_norm", "mlp_ln": "output_norm"}
    for i in range(cfg.num_layers):
        keys[f"encoder.layer.{i}.mlp.up_gate_proj.weight"] = f"layers.{i}.feed_forward.up_gate.weight"
        for theirs, ours in per_layer.items():
            for param in ("weight", "bias"):
                keys[f"encoder.layer.{i}.{theirs}.{param}"] = f"layers.{i}.{ours}.{param}"
    return keys


FAMILY = Family(MODEL_TYPE, read_config, key_map, build,
                             WeightNames(TASK_PREFIX, ENCODER_PARTS, UNUSED_HEADS, ()))
PUBLISHED_FAMILY = Family(PUBLISHED_MODEL_TYPE, read_published_config, key_map, build,
                                       WeightNames(PUBLISHED_TASK_PREFIX, ENCODER_PARTS, PUBLISHED_UNUSED_HEADS, ()))
