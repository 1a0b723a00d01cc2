"""The building blocks of the Llama-style families (Qwen3, Gemma 3, EuroBERT): RMSNorm, grouped-query attention
with rotary positions, and the gated feed-forward. Each family's file assembles them in its own order.

Shapes: B batch, T sequence, H hidden, nh query heads, nkv key/value heads (nh a multiple of it), hs head size,
F feed-forward size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .encoder import MASK_VALUE
from .rotary import rotate


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, in fp32 as transformers computes it. Gemma stores weight - 1
    (unit_offset: the scale is 1 + weight, and a fresh weight is zeros)."""

    def __init__(self, size: int, eps: float, unit_offset: bool = False):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter(torch.zeros(size) if unit_offset else torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., size)
        return x * (1.0 + self.weight if self.unit_offset else self.weight)


# config.json's hidden_act names, as transformers' ACT2FN maps them.
GATE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "swish": F.silu, "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


class GatedFeedForward(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with silu (Qwen3, EuroBERT), GeGLU-tanh with gelu_pytorch_tanh (Gemma 3)."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str, bias: bool = False):
        super().__init__()
        self.gate = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.activation = GATE_ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.gate(x)) * self.up(x))  # (B, T, H)


class GroupedQueryAttention(nn.Module):
    """Self-attention with nkv key/value heads shared by groups of nh / nkv query heads, rotary positions and,
    where the family has it, an RMSNorm over each query and key head before the rotation (Qwen3, Gemma 3).

    The attention maps are returned per query head, (B, nh, T, T): a key/value head's keys are the same for
    every query head of its group, but each query head weighs them its own way."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_size: int, bias: bool,
                 scale: float, head_norm: RMSNorm | None = None, out_bias: bool | None = None):
        super().__init__()
        assert num_heads % num_kv_heads == 0, "query heads must split evenly into key/value groups"
        self.nh, self.nkv, self.hs, self.scale = num_heads, num_kv_heads, head_size, scale
        self.query = nn.Linear(hidden_size, num_heads * head_size, bias=bias)
        self.key = nn.Linear(hidden_size, num_kv_heads * head_size, bias=bias)
        self.value = nn.Linear(hidden_size, num_kv_heads * head_size, bias=bias)
        self.out = nn.Linear(num_heads * head_size, hidden_size, bias=bias if out_bias is None else out_bias)  # W_O
        # One norm's weights for every query head and one for every key head, as transformers has them.
        self.query_norm = head_norm
        self.key_norm = None if head_norm is None else RMSNorm(head_size, head_norm.eps, head_norm.unit_offset)

    def _heads(self, x: torch.Tensor, n: int, norm: RMSNorm | None) -> torch.Tensor:
        B, T, _ = x.shape
        x = x.view(B, T, n, self.hs)  # (B, T, n, hs)
        return (x if norm is None else norm(x)).transpose(1, 2)  # (B, n, T, hs)

    def _repeat(self, x: torch.Tensor) -> torch.Tensor:
        """(B, nkv, T, hs) -> (B, nh, T, hs): key/value head j serves query heads j*g .. j*g + g - 1."""
        B, nkv, T, hs = x.shape
        g = self.nh // nkv
        return x if g == 1 else x[:, :, None].expand(B, nkv, g, T, hs).reshape(B, nkv * g, T, hs)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, H); mask: additive, broadcastable to (B, nh, T, T); cos, sin: (T, hs)."""
        B, T, _ = x.shape
        q = rotate(self._heads(self.query(x), self.nh, self.query_norm), cos, sin)  # (B, nh, T, hs)
        k = rotate(self._heads(self.key(x), self.nkv, self.key_norm), cos, sin)  # (B, nkv, T, hs)
        v = self._heads(self.value(x), self.nkv, None)  # (B, nkv, T, hs)
        scores = torch.matmul(q, self._repeat(k).transpose(-1, -2)) * self.scale  # (B, nh, T, T)
        probs = F.softmax(scores + mask, dim=-1)  # (B, nh, T, T), each row sums to 1
        context = torch.matmul(probs, self._repeat(v)).transpose(1, 2).reshape(B, T, self.nh * self.hs)
        return self.out(context), probs


def padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1 for real tokens -> (B, 1, 1, T) additive: 0 for real keys, MASK_VALUE for padded ones."""
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * MASK_VALUE


def causal_mask(T: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(T, T) additive: MASK_VALUE where the key comes after the query."""
    positions = torch.arange(T, device=device)
    return (positions[None, :] > positions[:, None]).to(dtype) * MASK_VALUE
