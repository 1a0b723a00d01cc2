"""Llama, Mistral and Qwen2: decoders used as encoders, and their checkpoints' config and key map.

The embedders built on them (e5-mistral-7b-instruct and SFR-Embedding-Mistral on Mistral, gte-Qwen2 and
stella on Qwen2, Llama-based ones) run the decoder as transformers' LlamaModel, MistralModel and Qwen2Model run it,
causal, and pool as their sentence-transformers folders say (last token, mean, with the end-of-text token their
tokenizer appends). The three share Llama's blocks (blocks.py): rotary positions, pre-RMSNorm layers, grouped-query
attention, a SwiGLU feed-forward and a final RMSNorm, no token types. They differ in these places only:
- llama: biases on the queries, keys, values and W_O where attention_bias says, on the feed-forward where mlp_bias
  says; rotary positions plain or Llama 3's scaled ones (rope_type "llama3");
- mistral: no biases; a sliding window in every layer (sliding_window, 4096 when config.json leaves it out: a
  query sees the keys fewer than that many positions behind it);
- qwen2: biases on the queries, keys and values, none on W_O or the feed-forward; sliding layers only where
  use_sliding_window says, which is refused.
Padding: as Qwen3's (qwen3.py), a token's output depends only on the real tokens before it and their distances, so
right padding (the engine's) and left padding (the tokenizers') give the same real outputs.
- llama_bidirec: NVIDIA's llama-nemotron-embed, Llama with bidirectional attention (every query sees every real key),
  as its published modelling code (llama_bidirectional_model.py, its auto_map's AutoModel) runs it.
- bidir_mistral: NV-Embed's bidirectional Mistral (BidirectionalMistralModel in its modeling_nvembed.py), read only
  as the text_config of an NV-Embed checkpoint (nvembed.py): every query sees every real key, with no sliding window
  (its mask is the padding alone, _prepare_4d_attention_mask, under eager attention).
Other bidirectional variants (gte-Qwen2's) are published as remote code of their own: a config whose auto_map names
an AutoModel no row follows, or that asks for bidirectional attention, is refused here rather than run as the
causal decoder its code may not be.

Shapes: as blocks.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnserve.errors import CheckpointError

from .blocks import (
    GATE_ACTIVATIONS,
    LLAMA_STYLE_SIZES,
    LlamaStyleConfig,
    PreNormEncoder,
    PreNormLayer,
    llama_style_key_map,
)
from .config_reading import check_architectures, check_object, check_positive, check_supported, flag, invalid_config
from .family import Family, WeightNames
from .rotary import llama3_inv_freq


@dataclass(frozen=True)
class Llama3Rope:
    """rope_type "llama3"'s settings (transformers' _compute_llama3_parameters)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LlamaConfig(LlamaStyleConfig):
    # Encoder sizes under the names EncoderConfig uses, so export and verification read either config.
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_size: int  # config.json's head_dim
    intermediate_size: int
    max_position_embeddings: int
    family: str  # config.json's model_type: "llama", "mistral" or "qwen2"
    rope_theta: float
    llama3_rope: Llama3Rope | None = None
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False  # the queries', keys' and values'
    out_bias: bool = False  # W_O's
    mlp_bias: bool = False
    sliding_window: int | None = None  # Mistral's: a query sees keys fewer than this many positions behind it
    pad_token_id: int = 0
    # Causal: padding on either side gives the same real outputs (tokenizer_parity.py). llama_bidirec's is not.
    causal: bool = True


class LlamaEncoder(PreNormEncoder):
    """Pre-norm layers (blocks.PreNormLayer), causal attention (within Mistral's window where it has one), or
    bidirectional (llama_bidirec)."""

    def __init__(self, cfg: LlamaConfig):
        rope = cfg.llama3_rope
        inv_freq = None if rope is None else llama3_inv_freq(
            cfg.head_size, cfg.rope_theta, rope.factor, rope.low_freq_factor, rope.high_freq_factor,
            rope.original_max_position_embeddings)
        # A window as long as the positions never bites: left out of the graph.
        window = cfg.sliding_window if cfg.sliding_window and cfg.sliding_window < cfg.max_position_embeddings \
            else None
        super().__init__(cfg, cfg.rope_theta, lambda: PreNormLayer(
            cfg, cfg.hidden_act, math.sqrt(cfg.head_size), mlp_bias=cfg.mlp_bias, out_bias=cfg.out_bias),
            name=LAYOUTS[cfg.family].name, causal=cfg.causal, window=window, inv_freq=inv_freq)


