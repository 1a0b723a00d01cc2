"""NV-Embed (NVIDIA's NV-Embed-v2): a bidirectional Mistral, then its latent attention layer, as its published
modelling code (modeling_nvembed.py, config.json's auto_map AutoModel NVEmbedModel) runs them.

- The text model (text_config, model_type "bidir_mistral"): MistralModel with every layer's is_causal false and the
  padding mask alone, under eager attention: every query sees every real key, with no sliding window (llama.py's
  bidir_mistral layout).
- The latent attention layer (latent_attention_config, LatentAttentionModel): each token's state, layer-normed, is
  the query of a cross-attention whose keys and values are the trained latents (num_latents_value of them,
  layer-normed): no mask, as the code passes none; num_cross_heads heads of cross_dim_head each, its W_O back to
  the hidden size; added to the state; then a GEGLU feed-forward (4x the hidden size, exact GELU) on the layer-normed
  sum, added again. Each token keeps its own output: that is what sentence-transformers' Transformer module gives
  (NVEmbedModel's forward without a pool_mask), and what the folder's Pooling then mean-pools.
- The pooling is the sentence-transformers folder's (modules.json: Pooling, Normalize): a masked mean, the
  instruction prompt's tokens left out where its Pooling says include_prompt false, as NVEmbedModel.encode leaves
  them out of its pool_mask (is_mask_instruction, padding_side "right"): the first len(tokenizer.tokenize(prompt))
  positions, the prompt's tokens without special tokens (engine/prompts.py counts them so).

The latent attention runs through the one attention core's softmax (attention.weighted_values): its keys are the
latents, not the tokens, so it is not a SelfAttention (whose maps and value norms the analyses stack per layer).
Shapes: B batch, T tokens, L latents, nh heads, hs head size, H hidden.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnserve.errors import CheckpointError

from . import llama
from .attention import weighted_values
from .blocks import llama_style_key_map
from .config_reading import check_architectures, check_object, invalid_config
from .family import Family, WeightNames
from .pipeline import read_pipeline

REMOTE_CODE = "modeling_nvembed.NVEmbedModel"  # the auto_map AutoModel this file follows
TEXT_MODEL_TYPE = "bidir_mistral"
LATENT_MODEL_TYPE = "latent_attention"
# LatentAttentionConfig's defaults (configuration_nvembed.py): NV-Embed-v2's config.json gives only the model_type.
LATENT_DEFAULTS = {"num_latents_value": 512, "num_cross_heads": 8, "output_normalize": True, "hidden_dim": 4096,
                   "latent_dim": 4096, "cross_dim_head": 4096}
FEED_FORWARD_MULT = 4  # FeedForward(dim, mult=4)'s
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which the code's PreNorm uses


@dataclass(frozen=True)
class NVEmbedConfig(llama.LlamaConfig):
    num_latents: int = 512
    latent_heads: int = 8
    latent_head_size: int = 4096
    mask_instruction: bool = True  # NVEmbedModel.encode leaves the instruction's tokens out of its pool_mask

    def text_config(self) -> llama.LlamaConfig:
        """The bidirectional Mistral's config (llama.py's bidir_mistral layout)."""
        return replace(self, family=TEXT_MODEL_TYPE)


def read_config(raw: dict[str, Any], path: Path) -> NVEmbedConfig:
    """config.json of an NV-Embed checkpoint (NVEmbedConfig: its text_config and latent_attention_config), or a
    one-line refusal of what the published code would not run as this file does."""
    check_architectures(raw, path, ("NVEmbedModel",))
    check_object(raw.get("auto_map"), path, "auto_map")
    remote = (raw.get("auto_map") or {}).get("AutoModel")
    if remote and str(remote).split("--")[-1] != REMOTE_CODE:
        raise CheckpointError(f"{path}: cannot reproduce auto_map's AutoModel {remote!r} (only NV-Embed's "
                              f"{REMOTE_CODE})")
    text, latent = raw.get("text_config"), raw.get("latent_attention_config") or {}
    if not isinstance(text, dict) or text.get("model_type") != TEXT_MODEL_TYPE:
        got = text.get("model_type") if isinstance(text, dict) else text
        raise CheckpointError(f"{path}: cannot reproduce text_config {got!r} (only model_type '{TEXT_MODEL_TYPE}', "
                              "NV-Embed's bidirectional Mistral)")
    check_object(latent, path, "latent_attention_config")
    if latent.get("model_type", LATENT_MODEL_TYPE) != LATENT_MODEL_TYPE:
        raise CheckpointError(f"{path}: cannot reproduce latent_attention_config's model_type "
                              f"{latent['model_type']!r} (only '{LATENT_MODEL_TYPE}')")
    padding_side, mask_instruction = raw.get("padding_side", "right"), raw.get("is_mask_instruction", True)
    if padding_side not in ("right", "left") or not isinstance(mask_instruction, bool):
        raise CheckpointError(f"{path}: padding_side must be 'right' or 'left' and is_mask_instruction a boolean, "
                              f"got {padding_side!r} and {mask_instruction!r}")
    text_cfg = llama.read_config(text, path)
    settings = {**LATENT_DEFAULTS, **{k: latent[k] for k in LATENT_DEFAULTS if k in latent}}
    sizes = [settings[k] for k in ("num_latents_value", "num_cross_heads", "hidden_dim", "latent_dim",
                                   "cross_dim_head")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        raise CheckpointError(f"{path}: latent_attention_config's sizes must be positive integers, got {settings!r}")
    if not settings["hidden_dim"] == settings["latent_dim"] == text_cfg.hidden_size:
        # The code layer-norms the tokens with latent_dim's norm and the latents with hidden_dim's: it runs only
        # where both are the text model's hidden size.
        raise CheckpointError(f"{path}: cannot reproduce latent_attention_config hidden_dim {settings['hidden_dim']} "
                              f"and latent_dim {settings['latent_dim']} (both must be text_config's hidden_size "
                              f"{text_cfg.hidden_size})")
    with invalid_config(path):
        return NVEmbedConfig(**{**vars(text_cfg), "family": "nvembed"}, num_latents=settings["num_latents_value"],
                             latent_heads=settings["num_cross_heads"], latent_head_size=settings["cross_dim_head"],
                             mask_instruction=mask_instruction and padding_side == "right")


class LatentAttention(nn.Module):
    """LatentAttentionModel without its pool_mask: (B, T, H) token states -> (B, T, H), each token on its own."""

    def __init__(self, cfg: NVEmbedConfig):
        super().__init__()
        H, inner = cfg.hidden_size, cfg.latent_heads * cfg.latent_head_size
        self.nh, self.hs = cfg.latent_heads, cfg.latent_head_size
        self.latents = nn.Parameter(torch.empty(cfg.num_latents, H))  # (L, H)
        self.norm = nn.LayerNorm(H, eps=LAYER_NORM_EPS)  # the tokens', before the queries
        self.latents_norm = nn.LayerNorm(H, eps=LAYER_NORM_EPS)  # the latents', before the keys and values
        self.query = nn.Linear(H, inner, bias=False)
        self.key_value = nn.Linear(H, 2 * inner, bias=False)  # keys, then values
        self.out = nn.Linear(inner, H, bias=False)
        self.feed_forward_norm = nn.LayerNorm(H, eps=LAYER_NORM_EPS)
        self.feed_forward_in = nn.Linear(H, 2 * FEED_FORWARD_MULT * H)  # values, then their GELU gates
        self.feed_forward_out = nn.Linear(FEED_FORWARD_MULT * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        L = self.latents.shape[0]
        q = self.query(self.norm(x)).view(B, T, self.nh, self.hs).transpose(1, 2)  # (B, nh, T, hs)
        k, v = self.key_value(self.latents_norm(self.latents)).chunk(2, dim=-1)  # (L, nh * hs) each
        k, v = (t.view(1, L, self.nh, self.hs).transpose(1, 2).expand(B, -1, -1, -1) for t in (k, v))  # (B, nh, L, hs)
        heads, _ = weighted_values(q, k, v, None, math.sqrt(self.hs))  # (B, nh, T, hs): every latent, no mask
        x = self.out(heads.transpose(1, 2).reshape(B, T, self.nh * self.hs)) + x
        values, gates = self.feed_forward_in(self.feed_forward_norm(x)).chunk(2, dim=-1)  # (B, T, 4H) each
        return self.feed_forward_out(values * F.gelu(gates)) + x


class NVEmbedEncoder(nn.Module):
    """The bidirectional Mistral, then the latent attention layer on its last hidden state; the attention maps are
    the Mistral layers' (the latent layer attends to latents, not tokens)."""

    def __init__(self, cfg: NVEmbedConfig):
        super().__init__()
        self.config = cfg
        self.text = llama.LlamaEncoder(cfg.text_config())
        self.latent = LatentAttention(cfg)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden, attentions = self.text(input_ids, attention_mask, output_attentions, token_type_ids)  # (B, T, H)
        return self.latent(hidden), attentions


