"""A Vision Transformer tower and the pre-LayerNorm layer CLIP and SigLIP build both their towers of.

The image is cut into P x P patches, each flattened and projected (a Conv2d of stride P: patch_embedding), a
position embedding is added, and the sequence of patches runs through pre-LayerNorm layers on the one attention
core (attention.py), whose maps over the patches are the product: CLS -> patch maps per layer and head (CLIP),
the pooling head's probe -> patch map (SigLIP), and rollout over them. Two towers follow it:
- CLIP: a class token before the patches (one position more), a LayerNorm before the layers (pre_layrnorm, as
  transformers spells it), the class token's state after post_layernorm is the pooled output;
- SigLIP: no class token, a bias on the patch projection, no norm before the layers; after post_layernorm a
  multi-head attention pooling head (a learned probe attends over the patches, then LayerNorm and MLP) pools.
The image embedding is the pooled output through the checkpoint's projection (clip.py).

SigLIP 2's NaFlex towers (variable_resolution) take each image at its own aspect ratio: the processor resizes it
to as many patches as it needs (up to its max_num_patches) and flattens them; the tower projects each flattened
patch with a Linear, and resizes its grid of position embeddings to the image's grid of rows x cols (transformers'
bilinear, antialiased resize, written as the linear map it is, so it traces into the graph). A batch's images are
padded to its longest with masked patches: pixel_values (B, N, C * P * P), patch_mask (B, N), spatial_shapes
(B, 2) rows and cols.

Shapes: B batch, C channels, S image side, P patch side, N = (S / P)^2 patches, T the sequence (N, or N + 1 with
the class token), H hidden, nh heads, hs head size, F feed-forward size, L layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import SelfAttention
from .blocks import GATE_ACTIVATIONS
from .encoder import MASK_VALUE
from .value_norms import keep_value_norms, stacked_value_norms


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """CLIP's approximation: x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x)


# config.json's hidden_act -> the function (transformers' ACT2FN): the Llama-style blocks' and CLIP's own.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {**GATE_ACTIVATIONS, "quick_gelu": quick_gelu,
                                                                  "relu": F.relu}


@dataclass(frozen=True)
class TowerSizes:
    """What a tower's layers need: sizes, the norm's epsilon and the feed-forward's activation."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    layer_norm_eps: float
    hidden_act: str  # a key of ACTIVATIONS

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class VisionConfig(TowerSizes):
    image_size: int  # S: the side the tower takes (the preprocessor's crop or resize gives it)
    patch_size: int  # P
    num_channels: int = 3
    class_token: bool = True  # CLIP's; SigLIP has none
    pre_norm: bool = True  # CLIP's pre_layrnorm
    patch_bias: bool = False  # SigLIP's patch projection has a bias
    attention_pooling: bool = False  # SigLIP's pooling head; else the class token's state
    # SigLIP 2's NaFlex: images of their own size, patches flattened by the processor; image_size is then the side
    # of the position embeddings' grid in pixels (its sqrt(num_patches) x P).
    variable_resolution: bool = False

    @property
    def grid(self) -> int:
        """Patches along a side: S / P (NaFlex: the position embeddings' grid)."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid ** 2


class TowerAttention(SelfAttention):
    """Multi-head attention with separate q, k, v and out projections, all with biases (CLIP's and SigLIP's
    self_attn)."""

    def __init__(self, sizes: TowerSizes):
        super().__init__()
        H = sizes.hidden_size
        self.nh, self.hs, self.divisor = sizes.num_heads, sizes.head_size, math.sqrt(sizes.head_size)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.out = nn.Linear(H, H)  # W_O: out_proj

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.nh, self.hs).transpose(1, 2)  # (B, nh, T, hs)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """queries: (B, Tq, H); keys (and values): (B, T, H); mask: additive, broadcastable to (B, nh, Tq, T).
        Returns (B, Tq, H) and the maps (B, nh, Tq, T)."""
        q = self._heads(self.q_proj(queries))
        return self.attend(q, self._heads(self.k_proj(keys)), self._heads(self.v_proj(keys)), mask)


class FeedForward(nn.Module):
    def __init__(self, sizes: TowerSizes):
        super().__init__()
        self.fc1 = nn.Linear(sizes.hidden_size, sizes.intermediate_size)
        self.fc2 = nn.Linear(sizes.intermediate_size, sizes.hidden_size)
        self.activation = ACTIVATIONS[sizes.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))  # (B, T, F) in between


class PreNormLayer(nn.Module):
    """x = x + attention(layer_norm1(x)); x = x + mlp(layer_norm2(x)): both towers' layer, CLIP's and SigLIP's."""

    def __init__(self, sizes: TowerSizes):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(sizes.hidden_size, eps=sizes.layer_norm_eps)
        self.self_attn = TowerAttention(sizes)
        self.layer_norm2 = nn.LayerNorm(sizes.hidden_size, eps=sizes.layer_norm_eps)
        self.mlp = FeedForward(sizes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.layer_norm1(x)
        attended, probs = self.self_attn(h, h, mask)
        x = x + attended
        return x + self.mlp(self.layer_norm2(x)), probs


def run_layers(layers: nn.ModuleList, x: torch.Tensor, mask: torch.Tensor, output_attentions: bool
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The layers in order; the maps stacked (L, B, nh, T, T) where asked."""
    maps = []
    for layer in layers:
        x, probs = layer(x, mask)
        if output_attentions:
            maps.append(probs)
    return x, torch.stack(maps) if output_attentions else None


class PatchEmbeddings(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        H, P = cfg.hidden_size, cfg.patch_size
        self.grid = cfg.grid
        self.patch_embedding: nn.Module = (
            nn.Linear(cfg.num_channels * P * P, H, bias=cfg.patch_bias) if cfg.variable_resolution else
            nn.Conv2d(cfg.num_channels, H, kernel_size=P, stride=P, bias=cfg.patch_bias))
        self.class_embedding = nn.Parameter(torch.empty(H)) if cfg.class_token else None
        self.position_embedding = nn.Embedding(cfg.num_patches + int(cfg.class_token), H)

    def forward(self, pixel_values: torch.Tensor, spatial_shapes: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, S, S) -> (B, T, H): patches in row-major order, after the class token where there is one.
        NaFlex: (B, N, C * P * P) flattened patches and spatial_shapes (B, 2) -> (B, N, H)."""
        if spatial_shapes is not None:
            return self.patch_embedding(pixel_values) + self.resized_positions(spatial_shapes, pixel_values.shape[1])
        x = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)  # (B, H, S/P, S/P) -> (B, N, H)
        if self.class_embedding is not None:
            x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)  # (B, N + 1, H)
        return x + self.position_embedding.weight  # (T, H), broadcast over the batch

    def resized_positions(self, spatial_shapes: torch.Tensor, length: int) -> torch.Tensor:
        """(B, 2) each image's rows and cols -> its position embeddings (B, N = length, H): the g x g grid resized to
        rows x cols as F.interpolate(mode="bilinear", align_corners=False, antialias=True) resizes it, in
        transformers' arithmetic (Siglip2VisionEmbeddings); padding positions take the first patch's."""
        g = self.grid
        sizes = spatial_shapes.float()[:, None]  # (B, 1, 2)
        positions = torch.arange(length, device=spatial_shapes.device, dtype=torch.float32)[None, :, None]  # (1, N, 1)
        rows = torch.div(positions, sizes[..., 1:], rounding_mode="floor")  # (B, N, 1)
        index = torch.cat([rows, positions - rows * sizes[..., 1:]], dim=-1)  # (B, N, 2): each patch's row, col
        index = index * (positions < sizes.prod(-1, keepdim=True))
        # Each axis's weights over the g source positions: a triangle filter, widened by the scale where it shrinks.
        scale = g / sizes  # (B, 1, 2)
        support = scale.clamp(min=1)
        center = (index + 0.5) * scale - 0.5  # (B, N, 2)
        source = torch.arange(g, device=spatial_shapes.device, dtype=torch.float32)
        weights = (1 - (source - center[..., None]).abs().div(support[..., None])).clamp(min=0)  # (B, N, 2, g)
        weights = weights / weights.sum(-1, keepdim=True)
        weights = (weights[..., 0, :, None] * weights[..., 1, None, :]).flatten(-2)  # (B, N, g * g)
        return weights @ self.position_embedding.weight  # (B, N, H)