@dataclass(frozen=True)
class Layout:
    """What sets one of the three apart in its config.json and its defaults (transformers' config classes)."""

    model_type: str
    name: str  # for messages
    architectures: tuple[str, ...]  # the bare model, and the causal LM used as an encoder (its lm_head unused)
    default_positions: int
    default_eps: float
    causal: bool = True
    remote_code: str | None = None  # the auto_map AutoModel whose published code this row follows
    standalone: bool = True  # a family of its own; False: read only inside another family's config (nvembed.py)


LAYOUTS = {layout.model_type: layout for layout in (
    Layout("llama", "Llama", ("LlamaModel", "LlamaForCausalLM"), 2048, 1e-6),
    Layout("mistral", "Mistral", ("MistralModel", "MistralForCausalLM"), 4096 * 32, 1e-6),
    Layout("qwen2", "Qwen2", ("Qwen2Model", "Qwen2ForCausalLM"), 32768, 1e-6),
    # NVIDIA's llama-nemotron-embed (llama_bidirectional_model.py, published with the model): LlamaModel with every
    # layer's is_causal false and the padding mask alone (_prepare_4d_attention_mask), on LlamaConfig's settings.
    Layout("llama_bidirec", "Llama (bidirectional)", ("LlamaBidirectionalModel",), 2048, 1e-6, causal=False,
           remote_code="llama_bidirectional_model.LlamaBidirectionalModel"),
    # NV-Embed's text_config (nvembed.py): MistralModel with every layer's is_causal false and the padding mask alone.
    Layout("bidir_mistral", "Mistral (bidirectional)", ("MistralModel", "MistralForCausalLM"), 4096 * 32, 1e-6,
           causal=False, standalone=False),
)}
MISTRAL_WINDOW = 4096  # MistralConfig's sliding_window where config.json gives none
DEFAULT_ROPE_THETA = 10_000.0
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor")
FULL = "full_attention"
TASK_PREFIX = "model."  # where XForCausalLM keeps the encoder's keys
ENCODER_PARTS = ("embed_tokens.", "layers.", "norm.")
UNUSED_HEADS = ("lm_head.",)


def read_config(raw: dict[str, Any], path: Path) -> LlamaConfig:
    """config.json of a Llama, Mistral or Qwen2 checkpoint, as transformers' config class reads it (rope in the 4.x
    or the 5.x form), or a one-line refusal of what the export does not run."""
    layout = LAYOUTS[raw["model_type"]]
    check_architectures(raw, path, layout.architectures, runs=" or ".join(layout.architectures))
    act = check_supported(path, "hidden_act", raw.get("hidden_act", "silu"), GATE_ACTIVATIONS)
    check_object(raw.get("auto_map"), path, "auto_map")
    remote = (raw.get("auto_map") or {}).get("AutoModel")
    # sentence-transformers runs remote code with trust_remote_code (gte-Qwen2's, say): only the code a row follows.
    # A Hub reference is "repo--module.Class"; the module and class are what is compared.
    if remote and (layout.remote_code is None or str(remote).split("--")[-1] != layout.remote_code):
        raise CheckpointError(f"{path}: cannot reproduce auto_map's AutoModel {remote!r} (remote code; only "
                              f"transformers' own {layout.architectures[0]})")
    if layout.causal and (raw.get("is_causal") is False or raw.get("use_bidirectional_attention")):
        raise CheckpointError(f"{path}: cannot reproduce bidirectional attention ({layout.name} attention is causal)")
    if raw.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise CheckpointError(f"{path}: cannot reproduce partial_rotary_factor {raw['partial_rotary_factor']!r} "
                              "(only rotary over the whole head)")
    biases = _biases(raw, path, layout)
    window = _sliding_window(raw, path, layout)
    with invalid_config(path):
        heads_count = int(raw["num_attention_heads"])
        kv_heads = raw.get("num_key_value_heads")
        hidden = int(raw["hidden_size"])
        positions = int(raw.get("max_position_embeddings") or layout.default_positions)
        theta, llama3 = _rope(raw, path, layout, positions)
        cfg = LlamaConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads_count,
            num_kv_heads=heads_count if kv_heads is None else int(kv_heads),
            head_size=int(raw.get("head_dim") or hidden // heads_count),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=positions,
            family=layout.model_type,
            rope_theta=theta,
            llama3_rope=llama3,
            rms_norm_eps=float(raw.get("rms_norm_eps", layout.default_eps)),
            hidden_act=act,
            sliding_window=window,
            pad_token_id=int(raw.get("pad_token_id") or 0),
            causal=layout.causal,
            **biases,
        )
    check_positive(cfg, path, LLAMA_STYLE_SIZES, "rms_norm_eps and rope_theta", cfg.rms_norm_eps, cfg.rope_theta)
    _check_layer_types(raw, path, cfg.num_layers)
    return cfg