LATENT_PREFIX = "latent_attention_model."
TEXT_PREFIX = "embedding_model."
# LatentAttentionModel's names (cross_attend_blocks: PreNorm(Attention), PreNorm(FeedForward)) -> LatentAttention's.
LATENT_KEYS = {
    "latents": "latents",
    "cross_attend_blocks.0.norm.weight": "norm.weight",
    "cross_attend_blocks.0.norm.bias": "norm.bias",
    "cross_attend_blocks.0.norm_context.weight": "latents_norm.weight",
    "cross_attend_blocks.0.norm_context.bias": "latents_norm.bias",
    "cross_attend_blocks.0.fn.to_q.weight": "query.weight",
    "cross_attend_blocks.0.fn.to_kv.weight": "key_value.weight",
    "cross_attend_blocks.0.fn.to_out.weight": "out.weight",
    "cross_attend_blocks.1.norm.weight": "feed_forward_norm.weight",
    "cross_attend_blocks.1.norm.bias": "feed_forward_norm.bias",
    "cross_attend_blocks.1.fn.net.0.weight": "feed_forward_in.weight",
    "cross_attend_blocks.1.fn.net.0.bias": "feed_forward_in.bias",
    "cross_attend_blocks.1.fn.net.2.weight": "feed_forward_out.weight",
    "cross_attend_blocks.1.fn.net.2.bias": "feed_forward_out.bias",
}