class AttentionPoolingHead(nn.Module):
    """SigLIP's pooling: a learned probe attends over the patches (torch's nn.MultiheadAttention in the
    checkpoint: in_proj split into q, k and v here, the same function), then x + mlp(layernorm(x))."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.probe = nn.Parameter(torch.empty(1, 1, cfg.hidden_size))
        self.attention = TowerAttention(cfg)
        self.layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = FeedForward(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, N, H) -> the pooled (B, H) and the probe's map over the patches (B, nh, 1, N)."""
        pooled, probs = self.attention(self.probe.expand(x.shape[0], 1, -1), x, mask)  # (B, 1, H)
        pooled = pooled + self.mlp(self.layernorm(pooled))
        return pooled[:, 0], probs


class VisionTransformer(nn.Module):
    """pixel_values (B, C, S, S) -> (last_hidden_state (B, T, H), pooled (B, H), attentions (L, B, nh, T, T) or
    None). The pooled output is before the checkpoint's projection. NaFlex: pixel_values (B, N, C * P * P) with
    patch_mask (B, N), 1 for an image's patches and 0 for padding, and spatial_shapes (B, 2)."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = PatchEmbeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.pre_norm else None
        self.layers = nn.ModuleList(PreNormLayer(cfg) for _ in range(cfg.num_layers))
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.head = AttentionPoolingHead(cfg) if cfg.attention_pooling else None

    def forward(self, pixel_values: torch.Tensor, output_attentions: bool = False,
                patch_mask: torch.Tensor | None = None, spatial_shapes: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        keep_value_norms(self, output_attentions)
        x = self.embeddings(pixel_values, spatial_shapes)  # (B, T, H)
        if self.pre_layrnorm is not None:
            x = self.pre_layrnorm(x)
        if patch_mask is None:  # every patch of every image is real: nothing to mask
            mask = x.new_zeros(1, 1, 1, 1)
        else:  # padding patches are keys no position attends to
            mask = (patch_mask[:, None, None, :] == 0).to(x.dtype) * MASK_VALUE  # (B, 1, 1, N)
        x, attentions = run_layers(self.layers, x, mask, output_attentions)
        if self.head is None:  # CLIP: the class token's state, normalised (the patches' are left as they are)
            return x, self.post_layernorm(x[:, 0]), attentions
        x = self.post_layernorm(x)
        pooled, _ = self.head(x, mask)
        return x, pooled, attentions

    def value_norms(self) -> torch.Tensor:
        """(L, B, nh, T): each layer's value norms from the forward just run with output_attentions."""
        return stacked_value_norms(self.layers)