def _biases(raw: dict[str, Any], path: Path, layout: Layout) -> dict[str, bool]:
    """Which linear layers have biases: Llama's two flags, Qwen2's fixed ones, none of Mistral's."""
    if layout.model_type in ("llama", "llama_bidirec"):
        attention = flag(raw, "attention_bias", path)
        return {"attention_bias": attention, "out_bias": attention, "mlp_bias": flag(raw, "mlp_bias", path)}
    if layout.model_type == "qwen2":
        return {"attention_bias": True, "out_bias": False, "mlp_bias": False}
    return {"attention_bias": False, "out_bias": False, "mlp_bias": False}


def _sliding_window(raw: dict[str, Any], path: Path, layout: Layout) -> int | None:
    """Mistral's window, in every layer (None: none); Qwen2's sliding layers are refused."""
    if layout.model_type == "qwen2":
        if flag(raw, "use_sliding_window", path):
            raise CheckpointError(f"{path}: cannot reproduce use_sliding_window true (sliding-window layers)")
        return None
    if layout.model_type != "mistral":
        return None
    window = raw.get("sliding_window", MISTRAL_WINDOW)
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise CheckpointError(f"{path}: sliding_window must be a positive integer or null, got {window!r}")
    return window


def _check_layer_types(raw: dict[str, Any], path: Path, num_layers: int) -> None:
    """transformers 5 lists each layer's kind; only full ones (Mistral's window is a setting of every layer)."""
    types = raw.get("layer_types")
    if types is None:
        return
    allowed = {FULL, "sliding_attention"} if raw["model_type"] == "mistral" else {FULL}
    if not isinstance(types, list) or len(types) != num_layers or any(t not in allowed for t in types) or \
            len(set(types)) > 1:
        raise CheckpointError(f"{path}: cannot reproduce layer_types {types!r} (only one kind for every layer: "
                              f"{' or '.join(sorted(allowed))})")


def _rope(raw: dict[str, Any], path: Path, layout: Layout, positions: int) -> tuple[float, Llama3Rope | None]:
    """The rope base, and Llama 3's scaling where rope_type is "llama3" (Llama only); from rope_parameters
    (transformers 5) or rope_scaling and rope_theta (4.x). Any other scaling is refused."""
    params, scaling = raw.get("rope_parameters"), raw.get("rope_scaling")
    check_object(params, path, "rope_parameters")
    check_object(scaling, path, "rope_scaling")
    name, spec = ("rope_parameters", params) if params is not None else ("rope_scaling", scaling)
    legacy_theta = float(raw.get("rope_theta", DEFAULT_ROPE_THETA))
    if spec is None:
        return legacy_theta, None
    rope_type = spec.get("rope_type", spec.get("type", "default"))
    theta = float(spec.get("rope_theta", legacy_theta))
    if rope_type == "default" and set(spec) <= {"rope_type", "type", "rope_theta"}:
        return theta, None
    llama = layout.model_type in ("llama", "llama_bidirec")
    if rope_type == "llama3" and llama and all(k in spec for k in LLAMA3_KEYS):
        rope = Llama3Rope(float(spec["factor"]), float(spec["low_freq_factor"]), float(spec["high_freq_factor"]),
                          int(spec.get("original_max_position_embeddings") or positions))
        if not (rope.factor > 0 and rope.high_freq_factor > rope.low_freq_factor > 0
                and rope.original_max_position_embeddings > 0):
            raise CheckpointError(f"{path}: {name} {spec!r}: factor, low_freq_factor and original_max_position_"
                                  "embeddings must be positive, high_freq_factor above low_freq_factor")
        return theta, rope
    also = " or 'llama3' with factor, low_freq_factor and high_freq_factor" if llama else ""
    raise CheckpointError(f"{path}: cannot reproduce {name} {spec!r} (only rope_type 'default'{also})")


FAMILIES = [Family(model_type, read_config, llama_style_key_map, LlamaEncoder,
                   WeightNames(TASK_PREFIX, ENCODER_PARTS, UNUSED_HEADS, ()))
            for model_type, layout in LAYOUTS.items() if layout.standalone]