def key_map(cfg: NVEmbedConfig) -> dict[str, str]:
    """NVEmbedModel's checkpoint keys -> NVEmbedEncoder's."""
    keys = {TEXT_PREFIX + theirs: "text." + ours for theirs, ours in llama_style_key_map(cfg).items()}
    keys.update({LATENT_PREFIX + theirs: "latent." + ours for theirs, ours in LATENT_KEYS.items()})
    return keys


def pipeline(directory: Path, cfg: NVEmbedConfig) -> Any:
    """The folder's sentence-transformers pipeline, its Pooling allowed to leave the prompt out, where that is what
    NVEmbedModel.encode does too (it masks the instruction under is_mask_instruction and padding_side "right")."""
    found = read_pipeline(directory, cfg.usable_positions, cfg.hidden_size, prompt_excludable=True)
    if found.include_prompt == cfg.mask_instruction:
        raise CheckpointError(f"{directory}: cannot reproduce include_prompt {str(found.include_prompt).lower()} "
                              f"with is_mask_instruction and padding_side saying the instruction is "
                              f"{'' if cfg.mask_instruction else 'not '}left out of the pooling "
                              "(NVEmbedModel.encode and sentence-transformers would differ)")
    return found


FAMILY = Family("nvembed", read_config, key_map, NVEmbedEncoder,
                WeightNames("", (TEXT_PREFIX, LATENT_PREFIX), (), ()), pipeline=pipeline)
